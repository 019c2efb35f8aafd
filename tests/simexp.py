"""Simulated runs without waiting: the simulated GPU read on a fake clock, into an Experiment.

``sim_experiment("throttled", seconds=30)`` plays 30 s of the scenario in milliseconds, with
the same SimulatedSource the profiler uses, so diagnosis and rule tests see real simulator
output (not hand-made numbers) and stay fast on 2 CI cores.
"""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd

from gpuprof_jupyter.core.sources.simulated import SimulatedSource
from gpuprof_jupyter.core.store.experiment import Experiment, ExperimentMeta

_counter = itertools.count()


def steps_frame(count: int, seconds: float, wait_frac: float, batch: float = 32.0, start: float = 0.0) -> pd.DataFrame:
    """``count`` equal steps over [start, start + seconds], each waiting ``wait_frac`` of its time for data."""
    duration = seconds / count
    ends = start + duration * np.arange(1, count + 1)
    return pd.DataFrame({"t_end_s": ends, "duration_s": np.full(count, duration),
                         "wait_s": np.full(count, duration * wait_frac), "n_samples": np.full(count, batch)})


def sim_experiment(scenario: str = "input-bound", gpus: int = 1, seconds: float = 5.0, interval: float = 0.1, *,
                   name: str | None = None, params: dict | None = None, user_metrics: dict | None = None,
                   steps: pd.DataFrame | None = None, cpu_util: float = 20.0, phases: list | None = None,
                   gaps: list | None = None, checks: list | None = None, provenance_tag: str | None = None,
                   status: str = "ok", requests: pd.DataFrame | None = None) -> Experiment:
    clock = [0.0]
    source = SimulatedSource(f"sim:{scenario}:{gpus}", clock=lambda: clock[0])
    devices = source.open()
    rows = []
    for i in range(1, int(round(seconds / interval)) + 1):
        t = clock[0] = i * interval
        reading = source.read()
        if any(start < t < end for start, end in gaps or []):
            # the sampler was starved: no row at all (docs/facts.md, "A long C call starves a Python thread")
            continue
        for key, values in reading.items():
            rows.append({"t": t, "wall_time": 1.9e9 + t, "device": key, **values})
        rows.append({"t": t, "wall_time": 1.9e9 + t, "device": "host", "cpu_util": cpu_util})
    provenance = source.provenance()
    if provenance_tag:
        for tags in provenance.values():
            tags["sm_util"] = provenance_tag
    provenance["host"] = {"cpu_util": "psutil.process_tree"}
    n = next(_counter)
    meta = ExperimentMeta(
        id=f"20261129T{100000 + n:06d}-sim{n:03d}", name=name or scenario, status=status,
        started_at=f"2026-11-29T{10 + n // 3600 % 10:02d}:{n // 60 % 60:02d}:{n % 60:02d}.000+00:00",
        duration_s=seconds, interval_s=interval, source=source.name, simulated=True,
        devices=[d.to_dict() for d in devices] + [{"key": "host", "kind": "host", "name": "testhost"}],
        provenance=provenance, params=dict(params or {}), user_metrics=dict(user_metrics or {}),
        phases=list(phases or []), gaps=[list(g) for g in gaps or []], context=source.context(),
        checks=list(checks or []),
    )
    return Experiment(meta, samples=pd.DataFrame(rows), steps=steps if steps is not None else None, requests=requests)


def requests_frame(latencies, gaps=0.0, batch=1.0, start: float = 0.0, tokens=None, cuda: bool = False) -> pd.DataFrame:
    """Serving requests one after another: each ``latencies[i]`` long, ``gaps`` (one or per request)
    of idle time before the next (core/finish.py REQUEST_FIELDS)."""
    latencies = np.asarray(latencies, dtype="float64")
    gaps = np.broadcast_to(np.asarray(gaps, dtype="float64"), latencies.shape)
    starts = start + np.concatenate([[0.0], np.cumsum(latencies + gaps)[:-1]])
    n = len(latencies)
    return pd.DataFrame({"t_start_s": starts, "latency_s": latencies, "host_s": latencies,
                         "batch": np.broadcast_to(np.asarray(batch, dtype="float64"), latencies.shape).copy(),
                         "tokens": np.full(n, np.nan) if tokens is None else np.asarray(tokens, dtype="float64"),
                         "ttft_s": np.full(n, np.nan), "gc_s": np.zeros(n), "wait_s": np.zeros(n),
                         "cuda": np.full(n, cuda), "kind": ["module"] * n})


def frame_experiment(t, sm, *, interval: float = 1.0, gpus_sm: list | None = None, phases=None, steps=None,
                     gaps=None, user_metrics=None, name: str = "exact") -> Experiment:
    """An experiment from exact arrays: ``sm`` on gpu0 (or ``gpus_sm``: one array per GPU)."""
    series = gpus_sm if gpus_sm is not None else [sm]
    rows = []
    for k, values in enumerate(series):
        for tt, v in zip(t, values):
            rows.append({"t": float(tt), "wall_time": 1.9e9 + tt, "device": f"gpu{k}", "sm_util": float(v),
                         "power_w": 100.0 + float(v)})
    meta = ExperimentMeta(
        id=f"exact-{next(_counter)}", name=name, status="ok", duration_s=float(t[-1]) + interval, interval_s=interval,
        devices=[{"key": f"gpu{k}", "kind": "gpu", "name": "Test GPU"} for k in range(len(series))],
        provenance={f"gpu{k}": {"sm_util": "gpm.sm_util"} for k in range(len(series))},
        phases=list(phases or []), gaps=[list(g) for g in gaps or []], user_metrics=dict(user_metrics or {}),
    )
    return Experiment(meta, samples=pd.DataFrame(rows), steps=steps)


def sm_util_during_steps(experiment, device: str = "gpu0") -> float:
    """The simulated SM utilisation over a real run's steps after its first (whose end is the
    first report the simulated GPU can follow), never from the run's start: the sampler
    process's start, slow on a loaded machine, would otherwise weigh in as idle time."""
    t_end = experiment.steps["t_end_s"]
    frame = experiment.device_frame(device, ["sm_util"])
    return float(frame[(frame["t"] > t_end.iloc[0]) & (frame["t"] <= t_end.iloc[-1])]["sm_util"].mean())
