"""A store of 10,000 experiments and one 6-hour, 9-device crashed run (issue 19, part 5).

The store is filled with copies of one real (simulated-source) run: its ``meta.json`` rewritten
with a new id, name, start and params, its Parquet files hard-linked (only ``meta.json`` is
read by a listing). Then, each in the process the figure is about:
* ``experiments()``: rebuilding a missing index once (not gated), then in a fresh process with
  the index present (cold: the first call; warm: the best of the next calls);
* ``gpuprof list`` as a whole process (interpreter start included), best of 3;
* ``compare()`` of two experiments by name, in a fresh process (imports done before timing);
* the Jupyter server's listing (a real ``jupyter server`` with the extension): warm, the
  best of several GETs; the bytes of an unchanged poll (If-None-Match -> 304, status line and
  headers counted);
* a run left ``running`` by a dead sampler process (6 hours, 9 GPUs and the host, an Arrow
  stream as the sampler writes it): the poll that finds it (the server finishes it aside),
  the time until its figures are listed (not gated), and the polls after it.
Timings are the best of several tries: the least disturbed by other processes on shared cores.
Each note gives the CPU time of the same operation (the process that does the work: the
subprocess, or the server) and the load average: on a machine shared with other work, wall
time exceeds CPU time by the wait for a core.
"""

from __future__ import annotations

import gzip
import http.client
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psutil

from ._common import ROOT, figure, save

NAME = "store_scale"
# experiments, crashed run's seconds, its interval (s), GPUs
SIZES = {"tiny": (20, 60.0, 1.0, 9), "quick": (10_000, 6 * 3600.0, 0.5, 9), "full": (10_000, 6 * 3600.0, 0.1, 9)}
METRICS = ("sm_util", "mem_bw_util", "power_w", "energy_j", "gpu_mem_used_bytes", "temperature_c", "sm_clock_mhz")


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


def _template(scratch: Path) -> Path:
    """One real run (the simulated source through the sampler process) to copy."""
    code = ("import gpuprof_jupyter as gp, sys\n"
            "with gp.profile('template', source='sim:compute-bound:2', store=sys.argv[1], interval=0.05,"
            " params={'batch_size': 32}):\n"
            "    for _ in gp.track(range(20)):\n        gp.step(8)\n")
    subprocess.run([sys.executable, "-c", code, str(scratch)], check=True, env=_env(), timeout=300,
                   capture_output=True)
    return next(p for p in scratch.iterdir() if (p / "meta.json").is_file())


def fill_store(store: Path, n: int, template: Path) -> None:
    """``n`` copies of ``template`` in ``store`` (new ids, names, starts and params)."""
    store.mkdir(mode=0o700, parents=True)
    meta = json.loads((template / "meta.json").read_text())
    files = [p for p in template.iterdir() if p.name != "meta.json"]
    for i in range(n):
        ident = f"2026{1 + i // 86400 % 12:02d}{1 + i // 3600 % 28:02d}T{i // 60 % 24:02d}{i % 60:02d}00-{i:06x}"
        directory = store / ident
        directory.mkdir(mode=0o700)
        for f in files:
            os.link(f, directory / f.name)
        meta.update(id=ident, name=f"run-{i}", started_at=f"2026-{ident[4:6]}-{ident[6:8]}T{ident[9:11]}:{ident[11:13]}:00+00:00",
                    params={"batch_size": 32 * (1 + i % 4), "lr": 0.001 * (1 + i % 7), "amp": bool(i % 2)})
        (directory / "meta.json").write_text(json.dumps(meta))


