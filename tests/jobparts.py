"""Parts of a multi-node job written straight into a store, as each node's ``gpuprof run`` saves
them (``core/job.py``), with true step ends shared by every rank (synchronous training) and an
optional clock skew planted on a node: its recorded start is ``skew_s`` ahead, its step times
(monotonic, relative to its start) are not. Also run as a script by the concurrent-writer test:
``python jobparts.py STORE JOB PART COUNT``."""

from __future__ import annotations

import sys
from datetime import datetime, timezone

import numpy as np
import pyarrow as pa

from gpuprof_jupyter.core.store.directory import Store
from gpuprof_jupyter.core.store.experiment import ExperimentMeta

T0 = 1_800_000_000.0  # the true start of every part (UNIX s)


def true_ends(steps: int, step_s: float = 0.1, seed: int = 0) -> np.ndarray:
    """When each step's all-reduce released every rank (true time, s after T0)."""
    rng = np.random.default_rng(seed)
    return 0.5 + step_s * np.arange(1, steps + 1) + rng.uniform(0, 0.002, steps)


def write_part(store: Store, job: str, *, host: str, node: int, ranks: list[int], world: int, steps: int = 20,
               waits: dict | None = None, skew_s: float = 0.0, start_s: float = 0.0, parts: int = 2,
               name: str = "ft", launcher: str = "torchrun", step: str | None = None, status: str = "ok") -> ExperimentMeta:
    """One node's part: ``ranks`` (global) on ``host``, each ending its steps at ``true_ends``
    (plus up to 1 ms of its own), with ``waits`` (rank -> data wait per step, s)."""
    waits = waits or {}
    ends = true_ends(steps)
    rng = np.random.default_rng(node + 7)
    key = f"{job}.{step}" if step is not None else job
    meta = ExperimentMeta(
        id="", name=name, status=status,
        started_at=datetime.fromtimestamp(T0 + start_s + skew_s, timezone.utc).isoformat(timespec="milliseconds"),
        source="host", duration_s=float(ends[-1]) + 0.1,
        context={"job": {"id": job, "step": step, "key": key, "launcher": launcher, "host": host, "node_rank": node,
                         "part": node, "parts": parts, "ranks": ranks, "world_size": world},
                 "ranks": {str(r): {"pid": 1000 + r, "local_rank": i, "world_size": world, "host": host,
                                    "node_rank": node, "ended": "ok"} for i, r in enumerate(ranks)}})
    store.create(meta)
    columns = {"t_end_s": [], "duration_s": [], "wait_s": [], "n_samples": [], "rank": []}
    for r in ranks:
        mine = ends - start_s + rng.uniform(0, 0.001, steps)  # its own clock: seconds since its start
        columns["t_end_s"] += list(mine)
        columns["duration_s"] += list(np.diff(np.concatenate([[mine[0] - 0.1], mine])))
        columns["wait_s"] += [waits.get(r, 0.005)] * steps
        columns["n_samples"] += [32.0] * steps
        columns["rank"] += [r] * steps
    store.save_steps(meta, pa.table({k: pa.array(v, type=pa.int64() if k == "rank" else pa.float64())
                                     for k, v in columns.items()}))
    store.save_meta(meta)
    return meta


if __name__ == "__main__":  # one writer of the concurrency test: COUNT parts of JOB-i, node PART
    root, job, part, count = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    store = Store(root)
    for i in range(count):
        write_part(store, f"{job}-{i}", host=f"node{part}", node=part, ranks=[2 * part, 2 * part + 1], world=4,
                   steps=5)
        store.entries()  # list while the other writer writes: the index is refreshed by both
