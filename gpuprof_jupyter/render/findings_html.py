"""Diagnosis findings and rule results as HTML and text; shared by the summary, the
comparison and the report. Every string is escaped (render/html.py: rule text and names come from users).

Runs in the kernel, the Jupyter server and the ``gpuprof`` command.

The texts are the analysis's own: a finding or rule says what its metric measured, and a
``per step`` result over steps shorter than its metric's window is marked unreliable.
"""

from __future__ import annotations

import weakref

from gpuprof_jupyter.render.alerts_html import alerts_html, alerts_text, as_alert
from gpuprof_jupyter.render.html import PALETTE, Cell, Markup, bullet_list, coloured, html, table

_SEVERITY_ROLES = {"high": "bad", "medium": "warn", "info": "info"}


_findings: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # a saved experiment's, diagnosed once


def experiment_findings(experiment) -> list:
    """Findings, never raising (a view must not fail because an analysis did). Each display
    renders them as HTML and as text: the diagnosis (which may read samples) runs once."""
    from gpuprof_jupyter.core.analysis.diagnosis import diagnose

    try:
        return _findings[experiment]
    except (KeyError, TypeError):
        pass
    try:
        findings = diagnose(experiment)
    except Exception:  # noqa: BLE001
        return []
    try:
        _findings[experiment] = findings
    except TypeError:  # not weakly referenceable (a test's stand-in): not kept
        pass
    return findings


def experiment_checks(experiment) -> list:
    from gpuprof_jupyter.core.analysis.rules import stored_results

    try:
        return stored_results(experiment)
    except Exception:  # noqa: BLE001
        return []


def experiment_alerts(experiment) -> list:
    """The alerts saved with the experiment (``meta.alerts``), [] if unreadable."""
    try:
        return [as_alert(a) for a in getattr(experiment.meta, "alerts", None) or []]
    except Exception:  # noqa: BLE001
        return []


def findings_html(findings) -> Markup:
    items = [html("<span data-finding='{}'>{}: {}<br/>{}</span>", f.id,
                  html("<b style='color:{}'>{}</b>", PALETTE[_SEVERITY_ROLES.get(f.severity, "muted")], f.title),
                  f.evidence, coloured(html("&rarr; {}", f.next_step), "good"))
             for f in findings]
    return bullet_list(items, cls="gpuprof-findings", title="diagnosis", item_cls="gpuprof-finding")


def findings_text(findings) -> list[str]:
    return [f"[{f.severity}] {f.title}: {f.evidence} -> {f.next_step}" for f in findings]


def _verdict(result) -> str:
    """PASS / FAIL, with "(unreliable)" where the result rests on steps shorter than the metric's window."""
    return ("PASS" if result.passed else "FAIL") + ("" if getattr(result, "reliable", True) else " (unreliable)")


def checks_html(results) -> Markup:
    if not results:
        return Markup("")
    rows = [(Cell(_verdict(r), cls=f"gpuprof-check {'pass' if r.passed else 'fail'}{'' if r.reliable else ' unreliable'}",
                  style=f"color:{PALETTE['good' if r.passed else 'bad']};font-weight:bold"),
             html("<code>{}</code>", r.rule), r.detail) for r in results]
    return html("<div class='gpuprof-checks'><b>rules</b>{}</div>", table(rows, ["result", "rule", "measured"]))


def checks_text(results) -> list[str]:
    return [f"{_verdict(r)} {r.rule}: {r.detail}" for r in results]


def analysis_html(experiment) -> Markup:
    return (findings_html(experiment_findings(experiment)) + checks_html(experiment_checks(experiment))
            + alerts_html(experiment_alerts(experiment)))


def analysis_text(experiment) -> list[str]:
    return (findings_text(experiment_findings(experiment)) + checks_text(experiment_checks(experiment))
            + alerts_text(experiment_alerts(experiment)))
