"""analysis.trace_summary over hand-made traces: self times, GPU time per operator, idle gaps."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from gpuprof_jupyter.core.analysis.trace_summary import (annotation_spans, gpu_idle, self_times, step_overhead,
                                                    summarize_trace, wall_time)


def op(name, ts, dur, tid=1, ext=None, cat="cpu_op"):
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur,
            "args": {"External id": ext} if ext is not None else {}}


def test_self_time_subtracts_direct_children_only():
    events = [op("outer", 0, 100), op("mid", 10, 50), op("leaf", 20, 10), op("other thread", 0, 100, tid=2)]
    assert self_times(events) == [50.0, 40.0, 10.0, 100.0]


def test_gpu_idle_between_kernels():
    kernels = [op("k", 0, 10, cat="kernel"), op("k", 30, 10, cat="kernel"), op("k", 35, 10, cat="kernel"),
               op("k", 60, 40, cat="kernel")]
    idle = gpu_idle(kernels, (0.0, 100.0))
    assert idle["share"] == pytest.approx(0.35)  # busy 0-10, 30-45, 60-100
    assert idle["gaps"] == 2 and idle["median_gap_us"] == pytest.approx(17.5)
    assert gpu_idle([], (0.0, 1.0)) is None


def cuda_trace():
    events = [op("aten::linear", 0, 100, ext=1), op("aten::addmm", 10, 80, ext=2), op("aten::relu", 100, 20, ext=3)]
    events += [op("sgemm", 20, 300, cat="kernel", ext=2), op("relu_kernel", 400, 50, cat="kernel", ext=3),
               op("relu_kernel", 500, 50, cat="kernel", ext=3)]
    return {"baseTimeNanoseconds": 1_700_000_000_000_000_000, "traceEvents": events}


def test_with_cuda_operators_rank_by_their_kernels_gpu_time():
    s = summarize_trace(cuda_trace(), {"activities": ["cpu", "cuda"], "steps": 2, "status": "complete"})
    assert s["operator_time"] == "cuda" and not s["cpu_only"]
    assert [r["name"] for r in s["operators"][:2]] == ["aten::addmm", "aten::relu"]
    assert s["operators"][0]["cuda_s"] == pytest.approx(300e-6)
    assert [r["name"] for r in s["kernels"]] == ["sgemm", "relu_kernel"]
    assert s["kernels"][1]["calls"] == 2 and s["kernels_per_step"] == 1.5
    assert s["gpu_idle"]["gaps"] == 2 and s["window_s"] == pytest.approx(550e-6)
    assert s["kernels"][0]["share"] == pytest.approx(300 / 550)


def test_cpu_only_ranks_by_cpu_self_time_and_says_so():
    trace = cuda_trace()
    trace["traceEvents"] = [e for e in trace["traceEvents"] if e["cat"] == "cpu_op"]
    s = summarize_trace(trace, {"activities": ["cpu"], "steps": 2})
    assert s["operator_time"] == "cpu" and s["cpu_only"]
    assert s["operators"][0]["name"] == "aten::addmm" and "cuda_s" not in s["operators"][0]
    assert s["kernels"] == [] and s["gpu_idle"] is None and math.isnan(s["kernels_per_step"])
    assert s["op_calls_per_step"] == 1.5


def test_annotation_spans_are_the_users_outermost_ranges_in_wall_time():
    base = 1_700_000_000_000_000_000
    trace = {"baseTimeNanoseconds": base, "traceEvents": [
        op("step 3", 1_000_000, 500_000, cat="user_annotation"),
        op("inner", 1_100_000, 10, cat="user_annotation"),
        op("Optimizer.step#SGD.step", 1_200_000, 10, cat="user_annotation"),
        op("step 4", 2_000_000, 500_000, cat="user_annotation")]}
    spans, left = annotation_spans(trace)
    assert [s[0] for s in spans] == ["step 3", "step 4"] and left == 0
    assert spans[0][1] == pytest.approx(1_700_000_001.0) and spans[0][2] == pytest.approx(1_700_000_001.5)
    assert wall_time(trace, 0) == 1_700_000_000.0
    assert annotation_spans(trace, limit=1)[1] == 1


def test_step_overhead_compares_inside_and_outside_the_window():
    steps = pd.DataFrame({"duration_s": [1.0, 1.0, 1.2, 3.0, 2.0, 1.0, 1.0]})
    out = step_overhead(steps, {"first_step": 3, "end_step": 5, "start_cost_s": 0.1})
    assert out["step_p50_in_s"] == 2.5 and out["step_p50_out_s"] == 1.0 and out["slowdown"] == 2.5
    assert out["start_cost_s"] == 0.1
    assert math.isnan(step_overhead(steps, {})["slowdown"])
