"""Per-sample cost measurements shared by bench_sampler_cost and bench_side_by_side.

Run inside a fresh interpreter per device count (pynvml and nvitop keep module state).
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter

from ._common import fake_nvml


def capture_nvml_calls(sample) -> list:
    """Run ``sample()`` once and return the (C function, args) pairs it made through pynvml.

    Wraps the entries of pynvml's function-pointer cache (filled by a warm-up), so what is
    recorded is exactly what the fake library was asked, arguments included.
    """
    import pynvml

    cache = pynvml._nvmlGetFunctionPointer_cache
    saved = dict(cache)
    log: list = []

    def wrap(fn):
        def recorded(*args):
            log.append((fn, args))
            return fn(*args)

        recorded.__name__ = getattr(fn, "__name__", "c_function")
        return recorded

    for name, fn in saved.items():
        cache[name] = wrap(fn)
    try:
        sample()
    finally:
        cache.clear()
        cache.update(saved)
    return log


def replay_cost_s(log: list, repeat: int) -> float:
    """CPU seconds per replay of the recorded calls: the fake's own cost ("inside C")."""
    t = time.thread_time()
    for _ in range(repeat):
        for fn, args in log:
            fn(*args)
    return (time.thread_time() - t) / repeat


def cpu_per_call_s(fn, repeat: int) -> float:
    fn()
    t = time.thread_time()
    for _ in range(repeat):
        fn()
    return (time.thread_time() - t) / repeat


def paired_python_cost(sample, log: list, repeat: int, rounds: int = 15) -> tuple[float, float, float]:
    """(total, fake, python) CPU seconds per sample: medians over rounds that alternate a
    block of ``sample()`` calls with a block of replays of its recorded NVML calls, so that
    the shared machine's noise hits both sides of each difference alike."""
    import statistics

    totals, fakes, diffs = [], [], []
    for _ in range(rounds):
        total = cpu_per_call_s(sample, repeat)
        fake = replay_cost_s(log, repeat)
        totals.append(total)
        fakes.append(fake)
        diffs.append(total - fake)
    return statistics.median(totals), statistics.median(fakes), statistics.median(diffs)


def best_of(fn, repeat: int, rounds: int = 9) -> float:
    """Lowest of ``rounds`` averages: the shared machine only ever adds time."""
    return min(cpu_per_call_s(fn, repeat) for _ in range(rounds))