def crashed_run(store: Path, seconds: float, interval: float, gpus: int) -> str:
    """A run left ``running`` by a sampler process that died: an Arrow stream of ``seconds`` at
    ``interval`` for ``gpus`` GPUs and the host, its pid one that no longer exists."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.ipc as ipc

    from gpuprof_jupyter.core.store.samples_file import STREAM_NAME, samples_schema

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    ident = "20991231T000000-crash0"
    directory = store / ident
    directory.mkdir(mode=0o700)
    devices = [{"key": f"gpu{i}", "kind": "gpu", "name": "simulated H100", "index": i} for i in range(gpus)]
    meta = {"id": ident, "name": "six-hours-nine-gpus", "status": "running", "started_at": "2099-12-31T00:00:00+00:00",
            "interval_s": interval, "source": f"sim:compute-bound:{gpus}", "simulated": True,
            "devices": devices + [{"key": "host", "kind": "host", "name": "host"}], "pid": dead.pid,
            "host": socket.gethostname(), "notes": ["simulated data (benchmark)"]}
    (directory / "meta.json").write_text(json.dumps(meta))
    schema = samples_schema([*METRICS, "cpu_util"])
    ticks = int(seconds / interval)
    rng = np.random.default_rng(0)
    keys = [d["key"] for d in devices] + ["host"]
    with pa.OSFile(str(directory / STREAM_NAME), "wb") as f, ipc.new_stream(f, schema) as writer:
        per_flush = max(1, int(2.0 / interval))  # the sampler flushes about every 2 s
        for start in range(0, ticks, per_flush * 50):  # 50 flushes per batch written here (speed)
            t = np.arange(start, min(ticks, start + per_flush * 50)) * interval
            n = len(t)
            columns = {"t": np.repeat(t, len(keys)), "wall_time": np.repeat(t + 4.1e9, len(keys)),
                       "device": np.tile(np.array(keys, dtype=object), n)}
            gpu = np.tile(np.array([k != "host" for k in keys]), n)
            for m in METRICS:
                values = rng.uniform(10, 100, n * len(keys))
                values[~gpu] = np.nan
                columns[m] = values
            columns["cpu_util"] = np.where(gpu, np.nan, rng.uniform(5, 50, n * len(keys)))
            writer.write_batch(pa.record_batch([pa.array(columns[fld.name], fld.type) for fld in schema], schema=schema))
    return ident


def _in_fresh_process(code: str, timeout: float = 600) -> dict:
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"benchmark subprocess failed: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


_EXPERIMENTS = """
import json, sys, time
import pandas, gpuprof_jupyter as gp
times, cpu = [], []
for _ in range({repeats}):
    t, c = time.perf_counter(), time.process_time()
    frame = gp.experiments({store!r})
    times.append(time.perf_counter() - t); cpu.append(time.process_time() - c)
print(json.dumps({{"times": times, "cpu": cpu, "rows": len(frame)}}))
"""

_COMPARE = """
import json, time
import gpuprof_jupyter as gp
from gpuprof_jupyter.core.analysis import compare, summary  # imported before timing, as in a kernel
from gpuprof_jupyter.notebook import compare_widget
times, cpu = [], []
for a, b in (("run-17", "run-{last}"), ("run-3", "run-{mid}"), ("run-5", "run-{mid2}")):
    t, c = time.perf_counter(), time.process_time()
    view = gp.compare(a, b, store={store!r})
    times.append(time.perf_counter() - t); cpu.append(time.process_time() - c)
