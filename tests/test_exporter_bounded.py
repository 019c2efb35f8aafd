"""A bounded exporter (sampler_process/exporter/server.py): another local user's idle
connections neither grow the exporter's threads nor keep a scrape with the token out; a
connection that sends nothing, or its headers too slowly, is closed after the timeout; the
token is checked before anything past the headers is read."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time

import pytest

from gpuprof_jupyter.sampler_process.exporter import server as exporter_server
from gpuprof_jupyter.sampler_process.exporter import Exporter
from gpuprof_jupyter.sampler_process.exporter.server import MAX_WAITING, MAX_WORKERS, BoundedWSGIServer
from tests.test_exporter import DEVICES, served, served_token  # noqa: F401 (fixture)
from tests.test_exporter_auth import status_of

NEIGHBOUR = "gpuprof-nbr28"
IDLE = 300

_OPEN_IDLE = """
import socket, sys, time
port, count = int(sys.argv[1]), int(sys.argv[2])
held = []
for _ in range(count):
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    held.append(s)
print("ready", flush=True)
sys.stdin.read()  # hold them until the test closes our stdin
"""


@pytest.fixture
def neighbour():
    """A second local user (CI runs as root: docs/development.md)."""
    if os.geteuid() != 0 or not shutil.which("useradd"):
        pytest.skip("needs root and useradd to create a second user (CI runs as root)")
    subprocess.run(["userdel", NEIGHBOUR], capture_output=True)  # left by an interrupted run
    subprocess.run(["useradd", "-M", "-N", "-s", "/usr/sbin/nologin", NEIGHBOUR], check=True)
    try:
        yield NEIGHBOUR
    finally:
        subprocess.run(["userdel", NEIGHBOUR], capture_output=True)


@pytest.fixture
def exporter():
    exporter = Exporter(node="n")
    exporter.set_devices(DEVICES)
    exporter.start(port=0, token="right")
    try:
        yield exporter
    finally:
        exporter.close()


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _sockets() -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        except OSError:
            pass
    return count


@pytest.mark.process
def test_idle_connections_of_a_second_user_do_not_grow_threads_and_a_scrape_with_the_token_works(neighbour, exporter):
    assert status_of(exporter.url, "right") == 200  # the first answer starts a worker
    threads, sockets = _threads(), _sockets()
    holder = subprocess.Popen(["/usr/bin/python3", "-c", _OPEN_IDLE, str(exporter.port), str(IDLE)], user=neighbour,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/")
    try:
        assert holder.stdout.readline().strip() == "ready", holder.stderr.read()
        time.sleep(0.5)  # every connection accepted by now
        assert _threads() <= threads + MAX_WORKERS, f"{_threads() - threads} more threads for {IDLE} idle connections"
        assert _sockets() <= sockets + MAX_WAITING + MAX_WORKERS
        for _ in range(3):  # the cap is reached: scrapes with the token are still answered
            assert status_of(exporter.url, "right") == 200
        assert status_of(exporter.url) == 401
        assert _threads() <= threads + MAX_WORKERS
    finally:
        holder.stdin.close()
        holder.wait(30)
    assert exporter._server.dropped["oldest"] >= IDLE - MAX_WAITING


@pytest.mark.process
def test_the_sampler_processs_exporter_keeps_its_threads_against_a_neighbours_idle_connections(neighbour, served,
                                                                                              fresh_sampler):
    """The same, end to end: ``%gpuprofile serve`` in the sampler process, the neighbour's
    connections counted against that process's threads (/proc/PID/task)."""
    import re

    from gpuprof_jupyter.runtime.link import sampler_link

    fresh_sampler()
    url = re.search(r"(http://\S+/metrics)", served.serve(0, "127.0.0.1")).group(1)
    token, port = served_token(), int(url.rsplit(":", 1)[1].split("/")[0])
    assert status_of(url, token) == 200
    pid = sampler_link().pid
    threads = len(os.listdir(f"/proc/{pid}/task"))
    holder = subprocess.Popen(["/usr/bin/python3", "-c", _OPEN_IDLE, str(port), str(IDLE)], user=neighbour,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/")
    try:
        assert holder.stdout.readline().strip() == "ready", holder.stderr.read()
        time.sleep(0.5)
        assert status_of(url, token) == 200 and status_of(url) == 401
        assert len(os.listdir(f"/proc/{pid}/task")) <= threads + MAX_WORKERS
    finally:
        holder.stdin.close()
        holder.wait(30)


def test_a_connection_that_sends_nothing_or_dribbles_its_headers_is_closed_after_the_timeout(monkeypatch):
    """The exporter closes both (its own count says why: the timeout), while the dribbler is
    still sending: one header line every 0.1 s never completes a request, so only the timeout
    can end it, however slow the machine."""
    monkeypatch.setattr(BoundedWSGIServer, "request_timeout_s", 0.5)
    with Exporter(node="n") as exporter:
        exporter.start(port=0, token="right")
        idle = socket.create_connection(("127.0.0.1", exporter.port), timeout=10)
        slow = socket.create_connection(("127.0.0.1", exporter.port), timeout=10)
        slow.sendall(b"GET /metrics HTTP/1.1\r\n")
        slow.settimeout(0.1)
        closed = False
        for _ in range(600):  # a minute of dribbling at most: a bound for a broken exporter, not a speed
            try:
                slow.sendall(b"X-Dribble: 1\r\n")
                closed = slow.recv(1) == b""  # the exporter hung up
            except TimeoutError:
                continue  # nothing to read: still open
            except OSError:
                closed = True
            if closed:
                break
        assert closed, "a dribbling connection was kept"
        assert idle.recv(1) == b"", "an idle connection was kept"
        dropped = exporter._server.dropped
        assert (dropped["timeout"], dropped["oldest"], dropped["flood"]) == (2, 0, 0), dropped  # both, by the timeout
        idle.close()
        slow.close()
        assert status_of(exporter.url, "right") == 200


def test_the_token_is_checked_before_a_body_is_read(exporter):
    with socket.create_connection(("127.0.0.1", exporter.port), timeout=10) as conn:
        conn.sendall(b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000\r\n\r\n" + b"x" * 1000)
        answer = conn.recv(65536)
    assert answer.startswith(b"HTTP/1.0 401") or answer.startswith(b"HTTP/1.1 401"), answer[:80]


def test_a_flood_of_complete_requests_is_answered_by_the_capped_workers(exporter):
    threads = _threads()
    conns = []
    for _ in range(100):
        conn = socket.create_connection(("127.0.0.1", exporter.port), timeout=10)
        conn.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
        conns.append(conn)
    for conn in conns:
        try:
            conn.recv(64)
        except OSError:
            pass
        conn.close()
    assert _threads() <= threads + MAX_WORKERS
    assert status_of(exporter.url, "right") == 200
    assert exporter_server.MAX_QUEUED >= 1


def test_a_connection_that_stalls_mid_headers_is_not_looked_at_again_until_it_sends_more(monkeypatch, exporter):
    """The waiting room reads what arrived and waits for more: a stalled request is looked at
    once per arrival, never in a loop (which would burn a core per stalled neighbour)."""
    looks = []
    real = BoundedWSGIServer._check
    monkeypatch.setattr(BoundedWSGIServer, "_check", lambda self, selector, sock: looks.append(1) or real(self, selector, sock))
    with socket.create_connection(("127.0.0.1", exporter.port), timeout=10) as conn:
        conn.sendall(b"GET /metrics HTTP/1.1\r\nAuthorization: Bearer right\r\n")
        time.sleep(1.0)
        assert len(looks) <= 3, f"looked at {len(looks)} times in 1 s"
        conn.sendall(b"Host: x\r\n\r\n")  # the rest: answered, with what had arrived before
        assert conn.recv(64).startswith(b"HTTP/1.0 200")
