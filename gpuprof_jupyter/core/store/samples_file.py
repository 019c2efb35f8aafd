"""Samples on disk: an Arrow IPC stream while recording, Parquet once finished (any process
that records or reads a store).

Runs in any process (core).

The stream is appended every few seconds and stays readable after a crash up to its last
complete batch, so a dead kernel loses at most the last flush interval. Each batch is
serialised before it is written, at the end of the last complete message; a failed write
(a full disk) is cut back there, so a retry neither repeats nor tears a batch: the only damage
a stream can hold is a torn end (the writer died mid-write), which readers stop before.
``stream_to_parquet`` turns the stream into Parquet with one device per row group, devices one
after another (memory stays bounded however long the run), records that layout in the file's
metadata and says what it dropped.

``SamplesFile`` reads that Parquet file (one device's chosen columns read alone) or the stream
of a run still recording or crashed. Analysis reads one device at a time through it
(``Experiment.device_frame``); ``Experiment.samples`` still gets every row, in tick order.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from gpuprof_jupyter.core.store.arrow_arrays import array, to_numpy
from gpuprof_jupyter.core.store.atomic import write_atomic
from gpuprof_jupyter.core.store.permissions import PRIVATE_DIR, UnsafeStore, create_file, handle_path, open_directory
from gpuprof_jupyter.core.store.keep_more import WouldShrink, refuse_fewer_rows
from gpuprof_jupyter.core.format import fmt_unit

STREAM_NAME = "samples.arrows"
PARQUET_NAME = "samples.parquet"
LAYOUT_KEY = "gpuprof.layout"  # Parquet key-value metadata: JSON, see stream_to_parquet
LAYOUT_VERSION = 2  # the layout every samples.parquet has (a file without it is not ours)
ROW_GROUP_ROWS = 65536  # rows per row group (one device's): big enough to read and write fast
CHUNK_ROWS = 8192  # rows of the stream handled at once while converting
KEY_COLUMNS = ("t", "wall_time", "device")
CONTINUATION = b"\xff\xff\xff\xff"  # starts every Arrow IPC message
END_OF_STREAM = CONTINUATION + b"\x00\x00\x00\x00"


def samples_schema(metrics: list[str]) -> pa.Schema:
    fields = [pa.field("t", pa.float64()), pa.field("wall_time", pa.float64()), pa.field("device", pa.string())]
    return pa.schema(fields + [pa.field(m, pa.float64()) for m in metrics])


@dataclass
class EncodedBatch:
    """One batch serialised to the stream's bytes before any write: a retry writes the same
    bytes again, at the same place."""

    data: pa.Buffer
    rows: int
    t_min: float | None
    t_max: float | None


class SampleStreamWriter:
    """Appends record batches to ``samples.arrows`` in an experiment directory.

    Each batch is serialised first (``encode``), then written at the end of the last complete
    message (``offset``); a write that fails is cut back to that offset before it is raised,
    so a retry neither repeats nor tears a batch. The file is created exclusively, never
    through a link (permissions.py).
    """

    def __init__(self, directory: Path, schema: pa.Schema) -> None:
        self.path = Path(directory) / STREAM_NAME
        self.schema = schema
        self.rows = 0
        self.offset = 0  # bytes on disk that hold complete messages
        try:
            self._fd = create_file(Path(directory), STREAM_NAME)
        except FileExistsError:
            raise UnsafeStore(f"{STREAM_NAME} already exists in the new experiment directory {directory} (someone "
                              f"else put it there): not opened, nothing written") from None
        self._header = schema.serialize()
        try:
            self._put(self._header)
        except OSError:  # a full disk already: the schema goes first with the first batch
            pass

    def encode(self, columns: dict[str, list]) -> EncodedBatch:
        batch = pa.record_batch([array(columns[f.name], f.type) for f in self.schema], schema=self.schema)
        t = columns["t"]
        return EncodedBatch(batch.serialize(), batch.num_rows, min(t, default=None), max(t, default=None))

    def append(self, encoded: EncodedBatch) -> None:
        """Write ``encoded`` after the last complete message; OSError leaves the file as before."""
        if self.offset == 0:
            self._put(self._header)
        self._put(encoded.data)
        self.rows += encoded.rows

    def write(self, columns: dict[str, list]) -> None:
        self.append(self.encode(columns))

    def _put(self, data) -> None:
        view, done = memoryview(data), 0
        try:
            while done < len(view):
                done += os.pwrite(self._fd, view[done:], self.offset + done)
        except BaseException:
            try:
                os.ftruncate(self._fd, self.offset)  # no torn message left for a reader to trip on
            except OSError:
                pass  # the next write starts at the same offset and covers it
            raise
        self.offset += done

    def close(self) -> None:
        if self._fd is None:
            return
        try:
            if self.offset:
                self._put(END_OF_STREAM)
        except OSError:
            pass  # a reader stops at the end of the file just as well
        finally:
            os.close(self._fd)
            self._fd = None


@dataclass
class StreamDamage:
    """Bytes at the end of a stream that hold no complete batch: the writer died mid-write."""

    offset: int
    size: int  # bytes skipped
    t_before: float | None  # the last readable row's time before them

    def note(self) -> str:
        where = f"after t={fmt_unit(self.t_before, 's', 2)}" if self.t_before is not None else "before the first row"
        return (f"{STREAM_NAME}: {self.size} damaged bytes at offset {self.offset} ({where}) held no readable "
                f"batch and were skipped; every readable row was kept")


_END = object()  # the end-of-stream marker


def _message_at(f, schema: pa.Schema, pos: int):
    """(record batch, or None for another message type; offset after it) for the message at
    ``pos``; ``_END`` at the end-of-stream marker; None when no complete, well-formed message is
    there."""
    try:
        if f.read_at(8, pos) == END_OF_STREAM:
            return _END
        f.seek(pos)
        message = ipc.read_message(f)
        end = f.tell()
        batch = ipc.read_record_batch(message, schema) if message.type == "record batch" else None
    except (EOFError, ValueError, OSError, pa.ArrowException):
        return None
    return batch, end


def _scan_stream(f, schema: pa.Schema, start: int, damage: list | None, to_end: bool):
    """Yield (batch, end offset) for each complete batch from ``start``. A torn end stops the
    scan before it; it is listed in ``damage`` when ``to_end`` (the writer is gone: nothing more
    will come)."""
    size = f.size()
    pos, previous = start, None  # the last batch yielded
    while pos < size:
        found = _message_at(f, schema, pos)
        if found is None:
            if to_end and damage is not None:
                damage.append(StreamDamage(pos, size - pos, _t_range(previous)[1]))
            return
        if found is _END:
            return
        batch, end = found
        if batch is not None:
            previous = batch
            yield batch, end
        pos = end


def _t_range(batch) -> tuple[float | None, float | None]:
    if batch is None or not batch.num_rows:
        return None, None
    bounds = pc.min_max(batch.column("t"))
    return bounds["min"].as_py(), bounds["max"].as_py()


def read_stream_batches(path: Path, damage: list | None = None):
    """Yield every complete batch of a stream file; a torn end is listed in ``damage``
    (StreamDamage) when a list is given."""
    try:
        with pa.OSFile(str(path), "rb") as f:
            schema = ipc.read_schema(ipc.read_message(f))
            for batch, _end in _scan_stream(f, schema, f.tell(), damage, to_end=True):
                yield batch
    except (EOFError, OSError, pa.ArrowException):  # no file, or not even a schema
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
            batches, end = [], start
            for batch, end in _scan_stream(f, schema, start, None, to_end=False):  # noqa: B007 - end: where the last batch ended
                batches.append(batch)
    except (EOFError, OSError, pa.ArrowException):
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


def _has_values(column) -> bool:
    """Does a float column hold at least one value that is neither null nor NaN?"""
    if column.null_count == len(column):
        return False
    if pa.types.is_floating(column.type):
        return bool(pc.any(pc.invert(pc.is_nan(column))).as_py())
    return True


class StreamRefused(WouldShrink):
    """The stream is missing or holds fewer rows than the Parquet file already there: converting
    it would lose samples, so nothing is written."""


def stream_to_parquet(directory: Path, schema: pa.Schema, row_group_rows: int = ROW_GROUP_ROWS,
                      notes: list[str] | None = None) -> Path:
    """Convert the stream to Parquet (one device per row group, devices one after another)
    atomically and remove the stream.

    Every complete row is kept: a torn end is skipped, with one note in ``notes``. A missing stream, or one with fewer rows than a ``samples.parquet`` already
    there (another process finished the run first), raises StreamRefused and changes nothing.

    Memory stays bounded by one chunk of the stream plus one row group however long the run:
    a first pass splits the stream into one temporary Arrow file per device, a second writes
    each device's rows as row groups of ``row_group_rows`` rows (the last one shorter). The
    layout (devices in order of first appearance, their row counts and the columns that hold
    values) goes into the file's metadata, so a reader can pick one device's row groups.
    """
    with open_directory(Path(directory)) as dir_fd:  # every file below reached through this handle:
        here = handle_path(dir_fd, Path(directory))  # a teammate renaming a folder redirects nothing
        if not (here / STREAM_NAME).is_file():
            raise StreamRefused(f"{STREAM_NAME} is missing: {PARQUET_NAME} left as it is")
        damage: list[StreamDamage] = []
        spill = f".samples-split-{secrets.token_hex(4)}"
        os.mkdir(spill, PRIVATE_DIR, dir_fd=dir_fd)
        try:
            with open_directory(here / spill) as spill_fd:
                _convert(here, handle_path(spill_fd, here / spill), schema, row_group_rows, damage)
        finally:
            shutil.rmtree(spill, dir_fd=dir_fd, ignore_errors=True)
            pa.default_memory_pool().release_unused()  # hand the conversion's buffers back to the OS (kernel RSS)
        if notes is not None:
            notes.extend(d.note() for d in damage)
        os.unlink(STREAM_NAME, dir_fd=dir_fd)
    return Path(directory) / PARQUET_NAME


def _convert(here: Path, spill: Path, schema: pa.Schema, row_group_rows: int, damage: list) -> None:
    """``stream_to_parquet``'s two passes: the stream in ``here`` split per device into
    ``spill``, then written as ``here``'s Parquet file."""
    metrics = [f.name for f in schema if f.name not in KEY_COLUMNS]
    target = here / PARQUET_NAME
    parts: dict[str, tuple] = {}  # device -> (path, file, writer)
    rows: dict[str, int] = {}
    present: dict[str, set] = {}
    for chunk in _chunks(read_stream_batches(here / STREAM_NAME, damage), CHUNK_ROWS):
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
    _refuse_shorter(target, sum(rows.values()))

    def write(out) -> None:
        groups: dict[str, list[int]] = {}
        index = 0
        with pq.ParquetWriter(out, schema, compression="zstd") as writer:
            for device, (path, _f, _w) in parts.items():
                for table in _regroup(read_stream_batches(path), row_group_rows, schema):
                    writer.write_table(table, row_group_size=row_group_rows)
                    groups.setdefault(device, []).append(index)
                    index += 1
            layout = {"version": LAYOUT_VERSION, "devices": list(parts), "rows": rows, "row_groups": groups,
                      "present": {d: [m for m in metrics if m in present[d]] for d in parts}}
            writer.add_key_value_metadata({LAYOUT_KEY: json.dumps(layout)})

    write_atomic(target, write, follow_directory=True)  # ``here`` is the handle's own path


