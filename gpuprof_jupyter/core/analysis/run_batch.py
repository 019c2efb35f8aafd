"""A run's batch size, the one its memory grows with.

Runs in any process (core).

Read by the largest-batch fit (core/analysis/headroom.py) and by the out-of-memory explanation
in the run's own summary (core/analysis/summary.py, core/analysis/oom.py).
"""

from __future__ import annotations

import math

import numpy as np

BATCH_PARAM_SUFFIX = "batch_size"


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def run_batch(experiment) -> float | None:
    """The run's batch size, the one memory grows with: its steps' median sample count per
    batch fetched (a step that accumulates gradients over 4 batches of 16 counts 16), else a
    ``*batch_size`` param."""
    steps = experiment.step_columns()
    if len(steps) and "n_samples" in steps:
        n = np.asarray(steps["n_samples"], dtype="float64")
        if "n_batches" in steps:
            batches = np.asarray(steps["n_batches"], dtype="float64")
            n = np.where(batches > 0, n / np.where(batches > 0, batches, 1.0), n)
        n = n[np.isfinite(n)]
        if len(n):
            return float(np.median(n))
    for key, value in experiment.meta.params.items():
        if key.rsplit(".", 1)[-1] == BATCH_PARAM_SUFFIX and _finite(value):
            return float(value)
    return None


__all__ = ["BATCH_PARAM_SUFFIX", "run_batch"]
