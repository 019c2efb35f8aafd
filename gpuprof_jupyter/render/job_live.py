"""What ``watch(JOB_ID)`` shows of a running multi-node job: a line naming the job and its
parts, then one row per rank (host, steps so far, step time and data wait over its last
seconds, how far behind the newest rank it is), as text and as HTML. With GPU readings
(``source="prometheus=URL"``: ``runtime/jobs/node_gpus.py``) each rank's row also shows its
node's GPUs' SM use, and a table below gives every GPU's newest readings by node.

Runs in the kernel, the Jupyter server and the ``gpuprof`` command.
"""

from __future__ import annotations

from gpuprof_jupyter.core.figure import measured
from gpuprof_jupyter.core.analysis.run_figures import metric_figure, metric_unit, step_figure
from gpuprof_jupyter.core.format import MISSING, fmt_figure, fmt_figures, fmt_unit
from gpuprof_jupyter.render.html import FONT, html, table


def job_live_line(job, window_s: float) -> str:
    """``job ft-0412 [running]: 2 of 2 parts (node-a, node-b), 1 still running; last 10 s``."""
    info = job.meta.context.get("job") or {}
    parts = info.get("parts") or []
    expected = info.get("parts_expected")
    running = len(info.get("running_parts") or [])
    return (f"job {info.get('key')} [{job.status}]: {len(parts)}" + (f" of {expected}" if expected else "")
            + f" parts ({', '.join(str(p.get('host')) for p in parts)})"
            + (f", {running} still running" if running else "") + f"; per rank over its last {fmt_unit(window_s, 's')}")


def job_live_rows(rows: list[dict], gpus: dict | None = None) -> list[dict]:
    """``core/job.live_rows`` formatted: one dict per rank; with ``gpus`` (node -> its GPUs, as
    ``NodeGPUs.by_node`` gives them), the SM use of its node's GPUs."""
    out = []
    for r in rows:
        if r.get("missing"):
            row = {"rank": str(r["rank"]), "host": MISSING, "steps": "not reported yet", "step time p50": "",
                   "data wait p50": "", "behind the newest rank": ""}
        else:
            row = {"rank": str(r["rank"]), "host": str(r.get("host") or MISSING), "steps": str(r["steps"]),
                   "step time p50": _per_step(r.get("step_time_s")), "data wait p50": _per_step(r.get("data_wait_s")),
                   "behind the newest rank": _per_step(r.get("behind_s"))}
        if gpus is not None:
            mine = gpus.get(r.get("host")) or []
            row["its node's GPUs, SM"] = (fmt_figures(_gpu_figure(g, "sm_util") for g in mine) if mine
                                          else "" if r.get("missing") else "no GPU on Prometheus")
        out.append(row)
    return out


def gpu_rows(gpus: dict) -> list[dict]:
    """Every GPU's newest readings, by node (``NodeGPUs.by_node``), as typed figures."""
    return [{"node": str(node), "gpu": str(g["device"]), "SM": fmt_figure(_gpu_figure(g, "sm_util")),
             "power": fmt_figure(_gpu_figure(g, "power_w")), "memory used": fmt_figure(_gpu_figure(g, "gpu_mem_used_bytes")),
             "read": "not yet" if g["age_s"] is None else f"{_read_age(g)} ago"}
            for node, mine in sorted(gpus.items(), key=lambda kv: str(kv[0])) for g in mine]


def _gpu_figure(gpu: dict, metric: str):
    """One GPU's newest ``metric``, with the provenance Prometheus's series give it."""
    tag = gpu["tags"].get(metric)
    return metric_figure([tag] if tag else [], gpu["values"].get(metric), metric_unit(metric))


def _read_age(gpu: dict) -> str:
    """How long ago Prometheus's newest reading of this GPU was taken, by this process's clock."""
    return fmt_figure(measured(gpu["age_s"], "s", "this process's clock against Prometheus's sample time"),
                      labelled=False)


def _per_step(seconds) -> str:
    """A rank's figure in seconds, from its step records ("n/a" before it has any)."""
    return fmt_figure(step_figure(seconds, "s"))


def job_live_text(job, rows: list[dict], window_s: float, gpus: dict | None = None, gpu_line: str = "") -> str:
    lines = [job_live_line(job, window_s)]
    lines += ["  " + "; ".join(f"{k}: {v}" for k, v in row.items() if v) for row in job_live_rows(rows, gpus)]
    if gpus is not None:
        lines.append(gpu_line)
        lines += ["  " + "; ".join(f"{k}: {v}" for k, v in row.items()) for row in gpu_rows(gpus)]
    return "\n".join(lines)


def job_live_html(job, rows: list[dict], window_s: float, gpus: dict | None = None, gpu_line: str = "") -> str:
    below = html("<div>{}</div>{}", gpu_line, table(gpu_rows(gpus))) if gpus is not None else ""
    return str(html("<div style='{}'><div>{}</div>{}{}</div>", FONT, job_live_line(job, window_s),
                    table(job_live_rows(rows, gpus)), below))


def gpus_heading(url: str, notes: list[str]) -> str:
    """``GPUs through Prometheus at URL`` and what the source noted (a poll failed, ...)."""
    return f"GPUs through Prometheus at {url}" + (": " + "; ".join(notes) if notes else "")


def waiting_text(key: str) -> str:
    return f"job {key}: waiting for its first part to appear in the store"


__all__ = ["gpus_heading", "gpu_rows", "job_live_html", "job_live_line", "job_live_rows", "job_live_text", "waiting_text"]
