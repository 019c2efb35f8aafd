"""Samples on disk: an Arrow IPC stream while recording, Parquet once finished.

The stream is appended every few seconds and stays readable after a crash up to its last
complete batch, so a dead kernel loses at most the last flush interval. ``finalize`` turns
it into Parquet batch by batch (memory stays bounded however long the run).
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from .atomic import write_atomic

STREAM_NAME = "samples.arrows"
PARQUET_NAME = "samples.parquet"


def samples_schema(metrics: list[str]) -> pa.Schema:
    fields = [pa.field("t", pa.float64()), pa.field("wall_time", pa.float64()), pa.field("device", pa.string())]
    return pa.schema(fields + [pa.field(m, pa.float64()) for m in metrics])


class SampleStreamWriter:
    """Appends record batches to ``samples.arrows`` in an experiment directory."""

    def __init__(self, directory: Path, schema: pa.Schema) -> None:
        self.path = Path(directory) / STREAM_NAME
        self.schema = schema
        self._file = open(self.path, "wb")
        self._writer = ipc.new_stream(self._file, schema)
        self.rows = 0

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
        with open(path, "rb") as f:
            reader = ipc.open_stream(f)
            while True:
                try:
                    yield reader.read_next_batch()
                except StopIteration:
                    return
    except (pa.ArrowInvalid, OSError):  # truncated or torn last batch: keep what came before
        return


def stream_to_parquet(directory: Path, schema: pa.Schema) -> Path:
    """Convert the stream to Parquet atomically and remove the stream."""
    directory = Path(directory)
    stream = directory / STREAM_NAME
    target = directory / PARQUET_NAME

    def write(tmp: Path) -> None:
        with pq.ParquetWriter(tmp, schema, compression="zstd") as writer:
            for batch in read_stream_batches(stream):
                writer.write_batch(batch)

    write_atomic(target, write)
    stream.unlink(missing_ok=True)
    return target


def read_samples_table(directory: Path, columns: list[str] | None = None) -> pa.Table | None:
    """Samples of an experiment (Parquet, else what the stream holds); None if there are none.

    Raises pa.ArrowInvalid / OSError for a corrupt Parquet file (the store reports it).
    """
    directory = Path(directory)
    parquet = directory / PARQUET_NAME
    if parquet.exists():
        return pq.read_table(parquet, columns=columns)
    stream = directory / STREAM_NAME
    if stream.exists():
        batches = list(read_stream_batches(stream))
        if not batches:
            return None
        table = pa.Table.from_batches(batches)
        return table.select(columns) if columns else table
    return None
