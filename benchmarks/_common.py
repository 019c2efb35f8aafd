"""Shared helpers: machine description, result files, figures with targets, fake NVML setup."""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results"

# Seconds slept per call by tests.fake_nvml.FakeNvml (a sleep releases the GIL like a real
# ctypes call into libnvidia-ml). Estimates for a datacenter GPU; benchmarks/gpu_check.py
# measures the real ones and writes a file that GPUPROF_BENCH_LATENCY=path makes us use.
# Linux sleeps at least ~50-60 us whatever is asked, so these err on the slow side.
REALISTIC_LATENCY: dict[str, float] = {
    "nvmlDeviceGetUtilizationRates": 30e-6,
    "nvmlDeviceGetMemoryInfo": 20e-6,
    "nvmlDeviceGetMemoryInfo_v2": 20e-6,
    "nvmlDeviceGetFieldValues": 60e-6,
    "nvmlDeviceGetPowerUsage": 20e-6,
    "nvmlDeviceGetTotalEnergyConsumption": 20e-6,
    "nvmlDeviceGetTemperature": 15e-6,
    "nvmlDeviceGetTemperatureV": 15e-6,
    "nvmlDeviceGetClockInfo": 15e-6,
    "nvmlDeviceGetCurrentClocksEventReasons": 15e-6,
    "nvmlDeviceGetCurrentClocksThrottleReasons": 15e-6,
    "nvmlGpmSampleGet": 150e-6,
    "nvmlGpmMigSampleGet": 150e-6,
    "nvmlGpmMetricsGet": 10e-6,
    "nvmlDeviceGetPcieThroughput": 20e-3,  # blocks ~20 ms a call (docs/metrics.md)
}
DEFAULT_LATENCY = 10e-6


def latency_table() -> dict[str, float]:
    """The realistic latencies, or those measured by gpu_check.py (GPUPROF_BENCH_LATENCY)."""
    path = os.environ.get("GPUPROF_BENCH_LATENCY")
    if path and Path(path).exists():
        data = json.loads(Path(path).read_text())
        measured = data.get("nvml_call_latency_s", data)
        return {**REALISTIC_LATENCY, **{k: float(v) for k, v in measured.items() if isinstance(v, (int, float))}}
    return dict(REALISTIC_LATENCY)


def fake_nvml(n_gpus: int, kind: str = "h100", realistic: bool = True, record_calls: bool = False):
    """A FakeNvml with ``n_gpus`` GPUs (not installed)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from tests.fake_nvml import FakeNvml, a100, h100

    make = h100 if kind == "h100" else a100
    if realistic:
        return FakeNvml([make(i) for i in range(n_gpus)], latency=latency_table(),
                        default_latency=DEFAULT_LATENCY, record_calls=record_calls)
    return FakeNvml([make(i) for i in range(n_gpus)], record_calls=record_calls)


def fake_nvml_env(n_gpus: int, kind: str = "h100", realistic: bool = True) -> dict[str, str]:
    """The environment that makes the sampler process use the fake NVML (``n_gpus`` GPUs, the
    same realistic latencies as ``fake_nvml``)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from tests.fake_nvml import sampler_process_env

    spec = {"gpus": [kind] * n_gpus}
    if realistic:
        spec.update(latency=latency_table(), default_latency=DEFAULT_LATENCY)
    return sampler_process_env(spec)


