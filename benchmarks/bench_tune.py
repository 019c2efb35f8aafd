"""``--tune`` (issue 21): what a trial costs beyond its own steps, and the state snapshot.

* Overhead per trial: a loop of fixed-length steps (a sleep, as a GPU step waits) is tuned
  through ``gpuprof_jupyter.tune`` with the sampler process on a fake GPU; for each trial, its
  wall time minus the time its steps took (warm-up included) is what tuning adds: session
  start and stop (Parquet, summary), measuring, and restoring the user's state. Target
  <= 0.5 s a trial.
* Snapshot and restore of a model of ``PARAMS`` parameters with its gradients and SGD
  momentum state, on the CPU, beside torch's own ``clone()`` and ``copy_()`` of the same
  tensors in the same process (alternated, ``ROUNDS`` each: the reference for what any copy
  of them costs on this machine), and the peak host memory each adds (the process's peak RSS,
  reset before each with ``/proc/self/clear_refs``). From the measured cost per byte, what a
  1 B-parameter model would cost, extrapolated (reported, no target: it grows with the model).
"""

from __future__ import annotations

import gc
import json
import statistics
import tempfile
import time

from ._common import figure, run_json_subprocess, save

NAME = "tune"
STEP_S = 0.01
PARAMS = {"tiny": 1_000_000, "quick": 100_000_000, "full": 100_000_000}
TRIAL_STEPS = {"tiny": 10, "quick": 20, "full": 20}  # 10: the fewest that give an interval
ROUNDS = {"tiny": 1, "quick": 3, "full": 5}  # snapshot and torch's copies, alternated
BILLION_BYTES = 12 * 10**9  # 1 B fp32 parameters + their gradients + SGD momentum: what a snapshot copies


def _overhead(trial_steps: int) -> dict:
    """Median tuning overhead per trial (s), with the sampler process on one fake GPU."""
    import os

    import torch

    import gpuprof_jupyter
    from gpuprof_jupyter.runtime.tune.measure import warmup_steps

    from ._common import fake_nvml_env

    os.environ.update(fake_nvml_env(1, "h100", realistic=True))
    model = torch.nn.Linear(16, 16)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    total = warmup_steps(trial_steps) + trial_steps + 5

    def train():
        for _ in range(total):
            time.sleep(STEP_S)
            opt.step()

    with tempfile.TemporaryDirectory() as store:
        gpuprof_jupyter.tune(train, store=store, trial_steps=trial_steps, budget="2min", source="nvml",
                             on_plan=lambda line: None)  # warm
        report = gpuprof_jupyter.tune(train, store=store, trial_steps=trial_steps, budget="2min", source="nvml",
                                      on_plan=lambda line: None)
    overheads = []
    for trial in report.result.trials:
        steps = trial.experiment.steps
        overheads.append(trial.wall_s - float(steps["duration_s"].sum()))
    return {"overhead_s": statistics.median(overheads), "per_trial_s": overheads, "trials": len(overheads)}


