"""Each kernel's session state as the server extension reads it (server/sessions.py) and GPU-aware
culling (server/culling.py). Through a real Jupyter server: tests/test_session_server_api.py."""

from __future__ import annotations

import json
import os
import time

import pytest

from gpuprof_jupyter.core.protocol import SESSION_RECORD_FOLDER
from gpuprof_jupyter.server.sessions import SessionCollector, session_states

GIB = 1 << 30


def _state(folder, kernel, user, idle_since=None, held=22 * GIB, running=False, written=None):
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    (folder / f"{kernel}.state.json").write_text(json.dumps({
        "version": 1, "kernel": {"id": kernel, "user": user, "pid": 1}, "on": True, "cell_running": running,
        "idle_since": idle_since, "memory_held_bytes": held, "written": written or time.time()}))


def test_idle_time_is_counted_to_now_and_only_this_servers_kernels_are_read(tmp_path):
    now = 10_000.0
    folder = tmp_path / SESSION_RECORD_FOLDER
    _state(folder, "k-a", "alice", idle_since=now - 14 * 60, written=now - 20)
    _state(folder, "k-busy", "alice", idle_since=None, running=True, written=now)
    _state(folder, "k-free", "alice", idle_since=now - 600, held=0, written=now)
    _state(folder, "k-other", "bob", idle_since=now - 600, written=now)
    (folder / "k-junk.state.json").write_text("{not json")
    rows = {r["kernel"]: r for r in session_states(tmp_path, ["k-a", "k-busy", "k-free", "k-junk"], now=now)}
    assert set(rows) == {"k-a", "k-busy", "k-free"}  # another server's kernel and a torn file are not listed
    assert rows["k-a"]["idle_s"] == pytest.approx(14 * 60) and rows["k-a"]["memory_held_bytes"] == 22 * GIB
    assert rows["k-a"]["user"] == "alice" and not rows["k-a"]["stale"]
    assert rows["k-busy"]["idle_s"] == 0.0 and rows["k-busy"]["cell_running"]
    assert rows["k-free"]["idle_s"] == 0.0  # nothing held: not idle-while-held
    assert session_states(tmp_path / "nowhere", None) == []


def test_the_collector_labels_by_user_and_kernel():
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry()
    registry.register(SessionCollector(lambda: [
        {"kernel": "k-a", "user": "alice", "idle_s": 840.0, "memory_held_bytes": 22.0 * GIB, "cell_running": False}]))
    text = generate_latest(registry).decode()
    assert 'gpuprof_session_gpu_idle_held_seconds{kernel="k-a",user="alice"} 840.0' in text
    assert 'gpuprof_session_gpu_memory_held_bytes{kernel="k-a",user="alice"} 2.3622320128e+10' in text
    assert 'gpuprof_session_cell_running{kernel="k-a",user="alice"} 0.0' in text


# -- GPU-aware culling (server/culling.py) ------------------------------------------------------------
class _Config:
    cull_idle_gpu_s, cull_warning_s = 3600.0, 600.0


def _row(kernel, idle_s, held=22.0 * GIB, running=False, stale=False):
    return {"kernel": kernel, "user": "alice", "idle_s": idle_s, "memory_held_bytes": held, "cell_running": running,
            "stale": stale}


def test_culling_warns_ahead_withdraws_on_activity_and_shuts_down_at_the_limit(tmp_path):
    import asyncio

    from gpuprof_jupyter.server.culling import GpuCuller, read_marker

    (tmp_path / SESSION_RECORD_FOLDER).mkdir()
    rows: list[dict] = []
    shut: list[str] = []

    async def shutdown(kernel):
        shut.append(kernel)

    culler = GpuCuller(_Config(), lambda: rows, tmp_path, shutdown)
    rows[:] = [_row("k-idle", 3000), _row("k-back", 3100), _row("k-busy", 5000, running=True),
               _row("k-free", 5000, held=0), _row("k-stale", 5000, stale=True)]
    asyncio.run(culler.check(now=1000.0))
    assert shut == [] and set(culler.warned) == {"k-idle", "k-back"}
    assert read_marker(tmp_path, "k-idle")["cull_at"] == pytest.approx(1000.0 + 600)
    rows[:] = [_row("k-idle", 3550), _row("k-back", 0, running=True)]  # k-back's user ran a cell
    asyncio.run(culler.check(now=1650.0))
    assert shut == [] and read_marker(tmp_path, "k-back") is None  # the warning is withdrawn
    rows[:] = [_row("k-idle", 3601)]
    asyncio.run(culler.check(now=1700.0))
    assert shut == ["k-idle"] and read_marker(tmp_path, "k-idle")["culled_at"] == 1700.0
    off = GpuCuller(type("Off", (), {"cull_idle_gpu_s": 0.0, "cull_warning_s": 0.0})(), lambda: rows, tmp_path, shutdown)
    asyncio.run(off.check(now=1800.0))
    assert shut == ["k-idle"]  # off by default: never


@pytest.mark.process
def test_a_culled_kernels_record_says_so(fresh_sampler, tmp_path):
    from gpuprof_jupyter.core.protocol import SessionControl
    from gpuprof_jupyter.server.culling import cull_marker
    from tests.fake_nvml import sampler_process_env

    link = fresh_sampler(sampler_process_env({"gpus": ["a100"]}))
    records = tmp_path / SESSION_RECORD_FOLDER
    records.mkdir(mode=0o700)
    cull_marker(tmp_path, "k-7").write_text(json.dumps({"culled_at": time.time(), "idle_s": 3700,
                                                        "memory_held_bytes": 22 * GIB, "limit_s": 3600}))
    link.tell(SessionControl(on=True, interval=0.5, store=str(tmp_path / "store"), record_dir=str(records),
                             kernel={"id": "k-7", "user": "alice", "pid": os.getpid()}))
    link.close()  # as when the kernel is shut down
    record = json.loads((records / "k-7.json").read_text())
    assert record["culled"]["limit_s"] == 3600
    assert any("the Jupyter server shut this kernel down" in n and "1 h 01 min" in n and "22.0 GiB" in n
               for n in record["notes"])
