"""A long cell run without the magic, saved after the fact as an experiment from the session record.

Runs in the sampler process.

The session record's own readings (its cadence, 1 s by default) of the cell's time become the
experiment's samples, through the same store code as a profiled run (the crash-safe stream,
then ``core/finish.py``): it lists, loads and compares like any other, labelled "from the
session record" (``context.from_session_record``, a note, the ``session-record`` source), with
no steps (no hooks ran).
"""

from __future__ import annotations

import time
from datetime import datetime, timezone

from gpuprof_jupyter.core.figure import measured
from gpuprof_jupyter.core.finish import finish_experiment
from gpuprof_jupyter.core.format import fmt_figure, fmt_unit
from gpuprof_jupyter.core.metrics import METRICS
from gpuprof_jupyter.core.protocol import Tick
from gpuprof_jupyter.core.store.directory import Store
from gpuprof_jupyter.core.store.experiment import ExperimentMeta

LABEL = "from the session record"
MARKS = "the kernel's cell marks"  # what measures a cell's length


def save_long_cell(store_root: str, cell, ticks: list[Tick], interval_s: float, provenance: dict,
                   device_provenance: dict, device_infos: list[dict]) -> dict:
    """Save ``cell`` (a ``session_account.Stretch``) with ``ticks`` (the record's readings of its
    time) as an experiment named ``cell-N`` in ``store_root``; returns its metadata (JSON).
    ``device_provenance``: the record's sources' tags (device -> metric -> tag); ``device_infos``:
    its GPUs (``DeviceInfo.to_dict``)."""
    from gpuprof_jupyter.core.store.samples_file import SampleStreamWriter, samples_schema
    from gpuprof_jupyter.sampler_process.recorder import Recorder

    store = Store(store_root)
    metrics = [m for m in METRICS if any(m in tick.reading.get(d, {}) for tick in ticks for d in tick.reading)]
    devices = sorted({d for tick in ticks for d in tick.reading})
    status = cell.status if cell.status in ("ok", "error", "interrupted") else "ok"
    meta = ExperimentMeta(
        id="", name=f"cell-{cell.cell}", status="running", started_at=_iso(cell.start_wall), interval_s=interval_s,
        source="session-record", devices=[d for d in device_infos if d.get("key") in devices],
        units={m: METRICS[m].unit for m in metrics}, provenance=device_provenance,
        notes=[f"gpuprof: {LABEL}: cell [{cell.cell}] ran {fmt_figure(measured(cell.duration_s, 's', MARKS))} without the magic; its samples "
               f"are the session record's ({fmt_unit(interval_s, 's')} apart), with no steps"],
        context={"from_session_record": True, "cell": cell.cell, "cell_source": cell.source,
                 "session_provenance": dict(provenance)},
    )
    store.create(meta)
    writer = SampleStreamWriter(store.directory(meta), samples_schema(metrics))
    recorder = Recorder(cell.start_mono, metrics, writer=writer)
    for tick in ticks:
        recorder.on_tick(Tick(tick.mono, tick.wall, tick.reading))
    recorder.close()
    writer.close()
    meta.status = status
    meta.duration_s = cell.duration_s
    meta.ended_at = _iso(cell.start_wall + (cell.duration_s or 0.0))
    finish_experiment(store, meta, [], [], meta.notes, schema=writer.schema)
    return meta.to_json()


def _iso(wall: float) -> str:
    return datetime.fromtimestamp(wall or time.time(), timezone.utc).isoformat(timespec="milliseconds")
