"""How a ``%%gpuprofile`` cell runs: IPython runs the cell itself; we start before, stop after.

Runs in the kernel.

The magic never executes the cell (docs/facts.md, "IPython magics": ``shell.run_cell`` from a magic breaks
top-level ``await`` and turns a raising cell's reply into ``ok``). Instead:

* an input transformer (``rewrite_header``, a cleanup transformer) turns the header line
  ``%%gpuprofile ARGS`` into the line magic ``%gpuprofile start ARGS`` (one line, as IPython
  writes any magic: ``get_ipython().run_line_magic(...)``, which expands ``$var``); the rest
  of the cell stays as typed, so IPython keeps ``await``, ``!``/``%`` lines, the displayed last value,
  ``_``/``Out``, the execution count, tracebacks and line numbers;
* a ``post_run_cell`` handler (``_post_run_cell``) stops the session when that cell ends,
  with the cell's own exception (if any) as its status;
* a ``pre_run_cell`` handler stops a run whose cell ended unseen (a silent execution).

Everything the profiler does here is a step (``core/guarded.py``): a failure is a note in the
experiment, the session always stops and the next cell works.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass

from IPython import get_ipython
from IPython.core.error import UsageError

from gpuprof_jupyter.runtime.profile import describe_error, status_for
from gpuprof_jupyter.runtime.session import ProfileSession, current_session
from gpuprof_jupyter.runtime.record.settings import capture
from gpuprof_jupyter.core.guarded import run_step
from gpuprof_jupyter.core.store.experiment import RunStatus
from gpuprof_jupyter.notebook import session_cells
from gpuprof_jupyter.notebook.cell_options import session_options

_HEADER = re.compile(r"%%gpuprofile(?:[ \t]+(.*?))?[ \t]*$")  # not "%%gpuprofile?" (help)
_TUNE = re.compile(r"(?:^|\s)--tune(?:\s|=|$)")


@dataclass
class _Run:
    session: ProfileSession
    capture: list[str]
    quiet: bool
    fail_on_check: bool
    dashboard: object | None
    info: object | None  # IPython's ExecutionInfo of the cell that started it


_run: _Run | None = None
_cells: list = []  # ExecutionInfo of the cells running now (nested run_cell: several)
_saved_in_cell: str | None = None  # the id of the experiment the running cell saved (the session record's mark)


# -- the header -----------------------------------------------------------------------------
def rewrite_header(lines: list[str]) -> list[str]:
    """``%%gpuprofile ARGS`` on the first line -> ``...start('ARGS')``; other cells unchanged."""
    match = _HEADER.match(lines[0].rstrip("\r\n")) if lines else None
    if match is None:
        return lines
    if _TUNE.search(match.group(1) or ""):  # --tune runs the body itself, once per trial: a plain cell magic
        return [f"get_ipython().run_cell_magic('gpuprofile', {(match.group(1) or '').strip()!r}, "
                f"{''.join(lines[1:])!r})\n"]
    call = f"get_ipython().run_line_magic('gpuprofile', {('start ' + (match.group(1) or '')).strip()!r})\n"
    return [call, *lines[1:]]


def _body(raw_cell: str | None) -> str | None:
    """The cell's text after its ``%%gpuprofile`` line (what the experiment records)."""
    if raw_cell is None:
        return None
    lines = raw_cell.splitlines(keepends=True)
    for i, line in enumerate(lines):
        if _HEADER.match(line.rstrip("\r\n")):
            return "".join(lines[i + 1:])
    return raw_cell


def make_live_dashboard():
    """The live dashboard observer, or None when its view is not available."""
    try:
        from gpuprof_jupyter.notebook.live import LiveDashboard
        from gpuprof_jupyter.notebook.static_ending import show_static_ending
    except ImportError:
        return None
    return LiveDashboard(show_static_ending)


# -- start and finish -----------------------------------------------------------------------
def start(args, body: str | None = None) -> None:
    """Start profiling the rest of this cell (``%gpuprofile start``: the rewritten header).

    ``args``: the magic's parsed arguments. A bad one raises UsageError before anything
    starts, and the cell does not run.
    """
    __tracebackhide__ = True
    global _run

    stop_stale()
    info = _cells[-1] if _cells else None
    options = session_options(args)  # UsageError for a bad one: nothing starts
    session = ProfileSession(options, cell_source=body if body is not None else _body(getattr(info, "raw_cell", None)))
    dashboard = None
    if not (args.no_live or args.quiet):
        dashboard = run_step("creating the live dashboard", make_live_dashboard, session.notes)
        if dashboard is not None:
            session.observers.append(dashboard)
    _run = _Run(session, args.capture, args.quiet, args.fail_on_check, dashboard, info)  # before: a Ctrl-C
    try:  # just after start() returns still finds the run to stop
        session.start()
    except ValueError as exc:  # a bad source or device: nothing was started
        _run = None
        raise UsageError(str(exc)) from None
    except BaseException:  # start() ended what it began
        _run = None
        raise
    _explain_before_traceback(get_ipython())


