"""A claim needs its evidence (issue 36, parts 2 and 6): a run that read no GPU gets findings
about the host only; a CPU loop waiting for data is input-bound; a memory figure says what it
counts and meets no device total of another kind; one gain per pair; a setting measured alone
counts once; serving shares are shares; exported figures in their rule's unit; docs' figures
from tests; the --tune estimate from the steps a trial runs."""

from __future__ import annotations

import itertools
import re

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from gpuprof_jupyter.core.analysis.compare import compare_experiments
from gpuprof_jupyter.core.analysis.diagnosis import diagnose
from gpuprof_jupyter.core.analysis.headroom import largest_batch
from gpuprof_jupyter.core.analysis.rules import evaluate_rule
from gpuprof_jupyter.core.analysis.summary import summary_of
from gpuprof_jupyter.core.store.experiment import Experiment, ExperimentMeta
from gpuprof_jupyter.core.format import fmt_change
from gpuprof_jupyter.render.memory_html import memory_facts
from gpuprof_jupyter.export.pipeline import export_pipeline
from tests.memexp import memory_run
from tests.simexp import requests_frame, sim_experiment, steps_frame

_ids = itertools.count()
GPU_WORDS = ("GPU idles", "the GPU waits", "pinned memory", "pin_memory", "non_blocking", "CUDA graphs",
             "decode on GPU", "kernel launches")


def host_experiment(seconds: float = 10.0, interval: float = 0.1, *, steps=None, requests=None, cpu_util=12.0,
                    params=None, name="cpu") -> Experiment:
    """A run with ``--source host``: the process tree's CPU only, no GPU device."""
    t = np.arange(1, int(round(seconds / interval)) + 1) * interval
    samples = pd.DataFrame({"t": t, "wall_time": 1.9e9 + t, "device": "host", "cpu_util": cpu_util})
    meta = ExperimentMeta(id=f"20261201T{next(_ids):06d}-host", name=name, status="ok", duration_s=seconds,
                          interval_s=interval, source="host", devices=[{"key": "host", "kind": "host", "name": "testhost"}],
                          provenance={"host": {"cpu_util": "psutil.process_tree"}}, params=dict(params or {}))
    return Experiment(meta, samples=samples, steps=steps, requests=requests)


def _text(finding) -> str:
    return " ".join((finding.title, finding.evidence, finding.next_step))


def test_a_cpu_model_flat_as_the_batch_grows_is_not_called_a_saturated_gpu():
    """The serving findings other than host-bound speak of the host only on a run that read no GPU."""
    small = requests_frame([0.010] * 60, gaps=0.001, batch=1)
    flat = requests_frame([0.075] * 60, gaps=0.001, batch=8, start=float(small["t_start_s"].max()) + 0.02)
    warm = requests_frame([0.5] + [0.010] * 59, gaps=0.001, start=float(flat["t_start_s"].max()) + 0.1)
    run = host_experiment(requests=pd.concat([small, flat], ignore_index=True))
    flat_finding = {f.id: f for f in diagnose(run)}["throughput-flat"]
    assert "GPU is saturated" not in _text(flat_finding) and "no GPU was read" in flat_finding.next_step
    assert "batch 8 gives 106.7 samples/s against 100.0 samples/s at batch 1" in flat_finding.evidence
    warm_finding = {f.id: f for f in diagnose(host_experiment(requests=warm))}["serving-warm-up"]
    assert "cudnn" not in warm_finding.next_step


def test_a_cpu_model_served_with_gaps_gets_no_gpu_claim_or_gpu_advice():
    # a CPU model under no_grad: 2 ms requests with 8 ms of caller work between them
    run = host_experiment(requests=requests_frame([0.002] * 200, gaps=0.008))
    found = {f.id: f for f in diagnose(run)}
    host = found["serving-host-bound"]
    assert not any(word in _text(host) for word in GPU_WORDS), _text(host)
    assert "no GPU was read" in host.evidence and "80 %" in host.evidence
    # the same gaps with a GPU read still speak of the GPU
    gpu = sim_experiment("input-bound", requests=requests_frame([0.002] * 200, gaps=0.008))
    host = {f.id: f for f in diagnose(gpu)}["serving-host-bound"]
    assert "the GPU idles" in host.evidence and "CUDA graphs" in host.next_step


