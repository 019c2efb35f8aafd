"""Per-sample cost measurements for bench_sampler_cost.

Run inside a fresh interpreter per device count (pynvml and nvitop keep module state).
"""

from __future__ import annotations

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


def python_speed_us() -> float:
    """sum(range(1000)) in microseconds (best of 5): how fast this CPU runs Python right now,
    about 8-10 us on an idle modern core; a shared machine reads several times that."""
    import timeit

    return min(timeit.repeat("sum(range(1000))", number=2000, repeat=5)) / 2000 * 1e6


def best_of(fn, repeat: int, rounds: int = 9) -> float:
    """Lowest of ``rounds`` averages: the shared machine only ever adds time."""
    return min(cpu_per_call_s(fn, repeat) for _ in range(rounds))


def measure_ours(n_gpus: int, kind: str, repeat: int) -> dict:
    """Python CPU per sample of our sources (and the recorder) on a zero-latency fake."""
    from gpuprof_jupyter.core.metrics import METRICS
    from gpuprof_jupyter.sampler_process.recorder import Recorder
    from gpuprof_jupyter.sampler_process.sampler import Sampler
    from gpuprof_jupyter.core.sources.host import HostSource
    from gpuprof_jupyter.core.sources.nvml import NvmlSource

    out: dict = {"n_gpus": n_gpus, "kind": kind}
    fake = fake_nvml(n_gpus, kind, realistic=False, record_calls=False)
    with fake:
        nvml = NvmlSource()
        nvml.open()
        try:
            nvml.read()
            log = capture_nvml_calls(nvml.read)
            speed = python_speed_us()
            total, inside, python = paired_python_cost(nvml.read, log, repeat)
            out["python_speed_us"] = (speed + python_speed_us()) / 2  # this worker's CPU, around the measurement
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
    from gpuprof_jupyter.sampler_process.sampler import Sampler
    from gpuprof_jupyter.core.sources.nvml import NvmlSource

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


# The metrics every side of the like-for-like comparison reads per GPU: what our fast lane reads
# on a GPU without GPM (PCIe throughput is the slow lane's, left out everywhere).
SAME_METRICS = ("gpu_busy", "mem_bw_util", "gpu_mem_used_bytes", "gpu_mem_total_bytes", "power_w",
                "energy_j", "gpu_temp_c", "sm_clock_mhz", "mem_clock_mhz", "throttle_reasons")


def _python_cost(sample, repeat: int) -> dict:
    """CPU per sample of ``sample()`` with and without the fake NVML's own Python."""
    sample()
    log = capture_nvml_calls(sample)
    total, inside, python = paired_python_cost(sample, log, repeat)
    return {"cpu_us_total": total * 1e6, "cpu_us_fake_nvml": inside * 1e6, "cpu_us_python": python * 1e6,
            "nvml_calls_per_sample": len(log),
            "calls": dict(Counter(getattr(fn, "__name__", "?") for fn, _ in log))}


def raw_public_sampler(handles: list):
    """The same metrics through nvidia-ml-py's public functions, nothing else: a floor."""
    import pynvml

    fields = [pynvml.NVML_FI_DEV_POWER_INSTANT, pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION]

    def sample() -> dict:
        out = {}
        for i, h in enumerate(handles):
            util = pynvml.nvmlDeviceGetUtilizationRates(h)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            power, energy = pynvml.nvmlDeviceGetFieldValues(h, fields)
            out[f"gpu{i}"] = {
                "gpu_busy": float(util.gpu), "mem_bw_util": float(util.memory),
                "gpu_mem_used_bytes": float(mem.used), "gpu_mem_total_bytes": float(mem.total),
                "power_w": power.value.uiVal / 1000.0, "energy_j": float(energy.value.ullVal),
                "gpu_temp_c": float(pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)),
                "sm_clock_mhz": float(pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)),
                "mem_clock_mhz": float(pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM)),
                "throttle_reasons": float(pynvml.nvmlDeviceGetCurrentClocksEventReasons(h)),
            }
        return out

    return sample


def nvitop_device_sampler(devices: list):
    """The same metrics through nvitop's ``Device`` API, used as its docs advise: inside
    ``oneshot()`` (memoises utilization, memory, clocks and power for the block). Its Device
    has no energy counter and no clock-event reasons: those two go through nvitop's own
    ``libnvml.nvmlQuery``. Power is ``nvmlDeviceGetPowerUsage`` (nvitop has no instant power)."""
    from nvitop.api import libnvml

    def sample() -> dict:
        out = {}
        for i, d in enumerate(devices):
            with d.oneshot():
                out[f"gpu{i}"] = {
                    "gpu_busy": float(d.gpu_utilization()), "mem_bw_util": float(d.memory_utilization()),
                    "gpu_mem_used_bytes": float(d.memory_used()), "gpu_mem_total_bytes": float(d.memory_total()),
                    "power_w": d.power_usage() / 1000.0,
                    "energy_j": float(libnvml.nvmlQuery("nvmlDeviceGetTotalEnergyConsumption", d.handle)),
                    "gpu_temp_c": float(d.temperature()),
                    "sm_clock_mhz": float(d.sm_clock()), "mem_clock_mhz": float(d.memory_clock()),
                    "throttle_reasons": float(libnvml.nvmlQuery("nvmlDeviceGetCurrentClocksEventReasons", d.handle)),
                }
        return out

    return sample


def like_for_like(n_gpus: int, kind: str, repeat: int) -> dict:
    """CPU per sample of the same metrics, same fake, same process: our NvmlSource.read(),
    nvitop's Device API, raw public pynvml."""
    import logging

    import pynvml

    logging.disable(logging.CRITICAL)
    from nvitop import Device

    from gpuprof_jupyter.core.sources.nvml import NvmlSource

    fake = fake_nvml(n_gpus, kind, realistic=False, record_calls=False)
    out: dict = {"n_gpus": n_gpus, "kind": kind, "metrics": list(SAME_METRICS)}
    with fake:
        nvml = NvmlSource(slow_interval_s=3600)
        nvml.open()
        try:
            out["ours"] = _python_cost(nvml.read, repeat)
            got = nvml.read()
        finally:
            nvml.close()
        pynvml.nvmlInit()
        try:
            raw = raw_public_sampler([pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(n_gpus)])
            out["raw_pynvml"] = _python_cost(raw, repeat)
            theirs = nvitop_device_sampler(Device.all())
            out["nvitop_device"] = _python_cost(theirs, max(repeat // 4, 10))
            # the same metrics on every side (values differ where APIs differ: power average vs instant)
            for name, sample in (("raw_pynvml", raw), ("nvitop_device", theirs)):
                have = sample()["gpu0"]
                assert set(SAME_METRICS) <= set(have) and set(SAME_METRICS) <= set(got["gpu0"]), (name, have)
        finally:
            pynvml.nvmlShutdown()
    return out


def worker(what: str, n_gpus: int, kind: str, repeat: int, seconds: float = 2.0) -> dict:
    threading.current_thread().name = "bench-worker"
    if what == "ours":
        return measure_ours(n_gpus, kind, repeat)
    if what == "fast_lane":
        return fast_lane_check(n_gpus, kind, seconds)
    if what == "like_for_like":
        return like_for_like(n_gpus, kind, repeat)
    raise ValueError(what)
