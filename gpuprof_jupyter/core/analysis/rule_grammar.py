"""The rules' grammar: ``parse_rule`` turns ``sm_util > 60 for >=80%`` into a ``Rule``.

Runs in any process (core).

Grammar (keywords in any order after the comparison)::

    RULE   := METRIC OP NUMBER [UNIT] [for [SHARE_OP] NUMBER [%]] [in phase NAME] [per step | within step]
    UNIT   := ms | s | GiB | MiB | %   (where the metric has that unit: rule_units.py)
    OP     := > | >= | < | <= | == | !=
    NAME   := a word, or a quoted string ('data loading')

What each form means, and how it is judged, is ``rules.py``'s docstring. A malformed rule raises
``RuleError`` naming what is wrong and where: a unit missing where a bare number would be
misread (rule_units.check_bare), a threshold that is not finite, digits that are not ASCII.
"""

from __future__ import annotations

import difflib
import math
import operator
import re
from dataclasses import dataclass
from fractions import Fraction

from gpuprof_jupyter.core.metrics import METRICS
from gpuprof_jupyter.core.analysis.rule_units import ALIASES, UNIT_RE, check_bare, convert

OPS = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le, "==": operator.eq, "!=": operator.ne}
# Sampled metrics a share makes sense for (not counters, totals or bitmasks).
SAMPLED = [m for m in METRICS if m not in ("energy_j", "gpu_mem_total_bytes", "throttle_reasons")]

_OP_RE = re.compile(r"\s*(>=|<=|==|!=|>|<|=>|=<|=)")
# Numbers are ASCII digits only (re.ASCII: ``\d`` would take Arabic-Indic or full-width digits).
_NUM_RE = re.compile(r"\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*(%?)", re.ASCII)
_VALUE_RE = re.compile(r"\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)(?:" + UNIT_RE.pattern + ")?", re.ASCII)
_NAME_RE = re.compile(r"\s*([A-Za-z_][\w.]*)")
_WORD_RE = re.compile(r"\s*(\S+)")


class RuleError(ValueError):
    """A malformed rule; the message names the rule and what is wrong."""


@dataclass(frozen=True)
class Rule:
    text: str
    metric: str
    op: str
    value: float
    share_op: str | None = None
    share: Fraction | None = None  # exact fraction 0..1 ("80.5%" -> 161/200): boundaries compare exactly
    phase: str | None = None
    per_step: bool = False
    within_step: bool = False
    unit: str | None = None  # the unit the threshold was written in (``ms`` in ``latency_p99 < 50 ms``)

    @property
    def is_share(self) -> bool:
        return self.share_op is not None

    def __str__(self) -> str:
        return self.text



_STEP_WORD = re.compile(r"\s*(steps?|iterations?)\b", re.I)


def suggest_name(name: str, choices) -> str:
    """" (did you mean X?)" for a close name only: ``accuracy`` is not close to ``sm_occupancy``."""
    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.75)
    return f" (did you mean {close[0]}?)" if close else ""


def _ascii_hint(src: str, pos: int) -> str:
    """Why a number that looks like one was not read: its digits are not ASCII."""
    rest = src[pos:].lstrip()
    return " (digits are ASCII 0-9 only)" if rest[:1].isdigit() and not rest[:1].isascii() else ""


