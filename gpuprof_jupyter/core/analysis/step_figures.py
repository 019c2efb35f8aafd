"""Figures of a list of steps (count, step time, data wait, throughput, batches): for the
summary's ``steps`` and for each rank's (``analysis.ranks``).

Runs in any process (core).
"""

from __future__ import annotations

import numpy as np


def steps_summary(steps) -> dict:
    if steps is None or len(steps) == 0:
        return {"count": 0}
    duration = np.asarray(steps["duration_s"], dtype="float64")
    wait = np.asarray(steps["wait_s"], dtype="float64")
    n = np.asarray(steps["n_samples"], dtype="float64")
    total = duration.sum()
    out = {
        "count": int(len(steps)),
        "step_time_p50_s": float(np.percentile(duration, 50)),
        "step_time_p95_s": float(np.percentile(duration, 95)),
        "data_wait_frac": float(wait.sum() / total) if total > 0 else float("nan"),
        "steps_per_s": float(len(steps) / total) if total > 0 else float("nan"),
        "samples_per_s": float(np.nansum(n) / total) if total > 0 and np.isfinite(n).any() else float("nan"),
        "samples": float(np.nansum(n)) if np.isfinite(n).any() else float("nan"),
    }
    if "n_batches" in steps:  # recorded since the zero-code hooks (runtime/hooks/torch_hooks.py); older runs lack them
        batches = np.asarray(steps["n_batches"], dtype="float64")
        out["batches"] = int(batches.sum())
        if len(batches) > 1 and batches[0] == np.median(batches[1:]) + 1:
            out["batches_ahead"] = 1  # the loader fetched one batch ahead (accelerate): the first step holds it
        out["skipped"] = int(np.asarray(steps["skipped"], dtype="bool").sum())
    return out


__all__ = ["steps_summary"]
