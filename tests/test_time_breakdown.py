"""Issue 41 part 4: where the time of a traced window went, per rank (HTA's definitions on GPU
windows, checked on synthetic Kineto traces; the CPU-side breakdown on CPU-only windows)."""

from __future__ import annotations

import pytest

from gpuprof_jupyter.core.analysis.time_breakdown import (cpu_breakdown, dominant_waste, experiment_breakdowns,
                                                          gpu_breakdown, kernel_type, window_breakdown)


def _gpu(cat, name, ts, dur, stream, corr):
    return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur,
            "args": {"stream": stream, "correlation": corr, "device": 0}}


def _launch(ts, corr, name="cudaLaunchKernel"):
    return {"ph": "X", "cat": "cuda_runtime", "name": name, "pid": 100, "tid": 100, "ts": ts, "dur": 2,
            "args": {"correlation": corr}}


def _kineto(events, rank=None):
    trace = {"schemaVersion": 1, "baseTimeNanoseconds": 1_700_000_000_000_000_000, "traceEvents": events}
    if rank is not None:
        trace["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": 2}
    return trace


@pytest.mark.parametrize("event, kind", [
    ({"cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL"}, "communication"),
    ({"cat": "kernel", "name": "ncclKernel_AllGather_RING_LL_Sum_int8_t"}, "communication"),
    ({"cat": "kernel", "name": "gloo:all_reduce"}, "communication"),
    ({"cat": "gpu_memcpy", "name": "Memcpy HtoD (Pageable -> Device)"}, "memory"),
    ({"cat": "gpu_memset", "name": "Memset (Device)"}, "memory"),
    ({"cat": "kernel", "name": "ampere_sgemm_128x64_nn"}, "computation"),
    ({"cat": "kernel", "name": "void at::native::vectorized_elementwise_kernel<4>"}, "computation"),
])
def test_kernel_types_follow_hta(event, kind):
    assert kernel_type(event) == kind


def test_gpu_window_compute_communication_memory_idle_and_overlap():
    trace = _kineto([
        _launch(-5, 1), _gpu("kernel", "ampere_sgemm_128x64_nn", 0, 40, 7, 1),
        _launch(0, 2), _gpu("kernel", "ncclDevKernel_AllReduce_Sum_f32_RING_LL", 30, 30, 20, 2),
        _launch(50, 3, "cudaMemcpyAsync"), _gpu("gpu_memcpy", "Memcpy HtoD (Pageable -> Device)", 60, 10, 7, 3),
        _gpu("gpu_memset", "Memset (Device)", 62, 3, 30, 5),
        _launch(65, 4), _gpu("kernel", "void at::native::vectorized_elementwise_kernel<4>", 90, 10, 7, 4),
    ])
    b = gpu_breakdown(trace)
    assert b["kind"] == "gpu" and b["span_us"] == 100
    # busy [0, 70] and [90, 100]; compute [0, 40] and [90, 100]; NCCL [30, 60], 10 us under the sgemm
    assert (b["compute"], b["communication"], b["memory"], b["idle"]) == pytest.approx((0.5, 0.2, 0.1, 0.2))
    assert b["non_compute"] == pytest.approx(0.3)  # HTA's non-compute time: exposed communication + memory
    assert b["overlap"] == pytest.approx(10 / 30)  # HTA's comp/comm overlap: of the communication time
    # stream 7: gap 40->60, the memcpy launched at 50 after the sgemm ended (host wait); gap 70->90,
    # the kernel launched at 65, before the memcpy ended, and longer than 30 ns (other)
    causes = b["idle_causes"]
    assert (causes["host_wait"], causes["kernel_wait"], causes["other"]) == pytest.approx((0.5, 0.0, 0.5))


def test_gaps_under_30_ns_are_kernel_wait():
    trace = _kineto([_launch(0, 1), _gpu("kernel", "k1", 10, 5, 7, 1), _launch(1, 2), _gpu("kernel", "k2", 15.02, 5, 7, 2)])
    assert gpu_breakdown(trace)["idle_causes"]["kernel_wait"] == pytest.approx(1.0)


def test_no_gpu_event_means_no_gpu_breakdown():
    assert gpu_breakdown(_kineto([{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 0,
                                   "dur": 5}])) is None


def _cpu(cat, name, ts, dur, tid=1):
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur}