def parse_rule(text: str) -> Rule:
    """Parse one rule; ``RuleError`` says what is wrong and where."""
    if not isinstance(text, str) or not text.strip():
        raise RuleError("empty rule: expected e.g. 'sm_util > 60 for >=80%' or 'accuracy >= 0.92'")
    src = text.strip()

    def fail(message: str, pos: int) -> RuleError:
        rest = src[pos:].strip()
        where = f" at {rest!r}" if rest else " at the end"
        return RuleError(f"rule {src!r}: {message}{where}")

    m = _NAME_RE.match(src, 0)
    if not m:
        raise fail("expected a metric name such as sm_util or accuracy", 0)
    metric, pos = m.group(1), m.end()
    m = _OP_RE.match(src, pos)
    if not m:
        raise fail(f"expected a comparison (>, >=, <, <=, ==, !=) after {metric!r}", pos)
    op = m.group(1)
    if op in ("=>", "=<", "="):
        raise fail(f"{op!r} is not a comparison; use {'>=' if op == '=>' else '<=' if op == '=<' else '=='}", pos)
    pos = m.end()
    m = _VALUE_RE.match(src, pos)
    if not m:
        raise fail(f"expected a number after {op!r}{_ascii_hint(src, pos)}", pos)
    written, metric = metric, ALIASES.get(metric, metric)  # latency_p99 -> the summary's latency_p99_s
    try:
        value = float(m.group(1))
        if m.group(2) is None:
            check_bare(metric, value, written)
        value = convert(metric, value, m.group(2), written)
    except ValueError as exc:
        raise fail(str(exc), pos) from None
    if not math.isfinite(value):
        raise fail(f"a threshold is a finite number; {m.group(0).strip()} is beyond what a float holds", pos)
    unit = m.group(2)
    pos = m.end()
    share_op = share = phase = None
    per_step = within_step = False
    while pos < len(src):
        m = _WORD_RE.match(src, pos)
        word = m.group(1).lower()
        if word == "for":
            if share_op is not None:
                raise fail("'for' given twice", pos)
            pos = m.end()
            om = _OP_RE.match(src, pos)
            share_op = ">="
            if om:
                share_op = om.group(1)
                if share_op not in (">=", "<=", ">", "<"):
                    raise fail(f"a share takes >=, <=, > or <, not {share_op!r}", pos)
                pos = om.end()
            nm = _NUM_RE.match(src, pos)
            if not nm:
                raise fail(f"expected a share in percent after 'for', e.g. 'for >=80%'{_ascii_hint(src, pos)}", pos)
            share = Fraction(nm.group(1))
            if not 0 <= share <= 100:
                raise fail(f"a share is a percentage between 0 and 100, got {nm.group(1)}", pos)
            share /= 100
            pos = nm.end()
        elif word == "in":
            if phase is not None:
                raise fail("'in phase' given twice", pos)
            pos = m.end()
            pm = re.compile(r"\s*phase\b").match(src, pos)
            if not pm:
                raise fail("expected 'phase NAME' after 'in'", pos)
            pos = pm.end()
            qm = re.compile(r"\s*(['\"])(.+?)\1").match(src, pos) or re.compile(r"\s*()(\S+)").match(src, pos)
            if not qm or qm.group(2).lower() in ("per", "for"):
                raise fail("expected a phase name after 'in phase'", pos)
            phase, pos = qm.group(2), qm.end()
        elif word in ("per", "within"):
            pos = m.end()
            sm = _STEP_WORD.match(src, pos)
            if not sm:
                raise fail(f"expected 'step' after {word!r}", pos)
            pos = sm.end()
            if word == "per":
                per_step = True
            else:
                within_step = True
        else:
            raise fail(f"unexpected {m.group(1)!r}: after the comparison come 'for N%', 'in phase NAME', "
                       "'per step' or 'within step'", pos)
    if share_op is not None and metric not in SAMPLED:
        raise RuleError(
            f"rule {src!r}: 'for N%' is a share of time and needs a sampled metric; {metric!r} is not one"
            f"{suggest_name(metric, SAMPLED)} (sampled: {', '.join(SAMPLED[:6])}, ...)"
        )
    if per_step and share_op is None:
        raise RuleError(f"rule {src!r}: 'per step' counts steps meeting the condition: add 'for >=N%'")
    if within_step and share_op is None:
        raise RuleError(f"rule {src!r}: 'within step' is a share of each step's time: add 'for >N%'")
    if within_step and per_step:
        raise RuleError(f"rule {src!r}: 'per step' (a share of steps) and 'within step' (a share of each "
                        "step's time) exclude each other")
    if phase is not None and share_op is None and metric not in SAMPLED:
        raise RuleError(f"rule {src!r}: 'in phase' applies to sampled metrics; {metric!r} is not one{suggest_name(metric, SAMPLED)}")
    return Rule(src, metric, op, value, share_op, share, phase, per_step, within_step, unit)


def parse_rules(texts) -> list[Rule]:
    if isinstance(texts, (str, Rule)):
        texts = [texts]
    return [t if isinstance(t, Rule) else parse_rule(t) for t in (texts or [])]



__all__ = ["OPS", "SAMPLED", "Rule", "RuleError", "parse_rule", "parse_rules", "suggest_name"]
