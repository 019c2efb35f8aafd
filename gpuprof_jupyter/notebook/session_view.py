"""``gpuprof_jupyter.session()`` and ``%gpuprofile session``: the kernel's session, cell by cell (docs/session.md).

Runs in the kernel.

The record lives in the sampler process (``sampler_process/session_record.py``); this module asks
it (``SessionQuery``), turns its rows into a DataFrame, and shows the timeline that
``render/session_timeline.py`` draws.
"""

from __future__ import annotations

from IPython.core.error import UsageError

from gpuprof_jupyter.core.protocol import SessionQuery
from gpuprof_jupyter.notebook import session_cells
from gpuprof_jupyter.runtime.link import sampler_link
from gpuprof_jupyter.core.format import fmt_unit

QUERY_TIMEOUT_S = 10.0
COLUMNS = ("kind", "cell", "source", "started", "duration_s", "gpu_busy_s", "energy_j", "memory_held_bytes",
           "status", "experiment", "idle_s", "provenance")


def start_session_record(shell=None, asked: bool = False) -> None:
    """At ``%load_ext`` (``shell``: then the loading cell is the record's first), or ``%gpuprofile
    session on`` (``asked``: on whatever the setting says): turn the record on unless the setting
    says off. Never raises."""
    if not asked and not session_cells.setting_on():
        return
    try:
        settings = session_cells.settings_from_environ()
    except ValueError as exc:
        print(f"gpuprof: {exc}; the session record uses its defaults")
        settings = {}
    try:
        from gpuprof_jupyter.core.store.directory import Store

        session_cells.turn_on(str(Store().root.resolve()), **settings)
        if shell is not None:
            session_cells.mark_loading_cell(shell)
    except Exception as exc:  # noqa: BLE001 - the extension loads without its record
        print(f"gpuprof: the session record is off ({type(exc).__name__}: {exc})")


def record() -> dict:
    """The record as the sampler process has it now (rows, timeline, settings)."""
    try:
        return sampler_link().request(SessionQuery(), timeout=QUERY_TIMEOUT_S)
    except Exception as exc:  # noqa: BLE001 - said in what is returned, never raised into a cell
        return {"rows": [], "timeline": {}, "on": session_cells.is_on(),
                "notes": [f"the session record could not be read: {exc}"]}


def session():
    """pandas.DataFrame of this kernel's session: one row per cell and per idle stretch between cells.

    Columns: ``kind`` ("cell" or "idle"), ``cell`` (execution count), ``source`` (its first
    line), ``started`` (UTC), ``duration_s``, ``gpu_busy_s`` (device-seconds with a kernel
    running: NVML ``utilization.gpu`` summed over the devices), ``energy_j`` (the devices'
    energy counters), ``memory_held_bytes`` (at the stretch's end: this kernel's GPU memory),
    ``status``, ``experiment`` (the id when the cell was profiled, or kept from the record),
    ``idle_s`` (idle stretches), ``provenance`` (every figure here is the session record's, read
    at its cadence, 1 s by default; a profiled cell's own experiment has its full rate).
    Unknown figures are NaN/None, never 0. ``frame.attrs``: the provenance of each figure, the
    record's settings and notes.
    """
    import pandas as pd

    body = record()
    cadence = body.get("interval_s")
    label = f"session record, every {fmt_unit(cadence, 's')}" if cadence else "session record"
    rows = [{**{k: row.get(k) for k in COLUMNS if k != "provenance"}, "provenance": label}
            for row in body.get("rows", [])]
    frame = pd.DataFrame(rows, columns=list(COLUMNS))
    frame["cell"] = frame["cell"].astype("Int64")
    frame["started"] = pd.to_datetime(frame["started"], unit="s", utc=True)
    for name in ("duration_s", "gpu_busy_s", "energy_j", "memory_held_bytes", "idle_s"):
        frame[name] = pd.to_numeric(frame[name], errors="coerce").astype("float64")
    frame.attrs.update({"provenance": body.get("provenance", {}), "on": body.get("on"),
                        "interval_s": cadence, "keep_after_s": body.get("keep_after_s"),
                        "idle_held": body.get("idle_held"), "notes": body.get("notes", []),
                        "dropped_rows": body.get("dropped_rows", 0)})
    return frame


def session_command(rest: list[str], keep_after: str | None) -> None:
    """``%gpuprofile session [on|off] [--keep-after 10s]``."""
    if len(rest) > 1 or (rest and rest[0] not in ("on", "off")):
        raise UsageError(f"%gpuprofile session takes on, off or nothing (the timeline); got {' '.join(rest)!r}")
    seconds = None
    if keep_after is not None:
        try:
            seconds = session_cells.parse_duration(keep_after, "--keep-after", allow_zero=True)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    if rest == ["off"]:
        session_cells.turn_off()
        from gpuprof_jupyter.core.analysis.session_account import RECORD_COST

        print(f"session record off (it cost {RECORD_COST}); %gpuprofile session on turns it back on")
        return None
    if rest == ["on"]:
        start_session_record(asked=True)
    if seconds is not None:
        session_cells.change(keep_after_s=seconds)
        print("cells without the magic are not kept as experiments" if seconds == 0 else
              f"a cell longer than {fmt_unit(seconds, 's')} without the magic is kept as an experiment from the session record")
    if rest == ["on"]:
        print("session record on")
    if rest or seconds is not None:
        return None
    show_timeline(record())
    return None


def show_timeline(body: dict) -> None:
    from IPython.display import display

    from gpuprof_jupyter.render.session_timeline import timeline_bundle

    display(timeline_bundle(body), raw=True)
