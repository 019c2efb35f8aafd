"""A multi-node job read as one experiment: its parts found in the store and put on one clock.

Runs in any process that reads the store (core): the kernel's ``load()``, the ``gpuprof``
command, the Jupyter server.

Each node's ``gpuprof run`` (or each rank's, under ``srun``) saves its own experiment, a *part*,
whose ``context["job"]`` names the job (``core/job_identity.py``) and its place in it. Parts
are written by their own agents only, each in its own directory, so nodes sharing a file
system never write the same file, and copying each node's store folder into one store gives
the same job. ``load_job(store, key)`` reads the parts (``key``: the job's id; a Slurm job's
``4242`` takes its latest step, ``4242.0`` that step) and makes one in-memory ``Experiment``:

* steps: every rank's, keyed by its global rank, with a ``host`` column; times on one clock
  (the parts' start times, then each node's offset estimated from the step ends every rank
  shares: ``analysis/clock.py``), in seconds since the earliest part started;
* samples: every part's, devices named ``HOST/gpuN`` (``HOST/host`` for the host's figures);
* ``context["ranks"]``: each rank with its ``host`` and ``node_rank``; ``context["job"]``: the
  parts (host, node rank, status, clock offset and error), the ranks and parts expected but
  missing, earlier attempts of a part (a node's agent started again for the same job);
* the summary computed from all of it (``summary["job"]`` repeats the job's context).

A part saved again for the same job and place (the same node rank, or Slurm task) replaces the
earlier one, which is listed as an earlier attempt.
"""

from __future__ import annotations

from datetime import datetime, timezone

from gpuprof_jupyter.core.analysis.clock import node_offsets
from gpuprof_jupyter.core.analysis.ranks import listed
from gpuprof_jupyter.core.store.columns import Columns
from gpuprof_jupyter.core.store.directory import Store, writer_alive
from gpuprof_jupyter.core.store.experiment import OWN_RANK, Experiment, ExperimentMeta, RunStatus


def part_entries(store: Store, key: str, entries=None) -> list:
    """The index entries of job ``key``'s parts, oldest first: those whose job key is ``key``;
    else, a Slurm job named without its step, those of its latest step. [] when none."""
    entries = store.entries() if entries is None else entries
    exact = [e for e in entries if e.job == key]
    if exact:
        return exact
    steps = [e for e in entries if e.job and e.job.startswith(key + ".") and "." not in e.job[len(key) + 1:]]
    if not steps:
        return []
    latest = steps[-1].job  # entries are oldest first
    return [e for e in steps if e.job == latest]


def _place(meta: ExperimentMeta):
    job = meta.context.get("job") or {}
    return job.get("part") if job.get("part") is not None else job.get("host") or meta.id