def _rss_kib(field: str) -> int:
    """``VmRSS`` (now) or ``VmHWM`` (the peak since the last reset) of this process, KiB."""
    with open("/proc/self/status", encoding="ascii") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def _reset_peak() -> bool:
    """Reset this process's peak RSS to its current one (Linux 4.0+); False where it cannot."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _timed_with_peak(*steps) -> tuple[list[float], int, bool]:
    """Each step's seconds, and the peak host memory (bytes) they added together over the RSS
    before them; whether the peak was reset first (else the process's peak so far bounds it)."""
    gc.collect()
    before, reset = _rss_kib("VmRSS"), _reset_peak()
    times, kept = [], []
    for step in steps:
        t = time.perf_counter()
        kept.append(step(kept[-1] if kept else None))
        times.append(time.perf_counter() - t)
    peak = _rss_kib("VmHWM")
    kept.clear()
    gc.collect()
    return times, max(0, peak - before) * 1024, reset


def _snapshot(params: int, rounds: int = 1) -> dict:
    """Snapshot and restore of a ``params``-parameter model with gradients and SGD momentum,
    beside torch's ``clone()`` then ``copy_()`` back of the same tensors, alternated ``rounds``
    times; medians, and the peak host memory each added."""
    import torch

    from gpuprof_jupyter.runtime.tune.state import Snapshot

    width = 4096
    layers = max(1, round(params / (width * width)))
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False) for _ in range(layers)]) if params >= width * width \
        else torch.nn.Linear(1000, params // 1000, bias=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()  # momentum buffers: optimizer state as large as the model
    ns = {"model": model, "opt": opt}
    tensors = list(Snapshot.tensors_to_copy([model, opt]))

    def torch_copy_back(copies):
        with torch.no_grad():
            for tensor, copy in zip(tensors, copies):
                tensor.copy_(copy)

    ours, theirs, size = [], [], 0
    for _ in range(rounds):
        (clone_s, copy_s), torch_peak, reset = _timed_with_peak(
            lambda _: [t.detach().clone() for t in tensors], torch_copy_back)
        theirs.append((clone_s, copy_s, torch_peak))
        (snapshot_s, restore_s), snap_peak, _ = _timed_with_peak(lambda _: Snapshot(ns), lambda snap: snap.restore())
        ours.append((snapshot_s, restore_s, snap_peak))
        size = sum(t.numel() * t.element_size() for t in tensors)
    med = [statistics.median(column) for column in zip(*ours)]
    ref = [statistics.median(column) for column in zip(*theirs)]
    return {"params": sum(p.numel() for p in model.parameters()), "bytes": size, "rounds": rounds,
            "snapshot_s": med[0], "restore_s": med[1], "peak_extra_bytes": med[2],
            "torch_clone_s": ref[0], "torch_copy_s": ref[1], "torch_peak_extra_bytes": ref[2],
            "peak_reset": reset, "runs": {"snapshot": ours, "torch": theirs}}


def run(mode: str = "quick") -> dict:
    over = run_json_subprocess("import json; from benchmarks.bench_tune import _overhead; "
                               f"print(json.dumps(_overhead({TRIAL_STEPS[mode]})))", timeout=600)
    snap = run_json_subprocess("import json; from benchmarks.bench_tune import _snapshot; "
                               f"print(json.dumps(_snapshot({PARAMS[mode]}, {ROUNDS[mode]})))", timeout=600)
    ours, theirs = snap["snapshot_s"] + snap["restore_s"], snap["torch_clone_s"] + snap["torch_copy_s"]
    per_byte = ours / snap["bytes"]
    mib, peak = snap["bytes"] / 2**20, "peak RSS reset before each" if snap["peak_reset"] else "peak RSS of the process"
    figures = [
        figure("trial_overhead_s", "--tune: a trial's wall time beyond its own steps (start, stop, measure, restore; "
               "median, 1 fake GPU)", round(over["overhead_s"], 3), "s", "<= 0.5 s", 0.5, gated=True,
               note=f"{over['trials']} trials of {TRIAL_STEPS[mode]} steady steps of {STEP_S * 1e3:.0f} ms; "
                    "per trial: " + ", ".join(f"{s:.2f}" for s in over["per_trial_s"])),
        figure("snapshot_s", f"--tune: snapshot of a {snap['params'] / 1e6:.0f}M-parameter model with gradients and "
               "SGD momentum (CPU)", round(snap["snapshot_s"], 3), "s",
               note=f"{mib:.0f} MiB copied; torch's clone() of the same tensors: {snap['torch_clone_s']:.3f} s "
                    f"(median of {snap['rounds']} alternated rounds)"),
        figure("restore_s", "--tune: restoring it after a trial (bitwise, in place)", round(snap["restore_s"], 3), "s",
               note=f"torch's copy_() of the same tensors back: {snap['torch_copy_s']:.3f} s"),
        figure("snapshot_vs_torch_x", "--tune: snapshot + restore over torch's clone() + copy_() of the same tensors",
               round(ours / theirs, 2) if theirs > 0 else None, "x"),
        figure("snapshot_peak_mib", "--tune: peak host memory the snapshot and its restore add",
               round(snap["peak_extra_bytes"] / 2**20), "MiB",
               note=f"{mib:.0f} MiB of tensors copied; torch's clone() + copy_(): "
                    f"{snap['torch_peak_extra_bytes'] / 2**20:.0f} MiB ({peak})"),
        figure("snapshot_1b_s", "--tune: snapshot + restore of a 1 B-parameter model with gradients and SGD momentum "
               "(CPU), extrapolated", round(per_byte * BILLION_BYTES, 1), "s",
               note=f"estimated, not measured: {per_byte * 2**30:.2f} s per GiB as measured here, times 11.2 GiB "
                    "(12 GB: fp32 parameters, gradients and momentum); it needs as much free host memory"),
    ]
    data = {"figures": figures, "overhead": over, "snapshot": snap}
    save(NAME, data, mode)
    return data


if __name__ == "__main__":
    import sys

    print(json.dumps(run(sys.argv[1] if len(sys.argv) > 1 else "quick")["figures"], indent=1))
