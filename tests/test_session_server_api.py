"""Each kernel's session state on the server extension's API and the server's /metrics, through a
real Jupyter server (pytest_jupyter's). Apart from tests/test_session_server.py so that the fast
loop never imports jupyter_server (1-2 s of CPU per worker, most of it jsonschema's format
checkers)."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import pytest
from tornado.httpclient import HTTPClientError

from pytest_jupyter.jupyter_server import *  # noqa: F403 - jp_fetch, jp_serverapp, ... (module scope only)
from test_session_server import GIB, _state

from gpuprof_jupyter.core.protocol import SESSION_RECORD_FOLDER

pytestmark = pytest.mark.process  # a Jupyter server in this process


@pytest.fixture
def jp_server_config():
    return {"ServerApp": {"jpserver_extensions": {"gpuprof_jupyter.server": True}},
            "GPUProfiler": {"poll_interval_s": 0.2, "idle_stop_s": 30.0, "devices_enabled": False}}


def test_the_api_and_metrics_show_this_servers_kernels(jp_fetch, jp_asyncio_loop, jp_serverapp, monkeypatch):
    # the loop jupyter_core hands out may not be this thread's current one: an earlier test's
    # asyncio.run() (tests/test_session_server.py's culling) ends by setting none, and tornado's
    # fetch asks for the current one
    asyncio.set_event_loop(jp_asyncio_loop)
    folder = os.path.join(jp_serverapp.runtime_dir, SESSION_RECORD_FOLDER)
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
