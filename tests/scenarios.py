"""Runs for the scenario matrix (tests/test_scenario_matrix.py), built on a fake clock without a
kernel: {host-only CPU, simulated GPU, fake-NVML GPU} x {training, serving, training then
serving, --tune, out of memory, two ranks, a two-node job}.

A job's workload is its two parts, as each node's ``gpuprof run`` saves them; the matrix reads
them back as one experiment (``core/job.py``), so a job's outputs meet the same invariants.

The simulated GPU is read as simexp.py reads it; the fake-NVML GPU through the real NVML source
over tests/fake_nvml.py (an A100: kernel-active time, no GPM); the host-only run has the host's
series alone, as a run on a machine without a GPU stores it.
"""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd

from gpuprof_jupyter.core.sources.nvml import NvmlSource
from gpuprof_jupyter.core.store.experiment import Experiment, ExperimentMeta
from tests.fake_nvml import FakeNvml, a100
from tests.simexp import requests_frame, sim_experiment, steps_frame

SOURCES = ("host", "sim", "nvml")
WORKLOADS = ("training", "serving", "training-serving", "tune", "oom", "ranks", "job")
GIB, MIB = 1024**3, 1024**2
SECONDS, INTERVAL = 6.0, 0.1
HOST = {"key": "host", "kind": "host", "name": "testhost"}
_ids = itertools.count()

# torch's messages when a run runs out of memory (c10's allocators)
CUDA_OOM = ("CUDA out of memory. Tried to allocate 3.00 GiB. GPU 0 has a total capacity of 40.00 GiB of which "
            "1.00 GiB is free. Including non-PyTorch memory, this process has 39.00 GiB memory in use. Of the "
            "allocated memory 37.00 GiB is allocated by PyTorch, and 1.00 GiB is reserved by PyTorch but unallocated.")
CPU_OOM = "[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: not enough memory: you tried to allocate 3221225472 bytes."


def _host_rows(seconds: float, gpus_rows=None) -> list[dict]:
    rows = []
    for i in range(1, int(round(seconds / INTERVAL)) + 1):
        t = i * INTERVAL
        rows.append({"t": t, "wall_time": 1.9e9 + t, "device": "host", "cpu_util": 20.0 + 5.0 * (i % 3)})
    return rows + list(gpus_rows or [])


def _nvml_readings(gpus: int, seconds: float):
    """The real NVML source over fake A100s, read every INTERVAL on a fake clock."""
    clock = [0.0]
    with FakeNvml([a100(i) for i in range(gpus)]) as fake:
        source = NvmlSource(clock=lambda: clock[0], slow_interval_s=1.0)
        devices = source.open()
        try:
            rows = []
            for i in range(1, int(round(seconds / INTERVAL)) + 1):
                t = clock[0] = i * INTERVAL
                for gpu in fake.gpus:  # busy every other reading; the energy counter goes on at the power drawn
                    gpu.util_gpu = 75 if i % 2 else 35
                    gpu.energy_mj += int(gpu.power_usage_mw * INTERVAL)
                for key, values in source.read().items():
                    rows.append({"t": t, "wall_time": 1.9e9 + t, "device": key, **values})
            return rows, [d.to_dict() for d in devices], source.provenance(), source.context()
        finally:
            source.close()


def run(source: str, name: str, *, steps=None, requests=None, params=None, gpus: int = 1, status: str = "ok",
        context: dict | None = None) -> Experiment:
    """One run of ``source`` ("host", "sim" or "nvml") over SECONDS."""
    if source == "sim":
        exp = sim_experiment("input-bound", gpus=gpus, seconds=SECONDS, interval=INTERVAL, name=name, params=params,
                             steps=steps, requests=requests, status=status)
        exp.meta.context.update(context or {})
        return exp
    if source == "nvml":
        rows, devices, provenance, ctx = _nvml_readings(gpus, SECONDS)
        rows, devices = _host_rows(SECONDS, rows), devices + [HOST]
    else:
        rows, devices, provenance, ctx = _host_rows(SECONDS), [HOST], {}, {}
    provenance["host"] = {"cpu_util": "psutil.process_tree"}
    n = next(_ids)
    meta = ExperimentMeta(
        id=f"20261130T{100000 + n:06d}-{source}{n:03d}", name=name, status=status,
        started_at=f"2026-11-30T10:{n // 60 % 60:02d}:{n % 60:02d}.000+00:00", duration_s=SECONDS,
        interval_s=INTERVAL, source=source, simulated=False, devices=devices, provenance=provenance,
        params=dict(params or {}), context={**ctx, **(context or {})})
    return Experiment(meta, samples=pd.DataFrame(rows), steps=steps, requests=requests)


def _ranked(frames: dict[int, pd.DataFrame]) -> pd.DataFrame:
    return pd.concat([f.assign(rank=rank) for rank, f in frames.items()], ignore_index=True)


