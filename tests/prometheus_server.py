"""A real Prometheus server for tests: Debian's ``prometheus`` on loopback, a temporary data
directory and config, a 1 s scrape interval, free-picked ports; always stopped.

CI installs it (``make system-deps``: ``apt-get install prometheus``); where it is missing the
tests that need it fail with a message saying so (never skip: a test that cannot fail is not one).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import requests

from tests.fakes import wait_for

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
DATA = Path(__file__).parent / "data"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def dcgm_endpoint():
    """A loopback HTTP endpoint serving tests/data/dcgm_exporter.txt (energy grows 5 J/s);
    yields its ``host:port``."""
    template = (DATA / "dcgm_exporter.txt").read_text()
    t0 = time.time()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            energy_mj = 8_000_000_000 + 5000.0 * (time.time() - t0)
            body = template.replace("{energy_mj}", f"{energy_mj:.1f}").encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, name="dcgm-fixture", daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def node_exporters(names: list[str]):
    """One exporter process per node name (tests/prom_node.py, this checkout's package); yields
    their ``host:port``."""
    root = str(Path(__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    procs = []
    try:
        for number, name in enumerate(names, start=1):
            proc = subprocess.Popen([sys.executable, str(Path(__file__).parent / "prom_node.py"), name, str(number)],
                                    stdout=subprocess.PIPE, text=True, env=env)
            procs.append(proc)
        yield [f"127.0.0.1:{int(proc.stdout.readline())}" for proc in procs]
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(timeout=10)
            proc.stdout.close()


@contextmanager
def prometheus_server(tmp_dir: Path, jobs: dict[str, list[str]]):
    """Prometheus scraping ``jobs`` (job name -> targets) every second; yields its URL once
    every target has been scraped successfully."""
    port = free_port()
    config = tmp_dir / "prometheus.yml"
    lines = ["global:", "  scrape_interval: 1s", "  evaluation_interval: 1s", "scrape_configs:"]
    for job, targets in jobs.items():
        lines += [f"  - job_name: {job}", "    static_configs:", f"      - targets: [{', '.join(repr(t) for t in targets)}]"]
    config.write_text("\n".join(lines) + "\n")
    log = open(tmp_dir / "prometheus.log", "w")
    proc = subprocess.Popen(
        [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp_dir / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
        stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        expected = sum(len(t) for t in jobs.values())

        def all_up():
            if proc.poll() is not None:
                raise RuntimeError(f"prometheus exited ({proc.returncode}): {(tmp_dir / 'prometheus.log').read_text()}")
            try:
                result = requests.get(f"{url}/api/v1/query", params={"query": "up == 1"}, timeout=1).json()
            except (requests.RequestException, ValueError):
                return False
            return len(result["data"]["result"]) == expected

        wait_for(all_up, 60, f"prometheus to scrape {expected} targets")
        yield url
    finally:
        proc.kill()
        proc.wait(timeout=10)
        log.close()


class FakePrometheus:
    """A loopback server speaking just enough of Prometheus's API for one simulated GPU
    (``DCGM_FI_DEV_GPU_UTIL`` and ``DCGM_FI_DEV_FB_USED`` of node n1, labelled simulated, 1 s
    scrapes), whose range queries misbehave as a test says: ``range_answer`` is None (good
    answers: 50 % and 1024 MiB at every step), a JSON-able object sent as the body, or one of
    ``"drip"`` (headers, then a byte of the body every 0.2 s), ``"drip_headers"`` (the status
    line a byte at a time), ``"huge"`` (150 MB streamed, no length), ``"huge_declared"`` (a
    150 MB Content-Length). Records each request's path and Authorization header; counts the
    bytes a huge answer got out before the client hung up; ``hung_up`` is set once a client
    hangs up on an answer still being sent."""

    SERIES = ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED")
    LABELS = {"gpu": "0", "UUID": "GPU-simulated-0", "Hostname": "n1", "simulated": "true",
              "job": "dcgm", "instance": "n1:9400"}
    HUGE = 150 * 10**6

    def __init__(self) -> None:
        self.range_answer = None
        self.requests: list[tuple[str, str | None]] = []
        self.huge_sent = 0
        self.stopping = threading.Event()
        self.hung_up = threading.Event()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's name)
                fake.requests.append((self.path, self.headers.get("Authorization")))
                try:
                    fake.answer(self)
                except (BrokenPipeError, ConnectionResetError):
                    fake.hung_up.set()  # the client gave up: what a bounded client does

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_port}"

    def range_queries(self) -> int:
        return sum("/api/v1/query_range" in path for path, _ in self.requests)

    @classmethod
    def range_body(cls, values: dict[str, list]) -> dict:
        return {"status": "success", "data": {"resultType": "matrix", "result": [
            {"metric": {"__name__": name, **cls.LABELS}, "values": points} for name, points in values.items()]}}

    def answer(self, handler: BaseHTTPRequestHandler) -> None:
        from urllib.parse import parse_qs, urlsplit

        parts = urlsplit(handler.path)
        query = {k: v[0] for k, v in parse_qs(parts.query).items()}
        if parts.path == "/api/v1/query":
            result = ([{"metric": {"__name__": name, **self.LABELS}, "value": [time.time(), "1"]} for name in self.SERIES]
                      if "DCGM" in query.get("query", "") else [])
            return self._json(handler, {"status": "success", "data": {"resultType": "vector", "result": result}})
        if parts.path == "/api/v1/targets":
            return self._json(handler, {"status": "success", "data": {"activeTargets": [
                {"labels": {"job": "dcgm", "instance": "n1:9400"}, "scrapeInterval": "1s"}]}})
        mode = self.range_answer
        if mode is None:
            start, end, step = (float(query[k]) for k in ("start", "end", "step"))
            steps = [start + i * step for i in range(int(round((end - start) / step)) + 1)]
            return self._json(handler, self.range_body({"DCGM_FI_DEV_GPU_UTIL": [[t, "50"] for t in steps],
                                                        "DCGM_FI_DEV_FB_USED": [[t, "1024"] for t in steps]}))
        if mode == "drip_headers":
            for byte in b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n" * 50:
                if self.stopping.wait(0.2):
                    return
                handler.wfile.write(bytes([byte]))
                handler.wfile.flush()
            return
        if mode in ("drip", "huge", "huge_declared"):
            handler.send_response(200)
            handler.send_header("Content-Type", "application/json")
            if mode != "huge":
                handler.send_header("Content-Length", str(self.HUGE if mode == "huge_declared" else 4096))
            handler.end_headers()
            handler.wfile.flush()
            if mode == "drip":
                while not self.stopping.wait(0.2):
                    handler.wfile.write(b" ")
                    handler.wfile.flush()
                return
            block = b" " * 65536
            while self.huge_sent < self.HUGE and not self.stopping.is_set():
                handler.wfile.write(block)
                self.huge_sent += len(block)
            return
        return self._json(handler, mode)

    @staticmethod
    def _json(handler: BaseHTTPRequestHandler, body) -> None:
        import json

        data = json.dumps(body).encode()
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)


@contextmanager
def fake_prometheus():
    """A FakePrometheus serving on loopback; stopped (its dripping answers too) afterwards."""
    fake = FakePrometheus()
    thread = threading.Thread(target=fake.server.serve_forever, args=(0.05,), name="fake-prometheus", daemon=True)
    thread.start()
    try:
        yield fake
    finally:
        fake.stopping.set()
        fake.server.shutdown()
        fake.server.server_close()
