"""Checks on a real NVIDIA GPU (not runnable without one): ``python -m benchmarks.gpu_check``.

1. Our readings against ``nvidia-smi --query-gpu=utilization.gpu,utilization.memory,
   power.draw,memory.used,temperature.gpu,clocks.sm --format=csv -lms 100`` over the same
   seconds (medians per metric and device, and the difference).
2. Each NVML call the sampler makes, timed (p50/p99 us) -> the fake's latencies:
   ``GPUPROF_BENCH_LATENCY=benchmarks/results/gpu_check.json python -m benchmarks``.
3. CPU share of the profiler's threads while a CUDA training loop runs (10 Hz).
4. Memory (docs/memory.md): the per-step allocator peaks against the peaks the check reads
   itself without profiling, memory outside PyTorch (NVML's own minus torch's reserved), the
   memory probe's cost per step with CUDA in use, ``largest_batch`` from two batch sizes
   against a real allocation at its answer, and a real ``torch.OutOfMemoryError`` in
   ``--tune``: recorded as "does not fit", memory released, the search going on below;
   ``--memory-history``'s cost (the same loop with torch's allocator history on and off) and
   a real out-of-memory in ``profile(memory_history=True)``: its explanation and snapshot.
Writes benchmarks/results/gpu_check.json and prints a markdown table. Exits with a clear
message (status 3) when there is no GPU.
"""

from __future__ import annotations

import csv
import io
import json
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

OUT = Path(__file__).resolve().parent / "results" / "gpu_check.json"
SMI_FIELDS = "utilization.gpu,utilization.memory,power.draw,memory.used,temperature.gpu,clocks.sm"
OURS = {"utilization.gpu": ("gpu_busy", 1.0), "utilization.memory": ("mem_bw_util", 1.0), "power.draw": ("power_w", 1.0),
        "memory.used": ("gpu_mem_used_bytes", 1 / 2**20), "temperature.gpu": ("gpu_temp_c", 1.0), "clocks.sm": ("sm_clock_mhz", 1.0)}


def no_gpu(reason: str) -> None:
    print(f"gpu_check: no NVIDIA GPU here ({reason}). Run it on a machine with a GPU, nvidia-smi and CUDA torch.",
          file=sys.stderr)
    raise SystemExit(3)


def require_gpu() -> None:
    if shutil.which("nvidia-smi") is None:
        no_gpu("nvidia-smi not found")
    try:
        import pynvml

        pynvml.nvmlInit()
        if pynvml.nvmlDeviceGetCount() < 1:
            no_gpu("NVML sees 0 devices")
    except Exception as exc:  # noqa: BLE001
        no_gpu(f"NVML: {exc}")


def time_nvml_calls(repeat: int = 200) -> dict:
    """Per-call latency of every NVML C function the sampler calls, on the real library."""
    import pynvml

    from gpuprof_jupyter.core.sources.nvml import NvmlSource

    source = NvmlSource()
    source.open()
    samples: dict[str, list[float]] = {}
    cache = pynvml._nvmlGetFunctionPointer_cache
    saved = dict(cache)

    def timed(name, fn):
        def call(*args):
            t = time.perf_counter()
            try:
                return fn(*args)
            finally:
                samples.setdefault(name, []).append(time.perf_counter() - t)
        return call

    for name, fn in saved.items():
        cache[name] = timed(name, fn)
    try:
        for _ in range(repeat):
            source.read()
            time.sleep(0.01)
    finally:
        cache.clear()
        cache.update(saved)
    source.close()
    return {name: {"p50_us": statistics.median(v) * 1e6, "p99_us": sorted(v)[int(0.99 * (len(v) - 1))] * 1e6, "calls": len(v)}
            for name, v in samples.items()}


def compare_with_smi(seconds: float = 20.0) -> dict:
    """Our NvmlSource and nvidia-smi at 100 ms over the same seconds, while the GPU trains."""
    from gpuprof_jupyter.core.sources.nvml import NvmlSource

    smi = subprocess.Popen(["nvidia-smi", f"--query-gpu=index,{SMI_FIELDS}", "--format=csv,noheader,nounits", "-lms", "100"],
                           stdout=subprocess.PIPE, text=True)
    source = NvmlSource()
    source.open()
    ours: list[dict] = []
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            ours.append(source.read())
            stop.wait(0.1)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    _cuda_work(seconds)
    stop.set()
    thread.join()
    smi.terminate()
    text = smi.communicate(timeout=10)[0]
    source.close()
    theirs: dict[str, dict[str, list[float]]] = {}
    for row in csv.reader(io.StringIO(text)):
        if len(row) != 7:
            continue
        key = f"gpu{int(row[0])}"
        for field, value in zip(SMI_FIELDS.split(","), row[1:]):
            try:
                theirs.setdefault(key, {}).setdefault(field, []).append(float(value))
            except ValueError:
                pass
    out = {}
    for key, fields in theirs.items():
        for field, values in fields.items():
            metric, scale = OURS[field]
            mine = [r[key][metric] * scale for r in ours if key in r and metric in r[key]]
            if mine and values:
                a, b = statistics.median(mine), statistics.median(values)
                out[f"{key}.{field}"] = {"ours_median": a, "smi_median": b, "diff": a - b, "n_ours": len(mine), "n_smi": len(values)}
    return out


