"""The sampler process's main loop: ``python -m gpuprof_jupyter.sampler_process --kernel-pid P --fd N``.

The main thread answers the kernel's requests on the socket ``N`` (pickled tuples, see
``link.py``); a live thread sends the running experiment's new rows twice a second; a
watchdog notices the kernel's death (a pidfd, else polling its pid) within a second,
finalises the running experiment with status ``died`` and exits. A pipe's end-of-file is not
relied on: forked DataLoader workers keep the kernel's end open.
"""

from __future__ import annotations

import argparse
import os
import select
import signal
import sys
import threading
import time
import traceback
from multiprocessing.connection import Connection

from gpuprof_jupyter.sampler_process.exporter_host import ExporterHost

LIVE_PERIOD_S = 0.5  # new rows to the kernel's live view, twice a second
WATCH_PERIOD_S = 0.5


class SamplerProcess:
    def __init__(self, conn: Connection, kernel_pid: int) -> None:
        self.conn = conn
        self.kernel_pid = kernel_pid
        self.run = None  # run.Run while an experiment records
        self.exporter = ExporterHost()
        self._send_lock = threading.Lock()
        self._run_lock = threading.Lock()  # begin/end/died never overlap
        self._quit = threading.Event()
        self._last_sent: dict = {}
        self.last_steps_run: list[str] = []  # the named steps the last run went through (tests)

    def send(self, message: tuple) -> None:
        with self._send_lock:
            try:
                self.conn.send(message)
            except (OSError, ValueError):
                self._quit.set()  # the kernel's end is gone

    # -- requests ----------------------------------------------------------------------------------
    def serve(self) -> None:
        threading.Thread(target=self._watch_kernel, name="gpuprof-watchdog", daemon=True).start()
        threading.Thread(target=self._live_loop, name="gpuprof-live", daemon=True).start()
        self.send(("ready", os.getpid()))
        threading.Thread(target=_warm_up, name="gpuprof-warmup", daemon=True).start()
        while not self._quit.is_set():
            try:
                if not self.conn.poll(WATCH_PERIOD_S):
                    continue
                message = self.conn.recv()
            except (EOFError, OSError):
                break  # every copy of the kernel's end closed: nobody left to serve
            kind = message[0]
            if kind == "quit":
                break
            if kind == "events":
                run = self.run
                if run is not None:
                    run.feed.add(message[1])
                continue
            request_id, payload = message[1], message[2]
            try:
                result = getattr(self, f"on_{kind}")(payload)
            except BaseException as exc:  # noqa: BLE001 - answered, never fatal
                self.send(("reply", request_id, False, f"{type(exc).__name__}: {exc}",
                           traceback.format_exc(limit=5)))
            else:
                self.send(("reply", request_id, True, result, None))
        self.shutdown("ok")

    def on_begin(self, payload: dict) -> dict:
        from gpuprof_jupyter.sampler_process.run import Run

        with self._run_lock:
            if self.run is not None and not self.run.finished:
                self.run.end({"status": "interrupted", "notes": ["gpuprof: a new run began before this one ended"]})
            self._last_sent = {}
            run = Run(payload, self.kernel_pid)
            meta = run.start()  # raises before creating anything when the source cannot open
            self.run = run  # only a run that started is saved, were the kernel to go now
            self.exporter.run_started(self.run)
            return meta

    def on_end(self, payload: dict) -> dict:
        with self._run_lock:
            run = self.run
            if run is None:
                raise RuntimeError("no experiment is recording")
            self._send_live(run, final=True)  # the last rows first
            meta = run.end(payload)
            self.run = None
            self.last_steps_run = list(dict.fromkeys(run.steps_run))
            self.exporter.run_finished(run)
            return meta

    def on_probe(self, payload: dict) -> dict:
        """Visible GPUs for ``%gpuprofile status`` and ``gpu_available()``."""
        run = self.run
        if run is not None and not run.finished:
            return {"devices": [d for d in run.meta.devices if d.get("kind") == "gpu"], "problem": None,
                    "running": run.meta.name}
        from gpuprof_jupyter.core.sources.select import probe_gpus
        from gpuprof_jupyter.kernel.link import apply_kernel_settings

        apply_kernel_settings(payload.get("cuda_visible_devices"))
        devices, problem = probe_gpus()
        return {"devices": [d.to_dict() for d in devices], "problem": problem, "running": None}

    def on_ping(self, payload) -> dict:
        """Alive and what runs here; with ``{"lateness": True}`` also the running fast lane's
        |actual - scheduled| tick starts (s), measured here (benchmarks)."""
        run = self.run
        reply = {"pid": os.getpid(), "running": run.meta.name if run is not None else None,
                 "threads": sorted(t.name for t in threading.enumerate()),
                 "torch_imported": "torch" in sys.modules,  # it must never initialise CUDA
                 "last_steps_run": self.last_steps_run}
        if payload and payload.get("lateness") and run is not None and run.sampler is not None:
            reply["lateness"] = list(run.sampler.lateness)
            reply["gaps"] = run._all_gaps()
        return reply

    def on_serve(self, payload: dict) -> dict:
        """The Prometheus exporter listens here, so scrapes are answered while the kernel is busy."""
        if payload.get("stop"):
            return {"message": self.exporter.stop()}
        return {"message": self.exporter.serve(payload["port"], payload["addr"], self.run)}

    # -- live feed -------------------------------------------------------------------------------------
    def _live_loop(self) -> None:
        while not self._quit.wait(LIVE_PERIOD_S):
            run = self.run
            if run is not None and not run.finished:
                self._send_live(run)

    def _send_live(self, run, final: bool = False) -> None:
        try:
            batch = run.live_batch(self._last_sent, final=final)
        except Exception:  # noqa: BLE001 - the view is best effort; the store has everything
            return
        if batch is not None:
            self.send(("live", batch))
            self.exporter.update(run, batch["rows"])

    # -- the kernel's death ----------------------------------------------------------------------------
    def _watch_kernel(self) -> None:
        wait = _death_waiter(self.kernel_pid)
        while not self._quit.is_set():
            if wait(WATCH_PERIOD_S):
                self.shutdown("died")
                os._exit(0)

    def shutdown(self, status: str) -> None:
        """Finalise a run still recording (``died``: the kernel is gone) and stop."""
        self._quit.set()
        with self._run_lock:
            run, self.run = self.run, None
            if run is not None and not run.finished:
                note = ("gpuprof: the kernel died during this run; the sampler process saved what it had"
                        if status == "died" else "gpuprof: the kernel closed the profiler during this run")
                run.end({"status": status if status == "died" else "interrupted", "notes": [note],
                         "error": "kernel died" if status == "died" else None, "as_of": time.monotonic(),
                         "phases": run.feed.phases})
        self.exporter.close()