def _refuse_shorter(target: Path, stream_rows: int) -> None:
    """StreamRefused when ``target`` already holds more rows than the stream (keep_more.py)."""
    try:
        refuse_fewer_rows(target, stream_rows, source=STREAM_NAME)
    except WouldShrink as exc:
        raise StreamRefused(str(exc)) from None


class SamplesFile:
    """One experiment's samples on disk: its Parquet file, else its stream (module docstring).

    Readers return None when there are no samples at all, and raise pa.ArrowInvalid /
    OSError for a corrupt Parquet file or one without ``stream_to_parquet``'s layout (the
    store reports it).
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
            self._layout = _layout_of(self._file, self.parquet)
        return self._file

    @property
    def layout(self) -> dict | None:
        """The per-device layout of the Parquet file (``stream_to_parquet``); None for a stream."""
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

    def _stream_chunks(self, columns: list[str] | None = None):
        """The stream's samples as tables of about CHUNK_ROWS rows, in file order."""
        if self.stream.exists():
            for table in _chunks(read_stream_batches(self.stream), CHUNK_ROWS):
                yield table.select(columns) if columns else table

    def devices(self) -> list[str]:
        """Devices with at least one sample, in order of first appearance."""
        if self.layout is not None:
            return [d for d in self._layout["devices"] if self._layout["rows"].get(d)]
        seen: dict[str, None] = {}
        for table in self._stream_chunks(["device"]):
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
        for table in self._stream_chunks():
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
        if pf is not None:
            groups = self._layout["row_groups"].get(device, [])
            if not groups:
                return schema.empty_table().select(wanted)
            return pf.read_row_groups(groups, columns=wanted)
        parts = [table.filter(pc.equal(table.column("device"), device)).select(wanted) for table in self._stream_chunks()]
        return pa.concat_tables(parts) if parts else schema.empty_table().select(wanted)

    def read_device_arrays(self, device: str, columns: list[str] | None = None) -> dict | None:
        """``read_device`` as float64 numpy arrays (nulls as NaN), filled one row group at a
        time: memory is the result plus one row group's columns, nothing more."""
        import numpy as np

        pf = self._open()
        if pf is None:
            table = self.read_device(device, columns)
            if table is None:
                return None
            return {name: to_numpy(table.column(name)) for name in table.column_names}
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
                out[name][offset:offset + n] = to_numpy(table.column(name))
            offset += n
        return out

    def read_all(self, columns: list[str] | None = None) -> pa.Table | None:
        """Every sample, in tick order (devices within a tick in their order of first appearance)."""
        pf = self._open()
        if pf is not None:
            if len(self.devices()) < 2:
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


def _layout_of(pf: pq.ParquetFile, path: Path) -> dict:
    """The layout ``stream_to_parquet`` recorded in ``pf``'s metadata; pa.ArrowInvalid when it is
    missing or another version (no gpuprof_jupyter release wrote such a file)."""
    raw = (pf.metadata.metadata or {}).get(LAYOUT_KEY.encode())
    try:
        layout = json.loads(raw) if raw else None
    except ValueError:
        layout = None
    if not isinstance(layout, dict) or layout.get("version") != LAYOUT_VERSION:
        raise pa.ArrowInvalid(f"{path} has no {LAYOUT_KEY} version {LAYOUT_VERSION} in its metadata: it was not "
                              f"written by gpuprof_jupyter (stream_to_parquet), so it is not read")
    return layout


def read_samples_table(directory: Path, columns: list[str] | None = None) -> pa.Table | None:
    """Samples of an experiment (Parquet, else what the stream holds); None if there are none.

    Raises pa.ArrowInvalid / OSError for a corrupt Parquet file (the store reports it).
    """
    return SamplesFile(directory).read_all(columns)