def test_a_cpu_training_loop_waiting_for_data_is_input_bound_in_host_words():
    run = host_experiment(steps=steps_frame(40, 10.0, 0.9), params={"num_workers": 0})
    found = {f.id: f for f in diagnose(run)}
    assert "input-bound" in found, [f.id for f in diagnose(run)]
    finding = found["input-bound"]
    assert "90 %" in finding.evidence and "num_workers=0" in finding.next_step
    assert not any(word in _text(finding) for word in GPU_WORDS), _text(finding)
    assert "input-bound" not in {f.id for f in diagnose(host_experiment(steps=steps_frame(40, 10.0, 0.05)))}


def test_busy_frac_is_a_share_even_with_four_serving_threads():
    # four threads, each serving 10 ms requests back to back: four requests always in flight
    frames = [requests_frame([0.01] * 100) for _ in range(4)]
    requests = pd.concat(frames, ignore_index=True)
    r = summary_of(host_experiment(requests=requests))["requests"]
    assert 0.0 <= r["busy_frac"] <= 1.0 and r["busy_frac"] == pytest.approx(1.0, abs=0.02)
    assert r["concurrency_mean"] == pytest.approx(4.0, rel=0.05)


# -- memory: what a figure counts, never against a device of another kind --------------------
def _cpu_tensors_on_sim(batch: int = 64, name: str | None = None):
    """A CPU model profiled with --source sim: the memory probe counted CPU tensor sizes (no CUDA
    allocator), while the simulated GPU reports its own 40 GiB."""
    run = memory_run(batch, name=name, step_peaks=False)
    run.meta.context["memory"]["sampled_peak_bytes"] = None
    return run


def test_cpu_tensors_are_never_set_against_a_gpus_total():
    run = _cpu_tensors_on_sim()
    memory = summary_of(run)["memory"]
    assert memory["counts"] == "cpu_tensors" and "CPU tensor sizes" in memory["basis"]
    assert "headroom_frac" not in memory and "device_total_bytes" not in memory
    assert not any("of 40.0 GiB" in fact for fact in memory_facts(run.meta, memory))
    assert "other" not in memory["breakdown"]  # unknown beside counted tensors, never "other 0 B"
    assert "not an allocator's peak" in memory["basis"]
    assert "memory-headroom" not in {f.id for f in diagnose(run)} and "memory-does-not-fit" not in {
        f.id for f in diagnose(run)}


def test_a_memory_rule_on_cpu_tensors_says_so_or_cannot_judge():
    run = _cpu_tensors_on_sim()
    peak = evaluate_rule(run, "peak_memory < 70 GiB")
    assert peak.verdict == "PASS" and "counted CPU tensors, not GPU memory" in peak.detail, peak.detail
    headroom = evaluate_rule(run, "memory_headroom > 10 %")
    assert headroom.verdict == "CANNOT JUDGE", headroom
    said = headroom.detail + " " + headroom.to_judge
    assert "model on the CPU" in said and "gpuprof_jupyter.log(" not in said, said


def test_largest_batch_refuses_runs_of_another_basis_precision_or_model():
    fp32, bf16 = memory_run(8, name="fp32"), memory_run(32, name="bf16")
    fp32.meta.params["amp.autocast"] = False
    bf16.meta.params.update({"amp.autocast": True, "amp.dtype": "torch.bfloat16"})
    with pytest.raises(ValueError, match="differ in precision.*fp32: no autocast.*bf16: autocast torch.bfloat16"):
        largest_batch([fp32, bf16])
    with pytest.raises(ValueError, match="differ in what the peak counts.*alloc: torch.cuda.*cpu: CPU tensor sizes"):
        largest_batch([memory_run(8, name="alloc"), _cpu_tensors_on_sim(32, name="cpu")])
    small, large = memory_run(8, name="small"), memory_run(32, name="large")
    small.meta.params["model.parameters"], large.meta.params["model.parameters"] = 1000, 2000
    with pytest.raises(ValueError, match="differ in model"):
        largest_batch([small, large])
    fit = largest_batch([memory_run(8, name="a"), memory_run(16, name="b"), memory_run(32, name="c")])
    assert "every run: a, b, c" in fit.basis


