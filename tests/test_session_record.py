"""The session record in a real sampler process on fake GPUs: cells accounted, a long cell kept, the record on disk."""

from __future__ import annotations

import json
import os
import time

import pytest

from gpuprof_jupyter.core.protocol import CellMark, Ping, SessionControl, SessionQuery
from gpuprof_jupyter.core.store.directory import Store
from tests.fake_nvml import sampler_process_env
from tests.fakes import wait_for

GIB = 1 << 30


def _mark(link, event, **kw):
    link.tell(CellMark(event, time.monotonic(), time.time(), **kw))


def _rows(link):
    return link.request(SessionQuery(), timeout=30)


@pytest.mark.process
def test_cells_are_accounted_a_long_one_is_kept_and_the_record_is_written(fresh_sampler, tmp_path):
    old = tmp_path / "runtime" / "gpuprof-sessions" / "gone-kernel.json"  # a kernel gone for 8 days
    old.parent.mkdir(parents=True, mode=0o700)
    old.write_text("{}")
    os.utime(old, (time.time() - 8 * 86400,) * 2)
    spec = {"gpus": [{"kind": "a100", "processes": [[os.getpid(), 3 * GIB]], "util_gpu": 0},
                     {"kind": "a100", "util_gpu": 90}]}
    link = fresh_sampler(sampler_process_env(spec))
    store = tmp_path / "store"
    records = tmp_path / "runtime" / "gpuprof-sessions"
    link.tell(SessionControl(on=True, interval=0.5, keep_after_s=1.0, store=str(store), record_dir=str(records),
                             kernel={"id": "k-1", "user": "alice", "pid": os.getpid()}))
    wait_for(lambda: _rows(link).get("timeline", {}).get("t"), 60, "the record's first readings")
    _mark(link, "start", cell=1, source="train(model)")
    time.sleep(2.0)
    _mark(link, "end", status="ok")
    _mark(link, "start", cell=2, source="print('short')")
    _mark(link, "end", status="error")

    def finished():
        body = _rows(link)
        cells = {r["cell"]: r for r in body["rows"] if r["kind"] == "cell"}
        done = 1 in cells and 2 in cells and cells[1]["experiment"] and cells[2]["memory_held_bytes"] is not None
        return (body, cells) if done else None

    body, cells = wait_for(finished, 60, "both cells finished and the long one kept")
    long, short = cells[1], cells[2]
    assert long["source"] == "train(model)" and short["status"] == "error"
    assert long["duration_s"] >= 2.0
    assert 0 < long["gpu_busy_s"] <= 0.9 * long["duration_s"] + 0.5  # one device at 90 %, one idle
    assert long["energy_j"] is not None  # the fake's counter stands still: 0 J, measured
    assert long["memory_held_bytes"] == 3 * GIB  # this process's memory on the GPUs, not the devices' 24 GiB
    assert short["experiment"] is None  # shorter than keep_after
    assert "utilization.gpu" in body["provenance"]["gpu_busy_s"]
    assert "running_processes" in body["provenance"]["memory_held_bytes"]
    assert body["kept"] == [{"cell": 1, "experiment": long["experiment"], "name": "cell-1"}]

    kept = Store(store).load(long["experiment"])
    assert kept.meta.source == "session-record" and kept.meta.context["from_session_record"] is True
    assert any("from the session record" in n for n in kept.meta.notes)
    assert kept.meta.status == "ok" and kept.meta.context["cell_source"] == "train(model)"
    assert kept.summary is not None and len(kept.samples) > 0

    link.close()
    written = json.loads((records / "k-1.json").read_text())
    assert not old.exists()  # records older than a week are removed
    assert written["kernel"]["user"] == "alice"
    assert [r["cell"] for r in written["rows"] if r["kind"] == "cell"] == [1, 2]


@pytest.mark.process
def test_off_stops_the_readings_and_keeps_the_record(fresh_sampler, tmp_path):
    link = fresh_sampler(sampler_process_env({"gpus": ["a100"]}))
    records = tmp_path / "runtime" / "gpuprof-sessions"
    link.tell(SessionControl(on=True, interval=0.5, store=str(tmp_path / "store"), record_dir=str(records)))
    wait_for(lambda: _rows(link).get("timeline", {}).get("t"), 60, "the record's first readings")
    link.tell(SessionControl(on=False))
    wait_for(lambda: _rows(link)["on"] is False, 30, "the record off")
    threads = link.request(Ping(), timeout=30)["threads"]
    assert "gpuprof-session" not in threads
    assert _rows(link)["timeline"]["t"]  # what it had is kept
    assert json.loads((records / "pid{}.json".format(os.getpid())).read_text())["on"] is False  # and written
    assert oct(records.stat().st_mode & 0o777) == "0o700"  # a folder of the user's alone


