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
