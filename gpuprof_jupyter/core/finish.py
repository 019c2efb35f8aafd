"""The end of an experiment on disk: Parquet, steps, summary, rule results, metadata.

Runs in the sampler process, or in the kernel when the sampler process cannot (below).

Run by the sampler process when a run ends (or when it notices the kernel died), and by the
kernel itself when the sampler process died: the same code either way. Each part is a
named step: a failure is a note, and what is already on disk (the sample stream, the
metadata) is kept whatever happens. Every finisher (this one, ``crashed.py``, a second one)
obeys one rule: no data file or summary is replaced by one that holds less
(``store/keep_more.py``).
"""

from __future__ import annotations

from gpuprof_jupyter.core.guarded import run_step
from gpuprof_jupyter.core.store.directory import Store
from gpuprof_jupyter.core.store.experiment import OWN_RANK, Experiment, ExperimentMeta
from gpuprof_jupyter.core.store.keep_more import WouldShrink, fuller_summary

STEP_FIELDS = ("t_end_s", "duration_s", "wait_s", "n_samples", "n_batches", "skipped", "peak_memory_bytes")
# a serving request (runtime/record/request_log.py): start (s since the run's start), latency (GPU
# time with CUDA events, else host), host wall time, batch size, tokens generated, time to first
# token, Python's garbage collection and data waits inside it (s), whether CUDA events timed it,
# what made it a request ("module", "generate()", ...)
REQUEST_FIELDS = ("t_start_s", "latency_s", "host_s", "batch", "tokens", "ttft_s", "gc_s", "wait_s", "cuda", "kind")


def steps_table(steps: list[tuple]):
    """Steps as sent by the kernel (tuples in ``STEP_FIELDS`` order) -> an Arrow table. Steps
    of the run's child processes carry their rank last; when there are any, a ``rank`` column
    holds it (``OWN_RANK`` for the run's own process: the kernel's steps)."""
    import pyarrow as pa

    from gpuprof_jupyter.core.store.arrow_arrays import array

    fields, types = list(STEP_FIELDS), [pa.float64()] * 4 + [pa.int64(), pa.bool_(), pa.float64()]
    if any(len(s) > len(STEP_FIELDS) for s in steps):
        steps = [s if len(s) > len(STEP_FIELDS) else (*s, OWN_RANK) for s in steps]
        fields.append("rank")
        types.append(pa.int64())
    columns = list(zip(*steps)) if steps else [[] for _ in fields]
    return pa.table({name: array(list(col), typ) for name, col, typ in zip(fields, columns, types)})


def requests_table(requests: list[tuple]):
    """Requests as sent by the kernel (tuples in ``REQUEST_FIELDS`` order; a child process's
    carry its rank last, as steps do) -> an Arrow table."""
    import pyarrow as pa

    from gpuprof_jupyter.core.store.arrow_arrays import array

    fields = list(REQUEST_FIELDS)
    types = [pa.float64()] * 8 + [pa.bool_(), pa.string()]
    if any(len(r) > len(REQUEST_FIELDS) for r in requests):
        requests = [r if len(r) > len(REQUEST_FIELDS) else (*r, OWN_RANK) for r in requests]
        fields.append("rank")
        types.append(pa.int64())
    columns = list(zip(*requests)) if requests else [[] for _ in fields]
    return pa.table({name: array(list(col), typ) for name, col, typ in zip(fields, columns, types)})


def finish_experiment(store: Store, meta: ExperimentMeta, steps: list[tuple], checks: list, notes: list[str],
                      schema=None, trace: dict | None = None, requests: list[tuple] | None = None) -> Experiment:
    """Write what ends an experiment whose sample stream is closed. ``schema``: the stream's
    (None when no stream was opened); ``requests``: the serving requests (none: no file). Never
    less than is there (``store/keep_more.py``): a steps or samples file, or a summary, that holds
    more than this finisher has is kept, with a note; so any number of finishers, in any order,
    leave the fullest run."""
    from gpuprof_jupyter.core.store.samples_file import stream_to_parquet

    directory = store.directory(meta)
    experiment = store.load_meta(meta, trace=trace)
    if schema is None:  # finished by the kernel after the sampler process died: the stream says
        schema = _stream_schema(directory)
    if schema is not None:
        run_step("converting samples to Parquet (they stay in samples.arrows)",
                 lambda: _unless_less(lambda: stream_to_parquet(directory, schema, notes=notes), notes), notes)
    run_step("saving steps", lambda: _unless_less(lambda: store.save_steps(meta, steps_table(steps)), notes), notes)
    if requests:
        run_step("saving requests", lambda: store.save_requests(meta, requests_table(requests)), notes)
    saved = meta.summary or _saved_summary(directory)
    run_step("summarising", lambda: _summarise(experiment, saved, notes), notes)  # computed once, kept in meta
    if checks:
        from gpuprof_jupyter.core.analysis.rules import evaluate_rules

        run_step("evaluating rules", lambda: setattr(
            meta, "checks", [r.to_dict() for r in evaluate_rules(experiment, checks)]), notes)
    if run_step("saving the metadata", lambda: store.save_meta(meta) or True, notes) is None:
        run_step("saving the metadata again", lambda: store.save_meta(meta), notes)
    return experiment


def _unless_less(write, notes: list[str]) -> None:
    """``write()``; when it would replace a file with less, that file stays and a note says so."""
    try:
        write()
    except WouldShrink as exc:
        notes.append(f"gpuprof: {exc}")


def _summarise(experiment: Experiment, saved: dict, notes: list[str]) -> None:
    """The summary of what is on disk now, unless ``saved`` (an earlier finish's) covers more."""
    from gpuprof_jupyter.core.analysis.summary import summarize

    experiment.meta.summary = fuller_summary(saved, summarize(experiment), notes)


def _saved_summary(directory) -> dict:
    """The summary an earlier finish saved in ``meta.json`` ({} when there is none)."""
    from gpuprof_jupyter.core.store.index import META_NAME, read_meta

    try:
        return read_meta(directory / META_NAME).summary or {}
    except (ValueError, TypeError, OSError):
        return {}


def _stream_schema(directory):
    import pyarrow as pa
    import pyarrow.ipc as ipc

    from gpuprof_jupyter.core.store.samples_file import STREAM_NAME

    try:
        with pa.OSFile(str(directory / STREAM_NAME), "rb") as f:
            return ipc.read_schema(ipc.read_message(f))
    except (OSError, pa.ArrowInvalid, EOFError):
        return None