def _warm_up() -> None:
    """Import what a run needs while the kernel is still busy elsewhere (the process starts at
    ``%load_ext``), so the first profiled cell does not pay for it."""
    try:
        import pandas  # noqa: F401  (pyarrow imports it on its first array)
        import pyarrow  # noqa: F401

        from gpuprof_jupyter.core.analysis import summary  # noqa: F401
        from gpuprof_jupyter.core.sources import nvml  # noqa: F401
        from gpuprof_jupyter.sampler_process import run  # noqa: F401
    except Exception:  # noqa: BLE001 - the run will import (and report) it itself
        pass


def _death_waiter(pid: int):
    """A function ``wait(timeout) -> True once pid has exited``: a pidfd where the kernel has
    them (Linux 5.3+), else polling that the pid is still our parent."""
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        def poll(timeout: float) -> bool:
            time.sleep(timeout)
            return os.getppid() != pid

        return poll

    def wait(timeout: float) -> bool:
        ready, _, _ = select.select([fd], [], [], timeout)
        return bool(ready)

    return wait


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="gpuprof-sampler")
    parser.add_argument("--kernel-pid", type=int, required=True)
    parser.add_argument("--fd", type=int, required=True)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # an interrupt is for the kernel's cell, not for us
    _install_fake_nvml_if_asked()
    conn = Connection(args.fd)
    SamplerProcess(conn, args.kernel_pid).serve()
    sys.exit(0)


def _install_fake_nvml_if_asked() -> None:
    """Tests and benchmarks: ``GPUPROF_FAKE_NVML`` = JSON ``{"module": path, "spec": {...}}``
    installs that fake below nvidia-ml-py's public functions before anything reads NVML."""
    raw = os.environ.get("GPUPROF_FAKE_NVML")
    if not raw:
        return
    import importlib.util
    import json

    config = json.loads(raw)
    spec = importlib.util.spec_from_file_location("gpuprof_fake_nvml", config["module"])
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpuprof_fake_nvml"] = module
    spec.loader.exec_module(module)
    module.install_from_spec(config.get("spec", {}))


if __name__ == "__main__":
    main()