# -- one gain per pair; a setting measured alone -----------------------------------------------
def _trial(name: str, batch: int, step_s: float, wait: float, warmup_s: float):
    """A --tune trial: 5 slow warm-up steps (left out of its rate), then 60 steady ones."""
    warm = steps_frame(5, 5 * warmup_s, 0.6, batch=batch)
    steady = steps_frame(60, 60 * step_s, wait, batch=batch, start=float(warm["t_end_s"].iloc[-1]))
    run = sim_experiment("input-bound", seconds=float(steady["t_end_s"].iloc[-1]) + 0.2, name=name,
                         steps=pd.concat([warm, steady], ignore_index=True), params={"batch_size": batch})
    run.meta.context["tune"] = {"warmup_steps": 5, "objective": "throughput", "run": "t"}
    return run


def test_the_comparisons_throughput_row_and_its_gain_are_one_estimate():
    base, trial = _trial("tune-t1", 32, 0.1, 0.08, 0.5), _trial("tune-t3", 32, 0.05, 0.03, 0.1)
    comparison = compare_experiments([base, trial])
    row, found = comparison.metric("samples_per_s"), comparison.gains[1]
    assert row.rel[1] == pytest.approx(found.value, rel=1e-9), (row.rel[1], found.value)
    assert comparison.metric("data_wait_frac").values == pytest.approx([0.08, 0.03])  # the tune table's


def _captured_run(name: str, batch: int, workers: int, step_s: float):
    params = {"batch_size": batch, "num_workers": workers, "prefetch_factor": 2 if workers else None}
    run = sim_experiment("input-bound", seconds=10.2, name=name, params=params,
                         steps=steps_frame(50, 50 * step_s, 0.3, batch=batch))
    run.meta.captured = {"cfg.batch_size": batch, "cfg.num_workers": workers}  # --capture cfg
    if workers:
        run.meta.context["torch_filled"] = ["prefetch_factor"]  # torch's default, nobody set it
    return run


def test_a_captured_duplicate_or_a_value_torch_filled_in_is_still_one_setting_measured_alone(tmp_path):
    bs32, bs64, w2 = (_captured_run("bs32-w0", 32, 0, 0.2), _captured_run("bs64-w0", 64, 0, 0.2),
                      _captured_run("bs64-w2", 64, 2, 0.15))
    for when, (a, b) in enumerate([(bs32, bs64), (bs64, w2)]):
        b.meta.started_at = f"2026-11-30T10:00:0{when + 1}.000+00:00"
    bs32.meta.started_at = "2026-11-30T10:00:00.000+00:00"
    assert not any(w.kind == "several-settings" for w in compare_experiments([bs32, bs64]).warnings)
    path = tmp_path / "pipeline.yaml"
    export_pipeline(w2, path, "train", baseline=bs32, candidates=[bs32, bs64, w2], captured=True)
    lines = path.read_text().splitlines()
    batch = next(line for line in lines if line.strip().startswith("batch_size:"))
    workers = next(line for line in lines if line.strip().startswith("num_workers:"))
    assert "alone in bs64-w0 against bs32-w0: +" in batch and "not measured alone" not in batch, batch
    assert "alone in bs64-w2 against bs64-w0: +" in workers and "not measured alone" not in workers, workers


def test_an_exported_value_rule_says_its_figure_in_the_rules_unit(tmp_path):
    run = sim_experiment("input-bound", name="serve-b8", requests=requests_frame([0.0006] * 60, gaps=0.001))
    run.meta.checks = [evaluate_rule(run, "latency_p99 < 50 ms").to_dict()]
    path = tmp_path / "pipeline.yaml"
    export_pipeline(run, path, "serve")
    line = next(line for line in path.read_text().splitlines() if "latency_p99 < 50 ms" in line)
    assert "serve-b8: pass" in line and re.search(r"\(6\d\d µs\)", line), line  # never seconds beside ms
    assert fmt_change(-0.0004) == "+0 %" and fmt_change(-0.00004, 1) == "+0.0 %"  # never "-0 %"


