"""Each kernel's session state on the server extension's API and the server's /metrics (server/sessions.py)."""

from __future__ import annotations

import json
import os
import time

import pytest
from tornado.httpclient import HTTPClientError

from pytest_jupyter.jupyter_server import *  # noqa: F403 - jp_fetch, jp_serverapp, ... (module scope only)

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


@pytest.fixture
def jp_server_config():
    return {"ServerApp": {"jpserver_extensions": {"gpuprof_jupyter.server": True}},
            "GPUProfiler": {"poll_interval_s": 0.2, "idle_stop_s": 30.0, "devices_enabled": False}}


@pytest.mark.process
def test_the_api_and_metrics_show_this_servers_kernels(jp_fetch, jp_asyncio_loop, jp_serverapp, monkeypatch):
    folder = os.path.join(jp_serverapp.runtime_dir, SESSION_RECORD_FOLDER)
    from pathlib import Path

    _state(Path(folder), "k-mine", "alice", idle_since=time.time() - 14 * 60)
    _state(Path(folder), "k-not-mine", "bob", idle_since=time.time() - 60)
    monkeypatch.setattr(jp_serverapp.kernel_manager, "list_kernel_ids", lambda: ["k-mine"])
    try:
        response = jp_asyncio_loop.run_until_complete(jp_fetch("gpuprof", "api", "sessions"))
        rows = json.loads(response.body)["sessions"]
        assert [r["kernel"] for r in rows] == ["k-mine"]
        assert rows[0]["idle_s"] >= 14 * 60 and rows[0]["memory_held_bytes"] == 22 * GIB
        metrics = jp_asyncio_loop.run_until_complete(jp_fetch("metrics")).body.decode()
        assert 'gpuprof_session_gpu_idle_held_seconds{kernel="k-mine",user="alice"}' in metrics
        assert "k-not-mine" not in metrics
        with pytest.raises(HTTPClientError) as refused:  # no token: refused
            jp_asyncio_loop.run_until_complete(jp_fetch("gpuprof", "api", "sessions", headers={"Authorization": ""}))
        assert refused.value.code == 403
    finally:
        jp_serverapp.web_app.settings["gpuprof"]["poller"].stop()
