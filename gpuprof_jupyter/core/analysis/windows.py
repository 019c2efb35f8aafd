"""The native window of each metric in one experiment: over how long a reading averages.

Runs in any process (core). Below both the summary, which stores the windows, and the provenance
checks, which judge a run or a step too short against them.
"""

from __future__ import annotations

from gpuprof_jupyter.core.metrics import native_window


def metric_tags(meta, metric: str) -> list[str]:
    """The provenance tags ``metric`` has across the experiment's devices, sorted."""
    return sorted({tags[metric] for tags in meta.provenance.values() if tags.get(metric)})


def metric_windows(meta, step_p50_s: float | None = None) -> dict[str, dict]:
    """metric -> ``{"window_s", "window", "provenance", "per_step_reliable"}``: the longest
    native window over the devices (seconds), its words, the tags, and whether the median step
    (``step_p50_s``) is at least that long and at least the sampling interval, the per-step
    gate's own test (``provenance.step_window``; None without steps). Stored in the summary as
    ``metric_windows``."""
    interval = meta.sampling_interval_s
    out: dict[str, dict] = {}
    for metric in sorted({m for tags in meta.provenance.values() for m in tags}):
        tags = metric_tags(meta, metric)
        windows = [native_window(t) for t in tags]
        longest = max(windows, key=lambda w: w.resolve(interval))
        window_s = longest.resolve(interval)
        out[metric] = {"window_s": window_s, "window": longest.text, "provenance": tags,
                       "per_step_reliable": None if step_p50_s is None else bool(step_p50_s >= max(window_s, interval or 0.0))}
    return out
