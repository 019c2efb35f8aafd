"""The kernel's side of the session record: each cell's start and end, marked (docs/session.md).

Runs in the kernel.

``%load_ext`` turns the record on (unless ``GPUPROF_SESSION=off``): the sampler process keeps a
low-rate record of the session, and IPython's ``pre_run_cell``/``post_run_cell`` events (the ones
``profiled_cell`` already registers) send a ``CellMark`` each: one small message on the link's
socket, no reply awaited, no thread woken in the kernel, no hook installed. ``%gpuprofile session
off`` (or the setting) stops it.
"""

from __future__ import annotations

import dataclasses
import getpass
import os
import time

from gpuprof_jupyter.core.protocol import SESSION_RECORD_FOLDER, CellMark, SessionControl
from gpuprof_jupyter.runtime.link import SamplerGone, sampler_link

SETTING = "GPUPROF_SESSION"  # "off" turns the record off at %load_ext
KEEP_AFTER_SETTING = "GPUPROF_SESSION_KEEP_AFTER"  # e.g. "10s", "5min", "0" (never)
INTERVAL_SETTING = "GPUPROF_SESSION_INTERVAL"  # seconds between the record's readings (default 1)
NOTICE_SETTING = "GPUPROF_SESSION_NOTICE_AFTER"  # idle while holding GPU memory this long: said once (default 10min)
SOURCE_CHARS = 200  # of a cell's first line


class _State:
    on = False
    starts = -1  # the link's process start the record was turned on in (a new process needs telling)
    control: SessionControl | None = None
    notice = None  # a SessionNotice not shown yet
    idle_told = False  # the idle-GPU notice was shown once: never again this session


def setting_on(environ=None) -> bool:
    """The setting: off when ``GPUPROF_SESSION`` is off, 0, false or no."""
    value = (environ if environ is not None else os.environ).get(SETTING, "on").strip().lower()
    return value not in ("off", "0", "false", "no")


def settings_from_environ(environ=None) -> dict:
    """The record's cadence and keep-after threshold from the settings (ValueError if malformed)."""
    env = environ if environ is not None else os.environ
    out: dict = {}
    if env.get(KEEP_AFTER_SETTING):
        out["keep_after_s"] = parse_duration(env[KEEP_AFTER_SETTING], KEEP_AFTER_SETTING, allow_zero=True)
    if env.get(INTERVAL_SETTING):
        out["interval"] = parse_duration(env[INTERVAL_SETTING], INTERVAL_SETTING)
    if env.get(NOTICE_SETTING):
        out["notice_after_s"] = parse_duration(env[NOTICE_SETTING], NOTICE_SETTING, allow_zero=True)
    return out


def parse_duration(text: str, what: str = "--keep-after", allow_zero: bool = False) -> float:
    """``10s``, ``5min``, ``90`` (seconds); with ``allow_zero`` also ``0`` (never). ValueError
    naming ``what`` otherwise."""
    from gpuprof_jupyter.runtime.tune.spec import parse_budget

    if allow_zero and str(text).strip().lower() in ("0", "0s", "off", "never"):
        return 0.0
    try:
        return parse_budget(str(text).strip())
    except ValueError:
        raise ValueError(f"{what} takes a duration like 10s, 5min or 1h{' (0: never)' if allow_zero else ''}; "
                         f"got {text!r}") from None


def kernel_identity() -> dict:
    """Who this kernel is, for the server extension: its id (from the connection file), user, pid."""
    kernel_id = None
    try:
        from ipykernel.connect import get_connection_file

        name = os.path.basename(get_connection_file())
        kernel_id = name[len("kernel-"):-len(".json")] if name.startswith("kernel-") and name.endswith(".json") else name
    except Exception:  # noqa: BLE001 - not an ipykernel (a plain IPython): the pid names it
        pass
    try:
        user = getpass.getuser()
    except Exception:  # noqa: BLE001
        user = str(os.getuid())
    return {"id": kernel_id or f"pid{os.getpid()}", "user": user, "pid": os.getpid()}


