"""pipeline.yaml export: round trip with comments, malformed file, missing file, failed rule."""

from __future__ import annotations

import os

import pytest
from ruamel.yaml import YAML

import gpuprof_jupyter as gp
from gpuprof_jupyter.export.pipeline import ExportRefused, PipelineError, export_pipeline
from tests.simexp import sim_experiment, steps_frame

SEED = """\
# Workflow v6 pipeline (team vision)
workflow:
  steps:
    - name: preprocess_images
      image: pytorch/pytorch:2.0
      command: ["python", "prep.py"]   # resize + normalise
    - name: train
      image: pytorch/pytorch:2.0
      command: ["python", "train.py"]
      resources:
        gpu: 1
      profiling:
        enabled: true          # <-- activation du profiling
        metrics: [sm_util, mem_bw, power]
      params:
        batch_size: 32   # first guess
        # mixed precision below
        amp: false
        lr: 0.1
  schedule: nightly  # kept
"""

PASS = {"rule": "sm_util > 60 for >=80%", "passed": True, "measured": 0.83, "detail": "ok", "kind": "time-share"}
FAIL = {"rule": "sm_util > 60 for >=80%", "passed": False, "measured": 0.41, "detail": "41 %", "kind": "time-share"}


def runs(checks=None):
    base = sim_experiment("input-bound", seconds=12, name="baseline", params={"batch_size": 32, "amp": False},
                          steps=steps_frame(60, 12, 0.5))
    b64 = sim_experiment("amp", gpus=2, seconds=9, name="b64-amp", params={"batch_size": 64, "amp": True},
                         steps=steps_frame(30, 9, 0.1, batch=64), checks=checks if checks is not None else [PASS])
    return base, b64


def test_round_trip_keeps_comments_order_and_layout(tmp_path):
    path = tmp_path / "pipeline.yaml"
    path.write_text(SEED)
    base, b64 = runs()
    result = export_pipeline(b64, path, "train", candidates=[base, b64])
    text = path.read_text()
    lines = text.splitlines()
    assert lines[0] == "# Workflow v6 pipeline (team vision)"
    assert '      command: ["python", "prep.py"]   # resize + normalise' in lines
    assert "        enabled: true          # <-- activation du profiling" in lines
    assert "  schedule: nightly  # kept" in lines
    assert any(line.startswith("    - name: train  # b64-amp against baseline: ") for line in lines)  # indentation kept
    batch = next(line for line in lines if "batch_size:" in line)
    assert batch.startswith("        batch_size: 64")
    assert "# 32 -> 64; changed in b64-amp with amp (not measured alone)" in batch
    step_line = next(line for line in lines if "- name: train" in line)
    assert "-25 % time" in step_line and "energy" in step_line and "sm_util" in step_line  # said once, on the step
    assert "first guess" not in batch
    assert any("# mixed precision below" in line for line in lines)
    amp = next(line for line in lines if line.strip().startswith("amp:"))
    assert "amp: true" in amp and "# false -> true; changed in b64-amp with batch_size" in amp
    assert "lr: 0.1" in text and "#" not in next(line for line in lines if "lr:" in line)
    gpu = next(line for line in lines if "gpu:" in line)
    assert "gpu: 2" in gpu and "# 1 -> 2; b64-amp" in gpu
    doc = YAML(typ="safe").load(text)
    step = doc["workflow"]["steps"][1]
    assert list(step) == ["name", "image", "command", "resources", "profiling", "params"]
    assert step["profiling"]["thresholds"] == ["sm_util > 60 for >=80%"]
    assert step["params"] == {"batch_size": 64, "amp": True, "lr": 0.1}
    assert doc["workflow"]["steps"][0]["name"] == "preprocess_images"
    assert result.baseline == "baseline" and {c[0] for c in result.changes} >= {"params.batch_size", "params.amp"}
    # exporting again changes nothing and keeps the comments
    again = export_pipeline(b64, path, "train", candidates=[base, b64])
    assert [c[0] for c in again.changes] == [] and "# 32 -> 64; changed in b64-amp" in path.read_text()


def test_missing_file_is_created_with_the_seed_layout(tmp_path):
    path = tmp_path / "sub" / "pipeline.yaml"
    base, b64 = runs()
    export_pipeline(b64, path, "train", candidates=[base, b64])
    doc = YAML(typ="safe").load(path.read_text())
    step = doc["workflow"]["steps"][0]
    assert step["name"] == "train" and step["resources"] == {"gpu": 2}
    assert step["profiling"]["enabled"] is True and step["profiling"]["metrics"] == ["sm_util", "mem_bw", "power"]
    assert step["params"] == {"batch_size": 64, "amp": True}
    assert "batch_size: 64  # 32 -> 64; changed in b64-amp" in path.read_text()
    assert oct(path.stat().st_mode & 0o777) != oct(0o600)  # not mkstemp's private mode


@pytest.mark.parametrize("content, message", [
    ("workflow: [unclosed\n", "not valid YAML"),
    ("- just\n- a list\n", "is not a pipeline"),
    ("workflow: 3\n", "'workflow' must be a mapping"),
    ("workflow:\n  steps: {a: 1}\n", "must be a list of steps"),
    ("workflow:\n  steps:\n    - image: x\n", "steps[0] must be a mapping with a 'name'"),
])
def test_malformed_file_is_a_clear_error_and_untouched(tmp_path, content, message):
    path = tmp_path / "pipeline.yaml"
    path.write_text(content)
    before = path.stat().st_mtime_ns
    with pytest.raises(PipelineError, match="left untouched") as info:
        export_pipeline(runs()[1], path)
    assert message in str(info.value)
    assert path.read_text() == content and path.stat().st_mtime_ns == before
    assert os.listdir(tmp_path) == ["pipeline.yaml"]  # no temporary file left behind


