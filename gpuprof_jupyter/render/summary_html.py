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
from gpuprof_jupyter.core.format import fmt_bytes, fmt_energy, fmt_frac, fmt_pct, fmt_rate, fmt_seconds, fmt_setting, fmt_watts, missing

_STATUS_COLOURS = {RunStatus.OK: "good", RunStatus.ERROR: "bad", RunStatus.INTERRUPTED: "warn", RunStatus.CRASHED: "bad",
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
        rows.append({
            "device": f"{device['key']}: {device['name']}",
            "SM util mean / p95": f"{fmt_pct(s.get('sm_util_mean'))} / {fmt_pct(s.get('sm_util_p95'))}",
            "SM < 50 %": fmt_frac(s.get("sm_low_frac")),
            "mem BW util": fmt_pct(s.get("mem_bw_util_mean")),
            "power mean": fmt_watts(s.get("power_mean_w")),
            "energy": fmt_energy(s.get("energy_j")),
            "peak memory": fmt_bytes(s.get("gpu_mem_peak_bytes")),
            "sm_util is": (f"{describe_provenance(sm_tag)}; native window "
                           f"{native_window(sm_tag).resolve(meta.sampling_interval_s):g} s" if sm_tag else "not measured"),
        })
        if shares:
            rows[-1].update(share_cells(s, device["key"] in unmatched))
    return rows


def _has_shares(meta, summary) -> bool:
    """Whether the run recorded per-process attribution (own/other) for any GPU."""
    return "gpu_sharing" in meta.context or any(
        d.get(k) is not None for d in summary.get("devices", {}).values()
        for k in ("own_sm_util_mean", "own_gpu_mem_peak_bytes"))


def share_cells(figures: dict, unmatched: bool) -> dict[str, str]:
    """'SM yours / others' and 'memory yours / others' of one GPU's summary figures."""
    sm = (figures.get("own_sm_util_mean"), figures.get("other_sm_util_mean"))
    mem = (figures.get("own_gpu_mem_peak_bytes"), figures.get("other_gpu_mem_peak_bytes"))
    why = " (another PID namespace: partly unmatched)" if unmatched else ""
    if all(v is None for v in sm + mem) and unmatched:
        text = "not measured: another PID namespace"
        return {"SM yours / others": text, "memory peak yours / others": text}
    return {"SM yours / others": f"{fmt_pct(sm[0])} / {fmt_pct(sm[1])}{why}",
            "memory peak yours / others": f"{fmt_bytes(mem[0])} / {fmt_bytes(mem[1])}"}


def headline(experiment) -> list[tuple[str, str]]:
    meta, summary = experiment.meta, summary_of(experiment)
    overall, host, steps = summary.get("overall", {}), summary.get("host", {}), summary.get("steps", {})
    items = [
        ("duration", fmt_seconds(meta.duration_s)),
        ("source", meta.source + (" (SIMULATED)" if meta.simulated else "")),
        ("GPUs", str(overall.get("gpu_count", 0))),
        ("SM util mean", fmt_pct(overall.get("sm_util_mean"))),
        ("time SM < 50 %", fmt_frac(overall.get("sm_low_frac"))),
        ("energy", fmt_energy(overall.get("energy_j"))),
        ("host CPU (process tree)", fmt_pct(host.get("cpu_util_mean"))),
    ]
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
            ("throughput", fmt_rate(steps.get("samples_per_s"), " samples/s")),
            ("step time p50 / p95", f"{fmt_seconds(steps.get('step_time_p50_s'))} / {fmt_seconds(steps.get('step_time_p95_s'))}"),
            ("waiting for data", fmt_frac(steps.get("data_wait_frac"))),
        ]
        sm_window = (summary.get("metric_windows") or {}).get("sm_util") or {}
        if sm_window.get("per_step_reliable") is False:
            items.append(("per-step sm_util", f"CANNOT JUDGE: steps ({fmt_seconds(steps.get('step_time_p50_s'))} median) "
                                              f"are shorter than its {sm_window['window_s']:g} s native window or the "
                                              f"{experiment.meta.sampling_interval_s:g} s sampling interval"))
    items += serving_headline(summary)
    gaps = summary.get("gaps", {})
    if gaps.get("count"):
        items.append(("sampler gaps", f"{gaps['count']} ({fmt_seconds(gaps['total_s'])}, not interpolated)"))
    return items


def phase_rows(experiment) -> list[dict]:
    return [
        {"phase": p["name"], "entered": f"{p.get('count', 1)}x", "time": fmt_seconds(p["duration_s"]),
         "SM util mean": fmt_pct(p.get("sm_util_mean")),
         "energy": fmt_energy(p.get("energy_j"))}
        for p in summary_of(experiment).get("phases", [])
    ]


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
        table(batch_rows(summary_of(experiment))), table(phase_rows(experiment)),
        memory_html(experiment), html("<div><b>logged:</b> {}</div>", user) if user else "",
        analysis_html(experiment), trace_html(experiment),
        html("<details><summary>notes ({})</summary><ul>{}</ul></details>", len(meta.notes), notes) if notes else "")


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
            clocks.append((abs(clock["offset_s"]), f"{part['host']} {clock['offset_s'] * 1000:+.0f} ms ± "
                                                    f"{clock['error_s'] * 1000:.0f} ms"))
    said = (f"{job.get('key')} ({job.get('launcher')}): {len(parts)}" + (f" of {expected}" if expected else "")
            + f" parts ({listed(str(p['host']) for p in parts)})")
    if clocks:
        said += ("; clock offsets against " + f"{job.get('clock', {}).get('reference')}: "
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
    for row in device_rows(experiment) + rank_rows(experiment) + batch_rows(summary_of(experiment)) + phase_rows(experiment):
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
