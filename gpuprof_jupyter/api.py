"""Reading experiments back: ``experiments()``, ``load()``, ``last()``.

Runs in the kernel, or any process that reads the store (the Jupyter server, the ``gpuprof`` command).
"""

from __future__ import annotations

import os

from gpuprof_jupyter.core.store.directory import Store
from gpuprof_jupyter.core.store.experiment import Experiment


_FRAMES: dict = {}  # store root -> (listing version, its experiments() frame)


def _store(store) -> Store:
    return store if isinstance(store, Store) else Store(store)


def experiments(store=None):
    """pandas.DataFrame, one row per experiment in the store (default ``.gpuprof/``), oldest first.

    Columns: id, name, status, started_at, duration_s, devices, source, simulated, sm_util_mean,
    sm_util_p50, sm_util_p95, sm_low_frac, mem_bw_util_mean, power_mean_w, energy_j, energy_kwh,
    gpu_mem_peak_bytes, cpu_util_mean, samples_per_s, data_wait_frac, latency_p50_ms,
    latency_p90_ms, latency_p99_ms, requests_per_s (serving runs' steady requests, warm-up left
    out; NaN for a run without requests), then one per param and
    per logged metric, typed by their values (integers ``Int64``, bools ``boolean``, numbers
    ``Float64``; <NA> where a run lacks it: ``64`` never becomes ``64.0``). Utilisations are
    averaged across GPUs; power and energy are totals. A multi-node job is one row (``id`` its
    key, ``load(id)`` reads it whole) with a ``parts`` column (``2/2``, ``1/2 (missing: 1)``,
    ``2/2 (running: node-b)``; <NA> on other rows) and ``part_ids`` (its parts' ids), as ``gpuprof list`` shows
    it (docs/multi-node.md). Read through the store's index (``core/listing.py``): only
    experiments new or changed since the last listing are read.
    """
    from gpuprof_jupyter.core.analysis.table import frame_of_rows
    from gpuprof_jupyter.core.listing import job_rows, store_listing

    s = _store(store)
    listing = job_rows(store_listing(s))
    key = os.path.realpath(s.root)
    version, frame = _FRAMES.get(key, (None, None))
    if version != listing.version:
        frame = frame_of_rows(listing.rows)
        if any(row.get("parts") for row in listing.rows):
            frame["parts"] = [row.get("parts") for row in listing.rows]
            frame["parts"] = frame["parts"].astype("string")
            frame["part_ids"] = [row.get("part_ids") for row in listing.rows]
        _FRAMES[key] = (listing.version, frame)
    return frame.copy()  # the caller may change its copy; the next call with nothing changed reuses ours


def load_many(names_or_ids=(), store=None) -> list[Experiment]:
    """Experiments by name, id or Experiment; none given: the whole store, in run order
    (LookupError when it is empty). KeyError names an unknown one."""
    s = _store(store)
    if not names_or_ids:
        metas = s.list()
        if not metas:
            raise LookupError(f"no experiments in {s.root} to compare")
        return [s.load_meta(m) for m in metas]
    entries = s.entries()  # one listing for them all: each name's own meta.json is read, no other
    return [n if isinstance(n, Experiment) else _load(s, n, entries) for n in names_or_ids]


DEFAULT_COMPARED = 2  # runs a comparison takes when none are named: the last two


def runs_to_compare(names_or_ids=(), store=None, *, all_runs: bool = False,
                    all_hint: str = "compare(all=True)") -> tuple[list[Experiment], list[str]]:
    """The experiments a comparison shows, and notes saying how they were chosen: the named ones;
    none named, the store's last two runs (a note names them and ``all_hint``, how to take every
    run) or, with ``all_runs``, every run in run order. LookupError for an empty store, KeyError
    for an unknown name, ValueError for names together with ``all_runs``."""
    if names_or_ids and all_runs:
        raise ValueError(f"{all_hint} compares every run in the store: give it no names, or names without it")
    if names_or_ids or all_runs:
        return load_many(names_or_ids, store), []
    s = _store(store)
    entries = s.entries()
    if not entries:
        raise LookupError(f"no experiments in {s.root} to compare")
    picked = [s.load_meta(s.read_meta(e.id)) for e in entries[-DEFAULT_COMPARED:]]
    notes = []
    if len(entries) > len(picked):
        notes.append(f"no runs named: the last {len(picked)} of the {len(entries)} runs in the store "
                     f"({', '.join(e.name for e in picked)}); {all_hint} compares them all, or name the runs")
    return picked, notes


