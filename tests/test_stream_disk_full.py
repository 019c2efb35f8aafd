"""A full disk never loses or repeats a sample row, and a damaged stream still converts.

The recorder runs with its real writer thread (a write every 0.05 s) into a real 200 KB tmpfs
that the test fills in the middle of the run and frees later (CI runs as root, so the mount
works there). Each case also runs against an injected fault: ``os.pwrite`` writes half a
batch and then fails with ENOSPC while the "disk" is full, so the case runs where no tmpfs can
be mounted too.
"""

from __future__ import annotations

import errno
import os
import subprocess
import threading
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gpuprof_jupyter.core.store.samples_file import (PARQUET_NAME, STREAM_NAME, SampleStreamWriter, StreamRefused,
                                                     read_stream_batches, samples_schema, stream_to_parquet)
from gpuprof_jupyter.sampler_process import recorder as recorder_module
from gpuprof_jupyter.core.protocol import Tick
from gpuprof_jupyter.sampler_process.recorder import Recorder
from tests.fakes import wait_for

DEVICES = ("gpu0", "host")
SCHEMA = samples_schema(["sm_util"])
TICK_S = 0.05  # each tick's time in the run (the value of row i is i: order and duplicates show)


class TmpfsDisk:
    """A real 200 KB tmpfs: ``fill`` writes a file until ENOSPC, ``free`` removes it."""

    def __init__(self, mount: Path, directory: Path) -> None:
        self.mount, self.directory = mount, directory

    def fill(self) -> None:
        fd = os.open(self.mount / "filler", os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        try:
            while os.write(fd, b"\0" * 4096):
                pass
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
        finally:
            os.close(fd)

    def free(self) -> None:
        (self.mount / "filler").unlink()


class InjectedDisk:
    """While full, ``os.pwrite`` writes half of what it is given, then fails with ENOSPC."""

    def __init__(self, directory: Path, monkeypatch) -> None:
        self.directory, self.full, self._torn = directory, False, False
        real = os.pwrite

        def pwrite(fd, data, offset):
            if not self.full:
                return real(fd, data, offset)
            if not self._torn and len(data) > 1:
                self._torn = True
                return real(fd, bytes(data[: len(data) // 2]), offset)
            self._torn = False
            raise OSError(errno.ENOSPC, "No space left on device (injected)")

        monkeypatch.setattr(os, "pwrite", pwrite)

    def fill(self) -> None:
        self.full = True

    def free(self) -> None:
        self.full = False


@pytest.fixture(scope="module")
def tmpfs(tmp_path_factory):
    mount = tmp_path_factory.mktemp("tmpfs")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=200k", "tmpfs", str(mount)], capture_output=True)
    if done.returncode:
        yield None
        return
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


@pytest.fixture(params=["tmpfs", "injected"])
def disk(request, tmpfs, tmp_path, monkeypatch):
    if request.param == "injected":
        yield InjectedDisk(tmp_path, monkeypatch)
        return
    if tmpfs is None:
        pytest.skip("cannot mount a tmpfs here (needs root; CI runs as root): the 'injected' twin of this "
                    "test fails writes at os.pwrite instead")
    directory = tmpfs / request.node.name.replace("[", "-").replace("]", "")
    directory.mkdir()
    try:
        yield TmpfsDisk(tmpfs, directory)
    finally:
        for path in sorted(directory.rglob("*"), reverse=True):
            path.rmdir() if path.is_dir() else path.unlink()
        directory.rmdir()
        (tmpfs / "filler").unlink(missing_ok=True)


class Feeder:
    """Ticks from a thread of their own, one every few ms, as a sampling lane would hand them."""

    def __init__(self, recorder: Recorder) -> None:
        self.recorder, self.count = recorder, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.003):
            i = self.count
            self.recorder.on_tick(Tick(i * TICK_S, 1000.0 + i * TICK_S, {d: {"sm_util": float(i)} for d in DEVICES}))
            self.count = i + 1

    @contextmanager
    def running(self):
        self._thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            self._thread.join()


def _values(directory: Path) -> dict[str, list[float]]:
    """Each device's sm_util values in the stream, in file order."""
    out: dict[str, list[float]] = {d: [] for d in DEVICES}
    for batch in read_stream_batches(directory / STREAM_NAME):
        for device, value in zip(batch.column("device").to_pylist(), batch.column("sm_util").to_pylist()):
            out[device].append(value)
    return out


def _rows(directory: Path) -> int:
    return sum(len(v) for v in _values(directory).values())


@contextmanager
def _recording(directory: Path):
    """A recorder writing every 0.05 s on its own thread into a real stream writer."""
    writer = SampleStreamWriter(directory, SCHEMA)
    recorder = Recorder(0.0, ["sm_util"], writer=writer, flush_every_s=0.05)
    recorder.start_writing()
    try:
        yield recorder, writer
    finally:  # also when a check failed: the file closed before the tmpfs is unmounted
        recorder.close(retries=0)
        writer.close()


@pytest.mark.process
def test_a_disk_full_for_a_while_loses_and_repeats_no_row(disk):
    with _recording(disk.directory) as (recorder, writer), Feeder(recorder).running() as feeder:
        wait_for(lambda: _rows(disk.directory) >= 40, 20, "rows on disk before it fills")
        disk.fill()
        wait_for(lambda: recorder.write_failures >= 3, 20, "writes failing on the full disk")
        full_at = feeder.count
        disk.free()
        wait_for(lambda: _rows(disk.directory) >= 2 * (full_at + 20), 20, "rows after the disk was freed")
    fed = list(map(float, range(feeder.count)))
    assert _values(disk.directory) == {d: fed for d in DEVICES}  # every row, in order, once
    [note] = [e for e in recorder.errors if "writing samples failed" in e]
    assert "none lost or repeated" in note and "No space left on device" in note, note
    notes: list[str] = []
    stream_to_parquet(disk.directory, SCHEMA, notes=notes)
    assert notes == []
    table = pq.read_table(disk.directory / PARQUET_NAME)
    for device in DEVICES:
        assert table.filter(pa.compute.equal(table["device"], device))["sm_util"].to_pylist() == fed


@pytest.mark.process
def test_a_disk_that_never_recovers_says_exactly_which_rows_were_lost(disk):
    with _recording(disk.directory) as (recorder, writer):
        with Feeder(recorder).running() as feeder:
            wait_for(lambda: _rows(disk.directory) >= 40, 20, "rows on disk before it fills")
            disk.fill()
            wait_for(lambda: recorder.write_failures >= 3, 20, "writes failing on the full disk")
        recorder.close(retries=1)
    kept = _values(disk.directory)
    for device in DEVICES:  # every row written before the disk filled, in order, once
        assert kept[device] == list(map(float, range(len(kept[device]))))
    lost = 2 * feeder.count - sum(len(v) for v in kept.values())
    first_lost = min(len(v) for v in kept.values()) * TICK_S
    [note] = [e for e in recorder.errors if "writing samples failed" in e]
    assert (f"{lost} sample rows from t={first_lost:.2f} s to t={(feeder.count - 1) * TICK_S:.2f} s were lost "
            f"(the disk was still failing when the run ended)") in note, note
    assert "none lost" not in note and "retried" not in note
    assert recorder.unwritten_rows == 0 and lost > 0


def test_rows_beyond_the_memory_set_aside_are_counted_as_lost(tmp_path, monkeypatch):
    """The disk fails longer than memory can hold: the oldest waiting rows are dropped, the note
    says exactly how many and over which seconds, and every other row is written once."""
    monkeypatch.setattr(recorder_module, "MAX_WAITING_BYTES", 4000)
    disk = InjectedDisk(tmp_path, monkeypatch)
    with _recording(tmp_path) as (recorder, writer), Feeder(recorder).running() as feeder:
        wait_for(lambda: _rows(tmp_path) >= 40, 20, "rows on disk before it fails")
        disk.fill()
        wait_for(lambda: recorder._trouble is not None and recorder._trouble.lost_rows >= 100, 20, "rows dropped")
        disk.free()
        wait_for(lambda: recorder._trouble is None, 20, "the disk taking writes again")
    kept = _values(tmp_path)
    fed = set(map(float, range(feeder.count)))
    missing = []
    for device in DEVICES:
        assert kept[device] == sorted(set(kept[device])), "in order, no duplicates"
        missing += [(v, device) for v in sorted(fed - set(kept[device]))]
    [note] = [e for e in recorder.errors if "writing samples failed" in e]
    lo, hi = min(missing)[0] * TICK_S, max(missing)[0] * TICK_S
    assert (f"{len(missing)} sample rows from t={lo:.2f} s to t={hi:.2f} s were lost "
            f"(more waited than the memory set aside for them)") in note, note


# -- damaged streams, and the finisher's guard ---------------------------------------------------
def _batch(first: int, n: int = 10) -> bytes:
    values = [float(i) for i in range(first, first + n)]
    return pa.record_batch([pa.array(values), pa.array([0.0] * n), pa.array(["gpu0"] * n), pa.array(values)],
                           schema=SCHEMA).serialize().to_pybytes()


def test_a_torn_stream_converts_with_every_complete_row_and_says_what_it_dropped(tmp_path):
    """The writer died in the middle of a batch (the only damage it leaves: a failed write is cut
    back before the next one)."""
    header, b1, b2, b3 = SCHEMA.serialize().to_pybytes(), _batch(0), _batch(10), _batch(20)
    (tmp_path / STREAM_NAME).write_bytes(header + b1 + b2 + b3[:40])
    notes: list[str] = []
    stream_to_parquet(tmp_path, SCHEMA, notes=notes)
    rows = pq.read_table(tmp_path / PARQUET_NAME)["sm_util"].to_pylist()
    assert rows == list(map(float, range(20)))
    assert len(notes) == 1 and "40 damaged bytes" in notes[0] and "after t=19.00 s" in notes[0], notes


@pytest.mark.process
def test_converting_refuses_a_missing_or_shorter_stream(tmp_path):
    """A late finisher must not replace good Parquet with less (the one-owner rule of a run)."""
    writer = SampleStreamWriter(tmp_path, SCHEMA)
    for first in (0, 10):
        writer.write({"t": [float(first)], "wall_time": [0.0], "device": ["gpu0"], "sm_util": [float(first)]})
    writer.close()
    saved = (tmp_path / STREAM_NAME).read_bytes()
    stream_to_parquet(tmp_path, SCHEMA)
    good = (tmp_path / PARQUET_NAME).read_bytes()
    with pytest.raises(StreamRefused, match="missing"):
        stream_to_parquet(tmp_path, SCHEMA)
    (tmp_path / STREAM_NAME).write_bytes(saved[: len(saved) - 20])  # one batch torn away: 1 row < 2
    with pytest.raises(StreamRefused, match="samples.parquet holds 2 rows but samples.arrows has 1"):
        stream_to_parquet(tmp_path, SCHEMA)
    assert (tmp_path / PARQUET_NAME).read_bytes() == good


@pytest.mark.process
def test_finishing_a_run_with_a_damaged_stream_keeps_its_rows_and_notes_the_damage(tmp_path):
    from gpuprof_jupyter.core.finish import finish_experiment
    from gpuprof_jupyter.core.store.directory import Store
    from gpuprof_jupyter.core.store.experiment import ExperimentMeta

    store = Store(tmp_path / "store")
    meta = ExperimentMeta(id="", name="torn-stream")
    directory = store.create(meta)
    header, b1, b2 = SCHEMA.serialize().to_pybytes(), _batch(0), _batch(10)
    (directory / STREAM_NAME).write_bytes(header + b1 + b2 + _batch(20)[:100])
    finish_experiment(store, meta, [], [], meta.notes)  # the kernel's path: the schema read from the stream
    loaded = store.load("torn-stream")
    assert list(loaded.samples["sm_util"]) == list(map(float, range(20)))
    assert any("100 damaged bytes" in note for note in loaded.meta.notes), loaded.meta.notes
