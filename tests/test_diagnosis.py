"""Each finding on simulated runs that must trigger it and runs that must not."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

import gpuprof_jupyter as gp
from gpuprof_jupyter.core.analysis.diagnosis import diagnose
from tests.simexp import sim_experiment, steps_frame


def ids(experiment) -> list[str]:
    return [f.id for f in diagnose(experiment)]


def test_input_bound_triggers_with_evidence_and_next_step():
    exp = sim_experiment("input-bound", seconds=10, steps=steps_frame(50, 10, wait_frac=0.58), cpu_util=95.0,
                         params={"num_workers": 2})
    finding = next(f for f in diagnose(exp) if f.id == "input-bound")
    assert finding.severity == "high"
    assert "sm_util < 50 %" in finding.evidence and "waited for data 58 %" in finding.evidence
    assert "95 % of its CPUs" in finding.evidence
    assert "num_workers=2" in finding.next_step and "prefetch_factor" in finding.next_step
    assert "pin_memory" in finding.next_step


@pytest.mark.parametrize("scenario, wait", [("compute-bound", 0.02), ("input-bound", 0.02)])
def test_input_bound_not_triggered_without_data_waits(scenario, wait):
    exp = sim_experiment(scenario, seconds=10, steps=steps_frame(50, 10, wait_frac=wait), cpu_util=20.0)
    assert "input-bound" not in ids(exp)


@pytest.mark.process
def test_input_bound_from_a_driven_profiled_loop(store_dir):
    """Real profiling: a slow iterable under track() makes the simulated GPU starve."""

    def slow_loader(n):
        for i in range(n):
            time.sleep(0.03)
            yield i

    with gp.profile(name="driven", source="sim", store=store_dir, interval=0.02) as p:
        for _ in gp.track(slow_loader(25)):
            time.sleep(0.015)
            gp.step(32)
    assert "input-bound" in ids(p.experiment)


def test_low_sm_without_evidence_is_gpu_underused_not_input_bound():
    exp = sim_experiment("input-bound", seconds=5, cpu_util=10.0)
    assert ids(exp) == ["gpu-underused"]
    advice = diagnose(exp)[0].next_step
    assert "gpuprof_jupyter.step(n_samples)" in advice and "track(loader)" in advice
    assert "earlier cell" not in advice  # nothing says torch came too late here


@pytest.mark.parametrize("late, words", [("cell", "torch was imported inside the profiled cell"),
                                         ("block", "import it before the block starts")])
def test_import_torch_earlier_is_advised_only_where_torch_came_late(late, words):
    exp = sim_experiment("input-bound", seconds=5, cpu_util=10.0)
    exp.meta.context["torch_imported_late"] = late
    advice = diagnose(exp)[0].next_step
    assert advice.startswith(words) or words in advice, advice
    assert ("earlier cell" in advice) is (late == "cell") and "gpuprof_jupyter.step(n_samples)" in advice


LATE_TORCH = """
import sys, time
import gpuprof_jupyter as gp
with gp.profile(name="late", source="sim:input-bound", store=sys.argv[1], interval=0.05) as p:
    import torch
    time.sleep(1.0)
