"""``--tune`` (issue 21): what a trial costs beyond its own steps, and the state snapshot.

* Overhead per trial: a loop of fixed-length steps (a sleep, as a GPU step waits) is tuned
  through ``gpuprof_jupyter.tune`` with the sampler process on a fake GPU; for each trial, its
  wall time minus the time its steps took (warm-up included) is what tuning adds: session
  start and stop (Parquet, summary), measuring, and restoring the user's state. Target
  <= 0.5 s a trial.
* Snapshot and restore of a model of ``PARAMS`` parameters with its SGD momentum state, on
  the CPU (reported, no target: it grows with the model).
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time

from ._common import figure, run_json_subprocess, save

NAME = "tune"
STEP_S = 0.01
PARAMS = {"tiny": 1_000_000, "quick": 100_000_000, "full": 100_000_000}
TRIAL_STEPS = {"tiny": 10, "quick": 20, "full": 20}  # 10: the fewest that give an interval


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


def _snapshot(params: int) -> dict:
    """Seconds to snapshot and to restore a ``params``-parameter model and its optimizer state."""
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
    t0 = time.perf_counter()
    snap = Snapshot(ns)
    t1 = time.perf_counter()
    snap.restore()
    t2 = time.perf_counter()
    return {"params": sum(p.numel() for p in model.parameters()), "snapshot_s": t1 - t0, "restore_s": t2 - t1,
            "bytes": snap.size_bytes()}


def run(mode: str = "quick") -> dict:
    over = run_json_subprocess("import json; from benchmarks.bench_tune import _overhead; "
                               f"print(json.dumps(_overhead({TRIAL_STEPS[mode]})))", timeout=600)
    snap = run_json_subprocess("import json; from benchmarks.bench_tune import _snapshot; "
                               f"print(json.dumps(_snapshot({PARAMS[mode]})))", timeout=600)
    figures = [
        figure("trial_overhead_s", "--tune: a trial's wall time beyond its own steps (start, stop, measure, restore; "
               "median, 1 fake GPU)", round(over["overhead_s"], 3), "s", "<= 0.5 s", 0.5, gated=True,
               note=f"{over['trials']} trials of {TRIAL_STEPS[mode]} steady steps of {STEP_S * 1e3:.0f} ms; "
                    "per trial: " + ", ".join(f"{s:.2f}" for s in over["per_trial_s"])),
        figure("snapshot_s", f"--tune: snapshot of a {snap['params'] / 1e6:.0f}M-parameter model + SGD momentum (CPU)",
               round(snap["snapshot_s"], 3), "s", note=f"{snap['bytes'] / 2**20:.0f} MiB of parameters copied"),
        figure("restore_s", "--tune: restoring it after a trial (bitwise, in place)", round(snap["restore_s"], 3), "s"),
    ]
    data = {"figures": figures, "overhead": over, "snapshot": snap}
    save(NAME, data, mode)
    return data


if __name__ == "__main__":
    import sys

    print(json.dumps(run(sys.argv[1] if len(sys.argv) > 1 else "quick")["figures"], indent=1))