def _cuda_work(seconds: float) -> float:
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(4096, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 4096)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(1024, 4096, device="cuda")
    end = time.monotonic() + seconds
    steps = 0
    while time.monotonic() < end:
        loss = model(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        steps += 1
    torch.cuda.synchronize()
    return steps


def cpu_share(seconds: float = 20.0) -> dict:
    """CPU of the gpuprof-* threads (schedstat) during a CUDA training loop under profile()."""
    import gpuprof_jupyter
    import tempfile

    from ._common import thread_cpu_ns

    def snapshot():
        return {f"{t.name}:{t.native_id}": thread_cpu_ns(t.native_id) or 0
                for t in threading.enumerate() if t.name.startswith("gpuprof-")}

    with tempfile.TemporaryDirectory() as store, gpuprof_jupyter.profile(name="gpu-check", source="nvml", store=store):
        time.sleep(0.5)
        c0, t0 = snapshot(), time.perf_counter()
        steps = _cuda_work(seconds)
        c1, wall = snapshot(), time.perf_counter() - t0
    ns = sum(c1[k] - c0.get(k, 0) for k in c1)
    return {"wall_s": wall, "steps": steps, "cpu_pct_of_core": 100.0 * ns / 1e9 / wall,
            "by_thread_ms_per_s": {k: (c1[k] - c0.get(k, 0)) / 1e6 / wall for k in c1}}


def _memory_loop(batch: int, steps: int = 8, profiled_store: str | None = None):
    """A CUDA training loop at ``batch``; without a store, its own per-step peaks (reset each step)."""
    import torch

    import gpuprof_jupyter

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4096, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 10)).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    peaks = []

    def train():
        for _ in range(steps):
            x = torch.randn(batch, 4096, device="cuda")
            torch.nn.functional.cross_entropy(model(x), torch.zeros(batch, dtype=torch.long, device="cuda")).backward()
            opt.step()
            opt.zero_grad()
            if profiled_store is None:
                torch.cuda.synchronize()
                peaks.append(torch.cuda.max_memory_allocated())
                torch.cuda.reset_peak_memory_stats()

    if profiled_store is None:
        torch.cuda.reset_peak_memory_stats()
        train()
        return peaks
    with gpuprof_jupyter.profile(name=f"mem-b{batch}", source="nvml", store=profiled_store) as p:
        train()
    return p.experiment


def memory_check() -> dict:
    import tempfile
    import timeit

    import torch

    import gpuprof_jupyter
    from gpuprof_jupyter.runtime.hooks.activity import ActivityLog
    from gpuprof_jupyter.runtime.hooks.memory_hooks import StepMemory

    out: dict = {}
    with tempfile.TemporaryDirectory() as store:
        plain = _memory_loop(256)
        runs = [_memory_loop(b, profiled_store=store) for b in (256, 1024)]
        recorded = [float(v) for v in runs[0].steps["peak_memory_bytes"]]
        out["step_peaks"] = {"plain_median": statistics.median(plain[1:]), "profiled_median": statistics.median(recorded[1:])}
        out["summary_memory"] = runs[0].summary.get("memory", {})
        fit = gpuprof_jupyter.largest_batch(*runs)
        out["largest_batch"] = {"batch": fit.batch, "fixed_bytes": fit.fixed_bytes, "per_sample_bytes": fit.per_sample_bytes,
                                "device_bytes": fit.device_bytes, "warnings": fit.warnings}
        torch.cuda.empty_cache()
        try:  # the answer, allocated for real
            _memory_loop(fit.batch, steps=2)
            out["largest_batch"]["fits"] = True
        except torch.OutOfMemoryError as exc:
            out["largest_batch"]["fits"] = f"no: {exc}"[:300]
        torch.cuda.empty_cache()
        memory = StepMemory(ActivityLog(time.monotonic()))
        memory.record = {}  # the breakdown done: the per-step cost alone
        n = 2000
        out["probe_us_per_step"] = timeit.timeit(memory.boundary, number=n) / n * 1e6
        cfg = {"batch_size": 256}
        before = torch.cuda.memory_allocated()

        def train():
            _memory_loop(cfg["batch_size"], steps=12)

        report = gpuprof_jupyter.tune(train, tune=["cfg.batch_size=1024,10000000,512"], trial_steps=3, budget="10min",
                                      source="nvml", store=store, namespace={"cfg": cfg})
        out["tune"] = [(t.label, t.verdict) for t in report.result.trials]
        out["tune_memory_after_bytes"] = torch.cuda.memory_allocated() - before
        out["memory_history_cost"] = memory_history_cost()
        out["oom"] = real_oom(store)
    return out