print(json.dumps({{"times": times, "cpu": cpu, "names": [e.name for e in view.comparison.experiments]}}))
"""


class _Server:
    """``jupyter server`` with the gpuprof extension on a free port, root ``root``."""

    def __init__(self, root: Path, scratch: Path) -> None:
        self.token = uuid.uuid4().hex
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        (scratch / "cfg").mkdir(exist_ok=True)
        (scratch / "cfg" / "jupyter_server_config.json").write_text(json.dumps(
            {"ServerApp": {"jpserver_extensions": {"gpuprof_jupyter.server": True}},
             "GPUProfiler": {"devices_enabled": False}}))
        self.log = open(scratch / "server.log", "w")
        env = {**_env(), "JUPYTER_CONFIG_DIR": str(scratch / "cfg"), "JUPYTER_RUNTIME_DIR": str(scratch / "rt")}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jupyter_server", "--allow-root", "--no-browser", f"--port={self.port}",
             f"--ServerApp.token={self.token}", "--ServerApp.ip=127.0.0.1", f"--ServerApp.root_dir={root}"],
            cwd=root, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 60
        while True:
            try:
                if self.get("/api/status")[0] == 200:
                    return
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError("jupyter server did not start: " + (scratch / "server.log").read_text()[-2000:])
            time.sleep(0.3)

    def cpu_s(self) -> float:
        """CPU seconds the server process has used so far."""
        times = psutil.Process(self.proc.pid).cpu_times()
        return times.user + times.system

    def get(self, path: str, headers: dict | None = None, timeout: float = 600) -> tuple[int, dict, bytes, int, float]:
        """(status, headers, body, bytes on the wire: status line + headers + body, seconds)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        t = time.perf_counter()
        conn.request("GET", path, headers={"Authorization": f"token {self.token}", "Accept-Encoding": "gzip",
                                           **(headers or {})})  # as a browser asks
        response = conn.getresponse()
        body = response.read()
        wire = len(f"HTTP/1.1 {response.status} {response.reason}\r\n") + 2 + len(body)
        wire += sum(len(k) + len(v) + 4 for k, v in response.getheaders())
        if response.getheader("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        elapsed = time.perf_counter() - t
        conn.close()
        return response.status, dict(response.getheaders()), body, wire, elapsed

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()


def run(mode: str = "quick") -> dict:
    n, crash_s, crash_interval, gpus = SIZES[mode]
    tries = 3 if mode == "tiny" else 5
    with tempfile.TemporaryDirectory(prefix="gpuprof-scale-") as tmp:
        scratch = Path(tmp)
        root = scratch / "root"
        store = root / ".gpuprof"
        t = time.perf_counter()
        fill_store(store, n, _template(scratch / "template"))
        fill_s = time.perf_counter() - t
        rebuild = _in_fresh_process(_EXPERIMENTS.format(repeats=1, store=str(store)))
        fresh = _in_fresh_process(_EXPERIMENTS.format(repeats=tries + 1, store=str(store)))
        assert fresh["rows"] == n, fresh
        lists, lists_cpu = [], []
        for _ in range(3):
            t, before = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
            out = subprocess.run([sys.executable, "-m", "gpuprof_jupyter.cli", "list", "--store", str(store)],
                                 capture_output=True, text=True, env=_env(), check=True, timeout=300)
            lists.append(time.perf_counter() - t)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            lists_cpu.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
        assert len(out.stdout.splitlines()) == n + 2  # the store line, the header, a row per run
        compare = _in_fresh_process(_COMPARE.format(store=str(store), last=n - 1, mid=n // 2, mid2=n // 3))
        server = _Server(root, scratch)
        try:
            path = "/gpuprof/api/experiments?store=.gpuprof"
            status, headers, body, full_wire, first_s = server.get(path)
            assert status == 200 and len(json.loads(body)["rows"]) == n, status
            warm, warm_cpu = [], []
            for _ in range(tries):
                c = server.cpu_s()
                warm.append(server.get(path)[4])
                warm_cpu.append(server.cpu_s() - c)
            status304, _, _, poll_bytes, poll_s = server.get(path, {"If-None-Match": headers["Etag"]})
            full_bytes = len(body)
            crashed = crashed_run(store, crash_s, crash_interval, gpus)
            stream_mib = (store / crashed / "samples.arrows").stat().st_size / 2**20
            c = server.cpu_s()
            status, _, body, _, found_s = server.get(path)  # the poll that finds it (finishing goes on aside)
            found_cpu = server.cpu_s() - c  # includes the finishing thread's start
            found_row = next(r for r in json.loads(body)["rows"] if r["id"] == crashed)
            t = time.perf_counter()
            while True:  # the polls the sidebar makes until its figures are in
                rows = json.loads(server.get(path)[2])["rows"]
                crashed_row = next(r for r in rows if r["id"] == crashed)
                if crashed_row["sm_util_mean"] is not None or time.perf_counter() - t > 600:
                    break
                time.sleep(0.5)
            finish_s = time.perf_counter() - t
            with_crash, crash_cpu = [], []
            for _ in range(tries):
                c = server.cpu_s()
                with_crash.append(server.get(path)[4])
                crash_cpu.append(server.cpu_s() - c)
            meta = json.loads((store / crashed / "meta.json").read_text())
            finished_once = meta["status"] == "crashed" and sum("ended without finishing" in x for x in meta["notes"]) == 1
        finally:
            server.close()
    cold_s, warm_s = fresh["times"][0], min(fresh["times"][1:])
    ok304 = status304 == 304
    load = os.getloadavg()[0]

    def cpu(values) -> str:
        return f"CPU {min(values):.3f} s; load average {load:.1f} on {os.cpu_count()} cores"

    figures = [
        figure("experiments_cold_s", f"experiments() of {n:,} experiments, first call in a fresh process (index present)",
               round(cold_s, 3), "s", "<= 1 s", 1.0, gated=True, note=cpu(fresh["cpu"][:1])),
        figure("experiments_warm_s", f"experiments() of {n:,}, warm (best of {tries})", round(warm_s, 3), "s",
               "<= 0.3 s", 0.3, gated=True, note=cpu(fresh["cpu"][1:])),
        figure("experiments_rebuild_s", f"experiments() of {n:,} with no index (rebuilt: every meta.json read once)",
               round(rebuild["times"][0], 3), "s"),
        figure("gpuprof_list_s", f"gpuprof list of {n:,}, whole process (best of 3)", round(min(lists), 3), "s",
               "<= 0.5 s", 0.5, gated=True, note=cpu(lists_cpu)),
        figure("compare_two_s", f"compare() of two of {n:,} by name, first call in a fresh process (best of 3 pairs)",
               round(min(compare["times"]), 3), "s", "<= 0.2 s", 0.2, gated=True, note=cpu(compare["cpu"])),
        figure("server_listing_warm_s", f"server listing of {n:,}, warm (best of {tries}; body {full_bytes / 1e6:.1f} MB, "
               f"{full_wire / 1e6:.2f} MB gzipped)",
               round(min(warm), 3), "s", "<= 0.2 s", 0.2, gated=True,
               note=f"first GET {first_s:.2f} s; server {cpu(warm_cpu)}"),
        figure("unchanged_poll_bytes", "a poll when nothing changed (If-None-Match -> 304), bytes on the wire",
               poll_bytes if ok304 else None, "B", "<= 2 KB", 2048, gated=True,
               note=f"status {status304}, {poll_s * 1000:.0f} ms"),
        figure("crashed_first_poll_s", f"the poll that finds the {crash_s / 3600:g} h, {gpus}-GPU crashed run "
               f"({stream_mib:.0f} MiB stream; it is finished aside)", round(found_s, 3), "s", "<= 0.2 s", 0.2,
               gated=True, note=f"listed as {found_row['status']} meanwhile; server {cpu([found_cpu])}, "
                                "the finishing thread's included"),
        figure("crashed_finished_s", "until its figures are listed (finished once, off the polls)", round(finish_s, 1),
               "s", note=f"finished once: {finished_once}; listed as {crashed_row['status']}"),
        figure("poll_with_crashed_s", f"server listing with the crashed run present, after (best of {tries})",
               round(min(with_crash), 3), "s", "<= 0.2 s", 0.2, gated=True, note=f"server {cpu(crash_cpu)}"),
    ]
    data = {"figures": figures, "experiments": n, "fill_s": round(fill_s, 1), "crashed_stream_mib": round(stream_mib, 1),
            "crashed_finished_once": finished_once, "raw": {"experiments": fresh, "rebuild": rebuild, "list": lists,
                                                            "compare": compare, "server_warm": warm,
                                                            "server_warm_cpu": warm_cpu, "with_crash": with_crash,
                                                            "with_crash_cpu": crash_cpu, "list_cpu": lists_cpu,
                                                            "load_average": load}}
    save(NAME, data, mode)
    return data


if __name__ == "__main__":
    mode = sys.argv[1].lstrip("-") if len(sys.argv) > 1 else "quick"
    for f in run(mode)["figures"]:
        print(f"{f['label']}: {f['value']} {f['unit']} [{f['target'] or '-'}] {'' if f['ok'] is None else ('ok' if f['ok'] else 'MISSED')}")