def test_tune_docs_figures_are_the_bounds_a_test_holds_the_search_to():
    """docs/tune.md's data-wait figures for the quickstart are tests/test_tune_kernel.py's bounds,
    never typed by hand."""
    from pathlib import Path

    from tests.test_tune_kernel import BASELINE_WAIT_OVER, TUNED_WAIT_UNDER

    text = " ".join((Path(__file__).resolve().parent.parent / "docs" / "tune.md").read_text().split())
    said = (f"falls from over {100 * BASELINE_WAIT_OVER:.0f} % to under {100 * TUNED_WAIT_UNDER:.0f} % of each step "
            "with a busy process per core")
    assert said in text and "about 55 %" not in text


def test_the_tune_estimate_is_the_time_of_the_steps_a_trial_runs(store_dir):
    """Issue 36: "6 x about 1.2 s" (steps x the earlier run's median step) when trials took 2.3 s:
    a trial's first steps are its slowest (workers start, compilation)."""
    from gpuprof_jupyter.core.store.directory import Store
    from gpuprof_jupyter.runtime.tune.driver import earlier_run, trial_estimate
    from gpuprof_jupyter.runtime.tune.search import TrialPlan

    slow, fast = steps_frame(5, 5.0, 0.9), steps_frame(35, 3.5, 0.1, start=5.0)  # 1 s, then 0.1 s steps
    run = sim_experiment("input-bound", seconds=8.6, name="first", steps=pd.concat([slow, fast], ignore_index=True))
    run.meta.context["cell_source"] = "train(loader)"
    store = Store(store_dir)
    summary_of(run)
    store.create(run.meta)
    store.save_steps(run.meta, pa.Table.from_pandas(run.steps, preserve_index=False))
    store.save_meta(run.meta)
    seconds, name = trial_estimate(earlier_run(store, "train(loader)"), TrialPlan(5, 15))
    assert seconds == pytest.approx(6.0) and name == "'first'"  # 5 x 1 s + 10 x 0.1 s, not 15 x 0.1 s
    assert trial_estimate(earlier_run(store, "train(loader)"), TrialPlan(5, 60)) is None  # it never ran 60


def test_the_overlay_of_host_only_runs_says_no_data_instead_of_empty_frames():
    from gpuprof_jupyter.render.overlay_plots import overlay_figures

    figs = overlay_figures([host_experiment(name="a"), host_experiment(name="b")])
    assert [f.title.text for f in figs] == ["sm_util, aligned at start: no data (no run here read a GPU)",
                                            "power (all GPUs), aligned at start: no data (no run here read a GPU)"]
    drawn = overlay_figures([sim_experiment("compute-bound")])
    assert not any("no data" in f.title.text for f in drawn)


@pytest.mark.parametrize("frames, cause", [
    ({0: (20, 3.0, 0.0), 1: (20, 3.0, 0.8)}, "data"),  # rank 1 waits for its data
    ({0: (20, 3.0, 0.0), 1: (10, 3.0, 0.0)}, "compute"),  # rank 1 twice slower, not in lockstep
])
def test_a_cpu_straggler_rank_gets_host_advice_only(frames, cause):
    """Two gloo ranks on CPU (torchrun, --source host): the straggler's advice names no GPU."""
    steps = pd.concat([steps_frame(n, s, w).assign(rank=r) for r, (n, s, w) in frames.items()], ignore_index=True)
    run = host_experiment(seconds=6.0, steps=steps)
    run.meta.context["ranks"] = {str(r): {"device": "cpu", "local_rank": r, "world_size": 2, "ended": "ok"}
                                 for r in frames}
    finding = next(f for f in diagnose(run) if f.id == "straggler-rank")
    assert finding.numbers["cause"] == cause
    assert not any(word in _text(finding) for word in (*GPU_WORDS, "GPU (", "throttling")), _text(finding)