def measure_ours(n_gpus: int, kind: str, repeat: int) -> dict:
    """Python CPU per sample of our sources (and the recorder) on a zero-latency fake."""
    from gpuprof_jupyter.metrics import METRICS
    from gpuprof_jupyter.recording import Recorder
    from gpuprof_jupyter.sampler import Sampler
    from gpuprof_jupyter.sources.host import HostSource
    from gpuprof_jupyter.sources.nvml import NvmlSource

    out: dict = {"n_gpus": n_gpus, "kind": kind}
    fake = fake_nvml(n_gpus, kind, realistic=False, record_calls=False)
    with fake:
        nvml = NvmlSource()
        nvml.open()
        try:
            nvml.read()
            log = capture_nvml_calls(nvml.read)
            total, inside, python = paired_python_cost(nvml.read, log, repeat)
            out["nvml"] = {
                "cpu_us_total": total * 1e6,
                "cpu_us_fake_nvml": inside * 1e6,
                "cpu_us_python": python * 1e6,
                "nvml_calls_per_sample": len(log),
                "calls": dict(Counter(getattr(fn, "__name__", "?") for fn, _ in log)),
            }
            # A clock stepped 0.1 s a read, as at 10 Hz: every 10th read is a slow one (RSS, disk,
            # whole-host CPU), so the average is the real per-sample cost at the default rate.
            ten_hz = [0.0]
            host = HostSource(clock=lambda: ten_hz[0])
            host.open()

            def host_read_at_10hz():
                ten_hz[0] += 0.1
                host.read()

            host_read_at_10hz()
            out["host"] = {"cpu_us_total": best_of(host_read_at_10hz, max(repeat // 4, 20) // 10 * 10 or 10) * 1e6,
                           "processes": len(host._procs)}
            sampler = Sampler([nvml, host], lambda tick: None)
            tick = sampler.sample_once()
            metrics = [m for m in METRICS if any(m in v for v in tick.reading.values())]
            recorder = Recorder(time.monotonic(), metrics, writer=None, flush_every_s=1e9)
            out["recorder"] = {"cpu_us_total": best_of(lambda: recorder.on_tick(tick), repeat) * 1e6,
                               "rows_per_tick": len(tick.reading)}
            host.close()
        finally:
            nvml.close()
    py = out["nvml"]["cpu_us_python"] + out["host"]["cpu_us_total"] + out["recorder"]["cpu_us_total"]
    out["sample_cpu_us_python"] = py  # everything the sampler thread spends per tick outside NVML
    return out


def fast_lane_check(n_gpus: int, kind: str, seconds: float) -> dict:
    """Run a 10 Hz sampler on a fake with realistic latencies: blocking calls from its thread?"""
    from gpuprof_jupyter.sampler import Sampler
    from gpuprof_jupyter.sources.nvml import NvmlSource

    fake = fake_nvml(n_gpus, kind, realistic=True, record_calls=True)
    durations: list[float] = []
    with fake:
        nvml = NvmlSource()
        nvml.open()

        class Timed:
            name = "nvml"

            def read(self):
                t = time.perf_counter()
                try:
                    return nvml.read()
                finally:
                    durations.append(time.perf_counter() - t)

        sampler = Sampler([Timed()], lambda tick: None, 0.1)
        sampler.start()
        time.sleep(0.2)
        ident = sampler._thread.ident
        time.sleep(seconds)
        sampler.stop()
        slow = set(n for n, v in fake.latency.items() if v >= 1e-3)
        in_fast = {name: fake.count(name, thread=ident) for name in slow}
        anywhere = {name: fake.count(name) for name in slow}
        nvml.close()
    durations.sort()
    return {
        "n_gpus": n_gpus, "kind": kind, "reads": len(durations),
        "blocking_calls_in_fast_lane": sum(in_fast.values()),
        "blocking_calls_elsewhere": sum(anywhere.values()) - sum(in_fast.values()),
        "read_ms_p50": durations[len(durations) // 2] * 1e3 if durations else None,
        "read_ms_max": durations[-1] * 1e3 if durations else None,
    }


def measure_nvitop(n_gpus: int, kind: str, repeat: int) -> dict:
    """nvitop's ResourceMetricCollector.take_snapshots() on the same zero-latency fake."""
    import logging

    logging.disable(logging.CRITICAL)
    from nvitop import Device, ResourceMetricCollector

    fake = fake_nvml(n_gpus, kind, realistic=False, record_calls=False)
    with fake:
        collector = ResourceMetricCollector(devices=Device.all(), root_pids={os.getpid()}, interval=1.0)
        collector.take_snapshots()
        collector.take_snapshots()
        log = capture_nvml_calls(collector.take_snapshots)
        total, inside, python = paired_python_cost(collector.take_snapshots, log, max(repeat // 10, 10), rounds=7)
        names = Counter(getattr(fn, "__name__", "?") for fn, _ in log)
    return {"n_gpus": n_gpus, "kind": kind, "cpu_us_total": total * 1e6, "cpu_us_fake_nvml": inside * 1e6,
            "cpu_us_python": python * 1e6, "nvml_calls_per_sample": len(log),
            "calls": dict(names), "devices_seen": n_gpus}


def worker(what: str, n_gpus: int, kind: str, repeat: int, seconds: float = 2.0) -> dict:
    threading.current_thread().name = "bench-worker"
    if what == "ours":
        return measure_ours(n_gpus, kind, repeat)
    if what == "fast_lane":
        return fast_lane_check(n_gpus, kind, seconds)
    if what == "nvitop":
        return measure_nvitop(n_gpus, kind, repeat)
    if what == "both":
        return {"ours": measure_ours(n_gpus, kind, repeat), "nvitop": measure_nvitop(n_gpus, kind, repeat)}
    raise ValueError(what)