def record_dir() -> str:
    """Where the sampler process writes the record: beside this kernel's connection file (the
    Jupyter server's runtime folder, where it reads it), else Jupyter's runtime folder."""
    try:
        from ipykernel.connect import get_connection_file

        folder = os.path.dirname(os.path.abspath(get_connection_file()))
    except Exception:  # noqa: BLE001 - not an ipykernel (a plain IPython)
        from jupyter_core.paths import jupyter_runtime_dir

        folder = jupyter_runtime_dir()
    return os.path.join(folder, SESSION_RECORD_FOLDER)


def turn_on(store: str, keep_after_s: float | None = None, interval: float | None = None,
            notice_after_s: float | None = None) -> None:
    """Start the record in the sampler process (started in the background if it is not)."""
    _State.control = SessionControl(on=True, interval=interval, keep_after_s=keep_after_s, store=store,
                                    kernel=kernel_identity(), record_dir=record_dir(), notice_after_s=notice_after_s)
    _State.on = True
    sampler_link().on_notice = _take_notice  # the link's thread: kept for the next cell, never printed from there
    _tell_control()


def _take_notice(notice) -> None:
    if not _State.idle_told:
        _State.notice = notice


def notice_text(notice) -> str:
    from gpuprof_jupyter.core.figure import measured
    from gpuprof_jupyter.core.format import fmt_figure, fmt_idle

    held = fmt_figure(measured(notice.memory_held_bytes, "B", "the session record"))
    return (f"gpuprof: the GPUs sat idle for {fmt_idle(notice.idle_s)} or more while this kernel held "
            f"{held} of their memory, which others on this node could not use. "
            "Free it (del the model, torch.cuda.empty_cache()) or shut the kernel down when you are done; "
            "%gpuprofile session shows when. (Said once.)")


def change(keep_after_s: float | None = None) -> None:
    """A new keep-after threshold for the record running now."""
    if _State.control is not None and keep_after_s is not None:
        _State.control = dataclasses.replace(_State.control, keep_after_s=keep_after_s)
    _tell(SessionControl(keep_after_s=keep_after_s))


def turn_off() -> None:
    _State.on = False
    if _State.control is not None:
        _State.control = dataclasses.replace(_State.control, on=False)
    _tell(SessionControl(on=False))


def is_on() -> bool:
    return _State.on


def _tell_control() -> None:
    link = sampler_link().ensure()
    _State.starts = link.starts
    _tell(_State.control)


def _tell(message) -> None:
    try:
        sampler_link().tell(message)
    except SamplerGone:
        pass  # told again when the next process starts (_mark)


def _mark(message: CellMark) -> None:
    link = sampler_link()
    if link.starts != _State.starts and _State.control is not None:
        if not link.alive:
            return  # no process now: the record waits for the next one (a profiled cell starts it)
        _State.starts = link.starts
        _tell(_State.control)  # a new process (the last one was killed): its record starts here
    _tell(message)


def mark_loading_cell(shell) -> None:
    """The cell running ``%load_ext`` began before our events were registered: mark its start
    now, with its text from IPython's history (stored before a cell runs)."""
    raw = ""
    try:
        raw = shell.history_manager.input_hist_raw[-1]
    except Exception:  # noqa: BLE001 - no history: a cell without its first line
        pass
    cell_started(shell, type("Info", (), {"raw_cell": raw})())


# -- the two IPython events (called by profiled_cell's handlers) ----------------------------------------
def cell_started(shell, info) -> None:
    """``pre_run_cell``: the cell about to run. Never raises."""
    if not _State.on:
        return
    try:
        if _State.notice is not None and not _State.idle_told:
            _State.idle_told = True
            print(notice_text(_State.notice))
            _State.notice = None
        raw = getattr(info, "raw_cell", None) or ""
        first = next((line for line in raw.splitlines() if line.strip()), "")[:SOURCE_CHARS]
        count = getattr(shell, "execution_count", None)
        _mark(CellMark("start", time.monotonic(), time.time(), count if isinstance(count, int) else None, first))
    except Exception:  # noqa: BLE001 - the record is best effort; the user's cell runs regardless
        pass


def cell_ended(status: str, experiment: str | None) -> None:
    """``post_run_cell``: the cell ended with ``status``; ``experiment``: the id it was profiled as."""
    if not _State.on:
        return
    try:
        _mark(CellMark("end", time.monotonic(), time.time(), status=status, experiment=experiment))
    except Exception:  # noqa: BLE001
        pass
