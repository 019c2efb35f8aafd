"""The ``--trace`` window in the summary, the comparison and the report: where its time went
(render/breakdown_html.py), which operators and kernels took it, launches per step, GPU idle
gaps, and what tracing cost.

Runs in the kernel, the Jupyter server and the ``gpuprof`` command.

Reads ``summary["trace"]`` (analysis.trace_summary); HTML with a plain-text twin. Every name is
escaped (render/html.py: operator and kernel names come from the user's code and record_function labels).
"""

from __future__ import annotations

from gpuprof_jupyter.core.analysis.summary import summary_of
from gpuprof_jupyter.core.figure import measured
from gpuprof_jupyter.core.format import MISSING, fmt_figure, missing
from gpuprof_jupyter.render.breakdown_html import breakdown_html, breakdown_text
from gpuprof_jupyter.render.html import PALETTE, Markup, html, join, table

TOP_ROWS = 8
TRACE = "torch.profiler's trace of the window"


def _f(value, unit: str) -> str:
    """A figure of the traced window, measured by torch.profiler, as text."""
    return fmt_figure(measured(value, unit, TRACE))


def _us(value) -> float:
    return (value or float("nan")) / 1e6
COMPARE_ROWS = 5


def trace_of(experiment) -> dict:
    """The experiment's trace figures ({} when it had no --trace window)."""
    if not experiment.meta.trace:
        return {}
    try:
        return summary_of(experiment).get("trace") or {}
    except Exception:  # noqa: BLE001 - a view must not fail because an analysis did
        return {}


def window_facts(t: dict) -> list[str]:
    """One line each: the window, what was recorded, what it cost."""
    steps = t.get("steps") or 0
    facts = [f"{t.get('spec')}: {t.get('status')}"
             + (f", {steps} step(s) in {_f(t.get('window_s'), 'time')}" if steps else "")]
    if t.get("cpu_only"):
        facts.append("CPU activities only (no GPU activity recorded: CUDA was not initialised by the code, or no "
                     "GPU): operator times are host times")
    else:
        facts.append("CPU and CUDA activities: operators ranked by the GPU time of the kernels they launched")
    o = t.get("overhead") or {}
    if not missing(o.get("slowdown")):
        facts.append(f"cost: step time p50 {_f(o.get('step_p50_in_s'), 'time')} inside the window vs "
                     f"{_f(o.get('step_p50_out_s'), 'time')} outside ({_f(o['slowdown'], 'ratio')})")
    costs = [f"{label} {_f(o.get(key), 'time')}" for label, key in
             (("start", "start_cost_s"), ("stop", "stop_cost_s"), ("export", "export_cost_s"))
             if not missing(o.get(key))]
    if costs:
        facts.append("profiler " + ", ".join(costs))
    idle = t.get("gpu_idle")
    if idle:
        facts.append(f"GPU idle between kernels: {_f(idle.get('share'), 'share')} of the window, {idle.get('gaps')} gaps, "
                     f"median {_f(_us(idle.get('median_gap_us')), 'time')}")
    if not missing(t.get("kernels_per_step")):
        facts.append(f"{_f(round(t['kernels_per_step']), 'count')} kernel launches per step, median kernel "
                     f"{_f(_us(t.get('kernel_median_us')), 'time')}")
    if not missing(t.get("op_calls_per_step")):
        facts.append(f"{_f(round(t['op_calls_per_step']), 'count')} operator calls per step")
    if t.get("truncated"):
        facts.append("trace truncated (event cap): later events left out")
    return facts


def operator_rows(t: dict, n: int = TOP_ROWS) -> list[dict]:
    gpu = t.get("operator_time") == "cuda"
    return [{"operator": r["name"], "calls/step": _f(r.get("calls_per_step"), "count"),
             ("GPU time" if gpu else "self CPU time"): _f(r.get("cuda_s" if gpu else "self_s"), "time"),
             "share of window": _f(r.get("share"), "share")} for r in (t.get("operators") or [])[:n]]


