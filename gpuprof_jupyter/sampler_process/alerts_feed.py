"""The run's live alerts (``--alert``): every sample, gap and closed step fed to the evaluator.

Runs in the sampler process.

Fed at full resolution, before the live view's decimation, from the live thread once a second
and from the run's end (``final``), one at a time; the evaluator is
``core/analysis/live_alerts.LiveAlertEvaluator``.
"""

from __future__ import annotations

import threading

from gpuprof_jupyter.core.finish import STEP_FIELDS


class AlertsFeed:
    """``rules``: the run's ``--alert`` rules; ``feed``: the kernel's events (its steps)."""

    def __init__(self, rules, interval: float, params: dict, t0: float, feed) -> None:
        from gpuprof_jupyter.core.analysis.live_alerts import LiveAlertEvaluator

        self.evaluator = LiveAlertEvaluator(rules, interval, params=params)
        self.t0, self.feed = t0, feed
        self._lock = threading.Lock()  # the live thread and the run's end both feed it
        self._steps = 0  # steps of the feed handed over so far

    def judge(self, ticks, new_gaps, now_s: float, final: bool = False) -> list[dict]:
        """The alerts fired now, given these samples, gaps and the steps closed since the last call."""
        evaluator = self.evaluator
        with self._lock:
            for tick in ticks:
                t = tick.mono - self.t0
                for device, values in tick.reading.items():
                    evaluator.add_row(t, device, values)
            for gap in new_gaps:
                evaluator.add_gap(gap[0], gap[1])
            steps = self.feed.steps[self._steps:]
            self._steps += len(steps)
            for step in steps:  # a child's step carries its rank after STEP_FIELDS
                evaluator.add_step(step[0], step[1], step[2], step[len(STEP_FIELDS)] if len(step) > len(STEP_FIELDS) else None)
            return [a.to_dict() for a in evaluator.evaluate(now_s, final=final)]


__all__ = ["AlertsFeed"]
