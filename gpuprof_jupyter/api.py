"""Reading experiments back: ``experiments()``, ``load()``, ``last()``.

Runs in the kernel, or any process that reads the store (the Jupyter server, the ``gpuprof`` command).
"""

from __future__ import annotations

from gpuprof_jupyter.core.store.directory import Store
from gpuprof_jupyter.core.store.experiment import Experiment


def _store(store) -> Store:
    return store if isinstance(store, Store) else Store(store)


def experiments(store=None):
    """pandas.DataFrame, one row per experiment in the store (default ``.gpuprof/``), oldest first.

    Columns: id, name, status, started_at, duration_s, devices, source, simulated, sm_util_mean,
    sm_util_p50, sm_util_p95, sm_low_frac, mem_bw_util_mean, power_mean_w, energy_j, energy_kwh,
    gpu_mem_peak_bytes, cpu_util_mean, samples_per_s, data_wait_frac, then one per param and
    per logged metric, typed by their values (integers ``Int64``, bools ``boolean``, numbers
    ``Float64``; <NA> where a run lacks it: ``64`` never becomes ``64.0``). Utilisations are
    averaged across GPUs; power and energy are totals.
    """
    from gpuprof_jupyter.core.analysis.table import experiments_frame

    s = _store(store)
    return experiments_frame(s.load_meta(meta) for meta in s.list())


def load_many(names_or_ids=(), store=None) -> list[Experiment]:
    """Experiments by name, id or Experiment; none given: the whole store, in run order
    (LookupError when it is empty). KeyError names an unknown one."""
    s = _store(store)
    if not names_or_ids:
        metas = s.list()
        if not metas:
            raise LookupError(f"no experiments in {s.root} to compare")
        return [s.load_meta(m) for m in metas]
    return [n if isinstance(n, Experiment) else s.load(n) for n in names_or_ids]


def load(name_or_id: str, store=None) -> Experiment:
    """The latest experiment with this name (or the one with this id)."""
    return _store(store).load(name_or_id)


def resolve(experiment, store=None) -> Experiment:
    """An experiment as given, or loaded by name or id: what every call taking a run accepts."""
    return load(experiment, store) if isinstance(experiment, str) else experiment


def last(store=None) -> Experiment:
    s = _store(store)
    metas = s.list()
    if not metas:
        raise LookupError(f"no experiments in {s.root}")
    return s.load_meta(metas[-1])


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
