"""The live header: the run's name, devices and source, current values per device, this kernel's
share, steps, requests, ranks, gaps and alerts, as HTML (and each line's text).

Runs in the kernel, the Jupyter server and the ``gpuprof`` command (the live view in
``notebook/live/dashboard.py`` gathers what it shows, from the latest values the sampler process
sends and the steps only the kernel sees, and displays this module's HTML).
"""

from __future__ import annotations

import itertools

import numpy as np

from gpuprof_jupyter.core.figure import Figure, measured
from gpuprof_jupyter.core.format import MISSING, as_number, fmt_figure, fmt_figures, fmt_gap, fmt_unit
from gpuprof_jupyter.core.metrics import describe_provenance
from gpuprof_jupyter.core.plots.spec import PlotSpec
from gpuprof_jupyter.render.alerts_html import alert_header_html
from gpuprof_jupyter.render.html import Markup, coloured, html, join, simulated_badge


LIVE = "the sampler's latest reading"
STEP_HOOKS = "the step hooks (last steps)"
REQUEST_HOOK = "the request hook (last requests)"


def current_values_text(spec: PlotSpec, latest: dict) -> list[str]:
    """Per device: 'gpu0 SM 93 % · BW 51 % · 385 W · 14.5 GiB/40.0 GiB' ('14.5 GiB' when the total
    is not known); a simulated GPU's values say "(simulated)" once per device."""
    parts = []
    by_device: dict[str, list[str]] = {}
    short = {"sm_util": "SM", "mem_bw_util": "BW", "power_w": "", "gpu_mem_used_bytes": "", "cpu_util": "CPU"}
    for s in spec.series():
        if s.metric not in short:
            continue
        value = as_number(latest.get(s.device, {}).get(s.metric))
        # the host's figures are measured even on a simulated run; the label goes once, at the device's end
        sim = spec.simulated and not _is_host(s.device)

        def reading(v, unit: str, sim: bool = sim) -> str:  # labelled once, at the device's end
            return fmt_figure(Figure(v, unit, "simulated" if sim else "measured", LIVE), labelled=False)

        if value is None:
            text = MISSING
        elif s.metric == "power_w":
            text = reading(value, "W")
        elif s.metric == "gpu_mem_used_bytes":
            total = as_number(latest.get(s.device, {}).get("gpu_mem_total_bytes"))
            text = f"{reading(value, 'B')}/{reading(total, 'B')}" if total else reading(value, "B")
        else:
            text = f"{short[s.metric]} {reading(value, '%')}"
        by_device.setdefault(s.device, []).append(text)
    for device, values in latest.items():
        share = share_text(values)
        if share:
            by_device.setdefault(device, []).append(share)
    for device, items in by_device.items():
        label = " (simulated)" if spec.simulated and not _is_host(device) else ""  # once for the device's readings
        parts.append(f"{device} " + " · ".join(items) + label)
    return parts


def _is_host(device: str) -> bool:
    """The host's readings: ``host``, or ``HOST/host`` in a multi-node job (core/job.py)."""
    return device == "host" or device.endswith("/host")


def share_text(values: dict) -> str:
    """This kernel's share of one GPU against other processes: 'yours SM 60 % / others 25 %,
    mem 3.0 / 5.0 GiB'; '' when not measured (no attribution source, MIG, or not matched)."""
    own_sm, other_sm = as_number(values.get("own_sm_util")), as_number(values.get("other_sm_util"))
    own_mem, other_mem = as_number(values.get("own_gpu_mem_bytes")), as_number(values.get("other_gpu_mem_bytes"))
    items = []
    by = "NVML's per-process readings"
    if own_sm is not None and other_sm is not None:
        items.append(f"SM {fmt_figure(measured(own_sm, '%', by))} / others {fmt_figure(measured(other_sm, '%', by))}")
    if own_mem is not None and other_mem is not None:
        items.append(f"mem {fmt_figures([measured(own_mem, 'B', by), measured(other_mem, 'B', by)])}")
    return ("yours " + ", ".join(items)) if items else ""


def rank_step_times(children, now_s: float, window_s: float = 10.0) -> str:
    """``step time per rank (last 10 s): 0 238 ms · 1 239 ms`` for a run whose child processes
    report steps (``runtime/jobs/children_listener.ChildListener``); "" with fewer than two."""
    times = []
    for child in list(children.children):
        facts = step_facts(child.activity.steps, now_s, window_s)
        if facts and facts.get("steps_per_s"):
            times.append(f"{child.rank} {fmt_figure(measured(1 / facts['steps_per_s'], 's', STEP_HOOKS))}")
    return f"step time per rank (last {fmt_unit(window_s, 's')}): " + " · ".join(times) if len(times) > 1 else ""


def step_facts(steps, now_s: float, window_s: float = 10.0) -> dict | None:
    """Throughput and data-wait share over the last ``window_s`` of reported steps."""
    cutoff = now_s - window_s
    recent = []
    for s in itertools.islice(reversed(steps), 2000):  # newest first; never copies the whole list
        if s.t_end_s < cutoff:
            break  # steps are recorded in the order they end
        recent.append(s)
    if not recent:
        return None
    span = sum(s.duration_s for s in recent)
    wait = sum(s.wait_s for s in recent)
    samples = [s.n_samples for s in recent if s.n_samples == s.n_samples]
    out = {"steps_per_s": len(recent) / span if span > 0 else None,
           "data_wait_frac": wait / span if span > 0 else None, "count": len(steps)}
    if samples and span > 0:
        out["samples_per_s"] = sum(samples) / span
    return out


