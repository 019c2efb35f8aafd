"""The summary shown when a profiled cell ends: HTML with a plain-text twin.

Runs in the kernel, the Jupyter server and the ``gpuprof`` command.

Every user-provided string is escaped (render/html.py). Simulated data says so at the top.
"""

from __future__ import annotations

from gpuprof_jupyter.core.analysis.sharing import unmatched_devices
from gpuprof_jupyter.core.analysis.summary import summary_of
from gpuprof_jupyter.core.metrics import describe_provenance, native_window
from gpuprof_jupyter.core.store.experiment import RunStatus
from gpuprof_jupyter.render.findings_html import analysis_html, analysis_text
from gpuprof_jupyter.render.html import FONT, PALETTE, SIMULATED_TEXT, Markup, html, join, simulated_banner, table
from gpuprof_jupyter.render.memory_html import memory_html, memory_text
from gpuprof_jupyter.core.analysis.ranks import listed
from gpuprof_jupyter.render.ranks_table import rank_rows
from gpuprof_jupyter.render.serving import batch_rows, serving_headline
from gpuprof_jupyter.render.trace_html import trace_html, trace_text
from gpuprof_jupyter.core.analysis.run_figures import run_figure
from gpuprof_jupyter.core.figure import estimated
from gpuprof_jupyter.core.format import fmt_figure, fmt_figures, fmt_setting, fmt_unit, missing

_STATUS_COLOURS = {RunStatus.OK: "good", RunStatus.ERROR: "bad", RunStatus.INTERRUPTED: "warn", RunStatus.CRASHED: "bad", RunStatus.STUCK: "bad",
                   RunStatus.DIED: "bad", RunStatus.RUNNING: "info"}


def device_rows(experiment) -> list[dict]:
    """One dict of formatted figures per GPU, then the host; shared by the HTML and text forms."""
    meta, summary = experiment.meta, summary_of(experiment)
    shares = _has_shares(meta, summary)
    unmatched = set(unmatched_devices(meta.context))
    rows = []
    for device in meta.gpu_devices:
        s = summary.get("devices", {}).get(device["key"], {})
        sm_tag = meta.provenance.get(device["key"], {}).get("sm_util", "")
        fig = _figure_of(meta, s)
        rows.append({
            "device": f"{device['key']}: {device['name']}",
            "SM util mean / p95": fmt_figures([fig("sm_util_mean", "%"), fig("sm_util_p95", "%")]),
            "SM < 50 %": fmt_figure(fig("sm_low_frac", "share")),
            "mem BW util": fmt_figure(fig("mem_bw_util_mean", "%")),
            "power mean": fmt_figure(fig("power_mean_w", "W")),
            "energy": fmt_figure(fig("energy_j", "J")),
            "peak memory": fmt_figure(fig("gpu_mem_peak_bytes", "B")),
            "sm_util is": (f"{describe_provenance(sm_tag)}; native window "
                           f"{fmt_unit(native_window(sm_tag).resolve(meta.sampling_interval_s), 's')}" if sm_tag else "not measured"),
        })
        if shares:
            rows[-1].update(share_cells(meta, s, device["key"] in unmatched))
    return rows


def _figure_of(meta, figures: dict):
    """A function (key, unit) -> the figure ``figures[key]`` of ``meta``'s run, typed (core/figure.py)."""
    return lambda key, unit: run_figure(meta, key, figures.get(key), unit)


def _has_shares(meta, summary) -> bool:
    """Whether the run recorded per-process attribution (own/other) for any GPU."""
    return "gpu_sharing" in meta.context or any(
        d.get(k) is not None for d in summary.get("devices", {}).values()
        for k in ("own_sm_util_mean", "own_gpu_mem_peak_bytes"))


def share_cells(meta, figures: dict, unmatched: bool) -> dict[str, str]:
    """'SM yours / others' and 'memory yours / others' of one GPU's summary figures."""
    fig = _figure_of(meta, figures)
    sm = [fig("own_sm_util_mean", "%"), fig("other_sm_util_mean", "%")]
    mem = [fig("own_gpu_mem_peak_bytes", "B"), fig("other_gpu_mem_peak_bytes", "B")]
    why = " (another PID namespace: partly unmatched)" if unmatched else ""
    if not any(f.known for f in sm + mem) and unmatched:
        text = "not measured: another PID namespace"
        return {"SM yours / others": text, "memory peak yours / others": text}
    return {"SM yours / others": fmt_figures(sm) + why, "memory peak yours / others": fmt_figures(mem)}


