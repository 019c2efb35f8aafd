"""A rule's result (``RuleResult``), its verdict (PASS, FAIL, CANNOT JUDGE) and the texts that gate on them.

Runs in any process (core).

Results cross processes and JSON files as plain dicts (``PlainRecord``) and are saved with the
experiment (``meta.checks``): ``stored_results`` reads them back, ``failed`` and
``verdict_counts`` say what did not pass, ``RuleFailed`` is ``--fail-on-check``'s error. A rule
that cannot be judged never passes. The evaluation that makes results is ``rules.py``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

from gpuprof_jupyter.core.analysis.run_figures import metric_figure, metric_unit
from gpuprof_jupyter.core.analysis.rule_grammar import RuleError, parse_rule


class PlainRecord:
    """A dataclass record that crosses processes and JSON files as a plain dict; unknown keys
    (a newer writer's) are ignored when read back."""

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict):
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


PASS, FAIL, CANNOT_JUDGE = "PASS", "FAIL", "CANNOT JUDGE"


@dataclass
class RuleResult(PlainRecord):
    rule: str
    passed: bool  # False when it failed or could not be judged
    measured: float | None  # the share (0..1) for share rules, the value otherwise
    detail: str
    kind: str  # "time-share", "step-share", "step-time-share" (within step), "value"
    measured_s: float | None = None  # time the share is over (share rules)
    provenance: list[str] = field(default_factory=list)  # tags of the metric judged (metrics.PROVENANCE)
    judged: bool = True  # False: CANNOT JUDGE (``detail`` says why); never a pass
    to_judge: str = ""  # what would make an unjudged rule judgeable
    simulated: bool = False  # the metric judged came from a simulated source
    unknown: bool = False  # the metric is neither the profiler's nor logged: a usage error, not a verdict

    @property
    def verdict(self) -> str:
        """PASS, FAIL or CANNOT JUDGE."""
        if not self.judged:
            return CANNOT_JUDGE
        return PASS if self.passed else FAIL

    @classmethod
    def from_dict(cls, data: dict):
        """Results saved before verdicts had three values: a pass over steps too short for the
        metric (``reliable`` False) reads back as CANNOT JUDGE, never as a pass."""
        result = super().from_dict(data)
        if data.get("reliable") is False and "judged" not in data:
            result.passed, result.judged = False, False
            result.to_judge = "re-check the run: steps are shorter than the metric's native window"
        return result





# Decimals of a verdict's figure: as many as its threshold is written with ('10.25 GiB' against '10.00 GiB'),
# so a figure just past the line never prints as the line itself.
VERDICT_DIGITS = {"B": 2, "%": 1, "share": 1}


def rule_figure(result: RuleResult):
    """What a verdict measured (``RuleResult.measured``) as a figure (core/figure.py) in the unit
    of the rule's metric (a share for share rules), simulated when the metric judged was."""
    if result.kind != "value":
        unit = "share"
    else:
        try:
            metric = parse_rule(result.rule).metric
        except (RuleError, ValueError):
            metric = ""
        unit = metric_unit(metric)
    return metric_figure(result.provenance, result.measured, unit, simulated_run=result.simulated)


def stored_results(experiment) -> list[RuleResult]:
    """The rule results saved with the experiment (``meta.checks``)."""
    return [RuleResult.from_dict(d) for d in getattr(experiment.meta, "checks", None) or []]


def failed(results) -> list[RuleResult]:
    """The results that did not pass: failed or could not be judged."""
    return [r for r in results if not r.passed]


def verdict_counts(results) -> str:
    """``"1 failed, 2 cannot be judged"``: the results that did not pass, by verdict."""
    fails = sum(r.verdict == FAIL for r in results)
    unjudged = sum(r.verdict == CANNOT_JUDGE for r in results)
    parts = ([f"{fails} failed"] if fails else []) + ([f"{unjudged} cannot be judged"] if unjudged else [])
    return ", ".join(parts) or "none failed"


class RuleFailed(Exception):
    """Raised after saving when ``--fail-on-check`` is set and a rule failed or could not be judged."""

    def __init__(self, experiment_name: str, results: list[RuleResult]) -> None:
        self.results = results
        lines = "; ".join(f"{r.verdict} {r.rule}: {r.detail}" + (f" (to judge it: {r.to_judge})" if r.to_judge else "")
                          for r in results)
        super().__init__(f"experiment {experiment_name!r}: {len(results)} rule(s) did not pass "
                         f"({verdict_counts(results)}): {lines}")


def raise_if_failed(experiment) -> None:
    """``--fail-on-check``: raise RuleFailed when a rule saved with the experiment failed or could
    not be judged (a gate never passes what it cannot judge)."""
    failures = failed(stored_results(experiment))
    if failures:
        raise RuleFailed(experiment.name, failures)


__all__ = ["CANNOT_JUDGE", "FAIL", "PASS", "VERDICT_DIGITS", "PlainRecord", "RuleFailed", "RuleResult", "failed",
           "raise_if_failed", "rule_figure", "stored_results", "verdict_counts"]