def test_failed_rule_needs_force(tmp_path):
    path = tmp_path / "pipeline.yaml"
    path.write_text(SEED)
    base, b64 = runs(checks=[FAIL])
    with pytest.raises(ExportRefused, match="force=True"):
        export_pipeline(b64, path, candidates=[base, b64])
    assert path.read_text() == SEED
    export_pipeline(b64, path, candidates=[base, b64], force=True)
    text = path.read_text()
    assert "batch_size: 64" in text and "FAILED, exported with force" in text


def test_unjudged_rule_needs_force_and_is_kept_as_such(tmp_path):
    """A gate that could not be judged (no GPU reading) is no pass: the export is refused, and a
    forced one says CANNOT JUDGE beside the threshold."""
    path = tmp_path / "pipeline.yaml"
    path.write_text(SEED)
    unjudged = {**FAIL, "measured": None, "judged": False, "detail": "sm_util was not measured",
                "to_judge": "judge it on a GPU runner"}
    base, b64 = runs(checks=[unjudged])
    with pytest.raises(ExportRefused, match=r"did not pass 1 rule\(s\) \(1 cannot be judged: CANNOT JUDGE sm_util"):
        export_pipeline(b64, path, candidates=[base, b64])
    assert path.read_text() == SEED
    export_pipeline(b64, path, candidates=[base, b64], force=True)
    assert "- sm_util > 60 for >=80%  # b64-amp: CANNOT JUDGE, exported with force" in path.read_text()


@pytest.mark.process
def test_export_by_name_from_store(store_dir, tmp_path):
    with gp.profile(name="fast", source="sim:amp", store=store_dir, interval=0.02, params={"batch_size": 64}):
        pass
    result = gp.export_pipeline("fast", tmp_path / "p.yaml", step="finetune", store=store_dir)
    assert result.step == "finetune"
    doc = YAML(typ="safe").load((tmp_path / "p.yaml").read_text())
    assert doc["workflow"]["steps"][0]["params"] == {"batch_size": 64}


def test_params_that_only_describe_the_run_are_not_written(tmp_path):
    """Observed facts (dataset, its length, optimizer class, parameter count) stay out of the
    pipeline: only settings someone chose are kept, with their reason."""
    params = {"batch_size": 64, "amp": True, "num_workers": 4, "dataset": "SlowImages", "dataset_len": 4352,
              "optimizer": "SGD", "model.parameters": 3018, "model.dtype": "float32", "amp.device": "cpu",
              "loader1.dataset": "Other", "loader1.batch_size": 8}
    run = sim_experiment("amp", seconds=9, name="fed", params=params, steps=steps_frame(45, 9, 0.1), checks=[PASS])
    path = tmp_path / "pipeline.yaml"
    export_pipeline(run, path=path, step="train")
    written = YAML(typ="safe").load(path.read_text())["workflow"]["steps"][0]["params"]
    assert written == {"batch_size": 64, "amp": True, "num_workers": 4, "loader1.batch_size": 8}, written


def test_torch_defaults_left_out_each_change_explained_once(tmp_path):
    """Part 6 of issue 22: only what the user set or changed; evidence where the runs isolate it."""
    torch_flags = {"cudnn.benchmark": False, "tf32.cudnn": True, "tf32.matmul": False,
                   "float32_matmul_precision": "highest", "pin_memory": False}
    base = sim_experiment("input-bound", seconds=12, name="baseline",
                          params={"batch_size": 32, "num_workers": 0, "lr": 0.1, **torch_flags},
                          steps=steps_frame(60, 12, 0.5))
    workers = sim_experiment("input-bound", seconds=10, name="workers",
                             params={"batch_size": 32, "num_workers": 4, "lr": 0.1, **torch_flags},
                             steps=steps_frame(55, 10, 0.3))
    best = sim_experiment("amp", seconds=9, name="b64", params={"batch_size": 64, "num_workers": 4, "lr": 0.1,
                                                                 **torch_flags, "tf32.matmul": True},
                          steps=steps_frame(45, 9, 0.1), checks=[PASS])
    best.meta.context["params_given"] = ["batch_size", "pin_memory"]  # --param: kept even at the default
    path = tmp_path / "pipeline.yaml"
    export_pipeline(best, path, "train", baseline=base, candidates=[base, workers, best])
    lines = path.read_text().splitlines()
    params = YAML(typ="safe").load(path.read_text())["workflow"]["steps"][0]["params"]
    assert params == {"batch_size": 64, "num_workers": 4, "lr": 0.1, "pin_memory": False, "tf32.matmul": True}
    line = {key: next(x for x in lines if x.strip().startswith(f"{key}:")) for key in params}
    # workers ran fewer samples than the baseline: its effect is the rate's gain, never "-17% time"
    assert "# 0 -> 4; alone in workers against baseline: +10 % throughput (95 % CI" in line["num_workers"]
    assert "time" not in line["num_workers"] and "% energy per sample" in line["num_workers"]
    assert "# 32 -> 64; changed in b64 with tf32.matmul (not measured alone)" in line["batch_size"]
    assert "# false -> true; changed in b64 with batch_size" in line["tf32.matmul"]
    assert "# the same in every run since baseline" in line["lr"]
    comments = [line[k].split("#", 1)[1] for k in ("batch_size", "num_workers", "tf32.matmul")]
    assert len(set(comments)) == len(comments)  # no two changed lines share one comment
    assert sum("b64 against baseline" in x for x in lines) == 1  # the run's effect, once, on the step