def _memory_context(source: str) -> dict:
    """What the memory probe stores: the sampled step's categories, and with a CUDA allocator its
    peak (a host-only or simulated run trains on the CPU: tensor sizes only)."""
    counted = {"parameters": 400 * MIB, "gradients": 400 * MIB, "optimizer_state": 800 * MIB, "activations": 1.2 * GIB}
    record = {"counted": counted}
    if source == "nvml":
        record["sampled_peak_bytes"] = sum(counted.values()) * 1.1
    return {"memory": record}


def _warming(count: int, seconds: float, wait_frac: float, batch: float, slower: float) -> pd.DataFrame:
    """Steps after a first one ``slower`` times as long (a warm-up: compilation, the loader's start)."""
    steps = steps_frame(count, seconds, wait_frac, batch=batch)
    steps.loc[0, ["duration_s", "wait_s"]] *= slower
    steps["t_end_s"] = steps["duration_s"].cumsum()
    return steps


TUNE_WARMUP = 2  # steps a --tune trial of the matrix leaves out (its slow first step among them)


def _trial(run_name: str, index: int, label: str, settings: dict) -> dict:
    """A --tune trial's context (runtime/tune/trial.py): the warm-up its figures leave out."""
    return {"tune": {"run": run_name, "trial": index, "label": label, "settings": settings,
                     "warmup_steps": TUNE_WARMUP, "objective": "throughput"}}


def workload(source: str, kind: str) -> list[Experiment]:
    """The runs of one cell of the matrix (two for --tune: its baseline and its kept trial)."""
    name = f"{source}-{kind}"
    params = {"batch_size": 32, "num_workers": 0}
    if kind == "training":
        return [run(source, name, steps=steps_frame(60, SECONDS, 0.45), params=params, context=_memory_context(source))]
    if kind == "serving":
        return [run(source, name, requests=requests_frame(np.full(200, 0.01), gaps=0.02))]
    if kind == "training-serving":
        return [run(source, name, steps=steps_frame(30, 3.0, 0.45), params=params,
                    requests=requests_frame(np.full(90, 0.01), gaps=0.02, start=3.1))]
    if kind == "tune":  # two trials, each with the warm-up it saved, as runtime/tune/trial.py saves it
        base = run(source, f"{name}-base", steps=_warming(40, 4.0, 0.45, 32.0, 20.0), params=params,
                   context=_trial(name, 1, "baseline", {}))
        kept = run(source, f"{name}-bs64", steps=_warming(40, 4.0, 0.1, 64.0, 5.0),
                   params={**params, "batch_size": 64}, context=_trial(name, 2, "batch_size 32 -> 64", {"batch_size": 64}))
        return [base, kept]
    if kind == "oom":
        context = {**_memory_context(source), "oom": {
            "error": CPU_OOM if source == "host" else CUDA_OOM,
            "counted": {"parameters": 400 * MIB, "gradients": 400 * MIB, "optimizer_state": 800 * MIB}}}
        return [run(source, name, steps=steps_frame(5, 1.0, 0.1), params={**params, "batch_size": 512}, status="error",
                    context=context)]
    if kind == "ranks":
        steps = _ranked({0: steps_frame(40, SECONDS, 0.2), 1: steps_frame(40, SECONDS, 0.25)})
        ranks = {str(r): {"device": "cpu" if source == "host" else f"cuda:{r}", "local_rank": r, "world_size": 2,
                          "ended": "ok"} for r in range(2)}
        return [run(source, name, steps=steps, params=params, gpus=2,
                    context={"ranks": ranks})]
    if kind == "job":
        return [_job_part(source, name, host, node, params) for node, host in enumerate(("node-a", "node-b"))]
    raise ValueError(kind)


JOB_SKEW_S = 1.5  # node-b's wall clock runs ahead: the job's one clock puts it back (core/analysis/clock.py)


def _job_part(source: str, name: str, host: str, node: int, params: dict) -> Experiment:
    """One node's part of job ``name`` (its key): ranks 2*node and 2*node+1 of 4, each ending its
    steps with the others (synchronous training) within a millisecond of its own."""
    noise = np.random.default_rng(node).uniform(0, 0.001, 40)
    frames = {r: steps_frame(40, SECONDS, 0.2 + 0.05 * (r % 2)) for r in (2 * node, 2 * node + 1)}
    for frame in frames.values():
        frame["t_end_s"] += noise
    ranks = {str(r): {"device": "cpu" if source == "host" else f"cuda:{r % 2}", "local_rank": r % 2, "world_size": 4,
                      "host": host, "node_rank": node, "ended": "ok"} for r in frames}
    job = {"id": name, "step": None, "key": name, "launcher": "torchrun", "host": host, "node_rank": node, "part": node,
           "parts": 2, "ranks": sorted(frames), "world_size": 4}
    part = run(source, name, steps=_ranked(frames), params=params, gpus=2, context={"job": job, "ranks": ranks})
    part.meta.started_at = f"2026-11-30T11:00:0{node * JOB_SKEW_S:.3f}+00:00"
    part.meta.host = host
    return part


__all__ = ["SOURCES", "TUNE_WARMUP", "WORKLOADS", "run", "workload"]
