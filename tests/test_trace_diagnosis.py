"""Diagnosis from a --trace window: tiny kernels, host-bound launches, one dominating operator."""

from __future__ import annotations

from gpuprof_jupyter.core.analysis.diagnosis import diagnose
from tests.simexp import sim_experiment, steps_frame


def op(name, ts, dur, ext, cat="cpu_op"):
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 7 if cat != "cpu_op" else 1, "ts": ts, "dur": dur,
            "args": {"External id": ext}}


def traced(events, activities=("cpu", "cuda"), steps=2):
    exp = sim_experiment("compute-bound", seconds=4, steps=steps_frame(10, 4, wait_frac=0.0))
    exp.meta.trace = {"spec": "steps=3:5", "status": "complete", "activities": list(activities), "steps": steps,
                      "first_step": 3, "end_step": 5, "file": "trace.json.gz"}
    exp._trace = {"baseTimeNanoseconds": 0, "traceEvents": events}
    exp.meta.summary = {}
    return exp


def ids(exp):
    return [f.id for f in diagnose(exp)]


def test_many_tiny_kernels_with_gaps_point_to_cuda_graphs():
    events = [op("aten::add", 0, 4500, 1)]
    events += [op("add_kernel", 15 * i, 5, 1, cat="kernel") for i in range(300)]  # 5 us on, 10 us off
    finding = next(f for f in diagnose(traced(events)) if f.id == "trace-tiny-kernels")
    assert "150 kernels" in finding.evidence and "5 µs" in finding.evidence
    assert "CUDA graph" in finding.next_step and "torch.compile" in finding.next_step
    assert "trace-host-bound" not in ids(traced(events))


def test_long_gaps_between_real_kernels_are_host_bound():
    events = [op("aten::addmm", 0, 3000, 1), op("aten::_local_scalar_dense", 3000, 50, 2)]
    events += [op("sgemm", 300 * i, 100, 1, cat="kernel") for i in range(10)]  # 100 us on, 200 us off
    finding = next(f for f in diagnose(traced(events)) if f.id == "trace-host-bound")
    assert "no kernel" in finding.evidence and ".item()" in finding.next_step
    assert "trace-tiny-kernels" not in ids(traced(events))


def test_one_operator_dominating_on_a_cpu_only_trace():
    events = [op("aten::addmm", 0, 800, 1), op("aten::relu", 800, 100, 2), op("aten::sum", 900, 100, 3)]
    finding = next(f for f in diagnose(traced(events, activities=("cpu",))) if f.id == "trace-dominant-op")
    assert "aten::addmm took 80 %" in finding.evidence and "CPU self time (CPU activities only)" in finding.evidence
    assert "torch.autocast" in finding.next_step


def test_a_balanced_window_and_an_untraced_run_say_nothing():
    events = [op(f"aten::op{i}", 100 * i, 100, i) for i in range(5)]
    events += [op("k", 100 * i, 95, i, cat="kernel") for i in range(5)]
    trace_ids = {"trace-tiny-kernels", "trace-host-bound", "trace-dominant-op"}
    assert not trace_ids & set(ids(traced(events)))
    plain = sim_experiment("compute-bound", seconds=4, steps=steps_frame(10, 4, wait_frac=0.0))
    assert not trace_ids & set(ids(plain))