def test_the_records_lean_nvml_read_takes_only_utilization_memory_power_and_energy():
    import threading

    from gpuprof_jupyter.core.sources.nvml import NvmlSource
    from gpuprof_jupyter.sampler_process.session_record import LEAN_READERS
    from tests.fake_nvml import FakeNvml, a100, h100

    with FakeNvml([a100(0), h100(1)], record_calls=True) as fake:
        source = NvmlSource(only=LEAN_READERS)
        source.open()
        try:
            reading = source.read()
            source.read()
            assert set(reading["gpu0"]) == set(reading["gpu1"]) == {
                "gpu_busy", "sm_util", "mem_bw_util", "gpu_mem_used_bytes", "gpu_mem_total_bytes", "power_w", "energy_j"}
            assert not any(name.startswith("nvmlGpm") and name != "nvmlGpmQueryDeviceSupport" for name, *_ in fake.calls)
            assert not any("Pcie" in name for name, *_ in fake.calls)  # no slow lane: no 20 ms blocking call
            assert not [t for t in threading.enumerate() if "pcie" in t.name.lower()]
            assert set(source.provenance()["gpu1"]) == set(reading["gpu1"])
        finally:
            source.close()


@pytest.mark.process
def test_the_idle_gpu_held_is_told_once_and_its_state_written(fresh_sampler, tmp_path):
    spec = {"gpus": [{"kind": "a100", "processes": [[os.getpid(), 3 * GIB]], "util_gpu": 0}]}
    link = fresh_sampler(sampler_process_env(spec))
    notices = []
    link.on_notice = notices.append
    records = tmp_path / "runtime" / "gpuprof-sessions"
    try:
        link.tell(SessionControl(on=True, interval=0.5, store=str(tmp_path / "store"), record_dir=str(records),
                                 notice_after_s=1.0, kernel={"id": "k-9", "user": "alice", "pid": os.getpid()}))
        _mark(link, "start", cell=1, source="model = load()")
        _mark(link, "end", status="ok")
        wait_for(lambda: notices, 60, "the idle notice")
        state = wait_for(lambda: (records / "k-9.state.json").exists() and json.loads(
            (records / "k-9.state.json").read_text()), 60, "the state file")
        assert state["kernel"]["user"] == "alice" and state["cell_running"] is False
        assert state["memory_held_bytes"] == 3 * GIB and state["idle_since"] is not None
        time.sleep(2.0)
        assert len(notices) == 1  # once
        assert notices[0].idle_s >= 1.0 and notices[0].memory_held_bytes == 3 * GIB
    finally:
        link.on_notice = None
    link.close()
    assert not (records / "k-9.state.json").exists()  # the kernel is gone: no state left to show
    assert (records / "k-9.json").exists()  # its record stays


def test_the_kernel_says_the_notice_once_at_its_next_cell(capsys, monkeypatch):
    from gpuprof_jupyter.core.protocol import SessionNotice
    from gpuprof_jupyter.notebook import session_cells

    monkeypatch.setattr(session_cells._State, "on", True)
    monkeypatch.setattr(session_cells._State, "idle_told", False)
    monkeypatch.setattr(session_cells, "_mark", lambda message: None)
    info = type("Info", (), {"raw_cell": "x = 1"})()
    session_cells._take_notice(SessionNotice(14 * 60.0, 22.0 * GIB))
    session_cells.cell_started(None, info)
    said = capsys.readouterr().out
    assert "idle for 14 min" in said and "22.0 GiB" in said
    session_cells._take_notice(SessionNotice(30 * 60.0, 22.0 * GIB))
    session_cells.cell_started(None, info)
    assert capsys.readouterr().out == ""  # not nagging


def test_session_on_turns_the_record_on_even_when_the_setting_said_off(monkeypatch):
    from gpuprof_jupyter.notebook import session_cells, session_view

    calls = []
    monkeypatch.setenv("GPUPROF_SESSION", "off")
    monkeypatch.setattr(session_cells, "turn_on", lambda store, **kw: calls.append(store))
    session_view.start_session_record()
    assert calls == []  # the setting: off at %load_ext
    session_view.session_command(["on"], None)
    assert len(calls) == 1


def test_the_memory_share_is_read_every_few_seconds_and_stands_in_between(monkeypatch):
    """This kernel's share of the GPUs' memory (two NVML calls a GPU) is read every
    SHARE_EVERY_S, not at each 1 Hz tick: its last values fill the ticks between, the other
    sources are read at each tick (benchmarks/README.md: the record's cost at 8 GPUs)."""
    import threading

    from gpuprof_jupyter.sampler_process import session_record
    from gpuprof_jupyter.sampler_process.session_record import SHARE_EVERY_S, SessionRecord

    class Counting:
        def __init__(self, metric):
            self.metric, self.reads = metric, 0

        def read(self):
            self.reads += 1
            return {"gpu0": {self.metric: float(self.reads)}}

    now = [100.0]
    monkeypatch.setattr(session_record.time, "monotonic", lambda: now[0])
    record = SessionRecord(1, threading.Event(), lambda *_: None)
    gpus, share = Counting("gpu_busy"), Counting("own_gpu_mem_bytes")
    record._sources, record._share_source = [gpus, share], share
    seen = []
    for _ in range(12):  # 12 ticks a second apart
        seen.append({k: v for s in record._sources for k, v in record._read_source(s)["gpu0"].items()})
        now[0] += 1.0
    assert gpus.reads == 12 and share.reads == -(-12 // int(SHARE_EVERY_S))
    assert [t["own_gpu_mem_bytes"] for t in seen] == [1.0] * 5 + [2.0] * 5 + [3.0] * 2