def machine() -> dict:
    """The machine a result was measured on (lscpu model, nproc, Python, key packages)."""
    info = {
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "nproc": os.cpu_count(),
        "hostname_hash": abs(hash(platform.node())) % 10_000,
    }
    try:
        info["nproc"] = int(subprocess.run(["nproc"], capture_output=True, text=True, timeout=5).stdout.strip())
    except Exception:
        pass
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=5).stdout
        for line in out.splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("Model name", "CPU(s)", "Hypervisor vendor", "Architecture"):
                info["lscpu_" + key.strip().lower().replace(" ", "_").replace("(s)", "s")] = value.strip()
    except Exception:
        pass
    try:
        mem = Path("/proc/meminfo").read_text().split("\n")[0].split()[1]
        info["mem_gib"] = round(int(mem) / 1024**2, 1)
    except Exception:
        pass
    from importlib import metadata

    versions = {}
    # Read from package metadata, not by importing: importing torch in the runner changes what
    # its child processes measure (see README, "Gaps").
    for mod, dist in (("torch", "torch"), ("pandas", "pandas"), ("pyarrow", "pyarrow"), ("bokeh", "bokeh"),
                      ("ipykernel", "ipykernel"), ("nvitop", "nvitop"), ("pynvml", "nvidia-ml-py")):
        try:
            versions[mod] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    info["packages"] = versions
    return info


def figure(fid: str, label: str, value, unit: str, target: str | None = None, limit: float | None = None,
           op: str = "<=", gated: bool = False, note: str = "") -> dict:
    """One reported figure; ``ok`` is None when there is no target."""
    ok = None
    if limit is not None and value is not None and not (isinstance(value, float) and math.isnan(value)):
        ok = bool(value <= limit) if op == "<=" else bool(value >= limit)
    return {"id": fid, "label": label, "value": value, "unit": unit, "target": target, "limit": limit,
            "op": op, "gated": gated, "ok": ok, "note": note}


def save(name: str, data: dict, mode: str) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    data = {"benchmark": name, "mode": mode, "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "machine": machine(), **data}
    path = RESULTS / (f"{name}.json" if mode != "tiny" else f"{name}.tiny.json")
    path.write_text(json.dumps(data, indent=2, default=_json_default) + "\n")
    return path


def _json_default(obj):
    try:
        import numpy as np

        if isinstance(obj, np.generic):
            return obj.item()
    except ImportError:
        pass
    return str(obj)


def pct(values, q: float) -> float:
    """The q-th percentile (0-100), nearest-rank; NaN when empty."""
    values = sorted(values)
    if not values:
        return float("nan")
    k = max(0, min(len(values) - 1, math.ceil(q / 100 * len(values)) - 1))
    return float(values[k])


def mean_ci(values, confidence: float = 0.95) -> tuple[float, float, float]:
    """(mean, low, high) with a Student-t interval."""
    n = len(values)
    m = statistics.fmean(values)
    if n < 2:
        return m, float("nan"), float("nan")
    sd = statistics.stdev(values)
    t = _t_quantile(n - 1, confidence)
    half = t * sd / math.sqrt(n)
    return m, m - half, m + half


def _t_quantile(df: int, confidence: float) -> float:
    table = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262,
             10: 2.228, 11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110,
             18: 2.101, 19: 2.093, 20: 2.086, 25: 2.060, 30: 2.042, 40: 2.021, 60: 2.000, 120: 1.980}
    if confidence != 0.95:
        raise ValueError("only 95 % intervals are tabulated")
    for k in sorted(table):
        if df <= k:
            return table[k]
    return 1.960


def thread_cpu_ns(native_id: int) -> int | None:
    """Nanoseconds a thread of this process has run on a CPU (/proc/self/task/<id>/schedstat)."""
    try:
        with open(f"/proc/self/task/{native_id}/schedstat") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def run_json_subprocess(code: str, timeout: float = 600, env: dict | None = None, root=ROOT) -> dict:
    """Run ``code`` in a fresh interpreter with ``root`` (this checkout, or another one to compare)
    first on sys.path and as its folder; it prints one JSON line last."""
    full_env = {**os.environ, "PYTHONPATH": str(root) + os.pathsep + os.environ.get("PYTHONPATH", ""), **(env or {})}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout,
                          cwd=str(root), env=full_env)
    if proc.returncode != 0:
        raise RuntimeError(f"benchmark subprocess failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    lines = [l for l in proc.stdout.strip().splitlines() if l.startswith("{")]
    return json.loads(lines[-1])