def headline(experiment) -> list[tuple[str, str]]:
    meta, summary = experiment.meta, summary_of(experiment)
    overall, host, steps = summary.get("overall", {}), summary.get("host", {}), summary.get("steps", {})
    gpu, on_host, step = _figure_of(meta, overall), _figure_of(meta, host), _figure_of(meta, steps)
    items = [
        ("duration", fmt_figure(run_figure(meta, "duration_s", meta.duration_s, "s"))),
        ("source", meta.source + (" (SIMULATED)" if meta.simulated else "")),
        ("GPUs", (str(overall["gpu_count"]) + (" (simulated)" if meta.simulated else ""))
         if overall.get("gpu_count") else "none (host only)"),
    ]
    if overall.get("gpu_count"):  # a host-only run shows no GPU figure (not even "n/a")
        items += [("SM util mean", fmt_figure(gpu("sm_util_mean", "%"))),
                  ("time SM < 50 %", fmt_figure(gpu("sm_low_frac", "share"))),
                  ("energy", fmt_figure(gpu("energy_j", "J")))]
    items.append(("host CPU (process tree)", fmt_figure(on_host("cpu_util_mean", "%"))))
    if summary.get("job"):
        items.append(("job", job_headline(summary["job"])))
    if summary.get("ranks"):
        lowest = min(map(int, summary["ranks"]))
        items.append(("ranks", f"{len(summary['ranks'])} (steps, throughput and waits here are rank {lowest}'s; "
                               "each rank has its row)"))
    if steps.get("count"):
        items += [
            ("steps", str(steps["count"]) + (
                f" ({steps['batches']} batches: the loader fetches one batch ahead, so the first step holds two)"
                if steps.get("batches_ahead") else "")),
            ("throughput", fmt_figure(step("samples_per_s", "samples/s"))),
            ("step time p50 / p95", fmt_figures([step("step_time_p50_s", "s"), step("step_time_p95_s", "s")])),
            ("waiting for data", fmt_figure(step("data_wait_frac", "share"))),
        ]
        sm_window = (summary.get("metric_windows") or {}).get("sm_util") or {}
        if sm_window.get("per_step_reliable") is False:
            items.append(("per-step sm_util", f"CANNOT JUDGE: steps ({fmt_figure(step('step_time_p50_s', 's'))} median) "
                                              f"are shorter than its {fmt_unit(sm_window['window_s'], 's')} native window or the "
                                              f"{fmt_unit(experiment.meta.sampling_interval_s, 's')} sampling interval"))
    items += serving_headline(meta, summary)
    gaps = summary.get("gaps", {})
    if gaps.get("count"):
        items.append(("sampler gaps", f"{gaps['count']} ({fmt_figure(run_figure(meta, 'total_s', gaps['total_s'], 's'))}, "
                                      "not interpolated)"))
    return items


def phase_rows(experiment) -> list[dict]:
    meta = experiment.meta
    rows = []
    for p in summary_of(experiment).get("phases", []):
        fig = _figure_of(meta, p)
        rows.append({"phase": p["name"], "entered": f"{p.get('count', 1)}x", "time": fmt_figure(fig("duration_s", "s")),
                     "SM util mean": fmt_figure(fig("sm_util_mean", "%")), "energy": fmt_figure(fig("energy_j", "J"))})
    return rows