def test_cpu_window_ops_collectives_data_wait_and_idle():
    trace = _kineto([
        _cpu("user_annotation", "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 0, 20),
        _cpu("cpu_op", "aten::stack", 5, 5),  # collating a batch: waiting for data
        _cpu("cpu_op", "c10d::allreduce_", 30, 5),
        _cpu("user_annotation", "gloo:all_reduce", 30, 20, tid=2),
        _cpu("cpu_op", "aten::mm", 55, 20),
    ])
    b = cpu_breakdown(trace, (0.0, 100.0))
    assert b["kind"] == "cpu"
    assert (b["data_wait"], b["collectives"], b["ops"], b["idle"]) == pytest.approx((0.2, 0.2, 0.2, 0.4))
    assert dominant_waste(b) == ("idle", pytest.approx(0.4))
    assert window_breakdown(trace, {})["kind"] == "cpu"  # no GPU event: the CPU side, and it says so


def test_dominant_waste_only_when_idle_or_communication_leads():
    assert dominant_waste({"kind": "gpu", "compute": 0.3, "communication": 0.45, "memory": 0.05, "idle": 0.2}) == \
        ("communication", 0.45)
    assert dominant_waste({"kind": "gpu", "compute": 0.5, "communication": 0.1, "memory": 0.0, "idle": 0.4}) is None
    assert dominant_waste({"kind": "gpu", "compute": 0.3, "communication": 0.3, "memory": 0.1, "idle": 0.3}) is None


def test_a_real_cpu_trace_of_a_dataloader_loop(tmp_path):
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile

    model = torch.nn.Linear(32, 32)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(256, 32)), batch_size=8)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for (x,) in loader:
            model(x).sum().backward()
    import json

    prof.export_chrome_trace(str(tmp_path / "trace.json"))
    trace = json.loads((tmp_path / "trace.json").read_text())
    b = window_breakdown(trace, {})
    assert b["kind"] == "cpu" and b["data_wait"] > 0 and b["ops"] > 0
    assert b["data_wait"] + b["collectives"] + b["ops"] + b["idle"] == pytest.approx(1.0)


def _two_rank_experiment():
    from tests.simexp import sim_experiment, steps_frame

    exp = sim_experiment(seconds=5, steps=steps_frame(10, 5.0, 0.1))
    rank0 = _kineto([_launch(0, 1), _gpu("kernel", "sgemm", 0, 90, 7, 1), _launch(1, 2),
                     _gpu("kernel", "ncclDevKernel_AllReduce", 90, 10, 20, 2)], rank=0)
    rank1 = _kineto([_launch(0, 1), _gpu("kernel", "sgemm", 0, 30, 7, 1), _launch(1, 2),
                     _gpu("kernel", "ncclDevKernel_AllReduce", 30, 70, 20, 2)], rank=1)
    exp.meta.trace = {"spec": "steps=3:5", "status": "complete", "file": "trace.json.gz", "wall0": 0.0,
                      "activities": ["cpu", "cuda"],
                      "ranks": {"0": {"file": "trace.json.gz"}, "1": {"file": "trace-rank1.json.gz"}}}

    class Loader:  # the store's reader: the two ranks' traces, no serving requests
        def trace(self, name=None):
            return rank1 if name == "trace-rank1.json.gz" else rank0

        def request_columns(self):
            from gpuprof_jupyter.core.store.experiment import _empty_requests

            return _empty_requests()

    exp._loader = Loader()
    exp.meta.summary = {}
    return exp


def test_every_rank_of_a_two_rank_gpu_window():
    exp = _two_rank_experiment()
    (window,) = experiment_breakdowns(exp)
    rows = {r["rank"]: r for r in window["ranks"]}
    assert rows[0]["communication"] == pytest.approx(0.1) and rows[1]["communication"] == pytest.approx(0.7)
    assert dominant_waste(rows[1]) == ("communication", pytest.approx(0.7)) and dominant_waste(rows[0]) is None


def test_the_breakdown_is_in_the_summary_the_findings_and_beside_the_window():
    from gpuprof_jupyter.core.analysis.diagnosis import diagnose
    from gpuprof_jupyter.core.analysis.summary import summary_of
    from gpuprof_jupyter.render.trace_html import trace_html, trace_text

    exp = _two_rank_experiment()
    assert [r["rank"] for r in summary_of(exp)["trace"]["breakdowns"][0]["ranks"]] == [0, 1]
    finding = next(f for f in diagnose(exp) if f.id == "trace-window-communication")
    assert "rank 1" in finding.evidence and "70 %" in finding.evidence
    text = "\n".join(trace_text(exp))
    assert "Holistic Trace Analysis" in text and "communication (not hidden): 70 %" in text
    assert "data-kind='gpu'" in trace_html(exp)


def test_a_cpu_window_says_it_is_cpu_only_and_its_idle_finding():
    from gpuprof_jupyter.core.analysis.diagnosis import diagnose
    from gpuprof_jupyter.render.trace_html import trace_text
    from tests.simexp import sim_experiment, steps_frame

    exp = sim_experiment(seconds=5, steps=steps_frame(10, 5.0, 0.1))
    trace = _kineto([_cpu("cpu_op", "aten::mm", 0, 10), _cpu("cpu_op", "aten::mm", 90, 10)])
    exp.meta.trace = {"spec": "steps=1:3", "status": "complete", "file": "trace.json.gz", "activities": ["cpu"]}
    exp._trace, exp.meta.summary = trace, {}
    text = "\n".join(trace_text(exp))
    assert "CPU activities only" in text and "idle (no op): 80 %" in text
    assert any(f.id == "trace-window-idle" and "80 %" in f.evidence for f in diagnose(exp))
