"""``export_pipeline``: an experiment's settings written into the user's ``pipeline.yaml``.

Runs in the kernel, the Jupyter server and the ``gpuprof`` command.

This module reads (the runs, through ``api.resolve``; the file) and writes (atomically: a
failed write leaves the file as it was); the new text comes from
``render/pipeline_yaml.py``, whose docstring describes the file's layout and comments.
"""

from __future__ import annotations

from pathlib import Path

from gpuprof_jupyter.api import resolve
from gpuprof_jupyter.core.store.atomic import write_text_atomic
from gpuprof_jupyter.render.pipeline_yaml import (
    ExportRefused, ExportResult, PipelineError, check_target, render_pipeline)


def _store_of(experiment):
    return getattr(getattr(experiment, "_loader", None), "store", None)


def _read(path: Path) -> str | None:
    """The file's text, None when there is no file yet; PipelineError when it cannot be read."""
    if not path.exists():
        return None
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PipelineError(f"cannot read {path}: {exc}") from None


def export_pipeline(experiment, path="pipeline.yaml", step: str = "train", *, baseline=None, force: bool = False,
                    store=None, candidates=None, prices=None, captured=False, evidence=None) -> ExportResult:
    """Write ``experiment``'s settings into step ``step`` of ``path``; return what changed.

    ``baseline`` (an Experiment or name) is what the measured effect in each comment is
    against; by default the latest earlier run in the same store whose settings match the
    file's current values (else the store's first run). ``force=True`` exports a run that
    failed one of its rules (the threshold comments say so). ``captured`` also writes
    ``--capture``d keys: True for all, or variable names/keys (``["train_config"]`` writes
    ``train_config.num_workers`` and the rest of that config). ``evidence`` (setting -> text,
    from ``--tune``'s trials) is the comment of each setting it names, in place of the run's
    overall effect.
    """
    from gpuprof_jupyter.core.analysis.rules import failed, stored_results, verdict_counts

    if not isinstance(step, str) or not step.strip():
        raise ValueError("step must be a non-empty step name")
    experiment = resolve(experiment, store)
    failures = failed(stored_results(experiment))
    if failures and not force:
        raise ExportRefused(
            f"experiment {experiment.name!r} did not pass {len(failures)} rule(s) ({verdict_counts(failures)}: "
            + "; ".join(f"{r.verdict} {r.rule}: {r.detail}" for r in failures)
            + "); pass force=True (gpuprof export --force) to export it anyway")
    path = Path(path)
    check_target(path)
    text = _read(path)
    if candidates is None:
        st = _store_of(experiment) or (store if store is not None else None)
        candidates = [st.load_meta(m) for m in st.list()] if st is not None and hasattr(st, "list") else []
    base = resolve(baseline, store or _store_of(experiment)) if baseline is not None else None
    text, result = render_pipeline(experiment, text, path, step, baseline=base, candidates=candidates,
                                   prices=prices, captured=captured, evidence=evidence)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, text)  # all or nothing: a failed write leaves the file as it was
    except OSError as exc:  # a full disk, a read-only folder
        raise PipelineError(f"cannot write {path} ({exc.strerror or exc}); left as it was") from None
    return result


__all__ = ["ExportRefused", "ExportResult", "PipelineError", "export_pipeline"]