def render_summary_html(experiment) -> Markup:
    meta = experiment.meta
    colour = PALETTE[_STATUS_COLOURS.get(meta.status, "muted")]
    facts = join(html("<span style='margin-right:14px'><b>{}:</b> {}</span>", k, v) for k, v in headline(experiment))
    user = join((html("{} = {}", k, fmt_setting(v)) for k, v in meta.user_metrics.items()), ", ")
    notes = join(html("<li>{}</li>", n) for n in meta.notes)
    return html(
        "<div class='gpuprof-summary' style='{}'>{}"
        "<div><b>gpuprof</b> experiment <b>{}</b> <span style='color:{};font-weight:bold'>[{}]</span> "
        "<span style='color:{}'>id {}</span></div>{}"
        "<div style='margin:4px 0'>{}</div>{}{}{}{}{}{}{}{}{}</div>",
        FONT, simulated_banner() if meta.simulated else "", meta.name, colour, meta.status, PALETTE["muted"], meta.id,
        html("<div style='color:{}'>{}</div>", PALETTE["bad"], meta.error) if meta.error else "",
        facts, table(device_rows(experiment)), table(rank_rows(experiment)),
        table(batch_rows(meta, summary_of(experiment))), table(phase_rows(experiment)),
        memory_html(experiment), html("<div><b>logged:</b> {}</div>", user) if user else "",
        analysis_html(experiment), trace_html(experiment),
        html("<details><summary>notes ({})</summary><ul>{}</ul></details>", len(meta.notes), notes) if notes else "")


CLOCK_ESTIMATE = "estimated from the step ends all ranks share"  # analysis/clock.py, said once per line


def _clock_offset(clock: dict) -> str:
    """``+2.5 s ± 3 ms``: a node's estimated offset, signed, within its error bound (the line
    names the estimate's basis once, so each figure goes unlabelled)."""
    offset, error = estimated(abs(clock["offset_s"]), "s", CLOCK_ESTIMATE), estimated(clock["error_s"], "s", CLOCK_ESTIMATE)
    return f"{'-' if clock['offset_s'] < 0 else '+'}{fmt_figure(offset, labelled=False)} ± {fmt_figure(error, labelled=False)}"


def job_headline(job: dict) -> str:
    """A multi-node job in one line (``core/job.py``): its parts, each node's clock offset with
    its error bound, and what is missing or still running."""
    parts = job.get("parts") or []
    expected = job.get("parts_expected")
    clocks = []
    for part in parts:  # the nodes whose clock was corrected or could not be, largest offset first
        clock = part.get("clock") or {}
        if clock.get("offset_s") is None:
            clocks.append((float("inf"), f"{part['host']}: {clock.get('basis', 'wall clock')}"))
        elif clock.get("error_s"):
            clocks.append((abs(clock["offset_s"]), f"{part['host']} {_clock_offset(clock)}"))
    said = (f"{job.get('key')} ({job.get('launcher')}): {len(parts)}" + (f" of {expected}" if expected else "")
            + f" parts ({listed(str(p['host']) for p in parts)})")
    if clocks:
        said += (f"; clock offsets against {job.get('clock', {}).get('reference')} ({CLOCK_ESTIMATE}): "
                 + listed(text for _, text in sorted(clocks, key=lambda c: -c[0])))
    if job.get("missing_ranks"):
        said += f"; ranks never reported: {listed(job['missing_ranks'])}"
    if job.get("missing_parts"):
        said += f"; parts never reported: {listed(job['missing_parts'])}"
    if job.get("running_parts"):
        said += f"; still running: {len(job['running_parts'])} part(s)"
    return said


def render_summary_text(experiment) -> str:
    meta = experiment.meta
    lines = []
    if meta.simulated:
        lines.append(SIMULATED_TEXT)
    lines.append(f"gpuprof experiment {meta.name!r} [{meta.status}] id {meta.id}")
    if meta.error:
        lines.append(f"  {meta.error}")
    lines.append("  " + "; ".join(f"{k}: {v}" for k, v in headline(experiment)))
    for row in device_rows(experiment) + rank_rows(experiment) + batch_rows(meta, summary_of(experiment)) + phase_rows(experiment):
        lines.append("  " + "; ".join(f"{k}: {v}" for k, v in row.items()))
    lines += [f"  {line}" for line in memory_text(experiment)]
    if meta.user_metrics:
        lines.append("  logged: " + ", ".join(f"{k} = {fmt_setting(v)}" for k, v in meta.user_metrics.items()))
    lines += [f"  {line}" for line in analysis_text(experiment)]
    lines += [f"  {line}" for line in trace_text(experiment)]
    lines += [f"  note: {n}" for n in meta.notes]
    return "\n".join(lines)


def summary_bundle(experiment) -> dict:
    """A display bundle any front end can show."""
    return {"text/html": str(render_summary_html(experiment)), "text/plain": render_summary_text(experiment)}


__all__ = ["job_headline", "render_summary_html", "render_summary_text", "summary_bundle", "missing"]