def steps_text(facts: dict) -> str:
    """'steps: 120 · throughput 528.4 samples/s · waiting for data 12 % (last 10 s)' (``step_facts``)."""
    if facts.get("samples_per_s"):
        rate = fmt_figure(measured(facts["samples_per_s"], "samples/s", STEP_HOOKS))
    elif facts.get("steps_per_s"):
        rate = fmt_figure(measured(facts["steps_per_s"], "steps/s", STEP_HOOKS))
    else:
        rate = MISSING
    return (f"steps: {facts['count']} · throughput {rate} · waiting for data "
            f"{fmt_figure(measured(facts.get('data_wait_frac'), 'share', STEP_HOOKS))} (last 10 s)")


def request_text(requests, now_s: float, window_s: float = 10.0) -> str:
    """``requests: 412 · latency p50 12.1 ms · p99 30.4 ms · 81.3 req/s (last 10 s)`` from the
    serving requests completed so far (``runtime.record.request_log``); "" when there are none."""
    recent = []
    for r in itertools.islice(reversed(requests), 5000):  # newest first; never copies the whole list
        if r.t_start_s < now_s - window_s:
            break
        if r.complete:
            recent.append(r)
    if not requests:
        return ""
    if not recent:
        return f"requests: {len(requests)} (none in the last {fmt_unit(window_s, 's')})"
    latency = np.array([r.latency_s for r in recent])
    p50, p99 = np.percentile(latency, [50, 99])
    span = max(r.t_start_s + max(r.host_s, r.latency_s) for r in recent) - min(r.t_start_s for r in recent)
    rate = (f" · {fmt_figure(measured(len(recent) / span, 'requests/s', REQUEST_HOOK))}"
            if span > 0 and len(recent) > 1 else "")
    timing = " (CUDA events)" if all(r.cuda for r in recent) else ""
    p50, p99 = (fmt_figure(measured(float(v), "time", REQUEST_HOOK)) for v in (p50, p99))
    return (f"requests: {len(requests)} · latency{timing} p50 {p50} · p99 {p99}"
            f"{rate} (last {fmt_unit(window_s, 's')})")


def device_names(gpus: list[dict]) -> str:
    """'gpu0: A100' or, for many alike, '8 x A100 (gpu0-gpu7)'."""
    if not gpus:
        return "no GPU"
    names: dict[str, list[str]] = {}
    for d in gpus:
        names.setdefault(d["name"], []).append(d["key"])
    parts = []
    for name, keys in names.items():
        parts.append(f"{keys[0]}: {name}" if len(keys) == 1 else f"{len(keys)} x {name} ({keys[0]}-{keys[-1]})")
    return ", ".join(parts)


def header_fixed_html(meta) -> tuple[Markup, Markup]:
    """The header's first line and the start of its second, which do not change during a run
    (the live view builds them once): the name and devices, the source and what sm_util is."""
    sim = meta.simulated
    tags = sorted({t for d in meta.gpu_devices for m, t in meta.provenance.get(d["key"], {}).items() if m == "sm_util"})
    prov = "; ".join(describe_provenance(t) for t in tags) or "not measured"
    return (html("{}<b>gpuprof</b> <b>{}</b> · {}", html("{} ", simulated_badge()) if sim else "", meta.name,
                 device_names(meta.gpu_devices)),
            html("source: {}{} · sm_util is {} · elapsed ", meta.source, " (simulated)" if sim else "", prov))


def live_header_html(fixed: tuple[Markup, Markup], elapsed_s: float, spec: PlotSpec | None, latest: dict, steps,
                     requests, children, gaps: list[tuple[float, float]], alerts_fired, failed: str | None) -> str:
    """The live header as HTML, one line a part: ``fixed`` (``header_fixed_html``) and the time
    elapsed, the current values (``spec`` None: none yet), the last steps (``steps``, this
    process's or a rank's), the serving requests (``requests`` None: no request log), the ranks'
    step times (``children`` None: no children), the recorded gaps, the alerts fired, and why the
    view failed (``failed``)."""
    first, second = fixed
    parts = [first, second + fmt_figure(measured(elapsed_s, "s", "the run's clock"))]
    if latest and spec is not None:
        parts.append(" | ".join(current_values_text(spec, latest)))
    facts = step_facts(steps, elapsed_s) if steps else None
    if facts:
        parts.append(steps_text(facts))
    serving = request_text(requests, elapsed_s) if requests is not None else ""
    if serving:
        parts.append(serving)
    ranks = rank_step_times(children, elapsed_s) if children is not None else ""
    if ranks:
        parts.append(ranks)
    if gaps:
        last = gaps[-1]
        total = fmt_figure(measured(sum(e - s for s, e in gaps), "s", "the sampler's recorded gaps"))
        parts.append(coloured(f"{fmt_gap(last[0], last[1])} ({len(gaps)} gap(s), {total}, not interpolated)", "gap"))
    if alerts_fired:
        parts.append(alert_header_html(alerts_fired))
    if failed:
        parts.append(coloured(f"dashboard: {failed}", "bad"))
    return str(html("<div class='gpuprof-live-header' style='font-family:sans-serif;font-size:12px;line-height:1.4'>"
                    "{}</div>", join(parts, "<br>")))


__all__ = ["current_values_text", "device_names", "header_fixed_html", "live_header_html", "rank_step_times",
           "request_text", "share_text", "step_facts", "steps_text"]
