"""Diagnosis findings and rule results as HTML and text; shared by the summary, the
comparison and the report. Every string is escaped (render/html.py: rule text and names come from users).

Runs in the kernel, the Jupyter server and the ``gpuprof`` command.

The texts are the analysis's own: a finding or rule says what its metric measured; a rule that
could not be judged shows CANNOT JUDGE with why and how to make it judgeable, never PASS; a
verdict on a simulated metric says so.
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
                  html("<b style='color:{}'>{}</b>", PALETTE[_SEVERITY_ROLES.get(f.severity, "muted")], f.headline),
                  f.evidence, coloured(html("&rarr; {}", f.next_step), "good"))
             for f in findings]
    return bullet_list(items, cls="gpuprof-findings", title="diagnosis", item_cls="gpuprof-finding")


def findings_text(findings) -> list[str]:
    return [f"[{f.severity}] {f.headline}: {f.evidence} -> {f.next_step}" for f in findings]


_VERDICT_STYLE = {"PASS": ("pass", "good"), "FAIL": ("fail", "bad"), "CANNOT JUDGE": ("cannot-judge", "unjudged")}  # class, PALETTE role


def verdict_label(result) -> str:
    """PASS / FAIL / CANNOT JUDGE, with "(simulated)" where the metric judged was simulated."""
    return result.verdict + (" (simulated)" if result.simulated else "")


def _measured(result) -> str:
    """The result's detail, and for one that could not be judged, how to make it judgeable."""
    return result.detail + (f"; to judge it: {result.to_judge}" if result.to_judge else "")


def checks_html(results) -> Markup:
    if not results:
        return Markup("")
    rows = [(Cell(verdict_label(r), cls=f"gpuprof-check {_VERDICT_STYLE[r.verdict][0]}",
                  style=f"color:{PALETTE[_VERDICT_STYLE[r.verdict][1]]};font-weight:bold"),
             html("<code>{}</code>", r.rule), _measured(r)) for r in results]
    return html("<div class='gpuprof-checks'><b>rules</b>{}</div>", table(rows, ["result", "rule", "measured"]))


def checks_text(results) -> list[str]:
    return [f"{verdict_label(r)} {r.rule}: {_measured(r)}" for r in results]


def analysis_html(experiment) -> Markup:
    return (findings_html(experiment_findings(experiment)) + checks_html(experiment_checks(experiment))
            + alerts_html(experiment_alerts(experiment), _captures(experiment)))


def analysis_text(experiment) -> list[str]:
    return (findings_text(experiment_findings(experiment)) + checks_text(experiment_checks(experiment))
            + alerts_text(experiment_alerts(experiment), _captures(experiment)))


def _captures(experiment) -> list[dict]:
    """The windows ``--trace on-alert`` took (``meta.trace["captures"]``), [] for other runs."""
    return list((getattr(experiment.meta, "trace", None) or {}).get("captures") or [])