def finish(error: BaseException | None = None):
    """Stop the running cell's session: settings, capture, save, summary. Returns the
    ``RuleFailed`` to raise for ``--fail-on-check`` (None otherwise); never raises itself."""
    global _run, _saved_in_cell
    run, _run = _run, None
    if run is None:
        return None
    session, notes = run.session, run.session.notes
    shell = get_ipython()
    namespace = shell.user_ns if shell is not None else {}
    try:
        run_step("recording DataLoader settings", lambda: session.record_loaders(namespace), notes)
        run_step("capturing variables", lambda: _capture(session, namespace, run.capture), notes)
        _stop_explaining(shell)
        session.record_error(error)
    except BaseException as exc:  # a second Ctrl-C while finishing: the run still stops, then it stands
        error = error if error is not None else exc
        raise
    finally:
        experiment = session.stop(status_for(error), describe_error(error))
        _saved_in_cell = getattr(getattr(experiment, "meta", None), "id", None) or None
    if error is not None and not run.quiet:  # out of memory: why and what fits (render.oom_text), before the traceback
        run_step("explaining the out-of-memory error", lambda: _explain_oom(experiment), notes)
    if not run.quiet and run.dashboard is None:
        run_step("showing the summary", lambda: _show_summary(experiment), notes)
    failure = None
    if run.fail_on_check and error is None:
        failure = run_step("checking the rules' results", lambda: _rule_failure(experiment), notes)
    session.save_notes()
    return failure


# -- out of memory: the explanation before the traceback ---------------------------------------
def _explain_before_traceback(shell) -> None:
    """While the cell runs, torch's ``OutOfMemoryError`` goes to ``_oom_handler`` (IPython's
    ``set_custom_exc``) so the run is saved and explained before IPython shows the traceback.
    Only when torch is imported and the user has no handler of their own: then the explanation
    comes after the traceback (``finish`` from ``post_run_cell``)."""
    torch = sys.modules.get("torch")
    oom = getattr(torch, "OutOfMemoryError", None)
    if shell is not None and oom is not None and not shell.custom_exceptions:
        shell.set_custom_exc((oom,), _oom_handler)


def _stop_explaining(shell) -> None:
    """Hand the shell's custom exceptions back, unless the cell set its own meanwhile."""
    if shell is not None and shell.custom_exceptions and _handler_is_ours(shell):
        shell.set_custom_exc((), None)


def _handler_is_ours(shell) -> bool:
    """IPython wraps the handler (``set_custom_exc``): ours is in the wrapper's closure."""
    closure = getattr(getattr(shell.CustomTB, "__func__", None), "__closure__", None) or ()
    return any(cell.cell_contents is _oom_handler for cell in closure)


def _oom_handler(shell, etype, value, tb, tb_offset=None):
    """The cell died of out-of-memory: finish the run (saved, explained), then the traceback as
    usual. A cell run inside it (a nested ``run_cell``) that dies of it leaves the run going."""
    if _run is not None and (_run.info is None or not _cells or _cells[-1] is _run.info):
        finish(value)  # also hands the shell's custom exceptions back
    shell.showtraceback((etype, value, tb), tb_offset=tb_offset, running_compiled_code=True)
    return []


def _explain_oom(experiment) -> None:
    from gpuprof_jupyter.render.oom_text import explain_oom

    explain_oom(experiment)


def _stop_unseen_run() -> None:
    """Stop our run whose cell ended unseen (a silent execution has no post_run_cell)."""
    if _run is not None and (_run.info is None or _run.info not in _cells):
        _run.session.notes.append("gpuprof: the cell's end was not seen (a silent execution?); "
                                  "stopped when the next cell started")
        finish()


def stop_stale() -> None:
    """Before a profiled cell, stop what an earlier cell left running (as pyinstrument's magic
    does): our own run whose cell ended unseen, or a ``profile()`` session never exited."""
    _stop_unseen_run()
    other = current_session()
    if other is not None and (_run is None or other is not _run.session):
        other.notes.append("gpuprof: left running by an earlier cell; stopped when a profiled cell started")
        other.stop(RunStatus.ERROR, "left running; stopped when a later profiled cell started")


