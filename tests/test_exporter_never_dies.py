"""The exporter's waiting room never dies (sampler_process/exporter/server.py): a socket closed
in one turn of its loop is skipped in the rest of that turn, any other failure of a turn is one
note and the loop goes on, and floods above the room's cap, again and again, leave it serving."""

from __future__ import annotations

import random
import socket
import threading
import time
from types import SimpleNamespace

from gpuprof_jupyter.sampler_process.exporter import Exporter
from gpuprof_jupyter.sampler_process.exporter.host import ExporterHost
from gpuprof_jupyter.sampler_process.exporter.server import BoundedWSGIServer
from tests.test_exporter import DEVICES
from tests.test_exporter_auth import status_of

REQUEST = b"GET /metrics HTTP/1.0\r\nAuthorization: Bearer right\r\n\r\n"


def _wait_for(condition, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.01)


def _connect(exporter: Exporter) -> socket.socket:
    return socket.create_connection(("127.0.0.1", exporter.port), timeout=10)


def test_the_oldest_waiting_socket_closed_in_the_turn_that_found_it_ready_is_skipped(monkeypatch):
    """The flood's KeyError, made to happen: the room is full, a newcomer and the oldest waiting
    connection's request become ready in the same turn; accepting the newcomer closes the oldest."""
    monkeypatch.setattr(BoundedWSGIServer, "max_waiting", 2)
    armed, paused, resume, turned = threading.Event(), threading.Event(), threading.Event(), threading.Event()
    real_expire = BoundedWSGIServer._expire

    def expire(self, selector):  # the end of each turn: hold the loop there once, when armed
        real_expire(self, selector)
        turned.set()
        if armed.is_set():
            armed.clear()
            paused.set()
            resume.wait(60)

    monkeypatch.setattr(BoundedWSGIServer, "_expire", expire)
    with Exporter(node="n") as exporter:
        exporter.set_devices(DEVICES)
        exporter.start(port=0, token="right")
        server, thread = exporter._server, exporter._thread
        oldest, second = _connect(exporter), _connect(exporter)
        _wait_for(lambda: len(server._waiting) == 2)
        armed.set()
        server._wake_w.send(b"x")  # a turn that ends in the pause
        assert paused.wait(60)
        newcomer = _connect(exporter)  # ready first: the room is full, so accepting it closes the oldest
        oldest.sendall(REQUEST)  # ... which is ready in the same turn
        turned.clear()
        resume.set()
        _wait_for(lambda: turned.is_set() or not thread.is_alive())
        assert thread.is_alive(), "the exporter's loop died"
        assert server.dropped["oldest"] == 1 and exporter.notes == []
        assert status_of(exporter.url, "right") == 200
        for conn in (oldest, second, newcomer):
            conn.close()


def test_any_failure_of_a_turn_is_one_note_and_the_loop_goes_on(monkeypatch):
    real_check = BoundedWSGIServer._check
    failures = []

    def check(self, selector, sock):
        if len(failures) < 3:
            failures.append(sock)
            raise RuntimeError("a bug of ours")
        return real_check(self, selector, sock)

    monkeypatch.setattr(BoundedWSGIServer, "_check", check)
    with Exporter(node="n") as exporter:
        exporter.set_devices(DEVICES)
        exporter.start(port=0, token="right")
        for _ in range(3):  # each one's turn fails: it is closed, the loop goes on
            with _connect(exporter) as conn:
                conn.sendall(REQUEST)
                try:
                    answer = conn.recv(64)
                except ConnectionResetError:  # closed with its request unread
                    answer = b""
                assert answer == b""
        assert exporter._thread.is_alive()
        assert status_of(exporter.url, "right") == 200
        assert exporter.notes == ["gpuprof: the exporter's waiting room failed (RuntimeError: a bug of ours); its "
                                  "waiting connections were closed and it went on"]
        assert exporter._server.loop_failures == 3


def test_floods_above_the_waiting_rooms_cap_again_and_again_leave_it_serving(monkeypatch):
    monkeypatch.setattr(BoundedWSGIServer, "max_waiting", 4)
    rng = random.Random(37)
    with Exporter(node="n") as exporter:
        exporter.set_devices(DEVICES)
        exporter.start(port=0, token="right")
        for _ in range(25):
            conns = [_connect(exporter) for _ in range(24)]
            for conn in conns:  # most send a whole request, some half of one, some nothing
                share = rng.random()
                try:
                    conn.sendall(REQUEST if share < 0.6 else REQUEST[:20] if share < 0.8 else b"")
                except OSError:  # closed already: the room was full
                    pass
            for conn in conns:
                conn.close()
            assert exporter._thread.is_alive(), "the exporter's loop died"
        assert status_of(exporter.url, "right") == 200
        assert exporter.notes == [] and exporter._server.dropped["oldest"] > 0


def test_the_servers_notes_reach_the_running_experiment():
    host = ExporterHost(kernel_pid=1)
    host.exporter = Exporter(node="n")
    host.exporter.notes.append("gpuprof: the exporter's waiting room failed (RuntimeError: x); ...")
    run = SimpleNamespace(meta=SimpleNamespace(name="r"), finished=False, notes=["an earlier note"],
                          feed=SimpleNamespace(steps=[], requests=[]))
    host.update(run, [])
    host.update(run, [])
    assert run.notes == ["an earlier note", host.exporter.notes[0]]
