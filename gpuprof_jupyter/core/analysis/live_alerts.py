"""Alerts while a run goes on: ``--alert RULE`` evaluated on full-resolution samples.

Runs in any process (core): the sampler process evaluates rules, the kernel parses them.

The sampler process runs one ``LiveAlertEvaluator`` per run (docs/architecture.md, 1): it
feeds every row it samples, the steps the kernel reports and the gaps it records, and calls
``evaluate(now_s)`` at the UI rate. The rules are the gate rules' grammar (analysis.rules),
judged on a span of time instead of the whole run:

* ``within step`` rules (``sm_util < 50 for >30% within step``) on each step as it closes;
* every other rule on a sliding window (``DEFAULT_WINDOW_S``) ending now; a window needs at
  least ``MIN_COVERAGE`` of its time measured, so a run's first seconds raise nothing;
* rules on a figure of the steps (``STEP_RULE_FIGURES``: ``data_wait_frac > 0.3``,
  ``step_time_p50_s > 0.5``) on each rank's steps of the sliding window, as the summary
  computes them (analysis.step_figures), once a rank has ``MIN_WINDOW_STEPS`` there. Steps
  of a job's child processes carry their rank; the alert names the rank where the figure is
  worst (``Alert.rank``: ``--trace on-alert`` traces that rank), and the other ranks where
  the rule holds too. The run's own process's steps have no rank (None).

Shares are time-weighted with gaps excluded and computed exactly (analysis.stats), like the
same rule at stop. The same rule fires at most once per ``MIN_REPEAT_S``; steps where it held
meanwhile are counted in the next alert (``repeats``). Each alert carries its evidence and,
for a GPU held back, the diagnosis' next step (analysis.input_findings). Memory: only the samples
of the metrics the rules need, over the window (or ``MAX_STEP_S`` for step rules), and the
first ``MAX_KEPT`` alerts fired.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np

from gpuprof_jupyter.core.metrics import METRICS
from gpuprof_jupyter.core.analysis.input_findings import low_activity_advice
from gpuprof_jupyter.core.format import fmt_frac, fmt_metric_value, fmt_unit
from gpuprof_jupyter.core.analysis.rules import OPS, SAMPLED, PlainRecord, Rule, RuleError, parse_rules, share_within
from gpuprof_jupyter.core.analysis.step_figures import steps_summary
from gpuprof_jupyter.core.analysis.stats import measured_time, overlap_weights, sample_weights, weighted_mean

DEFAULT_WINDOW_S = 60.0  # the sliding window of rules without 'within step'
MIN_REPEAT_S = 30.0  # the same rule fires at most once per this many seconds (run time)
MIN_COVERAGE = 0.5  # a window rule needs at least this share of its window measured
MAX_STEP_S = 300.0  # samples kept for 'within step' rules: a longer step is judged on its last 300 s
STEP_READY_S = 2.0  # a step is judged once samples reach its end, or this long after it at the latest
MAX_KEPT = 200  # alerts kept for the experiment's metadata (``meta.alerts``); later ones are counted
_LOW_ACTIVITY = ("sm_util", "gpu_busy")  # a low reading of these gets the diagnosis' next step
# figures of each rank's steps in the window a rule may watch live (analysis.step_figures' names)
STEP_RULE_FIGURES = ("step_time_p50_s", "step_time_p95_s", "data_wait_frac", "steps_per_s")
MIN_WINDOW_STEPS = 3  # a rank's step figure is judged once the window holds this many of its steps


def parse_alerts(texts) -> list[Rule]:
    """Parse ``--alert`` rules; ``RuleError`` for a malformed rule or one that cannot be judged live."""
    rules = parse_rules(texts)
    for rule in rules:
        if rule.metric in ("memory_peak_bytes", "memory_headroom_frac"):
            raise RuleError(f"alert {rule.text!r}: the run's peak memory and headroom are known at its end (use "
                            "--check); live, watch step_peak_memory_bytes (each step's peak, e.g. "
                            "'step_peak_memory_bytes > 70 GiB') or gpu_mem_used_bytes")
        if rule.metric in STEP_RULE_FIGURES:  # a plain comparison (parse_rule refuses a share of it)
            continue
        if rule.metric not in SAMPLED:
            raise RuleError(f"alert {rule.text!r}: alerts watch a sampled metric ({', '.join(SAMPLED[:6])}, ...) "
                            f"or a figure of each rank's steps ({', '.join(STEP_RULE_FIGURES)}); "
                            f"{rule.metric!r} is neither (use --check for other figures and logged metrics)")
        if rule.per_step:
            raise RuleError(f"alert {rule.text!r}: 'per step' is a share of the run's steps, a gate for --check; "
                            "an alert judges each step with 'within step'")
        if rule.phase is not None:
            raise RuleError(f"alert {rule.text!r}: 'in phase' is not judged live; use it with --check")
    return rules


@dataclass
class Alert(PlainRecord):
    """One firing of an alert rule; plain data (pickled to the kernel, stored in ``meta.alerts``)."""

    rule: str
    t_s: float  # end of the span judged (the step's end, or now), s since start
    span: str  # "step" or "window"
    measured: float | None  # share 0..1 of the span's time (share rules), the mean otherwise
    measured_s: float  # seconds measured in the span (gaps excluded)
    evidence: str
    next_step: str | None = None
    finding: str | None = None  # the diagnosis finding whose next step this is ("input-bound"...)
    data_wait_frac: float | None = None
    repeats: int = 0  # steps where it held since the last alert, held back by the rate limit
    rank: int | None = None  # a step figure's rule: the rank where it is worst (None: the run's own process)

    @property
    def text(self) -> str:
        return f"{self.evidence} -> {self.next_step}" if self.next_step else self.evidence



class _TickSeries:
    """One metric per tick, oldest first: the mean of the devices that measured it then.

    New ticks gather in Python lists (cheap per row) and move in one go into numpy buffers
    with a moving start, so judging a window reads a slice; pruned ticks are reclaimed when
    the buffer fills."""

    def __init__(self, capacity: int = 1024) -> None:
        self._t = np.empty(capacity)
        self._sum = np.zeros(capacity)
        self._n = np.zeros(capacity)
        self._lo = self._hi = 0
        self._new: list[list[float]] = []  # [t, sum, count] of ticks not yet in the buffers

    def __len__(self) -> int:
        self._flush()
        return self._hi - self._lo

    def add(self, t: float, value: float) -> None:
        new, ok = self._new, not math.isnan(value)
        if new and t == new[-1][0]:  # the usual case: the next GPU's reading of the newest tick
            new[-1][1] += value if ok else 0.0
            new[-1][2] += ok
            return
        if (new and t > new[-1][0]) or (not new and (self._hi == self._lo or t > self._t[self._hi - 1])):
            new.append([t, value if ok else 0.0, float(ok)])
            return
        self._flush()
        self._merge_held(t, value)

    def _flush(self) -> None:
        if not self._new:
            return
        rows = np.asarray(self._new, dtype="float64")
        self._new = []
        if self._hi + len(rows) > len(self._t):
            self._make_room(len(rows))
        end = self._hi + len(rows)
        self._t[self._hi:end], self._sum[self._hi:end], self._n[self._hi:end] = rows.T
        self._hi = end

    def _merge_held(self, t: float, value: float) -> None:
        """A reading of a tick already in the buffers, or a late one (inserted in time order)."""
        lo, hi = self._lo, self._hi
        i = lo + int(np.searchsorted(self._t[lo:hi], t))  # t <= the newest tick: i < hi
        if self._t[i] != t:
            self._insert(i, t)
        if not math.isnan(value):
            self._sum[i] += value
            self._n[i] += 1

    def _make_room(self, extra: int) -> None:
        n = self._hi - self._lo
        size = len(self._t)
        while n + extra > size // 2:
            size *= 2
        for name in ("_t", "_sum", "_n"):
            old = getattr(self, name)
            buf = np.zeros(size)
            buf[:n] = old[self._lo:self._hi]
            setattr(self, name, buf)
        self._lo, self._hi = 0, n

    def _insert(self, i: int, t: float) -> None:
        lo, hi = self._lo, self._hi
        self._t = np.insert(self._t[lo:hi], i - lo, t)
        self._sum = np.insert(self._sum[lo:hi], i - lo, 0.0)
        self._n = np.insert(self._n[lo:hi], i - lo, 0.0)
        self._lo, self._hi = 0, hi - lo + 1

    def _in_effect(self, since: float) -> int:
        """Index of the tick in effect at ``since`` (the last at or before it; the first if none)."""
        return self._lo + max(int(np.searchsorted(self._t[self._lo:self._hi], since, side="right")) - 1, 0)

    def prune(self, cutoff: float) -> None:
        """Drop ticks before ``cutoff``, keeping the one in effect at it."""
        self._flush()
        if self._hi > self._lo:
            self._lo = self._in_effect(cutoff)

    def arrays(self, since: float = -math.inf) -> tuple[np.ndarray, np.ndarray]:
        """(t, value) from the tick in effect at ``since`` on; NaN where no device measured it."""
        self._flush()
        start = self._in_effect(since) if self._hi > self._lo else self._lo
        counts = self._n[start:self._hi]
        with np.errstate(invalid="ignore", divide="ignore"):
            return self._t[start:self._hi].copy(), np.where(counts > 0, self._sum[start:self._hi] / counts, np.nan)


def _window_words(seconds: float) -> str:
    if seconds == 60:
        return "the last minute"
    if seconds % 60 == 0:
        return f"the last {seconds / 60:g} minutes"
    return f"the last {fmt_unit(seconds, 's')}"


class LiveAlertEvaluator:
    """Judges alert rules incrementally; see the module docstring.

    ``rules``: parsed by ``parse_alerts`` (strings are parsed here); ``interval_s``: the
    sampling interval (a sample stands for the time until the next, as in analysis.stats);
    ``params``: the run's recorded settings (``num_workers`` sharpens the advice).
    """

    def __init__(self, rules, interval_s: float, window_s: float = DEFAULT_WINDOW_S,
                 min_repeat_s: float = MIN_REPEAT_S, params: dict | None = None) -> None:
        if not window_s > 0:
            raise ValueError(f"window_s must be positive, got {window_s!r}")
        self.rules = parse_alerts(rules)
        self.interval_s = float(interval_s)
        self.window_s = float(window_s)
        self.min_repeat_s = float(min_repeat_s)
        self.params = dict(params or {})
        self.figure_rules = [r for r in self.rules if r.metric in STEP_RULE_FIGURES]
        self.step_rules = [r for r in self.rules if r.within_step]
        self.window_rules = [r for r in self.rules if not r.within_step and r not in self.figure_rules]
        metrics = {r.metric for r in self.rules if r not in self.figure_rules}
        if metrics & set(_LOW_ACTIVITY):
            metrics.add("cpu_util")  # for the advice: is the input pipeline short of CPU?
        self._series = {m: _TickSeries() for m in metrics}
        self._host_series = [(m, s) for m, s in self._series.items() if METRICS[m].scope == "host"]
        self._gpu_series = [(m, s) for m, s in self._series.items() if METRICS[m].scope != "host"]
        self._next_prune = -math.inf
        self._keep_s = max(self.window_s, MAX_STEP_S if self.step_rules else 0.0) + 4 * self.interval_s
        self._gaps: deque[tuple[float, float]] = deque()
        self._steps: deque[tuple[float, float, float]] = deque()  # closed steps in the window
        self._rank_steps: dict[int | None, deque] = {}  # per rank, its closed steps in the window (figure rules)
        self._pending: deque[tuple[float, float, float, int]] = deque()  # closed, not judged yet
        self._steps_seen = 0
        self._newest_t = -math.inf
        # newest reading per scope: a step is judged once the readings its rules need reach its
        # end (host rows come from the sampling lane, GPU rows may come later from a batched source)
        self._newest_scope = {"host": -math.inf, "gpu": -math.inf}
        self._step_scopes = sorted({"host" if METRICS[r.metric].scope == "host" else "gpu" for r in self.step_rules})
        self._last_fired: dict[str, float] = {}
        self._held_back: dict[str, int] = {}
        self._arrays: dict[str, tuple] = {}  # per metric, built once per evaluate() (many steps judged at once)
        self._since = -math.inf  # the oldest time this evaluate() needs
        self.fired: list[Alert] = []  # the first MAX_KEPT alerts, for meta.alerts
        self.not_kept = 0

    # -- feeding ------------------------------------------------------------------------------
    def add_row(self, t_s: float, device: str, values: dict) -> None:
        """One device's reading at ``t_s`` (s since start); metrics no rule needs are ignored."""
        for metric, series in (self._host_series if device == "host" else self._gpu_series):
            value = values.get(metric)
            if value is not None:
                series.add(float(t_s), float(value))
        scope = "host" if device == "host" else "gpu"
        if t_s > self._newest_scope[scope]:
            self._newest_scope[scope] = float(t_s)
        if t_s > self._newest_t:
            self._newest_t = float(t_s)
            if t_s >= self._next_prune:  # now and then: the held time stays under keep_s + 1 %
                self._next_prune = t_s + self._keep_s / 100
                for series in self._series.values():
                    series.prune(t_s - self._keep_s)

    def add_gap(self, start_s: float, end_s: float) -> None:
        """A recorded sampler gap: its time counts neither for nor against a rule."""
        self._gaps.append((float(start_s), float(end_s)))

    def add_step(self, t_end_s: float, duration_s: float, wait_s: float, rank: int | None = None) -> None:
        """A closed step (as the kernel reports it: end, duration, time waiting for data), of
        ``rank`` (a job's child process) or of the run's own process (None)."""
        self._steps_seen += 1
        step = (float(t_end_s), float(duration_s), float(wait_s))
        self._steps.append(step)
        if self.figure_rules:
            self._rank_steps.setdefault(rank, deque()).append(step)
        if self.step_rules:
            self._pending.append((*step, self._steps_seen))

    # -- judging ------------------------------------------------------------------------------
    def evaluate(self, now_s: float, final: bool = False) -> list[Alert]:
        """Alerts newly fired at ``now_s`` (s since start), past the rate limit. ``final``: the
        run has ended (its last sample taken): every step still waiting is judged now."""
        while self._steps and self._steps[0][0] < now_s - self.window_s:
            self._steps.popleft()
        for steps in self._rank_steps.values():
            while steps and steps[0][0] < now_s - self.window_s:
                steps.popleft()
        while self._gaps and self._gaps[0][1] < self._newest_t - self._keep_s:
            self._gaps.popleft()
        ready = []
        covered = min((self._newest_scope[scope] for scope in self._step_scopes), default=self._newest_t)
        while self._pending and (final or covered >= self._pending[0][0]
                                 or now_s >= self._pending[0][0] + STEP_READY_S):
            ready.append(self._pending.popleft())
        needed = [end - min(duration, MAX_STEP_S) for end, duration, _, _ in ready]
        needed += [now_s - self.window_s] if self.window_rules or "cpu_util" in self._series else []
        self._since, self._arrays = min(needed, default=now_s), {}
        alerts = []
        for end, duration, wait, index in ready:
            for rule in self.step_rules:
                alerts += self._judge_step(rule, end, duration, wait, index)
        for rule in self.window_rules:
            alerts += self._judge_window(rule, now_s)
        for rule in self.figure_rules:
            alerts += self._judge_ranks(rule, now_s)
        for alert in alerts:
            if len(self.fired) < MAX_KEPT:
                self.fired.append(alert)
            else:
                self.not_kept += 1
        return alerts

    def record(self) -> list[dict]:
        """What the experiment keeps (``meta.alerts``): the alerts fired, as plain dicts."""
        return [a.to_dict() for a in self.fired]

    def record_note(self) -> str | None:
        """A note for the experiment when more alerts fired than were kept."""
        if not self.not_kept:
            return None
        return f"{self.not_kept} more alert(s) fired after the first {MAX_KEPT}; only those were kept"

    def _samples(self, metric: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(t, per-tick value, seconds each stands for) of the samples held, gaps excluded."""
        if metric not in self._arrays:
            t, values = self._series[metric].arrays(self._since)
            self._arrays[metric] = (t, values, sample_weights(t, self.interval_s, self._gaps))
        return self._arrays[metric]

    def _judge_step(self, rule: Rule, end: float, duration: float, wait: float, index: int) -> list[Alert]:
        start = max(end - duration, end - MAX_STEP_S)
        share, measured_s = share_within(*self._samples(rule.metric), rule, start, end)
        if share is None or not OPS[rule.share_op](share, rule.share):
            return []
        if not self._may_fire(rule, end):
            self._held_back[rule.text] = self._held_back.get(rule.text, 0) + 1
            return []
        wait_frac = wait / duration if duration > 0 else None
        partial = f"the last {fmt_unit(end - start, 's', 0)} of " if start > end - duration else ""
        evidence = (f"{rule.metric} {rule.op} {fmt_metric_value(rule.value, rule.metric)} for {fmt_frac(share)} of "
                    f"{partial}step {index} ({fmt_unit(duration, 's', 2)}, ended at t={fmt_unit(end, 's', 1)})")
        repeats = self._held_back.pop(rule.text, 0)
        if repeats:
            evidence += f", and in {repeats} step(s) since the last alert"
        return [self._alert(rule, end, "step", float(share), measured_s, evidence, wait_frac, repeats)]

    def _judge_window(self, rule: Rule, now_s: float) -> list[Alert]:
        t, values, weights = self._samples(rule.metric)
        start = now_s - self.window_s
        where = _window_words(self.window_s)
        if rule.is_share:
            share, measured_s = share_within(t, values, weights, rule, start, now_s)
            holds = share is not None and OPS[rule.share_op](share, rule.share)
            figure = None if share is None else float(share)
            evidence = f"{rule.metric} {rule.op} {fmt_metric_value(rule.value, rule.metric)} for {fmt_frac(figure or 0)} of {where}"
        else:
            span, cut = overlap_weights(t, weights, start, now_s)
            figure, measured_s = weighted_mean(values[span], cut), measured_time(values[span], cut)
            holds = not math.isnan(figure) and OPS[rule.op](figure, rule.value)
            evidence = (f"{rule.metric} averaged {fmt_metric_value(figure, rule.metric)} over {where} "
                        f"(alert when {rule.op} {fmt_metric_value(rule.value, rule.metric)})")
        if not holds or measured_s < MIN_COVERAGE * self.window_s or not self._may_fire(rule, now_s):
            return []
        if measured_s < 0.95 * self.window_s:
            evidence += f" ({fmt_unit(measured_s, 's', 0)} measured)"
        total = sum(d for _, d, _ in self._steps)
        wait_frac = sum(w for _, _, w in self._steps) / total if total > 0 else None
        return [self._alert(rule, now_s, "window", figure, measured_s, evidence, wait_frac, 0)]

    def _judge_ranks(self, rule: Rule, now_s: float) -> list[Alert]:
        """A step figure's rule on each rank's steps of the window; one alert naming the rank
        where the figure is worst (the others where it holds are named in its evidence)."""
        holding = []
        for rank, steps in self._rank_steps.items():
            if len(steps) < MIN_WINDOW_STEPS:
                continue
            _, duration, wait = zip(*steps)
            figure = steps_summary({"duration_s": duration, "wait_s": wait, "n_samples": [math.nan] * len(steps)}
                                   ).get(rule.metric, math.nan)
            if not math.isnan(figure) and OPS[rule.op](figure, rule.value):
                holding.append((figure, rank, len(steps)))
        if not holding or not self._may_fire(rule, now_s):
            return []
        holding.sort(key=lambda h: h[0], reverse=rule.op in (">", ">=", "!=", "=="))
        figure, rank, count = holding[0]
        who = "this process" if rank is None else f"rank {rank}"
        evidence = (f"{who}: {rule.metric} {fmt_metric_value(figure, rule.metric)} over its {count} steps of "
                    f"{_window_words(self.window_s)} (alert when {rule.op} {fmt_metric_value(rule.value, rule.metric)})")
        if len(holding) > 1:
            evidence += "; also " + ", ".join(f"rank {r}: {fmt_metric_value(f, rule.metric)}" for f, r, _ in holding[1:])
        steps = self._rank_steps[rank]
        total = sum(d for _, d, _ in steps)
        wait_frac = sum(w for _, _, w in steps) / total if total > 0 else None
        alert = self._alert(rule, now_s, "window", figure, total, evidence, wait_frac, 0)
        alert.rank = rank
        return [alert]

    def _may_fire(self, rule: Rule, t_s: float) -> bool:
        last = self._last_fired.get(rule.text)
        return last is None or t_s - last >= self.min_repeat_s

    def _alert(self, rule: Rule, t_s: float, span: str, figure, measured_s: float, evidence: str,
               wait_frac: float | None, repeats: int) -> Alert:
        self._last_fired[rule.text] = t_s
        if wait_frac is not None and rule.metric != "data_wait_frac":
            evidence += f"; data wait {fmt_frac(wait_frac)}"
        finding = next_step = None
        if rule.metric in _LOW_ACTIVITY and rule.op in ("<", "<="):
            finding, next_step = low_activity_advice(wait_frac, self._cpu_mean(t_s), self.params.get("num_workers"))
        return Alert(rule.text, float(t_s), span, figure, float(measured_s), evidence, next_step, finding,
                     wait_frac, repeats)

    def _cpu_mean(self, now_s: float) -> float | None:
        if "cpu_util" not in self._series:
            return None
        t, values, weights = self._samples("cpu_util")
        span, cut = overlap_weights(t, weights, now_s - self.window_s, now_s)
        mean = weighted_mean(values[span], cut)
        return None if math.isnan(mean) else mean


__all__ = ["Alert", "LiveAlertEvaluator", "parse_alerts", "DEFAULT_WINDOW_S", "MIN_REPEAT_S", "MIN_COVERAGE",
           "MIN_WINDOW_STEPS", "STEP_RULE_FIGURES"]