def load(name_or_id: str, store=None) -> Experiment:
    """The latest experiment with this name (or the one with this id); or a multi-node job by
    its launcher's id (``TORCHELASTIC_RUN_ID``, ``SLURM_JOB_ID`` or ``4242.0``): its parts as one
    experiment (``core/job.py``, docs/multi-node.md)."""
    s = _store(store)
    return _load(s, name_or_id, s.entries())


def _load(s: Store, name_or_id: str, entries) -> Experiment:
    from gpuprof_jupyter.core.job import load_job

    job = load_job(s, name_or_id, entries)
    return job if job is not None else s.load_meta(s.resolve(name_or_id, entries))


def resolve(experiment, store=None) -> Experiment:
    """An experiment as given, or loaded by name or id: what every call taking a run accepts."""
    return load(experiment, store) if isinstance(experiment, str) else experiment


def last(store=None) -> Experiment:
    """The store's most recent experiment (LookupError when the store has none)."""
    s = _store(store)
    latest = s.latest()
    if latest is None:
        raise LookupError(f"no experiments in {s.root}")
    return s.load_meta(latest)


def check(experiment, *rules, store=None, prices=None):
    """Evaluate rules on a saved experiment (name, id or Experiment): a list of RuleResult.

    With no rules, the experiment's own rules (``--check`` at run time) are evaluated again.
    """
    from gpuprof_jupyter.core.analysis.rules import evaluate_rules, stored_results

    exp = resolve(experiment, store)
    if not rules:
        rules = tuple(r.rule for r in stored_results(exp))
    return evaluate_rules(exp, list(rules), prices=prices)


def diagnose(experiment, store=None):
    """Findings for a saved experiment (name, id or Experiment), most severe first: a list of
    Finding, each with its evidence and a next step."""
    from gpuprof_jupyter.core.analysis.diagnosis import diagnose as _diagnose

    return _diagnose(resolve(experiment, store))


def largest_batch(*runs, margin: float = 0.1, store=None):
    """The largest batch that fits the device's memory less ``margin`` (a share, default 10 %),
    from runs of the same cell at two or more batch sizes (names, ids, Experiments, or a
    ``--tune`` result / its trials, whose experiments count): a ``LargestBatch`` with
    ``batch``, ``fixed_bytes``, ``per_sample_bytes``, ``device_bytes``, ``basis`` and
    ``warnings`` (few points, not linear). No runs: the last run and those with its name (or
    the trials of its ``--tune`` run). ValueError says what is missing (docs/memory.md)."""
    from gpuprof_jupyter.core.analysis.headroom import largest_batch as _largest_batch

    given = []
    for run in runs:
        trials = getattr(getattr(run, "result", run), "trials", None)  # a --tune report or result
        if trials is not None:  # its trials' experiments
            given += [t.experiment for t in trials if getattr(t, "experiment", None) is not None]
        elif hasattr(run, "experiment") and not isinstance(run, (str, Experiment)):  # one trial
            given.append(run.experiment)
        else:
            given.append(run)
    if not runs:  # the last run's siblings: same name, or the trials of the same --tune run
        latest = last(store)
        tune = (latest.meta.context.get("tune") or {}).get("run")
        given = [m.id for m in _store(store).list()
                 if (tune is not None and (m.context.get("tune") or {}).get("run") == tune)
                 or (tune is None and m.name == latest.name)] or [latest.meta.id]
    return _largest_batch(load_many(given, store) if given else [], margin=margin)
