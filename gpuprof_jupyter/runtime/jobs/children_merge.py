"""What the run's child processes said, into the run, after their listener closed.

Runs in any process that holds a run: the kernel, or ``gpuprof run``.

``merge_children`` takes each child's goodbye (``children_listener.Child.final``): its notes,
phases and ``log()`` values, one entry per rank in ``context.ranks``, the job's part completed
from what the ranks said (``job_from_ranks``) and, when the run's own process reported no
steps, the primary child's settings as the run's; ``save_rank_traces`` keeps each traced
rank's window (``gpuprof run --trace``) in the experiment.
"""

from __future__ import annotations

import json
import os

from gpuprof_jupyter.core.store.directory import TRACE_NAME
from gpuprof_jupyter.core.torch_defaults import merge_recorded
from gpuprof_jupyter.runtime.hooks.activity import ActivityLog, PhaseRecord
from gpuprof_jupyter.runtime.jobs.children_listener import ChildListener
from gpuprof_jupyter.runtime.record.used_settings import serving_batch_size


def merge_children(listener: ChildListener, meta, activity: ActivityLog, notes: list[str], error: str | None) -> str | None:
    """What the children said, into the run (after ``listener.close()``): their notes, phases,
    ``log()`` values (the run's own process, then the lowest rank, win), one entry per rank in
    ``context.ranks`` (its process, devices, steps, settings, error), and, when the run's own
    process reported no steps, the primary child's settings and step origin as the run's.
    Returns ``error`` naming the ranks that failed (or as it was)."""
    children = listener.children
    notes.extend(n for n in listener.notes if n not in notes)
    if not children:
        return error
    several = len(children) > 1
    ranks = {}
    for child in children:
        final, hello = child.final or {}, child.hello
        notes.extend(f"gpuprof: {child.label}: {n.removeprefix('gpuprof: ')}" for n in final.get("notes") or ())
        for p in final.get("phases") or ():
            activity.phases.append(PhaseRecord((f"{child.label}: " if several else "") + p["name"], p["start_s"], p["end_s"]))
        for key, value in (final.get("user_metrics") or {}).items():
            activity.user_metrics.setdefault(key, value)
        earlier = ranks.get(str(child.rank))  # an earlier attempt of this rank (an elastic restart)
        ranks[str(child.rank)] = {
            "pid": hello.get("pid"), "local_rank": hello.get("local_rank"), "world_size": hello.get("world_size"),
            **{k: hello[k] for k in ("host", "node_rank", "restart_count") if hello.get(k) is not None},
            "cuda_visible_devices": hello.get("cuda_visible_devices"), "device": final.get("device"),
            "steps": len(child.activity.steps), "steps_from": child.activity.steps_origin,
            "params": final.get("params") or {}, "error": final.get("error"),
            "ended": "error" if final.get("error") else ("ok" if child.final is not None else "without goodbye"),
        }
        if hello.get("forked_from") is not None:  # a fork of a child: its own key, its parent named
            ranks[str(child.rank)]["forked_from"] = hello["forked_from"]
        if earlier is not None:
            entry = ranks[str(child.rank)]
            entry["attempts"] = earlier.get("attempts", 1) + 1
            entry["steps"] += earlier["steps"]
    meta.context["ranks"] = ranks
    job_from_ranks(meta.context, [c.hello for c in children])
    meta.context["training_hooks"] = f"installed in {len(children)} child process(es)"
    primary = listener.primary()
    if primary is not None and not activity.steps:
        final = primary.final or {}
        recorded = {**serving_batch_size(primary.activity.requests.records), **(final.get("params") or {})}
        merge_recorded(meta, recorded, final.get("torch_filled") or ())
        meta.context["steps_from"] = primary.activity.steps_origin
        if isinstance(final.get("memory"), dict):  # where the primary rank's memory went (runtime.hooks.memory_hooks)
            meta.context["memory"] = final["memory"]
        if several:
            meta.context["steps_rank"] = primary.rank
    low = [{"rank": c.rank, **c.final["memory_history"]} for c in children
           if isinstance((c.final or {}).get("memory_history"), dict)]
    if low:  # --memory-history: the ranks whose headroom ran low, each with its snapshot (runtime.hooks.oom_record)
        meta.context["memory_history"] = {"low_headroom": low}
    died = [c.final["oom"] for c in children if isinstance((c.final or {}).get("oom"), dict)]
    if died:  # out of memory: the first child's explanation (analysis.oom)
        meta.context["oom"] = died[0]
    failed = [c for c in children if (c.final or {}).get("error")]
    for child in failed:
        notes.append(f"gpuprof: {child.label} (pid {child.hello.get('pid')}) failed: {child.final['error']}")
    if failed and error:
        error = f"{error}; " + "; ".join(f"{c.label} failed: {c.final['error']}" for c in failed)
    return error