print("NOTES", p.experiment.meta.notes)
print("ADVICE", [f.next_step for f in gp.diagnose(p.experiment) if f.id == "gpu-underused"])
"""


@pytest.mark.process
def test_torch_imported_inside_a_profile_block_is_named_as_a_block(store_dir):
    """A script's profile() block, not a notebook cell: the advice says where to import torch
    in a script's words."""
    done = subprocess.run([sys.executable, "-c", LATE_TORCH, str(store_dir)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "torch was imported inside the profiled block" in done.stdout and "earlier cell" not in done.stdout
    assert "import it before the block starts" in done.stdout, done.stdout


@pytest.mark.process
def test_a_script_under_gpuprof_run_gets_no_earlier_cell_advice(store_dir, tmp_path, capsys):
    """gpuprof run hooks torch whenever the script imports it: import order is no advice there."""
    from gpuprof_jupyter.cli import main

    script = tmp_path / "train.py"
    script.write_text("import time\ntime.sleep(1.0)\n")
    main(["run", "--store", str(store_dir), "--source", "sim:input-bound", "--interval", "0.05", "--",
          sys.executable, str(script)])
    out = capsys.readouterr().out
    assert "GPU underused" in out and "gpuprof_jupyter.step(n_samples)" in out, out
    assert "earlier cell" not in out


def test_compute_bound_fp32_from_tensor_cores():
    exp = sim_experiment("fp32", seconds=5)
    finding = next(f for f in diagnose(exp) if f.id == "compute-bound-fp32")
    assert "tensor cores were active 2 %" in finding.evidence
    assert "torch.autocast" in finding.next_step and "batch" in finding.next_step


@pytest.mark.parametrize("scenario, params, expected", [
    ("compute-bound", {"amp": False}, "compute-bound-fp32"),
    ("compute-bound", {"precision": "fp32"}, "compute-bound-fp32"),
    ("compute-bound", {"amp": True}, None),
    ("amp", {}, None),
    ("input-bound", {"amp": False}, None),
])
def test_compute_bound_fp32_must_and_must_not(scenario, params, expected):
    found = {i for i in ids(sim_experiment(scenario, seconds=5, params=params)) if i.startswith("compute-bound")}
    assert found == ({expected} if expected else set())


def test_memory_underused_by_torch_allocator():
    exp = sim_experiment("small-batch", seconds=3, params={"batch_size": 32})
    finding = next(f for f in diagnose(exp) if f.id == "memory-underused")
    # the simulated GPU's figures say so in the evidence too, once for the clause (issue 36 part 1)
    assert "torch's allocator reserved at most 4.0 GiB of 40.0 GiB (10 %) (simulated)" in finding.evidence
    assert "batch_size=32" in finding.next_step


def test_memory_not_underused_when_the_gpu_is_well_filled():
    assert "memory-underused" not in ids(sim_experiment("compute-bound", seconds=3))  # 14.5 of 40 GiB, no torch stats


def test_throttling_share_of_time():
    exp = sim_experiment("throttled", gpus=2, seconds=30, interval=0.5)
    finding = next(f for f in diagnose(exp) if f.id == "throttled")
    assert "sw_power_cap" in finding.evidence
    assert 0.30 <= finding.numbers["share"] <= 0.37  # throttled for t in [10, 20) of 30 s
    assert "power" in finding.next_step
    assert "throttled" not in ids(sim_experiment("compute-bound", gpus=2, seconds=30, interval=0.5))


def test_idle_between_phases():
    exp = sim_experiment("idle-gaps", seconds=25, interval=0.25,
                         phases=[{"name": "train", "start_s": 0, "end_s": 5}, {"name": "eval", "start_s": 10, "end_s": 15}])
    finding = next(f for f in diagnose(exp) if f.id == "idle-gaps")
    assert finding.numbers["stretches"] == 2 and finding.numbers["longest_s"] >= 4.5
    assert "phase" in finding.evidence
    assert "idle-gaps" not in ids(sim_experiment("compute-bound", seconds=25, interval=0.25))


def test_idle_only_at_start_or_end_is_not_between_phases():
    # 9.5 s of idle-gaps: busy 0-5 s, idle 5-9.5 s: trailing idle is the end of the run, not a gap
    assert "idle-gaps" not in ids(sim_experiment("idle-gaps", seconds=9.5, interval=0.25))


def test_one_gpu_lagging():
    finding = next(f for f in diagnose(sim_experiment("lagging", gpus=4, seconds=5)) if f.id == "lagging-gpu")
    assert finding.numbers["device"] == "gpu3"
    assert "gpu3 averaged sm_util 59 %" in finding.evidence
    assert "lagging-gpu" not in ids(sim_experiment("compute-bound", gpus=4, seconds=5))
    assert "lagging-gpu" not in ids(sim_experiment("lagging", gpus=1, seconds=5))


def test_findings_are_ordered_by_severity():
    exp = sim_experiment("lagging", gpus=3, seconds=5, params={"amp": False})
    severities = [f.severity for f in diagnose(exp)]
    assert severities == sorted(severities, key=["high", "medium", "info"].index)
    assert ids(exp)[0] == "lagging-gpu"


def test_findings_shown_in_summary_html_and_text():
    from gpuprof_jupyter.render.summary_html import render_summary_html, render_summary_text

    exp = sim_experiment("fp32", seconds=3)
    assert "Compute-bound in fp32" in render_summary_html(exp)
    assert "Compute-bound in fp32" in render_summary_text(exp)


def test_the_registry_runs_every_family_in_its_order_with_a_stopped_rank_first():
    """diagnosis.CHECKS, the registry: one module per family of findings, the order kept."""
    from gpuprof_jupyter.core.analysis.diagnosis import CHECKS
    from gpuprof_jupyter.core.analysis.serving_findings import SERVING_CHECKS

    own = [(c.__module__.rsplit(".", 1)[-1], c.__name__) for c in CHECKS[:len(CHECKS) - len(SERVING_CHECKS)]]
    assert own == [
        ("stuck", "stuck_finding"), ("input_findings", "input_bound"), ("input_findings", "gpu_underused"),
        ("device_findings", "compute_bound"), ("memory_findings", "memory_underused"),
        ("memory_findings", "memory_headroom"), ("device_findings", "throttled"), ("device_findings", "idle_gaps"),
        ("device_findings", "lagging_gpu"), ("rank_findings", "straggler_rank"), ("rank_findings", "ranks_waiting"),
        ("job_findings", "ranks_missing"), ("rank_findings", "rank_gpu_mismatch"), ("trace_findings", "tiny_kernels"), ("trace_findings", "host_bound"),
        ("trace_findings", "dominant_operator"), ("trace_findings", "window_waste")]
    assert CHECKS[len(CHECKS) - len(SERVING_CHECKS):] == list(SERVING_CHECKS)
