"""Samples on disk: an Arrow IPC stream while recording, Parquet once finished.

Runs in any process (core).

The stream is appended every few seconds and stays readable after a crash up to its last
complete batch, so a dead kernel loses at most the last flush interval. ``stream_to_parquet``
turns it into Parquet with one device per row group, devices one after another (memory stays
bounded however long the run), and records that layout in the file's metadata.

``SamplesFile`` reads whichever layout is on disk: that Parquet file (one device's chosen
columns read alone), an older Parquet file with ticks interleaved, or the stream of a run
still recording or crashed. Analysis reads one device at a time through it
(``Experiment.device_frame``); ``Experiment.samples`` still gets every row, in tick order.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from gpuprof_jupyter.core.store.atomic import write_atomic
from gpuprof_jupyter.core.store.permissions import open_new_file

STREAM_NAME = "samples.arrows"
PARQUET_NAME = "samples.parquet"
LAYOUT_KEY = "gpuprof.layout"  # Parquet key-value metadata: JSON, see stream_to_parquet
LAYOUT_VERSION = 2  # 1 (no key): ticks interleaved, every device in every row group
ROW_GROUP_ROWS = 65536  # rows per row group (one device's): big enough to read and write fast
CHUNK_ROWS = 8192  # rows of the stream handled at once while converting
KEY_COLUMNS = ("t", "wall_time", "device")


def samples_schema(metrics: list[str]) -> pa.Schema:
    fields = [pa.field("t", pa.float64()), pa.field("wall_time", pa.float64()), pa.field("device", pa.string())]
    return pa.schema(fields + [pa.field(m, pa.float64()) for m in metrics])


class SampleStreamWriter:
    """Appends record batches to ``samples.arrows`` in an experiment directory."""

    def __init__(self, directory: Path, schema: pa.Schema) -> None:
        self.path = Path(directory) / STREAM_NAME
        self.schema = schema
        self._file = os.fdopen(open_new_file(self.path), "wb")
        self._writer = ipc.new_stream(self._file, schema)
        self.rows = 0
        # pyarrow imports pandas on its first pa.array() (~0.4 s, holding the import lock):
        # pay that here, in the caller's thread, not in the sampler thread's first flush.
        import pandas  # noqa: F401

    def write(self, columns: dict[str, list]) -> None:
        batch = pa.record_batch([pa.array(columns[f.name], f.type) for f in self.schema], schema=self.schema)
        self._writer.write_batch(batch)
        self._file.flush()
        self.rows += batch.num_rows

    def close(self) -> None:
        if not self._file.closed:
            self._writer.close()
            self._file.close()


def read_stream_batches(path: Path):
    """Yield the complete batches of a (possibly truncated) stream file."""
    try:
        with pa.OSFile(str(path), "rb") as f:  # Arrow's own reads: no Python bytes per batch
            reader = ipc.open_stream(f)
            while True:
                try:
                    yield reader.read_next_batch()
                except StopIteration:
                    return
    except (pa.ArrowInvalid, OSError):  # truncated or torn last batch: keep what came before
        return


def read_stream_tail(path: Path, offset: int = 0) -> tuple[pa.Table | None, int]:
    """The complete batches of a growing stream after byte ``offset``, and the offset to ask
    from next time (the end of the last complete batch).

    Only the bytes after ``offset`` are read (plus the schema message at the start): a reader
    following a 12-hour run asks for each new flush alone. ``offset`` 0 (or inside the schema)
    reads from the first batch. A torn last batch is left for the next call. (None, offset)
    when nothing new is there; (None, 0) when the file is missing or has no schema yet.
    """
    try:
        with pa.OSFile(str(path), "rb") as f:
            schema = ipc.read_schema(ipc.read_message(f))
            start = max(int(offset), f.tell())
            if start > f.size():  # the file was replaced (a new stream): start again
                start = f.tell()
            f.seek(start)
            batches, end = [], start
            while True:
                try:
                    message = ipc.read_message(f)
                except (EOFError, pa.ArrowInvalid, OSError):  # end of stream, or torn last batch
                    break
                if message is None:
                    break
                if message.type == "record batch":
                    batches.append(ipc.read_record_batch(message, schema))
                end = f.tell()
    except (EOFError, pa.ArrowInvalid, OSError):
        return None, 0
    if not batches:
        return None, end
    return pa.Table.from_batches(batches, schema), end


def _chunks(batches, rows: int):
    """Concatenate small stream batches into tables of about ``rows`` rows (bounded memory)."""
    pending, count = [], 0
    for batch in batches:
        if batch.num_rows:
            pending.append(batch)
            count += batch.num_rows
        if count >= rows:
            yield pa.Table.from_batches(pending)
            pending, count = [], 0
    if pending:
        yield pa.Table.from_batches(pending)


def _split_by_device(table: pa.Table):
    """(device, rows of that device in their order) for each device in ``table``."""
    devices = table.column("device").combine_chunks()
    if devices.null_count:  # never written by the recorder; such rows belong to no device
        table = table.filter(devices.is_valid())
        devices = table.column("device").combine_chunks()
    encoded = devices.dictionary_encode()
    codes = encoded.indices
    names = encoded.dictionary.to_pylist()
    if len(names) == 1:
        yield names[0], table
        return
    order = pc.sort_indices(pa.table({"c": codes}), sort_keys=[("c", "ascending")])  # stable
    grouped = table.take(order)
    counts = pc.value_counts(codes)
    sizes = dict(zip(counts.field("values").to_pylist(), counts.field("counts").to_pylist()))
    offset = 0
    for code in range(len(names)):
        n = sizes.get(code, 0)
        if n:
            yield names[code], grouped.slice(offset, n)
            offset += n


def _regroup(batches, rows: int, schema: pa.Schema):
    """Tables of exactly ``rows`` rows (the last one shorter) from a stream of batches."""
    pending, count = [], 0
    for batch in batches:
        pending.append(batch)
        count += batch.num_rows
        while count >= rows:
            table = pa.Table.from_batches(pending, schema)
            yield table.slice(0, rows)
            rest = table.slice(rows)
            pending, count = rest.to_batches(), rest.num_rows
    if count:
        yield pa.Table.from_batches(pending, schema)


def _float_array(column):
    """A float column as a float64 numpy array, nulls as NaN."""
    return column.to_numpy() if column.null_count == 0 else pc.fill_null(column, float("nan")).to_numpy()


def _has_values(column) -> bool:
    """Does a float column hold at least one value that is neither null nor NaN?"""
    if column.null_count == len(column):
        return False
    if pa.types.is_floating(column.type):
        return bool(pc.any(pc.invert(pc.is_nan(column))).as_py())
    return True


def stream_to_parquet(directory: Path, schema: pa.Schema, row_group_rows: int = ROW_GROUP_ROWS) -> Path:
    """Convert the stream to Parquet (one device per row group, devices one after another)
    atomically and remove the stream.

    Memory stays bounded by one chunk of the stream plus one row group however long the run:
    a first pass splits the stream into one temporary Arrow file per device, a second writes
    each device's rows as row groups of ``row_group_rows`` rows (the last one shorter). The
    layout (devices in order of first appearance, their row counts and the columns that hold
    values) goes into the file's metadata, so a reader can pick one device's row groups.
    """
    directory = Path(directory)
    stream = directory / STREAM_NAME
    target = directory / PARQUET_NAME
    metrics = [f.name for f in schema if f.name not in ("t", "wall_time", "device")]
    spill = Path(tempfile.mkdtemp(prefix=".samples-split-", dir=directory))
    try:
        parts: dict[str, tuple] = {}  # device -> (path, file, writer)
        rows: dict[str, int] = {}
        present: dict[str, set] = {}
        for chunk in _chunks(read_stream_batches(stream), CHUNK_ROWS):
            for device, part in _split_by_device(chunk):
                if device not in parts:
                    path = spill / f"{len(parts)}.arrows"
                    f = pa.OSFile(str(path), "wb")
                    parts[device] = (path, f, ipc.new_stream(f, schema))
                    rows[device], present[device] = 0, set()
                parts[device][2].write_table(part)
                rows[device] += part.num_rows
                present[device].update(m for m in metrics if m not in present[device] and _has_values(part.column(m)))
        for _path, f, writer in parts.values():
            writer.close()
            f.close()
        def write(tmp: Path) -> None:
            groups: dict[str, list[int]] = {}
            index = 0
            with pq.ParquetWriter(tmp, schema, compression="zstd") as writer:
                for device, (path, _f, _w) in parts.items():
                    for table in _regroup(read_stream_batches(path), row_group_rows, schema):
                        writer.write_table(table, row_group_size=row_group_rows)
                        groups.setdefault(device, []).append(index)
                        index += 1
                layout = {"version": LAYOUT_VERSION, "devices": list(parts), "rows": rows, "row_groups": groups,
                          "present": {d: [m for m in metrics if m in present[d]] for d in parts}}
                writer.add_key_value_metadata({LAYOUT_KEY: json.dumps(layout)})

        write_atomic(target, write)
    finally:
        shutil.rmtree(spill, ignore_errors=True)
        pa.default_memory_pool().release_unused()  # hand the conversion's buffers back to the OS (kernel RSS)
    stream.unlink(missing_ok=True)
    return target


class SamplesFile:
    """One experiment's samples on disk, whichever layout (see the module docstring).

    Readers return None when there are no samples at all, and raise pa.ArrowInvalid /
    OSError for a corrupt Parquet file (the store reports it).
    """

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self.parquet = self.directory / PARQUET_NAME
        self.stream = self.directory / STREAM_NAME
        self._file: pq.ParquetFile | None = None
        self._layout: dict | None = None

    def _open(self) -> pq.ParquetFile | None:
        if self._file is None and self.parquet.exists():
            self._file = pq.ParquetFile(self.parquet, pre_buffer=False)
            raw = (self._file.metadata.metadata or {}).get(LAYOUT_KEY.encode())
            layout = json.loads(raw) if raw else None
            self._layout = layout if isinstance(layout, dict) and layout.get("version") == LAYOUT_VERSION else None
        return self._file

    @property
    def layout(self) -> dict | None:
        """The per-device layout of a Parquet file written by ``stream_to_parquet`` (else None)."""
        self._open()
        return self._layout

    def schema(self) -> pa.Schema | None:
        pf = self._open()
        if pf is not None:
            return pf.schema_arrow
        if self.stream.exists():
            try:
                with open(self.stream, "rb") as f:
                    return ipc.open_stream(f).schema
            except (pa.ArrowInvalid, OSError):
                return None
        return None

    def _chunks(self, columns: list[str] | None = None):
        """The samples as tables of about CHUNK_ROWS rows, in file order (any layout)."""
        pf = self._open()
        if pf is not None:
            for batch in pf.iter_batches(batch_size=CHUNK_ROWS, columns=columns):
                yield pa.Table.from_batches([batch])
        elif self.stream.exists():
            for table in _chunks(read_stream_batches(self.stream), CHUNK_ROWS):
                yield table.select(columns) if columns else table

    def devices(self) -> list[str]:
        """Devices with at least one sample, in order of first appearance."""
        if self.layout is not None:
            return [d for d in self._layout["devices"] if self._layout["rows"].get(d)]
        seen: dict[str, None] = {}
        for table in self._chunks(["device"]):
            seen.update(dict.fromkeys(v for v in pc.unique(table.column("device")).to_pylist() if v is not None))
        return list(seen)

    def columns(self) -> list[str]:
        """Metric columns stored (whether or not they hold values)."""
        schema = self.schema()
        return [] if schema is None else [n for n in schema.names if n not in KEY_COLUMNS]

    def present(self, device: str | None = None) -> list[str]:
        """Metric columns holding at least one value (of ``device``, or of any device)."""
        columns = self.columns()
        if self.layout is not None:
            found = set()
            for d, names in self._layout["present"].items():
                if device is None or d == device:
                    found.update(names)
            return [c for c in columns if c in found]
        found = set()
        for table in self._chunks():
            if device is not None:
                table = table.filter(pc.equal(table.column("device"), device))
            found.update(c for c in columns if c not in found and _has_values(table.column(c)))
        return [c for c in columns if c in found]

    def read_device(self, device: str, columns: list[str] | None = None) -> pa.Table | None:
        """``t`` and the stored ones of ``columns`` (default: every metric; ``wall_time`` when
        asked for) of one device, in time order."""
        schema = self.schema()
        if schema is None:
            return None
        wanted = ["t"] + [c for c in (self.columns() if columns is None else columns)
                          if c in schema.names and c not in ("t", "device")]
        pf = self._open()
        if pf is not None and self._layout is not None:
            groups = self._layout["row_groups"].get(device, [])
            if not groups:
                return schema.empty_table().select(wanted)
            return pf.read_row_groups(groups, columns=wanted)
        if pf is not None:  # an older file, ticks interleaved: Arrow filters it batch by batch
            return pq.read_table(self.parquet, columns=wanted, filters=[("device", "==", device)])
        parts = [table.filter(pc.equal(table.column("device"), device)).select(wanted) for table in self._chunks()]
        return pa.concat_tables(parts) if parts else schema.empty_table().select(wanted)

    def read_device_arrays(self, device: str, columns: list[str] | None = None) -> dict | None:
        """``read_device`` as float64 numpy arrays (nulls as NaN), filled one row group at a
        time: memory is the result plus one row group's columns, nothing more."""
        import numpy as np

        pf = self._open()
        if pf is None or self._layout is None:
            table = self.read_device(device, columns)
            if table is None:
                return None
            return {name: _float_array(table.column(name)) for name in table.column_names}
        schema = pf.schema_arrow
        wanted = ["t"] + [c for c in (self.columns() if columns is None else columns)
                          if c in schema.names and c not in ("t", "device")]
        groups = self._layout["row_groups"].get(device, [])
        total = sum(pf.metadata.row_group(g).num_rows for g in groups)
        out = {name: np.empty(total) for name in wanted}
        offset = 0
        for g in groups:
            table = pf.read_row_group(g, columns=wanted, use_threads=False)
            n = table.num_rows
            for name in wanted:
                out[name][offset:offset + n] = _float_array(table.column(name))
            offset += n
        return out

    def read_all(self, columns: list[str] | None = None) -> pa.Table | None:
        """Every sample, in tick order (devices within a tick in their order of first appearance)."""
        pf = self._open()
        if pf is not None:
            if self._layout is None or len(self.devices()) < 2:
                return pq.read_table(self.parquet, columns=columns)
            wanted = columns if columns is None or "t" in columns else ["t", *columns]
            table = pq.read_table(self.parquet, columns=wanted)
            table = table.take(pc.sort_indices(table, sort_keys=[("t", "ascending")]))  # stable: device order kept
            return table.select(columns) if columns else table
        if self.stream.exists():
            batches = list(read_stream_batches(self.stream))
            if not batches:
                return None
            table = pa.Table.from_batches(batches)
            return table.select(columns) if columns else table
        return None


def read_samples_table(directory: Path, columns: list[str] | None = None) -> pa.Table | None:
    """Samples of an experiment (Parquet, else what the stream holds); None if there are none.

    Raises pa.ArrowInvalid / OSError for a corrupt Parquet file (the store reports it).
    """
    return SamplesFile(directory).read_all(columns)