def kernel_rows(t: dict, n: int = TOP_ROWS) -> list[dict]:
    return [{"kernel": r["name"], "calls/step": _f(r.get("calls_per_step"), "count"),
             "GPU time": _f(r.get("total_s"), "time"), "share of window": _f(r.get("share"), "share")}
            for r in (t.get("kernels") or [])[:n]]


def trace_html(experiment) -> Markup:
    """The traced-window section ("" without a window)."""
    t = trace_of(experiment)
    if not t:
        return Markup("")
    facts = join(html("<li>{}</li>", f) for f in window_facts(t))
    how = (html("merged trace with the counters: <code>gpuprof trace {} -o trace.json</code>, "
                "then open it in ui.perfetto.dev or chrome://tracing", experiment.name)
           if (experiment.meta.trace or {}).get("file") else "")
    return html("<div class='gpuprof-trace' style='margin:6px 0'><b>traced window</b> (torch.profiler)"
                "<ul style='margin:2px 0'>{}</ul>{}{}{}<div style='color:{}'>{}</div></div>",
                facts, breakdown_html(t), table(operator_rows(t)), table(kernel_rows(t)), PALETTE["muted"], how)


def trace_link_html(href: str) -> Markup:
    """The report's link to an experiment's merged trace, written beside the report."""
    return html("<p class='gpuprof-trace-link'><b>merged trace</b> (torch.profiler events + gpuprof counters, one "
                "clock): <a href='{0}' download>{0}</a> &mdash; open it in "
                "<a href='https://ui.perfetto.dev'>ui.perfetto.dev</a> (Open trace file) or chrome://tracing</p>", href)


def trace_text(experiment) -> list[str]:
    t = trace_of(experiment)
    if not t:
        return []
    lines = ["traced window (torch.profiler): " + "; ".join(window_facts(t))] + breakdown_text(t)
    for row in operator_rows(t) + kernel_rows(t):
        lines.append("  " + "; ".join(f"{k}: {v}" for k, v in row.items()))
    lines.append(f"  merged trace: gpuprof trace {experiment.name} -o trace.json (ui.perfetto.dev)")
    return lines


def trace_comparison_rows(experiments, n: int = COMPARE_ROWS) -> list[dict]:
    """Operator -> share of each experiment's window (its top ``n`` together); [] when none was traced."""
    traces = [trace_of(e) for e in experiments]
    if not any(traces):
        return []
    names: list[str] = []
    for t in traces:
        for r in (t.get("operators") or [])[:n]:
            if r["name"] not in names:
                names.append(r["name"])
    shares = [{r["name"]: r.get("share") for r in (t.get("operators") or [])} for t in traces]
    rows = [{"operator": name, **{e.name: _f(s.get(name), "share") for e, s in zip(experiments, shares)}}
            for name in names]
    rows.append({"operator": "traced window slowdown",
                 **{e.name: _f((t.get("overhead") or {}).get("slowdown"), "ratio") if t else MISSING
                    for e, t in zip(experiments, traces)}})
    return rows


def trace_comparison_html(experiments) -> Markup:
    rows = trace_comparison_rows(experiments)
    if not rows:
        return Markup("")
    return html("<h4 style='margin:6px 0 2px'>traced windows: top operators, share of each window</h4>"
                "<div class='gpuprof-trace-compare'>{}</div>", table(rows))


def trace_comparison_text(experiments) -> list[str]:
    rows = trace_comparison_rows(experiments)
    if not rows:
        return []
    return ["traced windows (share of each window):"] + [
        "  " + row["operator"] + ": " + ", ".join(f"{k} {v}" for k, v in row.items() if k != "operator")
        for row in rows]


__all__ = ["trace_comparison_html", "trace_comparison_text", "trace_html", "trace_link_html", "trace_text"]
