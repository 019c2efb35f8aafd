"""What ``watch(JOB_ID)`` shows of a running multi-node job: a line naming the job and its
parts, then one row per rank (host, steps so far, step time and data wait over its last
seconds, how far behind the newest rank it is), as text and as HTML.

Runs in the kernel, the Jupyter server and the ``gpuprof`` command.
"""

from __future__ import annotations

from gpuprof_jupyter.core.analysis.run_figures import step_figure
from gpuprof_jupyter.core.format import fmt_figure
from gpuprof_jupyter.render.html import FONT, html, table


def job_live_line(job, window_s: float) -> str:
    """``job ft-0412 [running]: 2 of 2 parts (node-a, node-b), 1 still running; last 10 s``."""
    info = job.meta.context.get("job") or {}
    parts = info.get("parts") or []
    expected = info.get("parts_expected")
    running = len(info.get("running_parts") or [])
    return (f"job {info.get('key')} [{job.status}]: {len(parts)}" + (f" of {expected}" if expected else "")
            + f" parts ({', '.join(str(p.get('host')) for p in parts)})"
            + (f", {running} still running" if running else "") + f"; per rank over its last {window_s:g} s")


def job_live_rows(rows: list[dict]) -> list[dict]:
    """``core/job.live_rows`` formatted: one dict per rank."""
    return [{"rank": str(r["rank"]), "host": "n/a", "steps": "not reported yet", "step time p50": "",
             "data wait p50": "", "behind the newest rank": ""} if r.get("missing") else
            {"rank": str(r["rank"]), "host": str(r.get("host") or "n/a"), "steps": str(r["steps"]),
             "step time p50": _per_step(r.get("step_time_s")), "data wait p50": _per_step(r.get("data_wait_s")),
             "behind the newest rank": _per_step(r.get("behind_s"))} for r in rows]


def _per_step(seconds) -> str:
    """A rank's figure in seconds, from its step records ("n/a" before it has any)."""
    return fmt_figure(step_figure(seconds, "s"))


def job_live_text(job, rows: list[dict], window_s: float) -> str:
    lines = [job_live_line(job, window_s)]
    lines += ["  " + "; ".join(f"{k}: {v}" for k, v in row.items() if v) for row in job_live_rows(rows)]
    return "\n".join(lines)


def job_live_html(job, rows: list[dict], window_s: float) -> str:
    return str(html("<div style='{}'><div>{}</div>{}</div>", FONT, job_live_line(job, window_s),
                    table(job_live_rows(rows))))


def waiting_text(key: str) -> str:
    return f"job {key}: waiting for its first part to appear in the store"


__all__ = ["job_live_html", "job_live_line", "job_live_rows", "job_live_text", "waiting_text"]