def _epoch(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


def load_job(store: Store, key: str, entries=None, *, live: bool = False) -> Experiment | None:
    """Job ``key`` as one experiment (module docstring), or None when no part names it.
    ``live``: steps and the job's context only (no samples, no summary), for ``watch``."""
    found = part_entries(store, key, entries)
    if not found:
        return None
    metas, earlier = {}, []
    for entry in found:  # oldest first: a later part at the same place replaces an earlier attempt
        try:
            meta = store.read_meta(entry.id)
        except KeyError:
            continue
        place = _place(meta)
        if place in metas:
            earlier.append(metas[place])
        metas[place] = meta
    if not metas:
        return None
    parts = [store.load_meta(m) for m in sorted(metas.values(), key=lambda m: (_sort_key(_place(m)), m.started_at))]
    return _assemble(parts, earlier, live)


def _sort_key(place):
    return (0, place, "") if isinstance(place, int) else (1, 0, str(place))


def _assemble(parts: list[Experiment], earlier: list[ExperimentMeta], live: bool = False) -> Experiment:
    import numpy as np
    import pandas as pd

    from gpuprof_jupyter.core.analysis.summary import summary_of

    first = parts[0].meta
    job0 = first.context["job"]
    hosts = {p.id: (p.meta.context.get("job") or {}).get("host") or p.meta.host or p.id for p in parts}
    steps_by_part = {p.id: _rank_steps(p) for p in parts}
    offsets, shift, start = _one_clock(parts, steps_by_part)

    steps, samples, devices, ranks, notes, gaps = {}, [], [], {}, [], []
    for part in parts:
        pid, host, job = part.id, hosts[part.id], part.meta.context.get("job") or {}
        for rank, columns in steps_by_part[pid].items():  # numpy, never a DataFrame per rank (512 ranks)
            steps[rank] = Columns({**columns.arrays, "t_end_s": columns["t_end_s"] + shift[pid],
                                   "rank": np.full(len(columns), rank, dtype="int64"),
                                   "host": np.full(len(columns), host, dtype=object)})
        frame = part.samples if not live else ()
        if len(frame):
            offset = (offsets.get(pid) and offsets[pid].offset_s) or 0.0
            samples.append(frame.assign(t=frame["t"] + shift[pid], wall_time=frame["wall_time"] - offset,
                                        device=host + "/" + frame["device"].astype(str)))
        devices += [{**d, "key": f"{host}/{d.get('key')}", "host": host, "node_rank": job.get("node_rank")}
                    for d in part.meta.devices]
        for key, info in (part.meta.context.get("ranks") or {}).items():
            if int(key) in steps_by_part[pid] or key not in ranks:
                ranks[key] = {**info, "host": info.get("host") or host,
                              "node_rank": info.get("node_rank", job.get("node_rank")), "part": pid}
        for rank in steps_by_part[pid]:  # a running part says who its ranks are only at its end
            ranks.setdefault(str(rank), {"host": host, "node_rank": job.get("node_rank"), "part": pid})
        notes += [f"{host}: {n}" for n in part.meta.notes]
        gaps += [[g[0] + shift[pid], g[1] + shift[pid], *g[2:]] for g in part.meta.gaps]
    job = _job_context(parts, earlier, offsets, hosts, ranks)
    notes += job["problems"]
    meta = ExperimentMeta(
        id=job0["key"], name=_common(p.meta.name for p in parts) or job0["key"], status=_status(parts),
        started_at=datetime.fromtimestamp(start, timezone.utc).isoformat(timespec="milliseconds"),
        ended_at=max((p.meta.ended_at or "" for p in parts), default="") or None,
        interval_s=first.interval_s, source=_common(p.meta.source for p in parts) or first.source,
        simulated=any(p.meta.simulated for p in parts), devices=devices,
        provenance={f"{hosts[p.id]}/{k}": v for p in parts for k, v in p.meta.provenance.items()},
        units={k: v for p in parts for k, v in p.meta.units.items()}, notes=notes, gaps=gaps,
        params=dict(first.params), user_metrics=dict(first.user_metrics),
        context={"job": job, "ranks": dict(sorted(ranks.items(), key=lambda kv: int(kv[0]))),
                 "command": first.context.get("command")},
        error="; ".join(f"{hosts[p.id]}: {p.meta.error}" for p in parts if p.meta.error) or None, host=None,
    )
    ends_at = [float(f["t_end_s"].max()) for f in steps.values() if len(f)]
    meta.duration_s = max([s + (p.meta.duration_s or 0.0) for p, s in ((p, shift[p.id]) for p in parts)] + ends_at)
    sample_frame = pd.concat(samples, ignore_index=True) if samples else None
    experiment = Experiment.of_rank_columns(meta, dict(sorted(steps.items())), samples=sample_frame)
    meta.summary = {"job": job} if live else {**summary_of(experiment), "job": job}
    if not live:
        meta.checks = _job_checks(experiment, parts)
    return experiment


def _job_checks(job: Experiment, parts: list[Experiment]) -> list[dict]:
    """Every part's stored rules (each once, in the parts' order) judged again on the whole job:
    a part judged only its own node's ranks, the job's gate is the job's (a per-step rule per
    rank, naming its host)."""
    from gpuprof_jupyter.core.analysis.rules import evaluate_rules

    rules = list(dict.fromkeys(c["rule"] for p in parts for c in p.meta.checks or () if c.get("rule")))
    return [r.to_dict() for r in evaluate_rules(job, rules)]


def live_rows(job: Experiment, window_s: float = 10.0) -> list[dict]:
    """What ``watch`` shows of a job, one row per global rank: its host, node rank, steps so far,
    median step time and data wait over its last ``window_s`` of steps, and how long ago (s,
    on the job's clock) its last step ended against the newest of any rank; the ranks expected
    but not reported yet, as rows of their own (``missing``)."""
    import numpy as np

    info = job.meta.context.get("ranks") or {}
    frames = job.rank_steps()
    newest = max((float(f["t_end_s"].max()) for f in frames.values() if len(f)), default=0.0)
    rows = []
    for rank, frame in sorted(frames.items()):
        ends = frame["t_end_s"].to_numpy()
        recent = frame[ends >= ends.max() - window_s] if len(frame) else frame
        rank_info = info.get(str(rank)) or {}
        rows.append({"rank": rank, "host": rank_info.get("host"), "node_rank": rank_info.get("node_rank"),
                     "steps": len(frame),
                     "step_time_s": float(np.median(recent["duration_s"])) if len(recent) else None,
                     "data_wait_s": float(np.median(recent["wait_s"])) if len(recent) else None,
                     "behind_s": newest - float(ends.max()) if len(frame) else None})
    rows += [{"rank": rank, "missing": True} for rank in (job.meta.context.get("job") or {}).get("missing_ranks") or ()]
    return rows


def _one_clock(parts: list[Experiment], steps_by_part: dict) -> tuple[dict, dict, float]:
    """Each node's clock offset (``analysis/clock.node_offsets``, against the first part with
    steps), each part's shift onto the job's timeline (s: its start as its clock says, less its
    offset, since the earliest corrected start) and that start (UNIX s)."""
    import numpy as np

    starts = {p.id: _epoch(p.meta.started_at) for p in parts}
    t0 = min(starts.values())
    ends = {pid: {r: f["t_end_s"] + starts[pid] - t0 for r, f in ranks.items()}
            for pid, ranks in steps_by_part.items() if ranks}
    durations = [f["duration_s"] for ranks in steps_by_part.values() for f in ranks.values()]
    step_time = float(np.median(np.concatenate(durations))) if durations and sum(map(len, durations)) else 0.0
    reference = next((p.id for p in parts if p.id in ends), parts[0].id)
    offsets = node_offsets(ends, reference, step_time) if ends else {}
    shift = {pid: starts[pid] - t0 - ((offsets.get(pid) and offsets[pid].offset_s) or 0.0) for pid in starts}
    origin = min(shift.values())
    return offsets, {pid: s - origin for pid, s in shift.items()}, t0 + origin


def _rank_steps(part: Experiment) -> dict:
    """rank -> a part's steps as ``Columns`` (its ranks'; the agent's own process trains nothing
    under ``gpuprof run``: its steps count only where no rank reported, as the part's one rank)."""
    ranks = {r: f for r, f in part.rank_step_columns().items() if r != OWN_RANK and len(f)}
    if not ranks:
        steps = part.all_step_columns()
        if not len(steps):
            return {}
        job = part.meta.context.get("job") or {}
        ranks = {(job.get("ranks") or [job.get("part") or 0])[0]: steps}
    return {r: Columns({k: v for k, v in f.arrays.items() if k != "rank"}) for r, f in ranks.items()}


def _job_context(parts, earlier, offsets, hosts, ranks) -> dict:
    """What ``context["job"]`` holds: the parts, the clock, and what is missing or running."""
    job0 = parts[0].meta.context["job"]
    described = []
    for part in parts:
        job, offset = part.meta.context.get("job") or {}, offsets.get(part.id)
        running = part.meta.status == RunStatus.RUNNING and writer_alive(part.meta)
        described.append({"id": part.id, "host": hosts[part.id], "node_rank": job.get("node_rank"),
                       "part": job.get("part"), "status": RunStatus.RUNNING if running else part.meta.status,
                       "ranks": sorted(int(r) for r, i in ranks.items() if i.get("part") == part.id),
                       "restart_count": job.get("restart_count"),
                       "clock": offset.as_dict() if offset else {"offset_s": None, "error_s": None,
                                                                 "basis": "no steps: wall clocks trusted"}})
    world = max([i.get("world_size") or 0 for i in ranks.values()]
                + [(p.meta.context.get("job") or {}).get("world_size") or 0 for p in parts])
    expected = max([(p.meta.context.get("job") or {}).get("parts") or 0 for p in parts])
    places = {p.get("part") for p in described}
    missing_ranks = [r for r in range(world) if str(r) not in ranks]
    missing_parts = [i for i in range(expected) if i not in places] if all(isinstance(x, int) for x in places) else []
    problems = []
    if missing_parts:
        problems.append(f"gpuprof: part(s) {listed(missing_parts)} of {expected} never reported "
                        "(their nodes' gpuprof run saved nothing in this store)")
    if missing_ranks:
        problems.append(f"gpuprof: rank(s) {listed(missing_ranks)} of {world} never reported")
    bounds = [p["clock"]["error_s"] for p in described if p["clock"].get("error_s") is not None]
    return {"id": job0.get("id"), "step": job0.get("step"), "key": job0.get("key"), "launcher": job0.get("launcher"),
            "parts": described, "parts_expected": expected or None, "world_size": world or None,
            "missing_ranks": missing_ranks, "missing_parts": missing_parts,
            "running_parts": [p["id"] for p in described if p["status"] == RunStatus.RUNNING],
            "earlier_attempts": [m.id for m in earlier],
            "clock": {"reference": hosts[parts[0].id], "error_s": max(bounds) if bounds else None},
            "problems": problems}


def _status(parts) -> str:
    return RunStatus.of_parts(RunStatus.RUNNING if p.meta.status == RunStatus.RUNNING and writer_alive(p.meta)
                              else p.meta.status for p in parts)


def _common(values) -> str | None:
    values = set(values)
    return values.pop() if len(values) == 1 else None


__all__ = ["live_rows", "load_job", "part_entries"]