def _capture(session: ProfileSession, namespace: dict, names: list[str]) -> None:
    values, missing = capture(namespace, names)
    session.meta.captured.update(values)
    session.notes.extend(missing)


def _show_summary(experiment) -> None:
    from IPython.display import display

    from gpuprof_jupyter.render.summary_html import summary_bundle

    display(summary_bundle(experiment), raw=True)


def _rule_failure(experiment):
    from gpuprof_jupyter.core.analysis.rules import RuleFailed, raise_if_failed

    try:
        raise_if_failed(experiment)
    except RuleFailed as exc:
        return exc
    return None


# -- IPython events -------------------------------------------------------------------------
def _pre_run_cell(info) -> None:
    global _saved_in_cell
    _cells.append(info)
    _stop_unseen_run()  # a profile() left open is the user's to close, across cells
    _saved_in_cell = None
    session_cells.cell_started(get_ipython(), info)  # the session record's mark (docs/session.md)


def _post_run_cell(result) -> None:
    try:
        _end_profiled_run(result)
    finally:
        session_cells.cell_ended(status_for(cell_error(result)), _saved_in_cell)


def _end_profiled_run(result) -> None:
    info = getattr(result, "info", None)
    if info in _cells:
        _cells.remove(info)
        ended = info
    else:  # an interrupt outside the cell's statements: IPython made the result a new ExecutionInfo
        ended = _cells.pop() if _cells else info
    if _run is None or (_run.info is not None and _run.info is not ended):
        return  # not the cell that started it (a nested run_cell inside it)
    failure = finish(cell_error(result))
    if failure is not None and result is not None:  # --fail-on-check: the cell's reply becomes an error
        shell = get_ipython()
        try:
            raise failure
        except type(failure):
            shell.showtraceback(exception_only=True)
        result.error_in_exec = failure


def cell_error(result) -> BaseException | None:
    """The exception that ended the cell, as the kernel's reply names it. A Ctrl-C that lands
    between two of the cell's statements is ``error_before_exec`` (IPython's ``run_ast_nodes``),
    not ``error_in_exec``: the run is still "interrupted"."""
    before = getattr(result, "error_before_exec", None)
    return before if before is not None else getattr(result, "error_in_exec", None)


# What a profiled cell's live view and static ending import (1-2 s on a loaded 2-core machine),
# imported at %load_ext in the background so the first profiled cell does not wait for them.
# Not pandas: a cell reads its samples as numpy columns (store.columns); pandas comes with the
# first DataFrame the user asks for. samples_file: pyarrow with its compute and Parquet modules.
PRELOAD = ("ipywidgets", "PIL.Image", "gpuprof_jupyter.core.store.samples_file",
           "gpuprof_jupyter.notebook.live.dashboard", "gpuprof_jupyter.render.static_plots",
           "gpuprof_jupyter.render.summary_html")


def preload() -> None:
    """Import ``PRELOAD`` on a daemon thread; returns at once. A cell that needs one of them
    meanwhile waits for that import only (Python's per-module import lock)."""
    import importlib
    import threading

    def run() -> None:
        for name in PRELOAD:
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001 - the cell that needs it reports the failure
                pass

    # not a profiler thread ("gpuprof-*", which the kernel's checks count): it ends with the imports
    threading.Thread(target=run, name="preload-imports[gpuprof_jupyter]", daemon=True).start()


def install(shell) -> None:
    """Register the header transformer and the two events (once, however often loaded)."""
    cleanup = shell.input_transformers_cleanup
    if rewrite_header not in cleanup:
        cleanup.append(rewrite_header)
    for event, callback in (("pre_run_cell", _pre_run_cell), ("post_run_cell", _post_run_cell)):
        if callback not in shell.events.callbacks[event]:
            shell.events.register(event, callback)


def uninstall(shell) -> None:
    if rewrite_header in shell.input_transformers_cleanup:
        shell.input_transformers_cleanup.remove(rewrite_header)
    for event, callback in (("pre_run_cell", _pre_run_cell), ("post_run_cell", _post_run_cell)):
        if callback in shell.events.callbacks[event]:
            shell.events.unregister(event, callback)


def run_directly(shell, args, cell: str):
    """``run_cell_magic('gpuprofile', line, cell)`` called from code, where no header was
    rewritten: the body runs as plain statements (no top-level ``await``, no displayed value)."""
    __tracebackhide__ = True
    start(args, body=cell)
    error = None
    try:
        shell.ex(shell.transform_cell(cell))
    except BaseException as exc:  # noqa: B036 - recorded, then re-raised unchanged
        error = exc
        raise
    finally:
        failure = finish(error)
    if failure is not None:
        raise failure
