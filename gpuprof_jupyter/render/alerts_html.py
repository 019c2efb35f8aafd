"""Alerts (``--alert``) as text and HTML: the live header's line and the saved experiment's list.

Runs in the kernel, the Jupyter server and the ``gpuprof`` command.

Which alerts reach the header, and how often, is the evaluator's job (analysis.live_alerts):
this only renders them. Every string is escaped (render/html.py: the rule text comes from users).
"""

from __future__ import annotations

from gpuprof_jupyter.core.analysis.live_alerts import Alert
from gpuprof_jupyter.core.figure import measured
from gpuprof_jupyter.core.format import fmt_figure
from gpuprof_jupyter.render.html import Markup, bullet_list, coloured, html, join

HEADER_SHOWN = 2  # alerts the live header shows, newest first


def as_alert(alert) -> Alert:
    """An Alert from an Alert or its stored dict (``meta.alerts``)."""
    return alert if isinstance(alert, Alert) else Alert.from_dict(alert)


def alert_text(alert) -> str:
    """'alert at t=33.2 s [sm_util < 50 for >30% within step]: EVIDENCE -> NEXT STEP'."""
    alert = as_alert(alert)
    return f"alert at t={_at(alert)} [{alert.rule}]: {alert.text}"


def _at(alert: Alert) -> str:
    """When the alert fired, on the run's clock: '33.2 s'."""
    return fmt_figure(measured(alert.t_s, "offset", "the run's clock"))


def capture_of(alert: Alert, captures) -> dict | None:
    """The ``--trace on-alert`` window this alert caused (``meta.trace["captures"]``), or None."""
    for record in captures or ():
        cause = record.get("alert") or {}
        if cause.get("rule") == alert.rule and cause.get("t_s") == alert.t_s:
            return record
    return None


def capture_text(record: dict) -> str:
    """'traced: steps 8 to 12 (complete), trace-alert1.json.gz' ('traced: rank 1, steps ...' for a rank's)."""
    first, end = record.get("first_step"), record.get("end_step")
    steps = f"steps {first} to {end - 1}" if first is not None and end is not None else "no step"
    if record.get("rank") is not None:
        steps = f"rank {record['rank']}, {steps}"
    where = f", {record['file']}" if record.get("file") else ""
    return f"traced: {steps} ({record.get('status')}){where}"


def _alert_item_html(alert: Alert, captures=()) -> Markup:
    advice = html(" {}", coloured(html("&rarr; {}", alert.next_step), "good")) if alert.next_step else ""
    record = capture_of(alert, captures)
    traced = html(" <span class='gpuprof-alert-trace'>[{}]</span>", capture_text(record)) if record else ""
    return html("{} t={} <code>{}</code>: {}{}{}", coloured("alert", "bad", bold=True), _at(alert), alert.rule,
                alert.evidence, advice, traced)


def alert_header_html(alerts, shown: int = HEADER_SHOWN) -> Markup:
    """The live header's alert lines: the ``shown`` newest, newest first ('' when none)."""
    newest = [as_alert(a) for a in list(alerts)[-shown:]][::-1] if shown > 0 else []
    return join((html("<span class='gpuprof-alert'>{}</span>", _alert_item_html(a)) for a in newest), "<br>")


def alerts_html(alerts, captures=()) -> Markup:
    """A saved experiment's alerts, in the order they fired ('' when none); ``captures``: the
    windows ``--trace on-alert`` took, each named beside the alert that caused it."""
    return bullet_list((_alert_item_html(as_alert(a), captures) for a in alerts or []), cls="gpuprof-alerts",
                       title="alerts while it ran", item_cls="gpuprof-alert")


def alerts_text(alerts, captures=()) -> list[str]:
    lines = []
    for alert in alerts or []:
        record = capture_of(as_alert(alert), captures)
        lines.append(alert_text(alert) + (f" [{capture_text(record)}]" if record else ""))
    return lines


__all__ = ["alert_header_html", "alert_text", "alerts_html", "alerts_text", "as_alert", "capture_of", "capture_text"]
