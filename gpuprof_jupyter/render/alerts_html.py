"""Alerts (``--alert``) as text and HTML: the live header's line and the saved experiment's list.

Runs in the kernel, the Jupyter server and the ``gpuprof`` command.

Which alerts reach the header, and how often, is the evaluator's job (analysis.live_alerts):
this only renders them. Every string is escaped (the rule text comes from users).
"""

from __future__ import annotations

from html import escape

from gpuprof_jupyter.core.analysis.live_alerts import Alert

HEADER_SHOWN = 2  # alerts the live header shows, newest first


def as_alert(alert) -> Alert:
    """An Alert from an Alert or its stored dict (``meta.alerts``)."""
    return alert if isinstance(alert, Alert) else Alert.from_dict(alert)


def alert_text(alert) -> str:
    """'alert at t=33.2 s [sm_util < 50 for >30% within step]: EVIDENCE -> NEXT STEP'."""
    alert = as_alert(alert)
    return f"alert at t={alert.t_s:.1f} s [{alert.rule}]: {alert.text}"


def _alert_item_html(alert: Alert) -> str:
    advice = f" <span style='color:#2e7d32'>&rarr; {escape(alert.next_step)}</span>" if alert.next_step else ""
    return (f"<b style='color:#c62828'>alert</b> t={alert.t_s:.1f} s <code>{escape(alert.rule)}</code>: "
            f"{escape(alert.evidence)}{advice}")


def alert_header_html(alerts, shown: int = HEADER_SHOWN) -> str:
    """The live header's alert lines: the ``shown`` newest, newest first ('' when none)."""
    newest = [as_alert(a) for a in list(alerts)[-shown:]][::-1] if shown > 0 else []
    return "<br>".join(f"<span class='gpuprof-alert'>{_alert_item_html(a)}</span>" for a in newest)


def alerts_html(alerts) -> str:
    """A saved experiment's alerts, in the order they fired ('' when none)."""
    if not alerts:
        return ""
    items = "".join(f"<li class='gpuprof-alert'>{_alert_item_html(as_alert(a))}</li>" for a in alerts)
    return f"<div class='gpuprof-alerts'><b>alerts while it ran</b><ul style='margin:2px 0'>{items}</ul></div>"


def alerts_text(alerts) -> list[str]:
    return [alert_text(a) for a in alerts or []]


__all__ = ["alert_header_html", "alert_text", "alerts_html", "alerts_text", "as_alert"]