def memory_history_cost(repeats: int = 3) -> dict:
    """--memory-history's cost: the same CUDA loop with torch's allocator history on and off."""
    import torch

    def timed(history: bool) -> float:
        if history:
            torch.cuda.memory._record_memory_history(max_entries=100_000)
        try:
            torch.cuda.synchronize()
            t = time.perf_counter()
            _memory_loop(256, steps=20)
            torch.cuda.synchronize()
            return time.perf_counter() - t
        finally:
            if history:
                torch.cuda.memory._record_memory_history(enabled=None)

    timed(False)  # warm up
    plain = min(timed(False) for _ in range(repeats))
    history = min(timed(True) for _ in range(repeats))
    return {"plain_s": plain, "history_s": history, "ratio": history / plain}


def real_oom(store: str) -> dict:
    """A real torch.OutOfMemoryError in a profiled block with the history on: its explanation."""
    import os

    import torch

    import gpuprof_jupyter
    from gpuprof_jupyter.core.store.directory import Store

    try:
        with gpuprof_jupyter.profile("real-oom", source="nvml", store=store, memory_history=True):
            _memory_loop(256, steps=3)
            _memory_loop(10_000_000, steps=1)  # 164 GB of input: more than any GPU holds
    except torch.OutOfMemoryError:
        pass
    torch.cuda.empty_cache()
    oom = Store(store).load("real-oom").summary.get("memory", {}).get("oom", {})
    snapshot = (oom.get("memory_history") or {}).get("snapshot")
    return {key: oom.get(key) for key in ("step", "requested_bytes", "free_bytes", "device_total_bytes", "breakdown",
                                          "next_steps")} | {
        "snapshot_bytes": os.path.getsize(snapshot) if snapshot and os.path.exists(snapshot) else None}


def main() -> int:
    require_gpu()
    calls = time_nvml_calls()
    result = {"nvml_calls": calls, "nvml_call_latency_s": {k: v["p50_us"] / 1e6 for k, v in calls.items()},
              "vs_nvidia_smi": compare_with_smi(), "cpu_share": cpu_share(), "memory": memory_check()}
    from ._common import machine

    result["machine"] = machine()
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    print("| check | value |\n| --- | --- |")
    for name, v in sorted(calls.items()):
        print(f"| NVML {name} | p50 {v['p50_us']:.1f} us, p99 {v['p99_us']:.1f} us |")
    for key, v in sorted(result["vs_nvidia_smi"].items()):
        print(f"| {key}: ours vs nvidia-smi (medians) | {v['ours_median']:.1f} vs {v['smi_median']:.1f} (diff {v['diff']:+.1f}) |")
    print(f"| profiler threads' CPU, CUDA loop, 10 Hz | {result['cpu_share']['cpu_pct_of_core']:.2f} % of one core |")
    mem = result["memory"]
    print(f"| step peak, profiled vs plain (median) | {mem['step_peaks']['profiled_median'] / 2**20:.0f} vs "
          f"{mem['step_peaks']['plain_median'] / 2**20:.0f} MiB |")
    print(f"| memory outside PyTorch | {mem['summary_memory'].get('outside_torch_bytes', float('nan')) / 2**20:.0f} MiB |")
    print(f"| memory probe per step, CUDA in use | {mem['probe_us_per_step']:.1f} us |")
    print(f"| largest_batch from batch 256 and 1024 | {mem['largest_batch']['batch']}, fits: {mem['largest_batch']['fits']} |")
    print(f"| --tune with an out-of-memory batch | {mem['tune']}; left allocated {mem['tune_memory_after_bytes']} B |")
    cost = mem["memory_history_cost"]
    print(f"| --memory-history, 20 steps at batch 256 | {cost['history_s']:.3f} vs {cost['plain_s']:.3f} s "
          f"({cost['ratio']:.2f}x) |")
    oom = mem["oom"]
    print(f"| a real out-of-memory, explained | step {oom['step']}, requested {oom['requested_bytes']} B, "
          f"snapshot {oom['snapshot_bytes']} B |")
    print(f"\nwritten: {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