def job_from_ranks(context: dict, hellos: list[dict]) -> None:
    """The part's job (``context["job"]``, set by ``gpuprof run`` from its command) completed
    by what its ranks said: the node's rank (``GROUP_RANK``: torchrun's rendezvous assigns it),
    the restart count, the host; a job only the ranks named (a launcher the agent did not
    recognise) becomes the part's job too."""
    from gpuprof_jupyter.core.job_identity import host_name

    hellos = [h for h in hellos if h.get("forked_from") is None]
    said = [h for h in hellos if h.get("job")]
    job = context.get("job")
    if job is None and not said:
        return  # no job's part: a run on one machine
    if job is None:
        # a launcher the agent's command does not show: Ray Train's workers, a torchrun started by a script
        job = context["job"] = {"id": said[0]["job"], "step": None, "key": said[0]["job"],
                                "launcher": said[0].get("launcher") or "torchrun", "host": host_name(),
                                "node_rank": None, "part": None, "parts": None}
    nodes = sorted({h["node_rank"] for h in hellos if h.get("node_rank") is not None})
    if len(nodes) == 1:
        job["node_rank"] = nodes[0]
        if job.get("launcher") in ("torchrun", "ray"):
            job["part"] = nodes[0]
    restarts = [h["restart_count"] for h in hellos if h.get("restart_count") is not None]
    if restarts:
        job["restart_count"] = max(restarts)
    job["ranks"] = sorted({h["rank"] for h in hellos if h.get("rank") is not None})
    sizes = [h["world_size"] for h in hellos if h.get("world_size")]
    if sizes:
        job["world_size"] = max(sizes)


def save_rank_traces(listener: ChildListener, store, meta, notes: list[str]) -> None:
    """``gpuprof run --trace``: each traced rank's window into the experiment, the lowest
    rank's as its trace (``trace.json.gz``), the others' as ``trace-rank<N>.json.gz``, all listed
    in ``meta.trace["ranks"]`` (``Experiment.rank_traces``)."""
    import gzip

    ranks: dict[str, dict] = {}
    for child in listener.children:
        info = dict((child.final or {}).get("trace") or {})
        if not info:
            continue
        path = info.pop("file", None)
        if path and os.path.dirname(path) == listener.folder and os.path.exists(path):
            try:
                with gzip.open(path, "rt", encoding="utf-8") as f:
                    trace = json.load(f)
                info["file"] = store.save_trace(meta, trace, TRACE_NAME if not any(
                    r.get("file") for r in ranks.values()) else f"trace-rank{child.rank}.json.gz")
            except (OSError, ValueError, EOFError) as exc:
                notes.append(f"gpuprof: {child.label}'s trace could not be kept ({type(exc).__name__}: {exc})")
        ranks[str(child.rank)] = info
    if ranks:
        first = next((info for info in ranks.values() if info.get("file")), next(iter(ranks.values())))
        meta.trace = {**first, "ranks": ranks}


__all__ = ["job_from_ranks", "merge_children", "save_rank_traces"]
