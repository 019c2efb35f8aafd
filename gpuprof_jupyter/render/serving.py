"""A serving run's figures as the summary shows them: latency percentiles, throughput, warm-up, per batch.

Runs in the kernel, the Jupyter server and the ``gpuprof`` command.

Reads the summary's ``requests`` (``core/analysis/latency.py``); shared by the HTML and text
forms of the summary (``summary_html.py``), so the report shows the same.
"""

from __future__ import annotations

from gpuprof_jupyter.core.analysis.run_figures import REQUEST_HOOK
from gpuprof_jupyter.core.figure import measured
from gpuprof_jupyter.core.format import fmt_figure, fmt_figures


def _time(value):
    return measured(value, "time", REQUEST_HOOK)


def _rate(value, unit: str):
    return measured(value, unit, REQUEST_HOOK)


def serving_headline(meta, summary: dict) -> list[tuple[str, str]]:
    """(label, text) pairs for a run with requests; [] without. Every figure is the request hook's
    measurement (``meta``: the run, for figures of another kind)."""
    r = summary.get("requests") or {}
    if not r.get("count"):
        return []
    items = []
    if summary.get("run_kind") == "training and serving":
        items.append(("run", "training and serving (optimizer steps and requests with gradients off: both are reported)"))
    kinds = ", ".join(f"{n} {kind}" for kind, n in (r.get("kinds") or {}).items())
    items.append(("requests", f"{r['count']} ({kinds}); warm-up {r.get('warmup_count', 0)} left out "
                              f"({r.get('warmup_rule', '')})"))
    quantiles = fmt_figures([_time(r.get(f"latency_{q}_s")) for q in ("p50", "p90", "p95", "p99", "max")])
    items.append(("latency p50 / p90 / p95 / p99 / max", f"{quantiles} ({r.get('timing', '')})"))
    if r.get("host_p50_s") is not None:
        items.append(("host time p50 / p99", fmt_figures([_time(r["host_p50_s"]), _time(r.get("host_p99_s"))])))
    rates = [fmt_figure(_rate(r.get("requests_per_s"), "requests/s"))]
    if r.get("samples_per_s") is not None:
        rates.append(fmt_figure(_rate(r["samples_per_s"], "samples/s")))
    if r.get("tokens_per_s") is not None:
        rates.append(fmt_figure(_rate(r["tokens_per_s"], "tokens/s")))
    items.append(("serving throughput", " · ".join(rates)))
    if r.get("ttft_p50_s") is not None:
        items.append(("time to first token p50 / p90", fmt_figures([_time(r["ttft_p50_s"]), _time(r.get("ttft_p90_s"))])))
    if r.get("warmup_latency_s"):
        items.append(("warm-up latency", fmt_figures([_time(v) for v in r["warmup_latency_s"][:5]], ", ")
                      + (" ..." if len(r["warmup_latency_s"]) > 5 else "")))
    return items


def batch_rows(meta, summary: dict) -> list[dict]:
    """One row per batch size when it varied."""
    return [{"batch size": fmt_figure(measured(row["batch"], "count", REQUEST_HOOK)), "requests": str(row["count"]),
             "latency p50 / p99": fmt_figures([_time(row["latency_p50_s"]), _time(row["latency_p99_s"])]),
             "samples/s at p50": fmt_figure(_rate(row.get("samples_per_s"), "samples/s"))}
            for row in (summary.get("requests") or {}).get("per_batch", [])]


__all__ = ["batch_rows", "serving_headline"]
