"""Simulated runs whose memory grows with the batch: fixed + per-sample x batch (tests only).

The simulated GPU has 40 GiB. Each run's steps carry ``peak_memory_bytes`` as the memory
probe records them and its context the sampled step's counted categories
(``runtime/hooks/memory_hooks.py``), so the summary, renderers and ``largest_batch`` see
what a real run stores.
"""

from __future__ import annotations

import numpy as np

from tests.simexp import sim_experiment, steps_frame

GIB, MIB = 1024**3, 1024**2
PARAMS, STATE = 1 * GIB, 2 * GIB  # parameters (= gradients), optimizer state (Adam: two moments)
PER_SAMPLE = 100 * MIB  # activations per sample


def memory_run(batch: int, *, name: str | None = None, per_sample: float = PER_SAMPLE, curve: float = 0.0,
               breakdown: bool = True, step_peaks: bool = True):
    """A run at ``batch``: peak = params + grads + state + per_sample x batch (+ ``curve`` x batch^2)."""
    activations = per_sample * batch + curve * batch**2
    peak = 2 * PARAMS + STATE + activations
    steps = steps_frame(10, 2.0, 0.1, batch=float(batch))
    if step_peaks:
        steps["peak_memory_bytes"] = np.full(len(steps), peak)
    exp = sim_experiment("compute-bound", name=name or f"b{batch}", steps=steps, params={"batch_size": batch})
    if breakdown:
        exp.meta.context["memory"] = {"counted": {"parameters": PARAMS, "gradients": PARAMS, "optimizer_state": STATE,
                                                  "activations": activations * 0.9},  # 10 %: other
                                      "sampled_peak_bytes": peak}
    return exp
