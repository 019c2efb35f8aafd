"""What limits a serving run: host-bound gaps, warm-up, stalls (and what coincided), a flat throughput."""

from __future__ import annotations

import gc
import time

import numpy as np
import torch

from gpuprof_jupyter.core.analysis.diagnosis import diagnose
from gpuprof_jupyter.runtime.hooks.activity import ActivityLog
from gpuprof_jupyter.runtime.hooks.torch_hooks import TrainingHooks
from tests.simexp import requests_frame, sim_experiment


def _ids(experiment) -> dict:
    return {f.id: f for f in diagnose(experiment)}


def _serving(requests, scenario="compute-bound", seconds=None):
    span = float((requests["t_start_s"] + requests["latency_s"]).max())
    return sim_experiment(scenario, seconds=seconds or max(2.0, span + 0.2), requests=requests)


def test_gaps_between_requests_are_host_bound_serving_and_no_training_advice():
    exp = _serving(requests_frame([0.005] * 200, gaps=0.010))
    found = _ids(exp)
    f = found["serving-host-bound"]
    assert f.severity == "high" and f.numbers["idle_between_frac"] > 0.6
    assert "time between requests was 67 %" in f.evidence and "CUDA graphs or torch.compile" in f.next_step
    assert "gpu-underused" not in found and "input-bound" not in found  # not "no training steps were found"
    assert "serving-host-bound" not in _ids(_serving(requests_frame([0.010] * 200, gaps=0.0005)))


def test_a_first_request_that_dominates_is_warm_up():
    exp = _serving(requests_frame([2.0] + [0.01] * 100, gaps=0.001))
    f = _ids(exp)["serving-warm-up"]
    assert f.severity == "medium" and f.numbers["first_over_p50"] > 100
    assert "the first 1 request(s) took 2.0 s" in f.evidence and "warm the model up" in f.next_step
    assert "serving-warm-up" not in _ids(_serving(requests_frame([0.012] + [0.01] * 100, gaps=0.001)))


def _stalled(column: str):
    latencies = np.full(100, 0.01)
    latencies[[20, 50, 80]] = 0.10
    requests = requests_frame(latencies, gaps=0.001)
    requests.loc[[20, 50, 80], column] = 0.085
    return _serving(requests)


def test_p99_far_above_p50_is_a_stall_naming_the_garbage_collector():
    f = _ids(_stalled("gc_s"))["latency-stall"]
    assert f.numbers["causes"] == ["gc"] and "garbage collection took 255.00 ms inside them" in f.evidence
    assert "gc.freeze()" in f.next_step


def test_a_stall_naming_data_waits():
    f = _ids(_stalled("wait_s"))["latency-stall"]
    assert f.numbers["causes"] == ["data"] and "data waits took" in f.evidence and "prefetch" in f.next_step


def test_a_stall_with_nothing_recorded_says_so():
    latencies = np.full(100, 0.01)
    latencies[[20, 50, 80]] = 0.10
    f = _ids(_serving(requests_frame(latencies, gaps=0.001)))["latency-stall"]
    assert f.numbers["causes"] == [] and "nothing recorded coincided" in f.evidence


def test_throughput_flat_as_the_batch_grows_is_compute_bound():
    small = requests_frame([0.010] * 60, gaps=0.001, batch=1)
    flat = requests_frame([0.075] * 60, gaps=0.001, batch=8, start=float(small["t_start_s"].max()) + 0.02)
    import pandas as pd

    f = _ids(_serving(pd.concat([small, flat], ignore_index=True)))["throughput-flat"]
    assert "batch 8 gives 106.7 samples/s against 100.0 samples/s at batch 1" in f.evidence
    assert "GPU is saturated (compute-bound)" in f.next_step
    scaling = requests_frame([0.020] * 60, gaps=0.001, batch=8, start=float(small["t_start_s"].max()) + 0.02)
    assert "throughput-flat" not in _ids(_serving(pd.concat([small, scaling], ignore_index=True)))


def test_garbage_collection_inside_a_request_is_attributed_to_it():
    # the youngest generation only: the hook sees every generation's collection alike, and a full
    # one of this process (torch, pandas loaded) costs the fast run 0.4 s each
    class Collecting(torch.nn.Module):
        def forward(self, x):
            gc.collect(0)
            return x * 2

    callbacks = list(gc.callbacks)
    activity = ActivityLog(time.monotonic())
    hooks = TrainingHooks(activity).install()
    assert len(gc.callbacks) == len(callbacks) + 1
    try:
        model = Collecting()
        with torch.no_grad():
            model(torch.ones(2))
        gc.collect(0)  # between requests: nobody's
        with torch.no_grad():
            model(torch.ones(2))
    finally:
        hooks.remove()
    done = activity.take_requests()
    assert len(done) == 2 and all(0 < r[6] <= r[2] for r in done)  # gc_s inside its host time
    assert gc.callbacks == callbacks  # the GC hook went with the others
