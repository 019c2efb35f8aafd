"""The sampler process's main loop: ``python -m gpuprof_jupyter.sampler_process --kernel-pid P --fd N``.

Runs in the sampler process. The main thread answers the kernel's requests on the socket
``N`` (``core/protocol.py`` messages, checked on receipt: a malformed one is answered with an
error and noted, never fatal). ``Begin`` is answered from a thread of its own, which opens
the sources with a deadline, so status, serve and end never wait behind a stuck source. A
live thread sends the kernel the running experiment's live update once a second, with the
live plots' changes ready to forward (``live_view``). The kernel's death ends the running
experiment as ``died``, whichever sign comes first: end of file on the socket
(no ``Quit`` came), or the watchdog (a pidfd, else polling the parent pid, every
``WATCH_PERIOD_S``), which also catches a kernel whose forked DataLoader workers keep the
socket open.
"""

from __future__ import annotations

import argparse
import os
import pickle
import select
import signal
import sys
import threading
import time
import traceback
from multiprocessing.connection import Connection

from gpuprof_jupyter.core.fault_injection import install_fake_nvml_if_asked, switch_interval_s, traced_steps
from gpuprof_jupyter.core.protocol import (MALFORMED, Begin, Cancel, CellMark, End, Events, LiveTarget, LiveUpdate,
                                           Malformed, Ping, Quit, Ready, RemoteError, Reply, Request, RunCancelled,
                                           Serve, SessionControl, SessionQuery, Status, apply_kernel_settings, check,
                                           timeout_s)
from gpuprof_jupyter.core.store.experiment import RunStatus
from gpuprof_jupyter.sampler_process.exporter.host import ExporterHost
from gpuprof_jupyter.sampler_process.guards import OptionalParts, call_with_deadline
from gpuprof_jupyter.sampler_process.session_record import SessionRecord

LIVE_PERIOD_S = 1.0  # the live view's update to the kernel (and the exporter's rows), once a second: the
# kernel's link hands its events over and forwards the view's texts on the same wake-up (runtime/link.py)
WATCH_PERIOD_S = 0.5  # the watchdog's poll, where there is no pidfd; also the request loop's wake-up
OPEN_DEADLINE_S = timeout_s("OPEN_DEADLINE", 30.0)  # opening the sources (the kernel waits 60 s for begin)
PROBE_DEADLINE_S = timeout_s("PROBE_DEADLINE", 10.0)  # asking NVML for the visible GPUs
EXPORTER = "the Prometheus exporter"
SWITCH_INTERVAL_S = switch_interval_s(0.001)  # the lane waits at most this for the GIL


class SamplerProcess:
    def __init__(self, conn: Connection, kernel_pid: int) -> None:
        self.conn = conn
        self.kernel_pid = kernel_pid
        self.run = None  # run.Run while an experiment records
        self.exporter = ExporterHost()
        self.parts = OptionalParts(self._note)
        self._send_lock = threading.Lock()
        self._run_lock = threading.Lock()  # starting, ending, cancelling and the kernel's death never overlap
        self._beginning: str | None = None  # the token of a begin still opening its sources
        self._cancelled: set[str] = set()
        self._quit = threading.Event()
        self._last_sent: dict = {}
        self._notes_for_next: list[str] = []  # an optional part failed between runs
        self.malformed = 0  # messages that were not the protocol's (tests)
        self._warmed_up = threading.Event()
        self.session = SessionRecord(kernel_pid, self._warmed_up, self._note, self.send)  # the kernel's whole session

    def send(self, message) -> None:
        with self._send_lock:
            try:
                self.conn.send(message)
            except (OSError, ValueError):
                self._quit.set()  # the kernel's end is gone

    def _note(self, note: str) -> None:
        run = self.run
        notes = run.notes if run is not None and not run.finished else self._notes_for_next
        if note not in notes:
            notes.append(note)

    # -- requests ----------------------------------------------------------------------------------
    def serve(self) -> None:
        threading.Thread(target=self._watch_kernel, name="gpuprof-watchdog", daemon=True).start()
        threading.Thread(target=self._live_loop, name="gpuprof-live", daemon=True).start()
        self.send(Ready(os.getpid()))
        threading.Thread(target=_warm_up, args=(self._warmed_up,), name="gpuprof-warmup", daemon=True).start()
        closed_by = "died"  # end of file without a Quit: the kernel is gone
        while not self._quit.is_set():
            try:
                if not self.conn.poll(WATCH_PERIOD_S):
                    continue
                raw = self.conn.recv_bytes()
            except (EOFError, OSError):
                break
            message = None
            try:
                message = pickle.loads(raw)
                check(message, (Request, Events, LiveTarget, Quit, SessionControl, CellMark))
            except Exception as exc:  # noqa: BLE001 - not a message of ours: answered, noted, never fatal
                self._reject(message, exc)
                continue
            if isinstance(message, Quit):
                closed_by = "quit"
                break
            if isinstance(message, SessionControl):
                self.session.control(message)
            elif isinstance(message, CellMark):
                self.session.mark(message)
            elif isinstance(message, (Events, LiveTarget)):
                run = self.run
                if run is not None:
                    try:
                        self._take(run, message)
                    except Exception as exc:  # noqa: BLE001 - a message it cannot use is malformed
                        self._reject(message, exc)
            elif isinstance(message.body, Begin):
                threading.Thread(target=self._begin, args=(message,), name="gpuprof-begin", daemon=True).start()
            else:
                self._answer(message.id, lambda body=message.body: self._handle(body))
        self.shutdown(closed_by)

    @staticmethod
    def _take(run, message) -> None:
        """A message without a reply, for the running experiment."""
        if isinstance(message, Events):
            run.feed.add(message)
            run.write_job_steps()  # a part of a multi-node job: its steps so far, for watch(JOB_ID)
        elif message.token == run.begin.token:  # else a view of a run that has ended
            run.view.attach(message, time.monotonic())

    def _answer(self, request_id: int, handle) -> None:
        try:
            result = handle()
        except BaseException as exc:  # noqa: BLE001 - answered, never fatal
            self.send(Reply(request_id, error=RemoteError.of(exc, traceback.format_exc(limit=5))))
        else:
            self.send(Reply(request_id, result))

    def _reject(self, message, exc: Exception) -> None:
        """A message that is not the protocol's (``message``: what it unpickled to, None when it
        did not): an error reply (to its request when it has a readable id) and one note on the
        running experiment."""
        self.malformed += 1
        why = str(exc) if isinstance(exc, Malformed) else f"unreadable ({type(exc).__name__})"
        request_id = getattr(message, "id", None)  # a Request whose body is wrong
        self.send(Reply(request_id if isinstance(request_id, int) else None, error=RemoteError(MALFORMED, why)))
        run = self.run
        if run is not None:
            run.malformed.append(why)

    def _handle(self, body):
        if isinstance(body, End):
            return self._end(body)
        if isinstance(body, Status):
            return self._status(body)
        if isinstance(body, Ping):
            return self._ping(body)
        if isinstance(body, Serve):
            return self._serve(body)
        if isinstance(body, Cancel):
            return self._cancel(body)
        if isinstance(body, SessionQuery):
            return self.session.query()
        raise Malformed(f"unknown request {type(body).__name__}")

    def _begin(self, request: Request) -> None:
        """A thread of its own: open the sources (with a deadline), then create the experiment
        and start the lanes, unless the kernel cancelled meanwhile. Replies itself."""
        begin: Begin = request.body
        run = None

        def start() -> dict:
            nonlocal run
            from gpuprof_jupyter.sampler_process.run import Run

            with self._run_lock:
                if self._beginning is not None:
                    raise RuntimeError("another run is still beginning")
                self._beginning = begin.token
                previous = self.run
                if previous is not None and not previous.finished:
                    self.run = None
                    previous.end(End(RunStatus.INTERRUPTED, notes=["gpuprof: a new run began before this one ended"]))
            run = Run(begin, self.kernel_pid)
            run.notes.extend(self._notes_for_next)
            self._notes_for_next.clear()
            call_with_deadline("opening the sources", run.open, OPEN_DEADLINE_S, too_late=lambda _: run.close_sources())
            run.opened = True
            with self._run_lock:
                if begin.token in self._cancelled or self._quit.is_set():
                    raise RunCancelled("the kernel stopped waiting for this run; nothing of it is kept")
                self._last_sent = {}
                meta = run.start()
                self.run = run
            if self.exporter.exporter is not None:
                self.parts.call(EXPORTER, lambda: self.exporter.run_started(run), "starting")
            return meta

        try:
            self._answer(request.id, start)
        finally:
            with self._run_lock:
                self._beginning = None
                self._cancelled.discard(begin.token)
                if run is not None and self.run is not run and not run.finished:
                    run.discard()  # failed, or cancelled: the kernel keeps its own record of the run

    def _end(self, final: End) -> dict:
        with self._run_lock:
            run = self.run
            if run is None:
                raise RuntimeError("no experiment is recording")
            self._send_live(run, final=True)  # the last rows first
            meta = run.end(final)
            self.run = None
        self.exporter.remember_source(run)  # served later or not, its source reads the devices between runs
        if self.exporter.exporter is not None:
            self.parts.call(EXPORTER, lambda: self.exporter.run_finished(run), "finishing")
        return meta

    def _cancel(self, cancel: Cancel) -> dict:
        """The kernel gave up on a begin: a run it started is discarded; one still opening its
        sources will be, when they open."""
        with self._run_lock:
            run = self.run
            if run is not None and run.begin.token == cancel.token and not run.finished:
                self.run = None
                run.discard()
                return {"discarded": True}
            if self._beginning == cancel.token:
                self._cancelled.add(cancel.token)
        return {"discarded": False}

    def _status(self, status: Status) -> dict:
        """Visible GPUs for ``%gpuprofile status`` and ``gpu_available()``."""
        run = self.run
        if run is not None and not run.finished:
            return {"devices": run.meta.gpu_devices, "problem": None,
                    "running": run.meta.name}
        from gpuprof_jupyter.core.sources.select import probe_gpus

        apply_kernel_settings(status.cuda_visible_devices)
        try:
            devices, problem = call_with_deadline("probing NVML", probe_gpus, PROBE_DEADLINE_S)
        except TimeoutError as exc:
            devices, problem = [], str(exc)
        return {"devices": [d.to_dict() for d in devices], "problem": problem, "running": None}

    def _ping(self, ping: Ping) -> dict:
        """Alive and what runs here; with ``lateness`` also the running fast lane's
        |actual - scheduled| tick starts (s), measured here, and the gaps (benchmarks)."""
        run = self.run
        reply = {"pid": os.getpid(), "running": run.meta.name if run is not None else None,
                 "threads": sorted(t.name for t in threading.enumerate()),
                 "torch_imported": "torch" in sys.modules,  # it must never initialise CUDA
                 "pandas_imported": "pandas" in sys.modules,  # nothing here needs it (the first cell would wait)
                 **traced_steps(),  # tests: the latest run's named steps, and the one made to fail
                 "malformed": self.malformed,
                 "beginning": self._beginning, "session_record": self.session.on}
        sampler = run.lanes.sampler if run is not None else None
        if ping.lateness and sampler is not None:
            reply["lateness"] = list(sampler.lateness)
            reply["last_sample_at"] = sampler.last_sample_at
            reply["gaps"] = run.lanes.all_gaps()
        return reply

    def _serve(self, serve: Serve) -> dict:
        """The Prometheus exporter listens here, so scrapes are answered while the kernel is busy."""
        if serve.stop:
            return {"message": self.exporter.stop()}
        self.parts.turn_on(EXPORTER)
        return {"message": self.exporter.serve(serve.port, serve.addr, self.run, serve.token, serve.token_file,
                                               serve.source)}

    # -- live feed -------------------------------------------------------------------------------------
    def _live_loop(self) -> None:
        """Once a second, just after a tick of the run's fast lane (run.after_next_tick): the
        update's work then never delays a tick. The schedule keeps its phase (no drift)."""
        due = time.monotonic()
        while True:
            due = max(due + LIVE_PERIOD_S, time.monotonic())
            if self._quit.wait(due - time.monotonic()):
                return
            run = self.run
            if run is not None and not run.finished:
                run.after_next_tick()
                self._send_live(run)

    def _send_live(self, run, final: bool = False) -> None:
        """The period's live update, sent even when it says nothing: the kernel's link hands its
        events over on the wake-up each update brings (runtime/link.py), and a batched source
        that follows those events (the simulated GPU) would otherwise wait for the link's timer."""
        try:
            batch = run.live_batch(self._last_sent, final=final)
        except Exception:  # noqa: BLE001 - the view is best effort; the store has everything
            self.send(LiveUpdate())
            return
        try:
            update = run.view.update(batch.rows, batch.gaps, batch.alerts, run.feed.phases, time.monotonic(), final)
        except Exception:  # noqa: BLE001 - the view is best effort; the alerts fired still go
            update = LiveUpdate(alerts=list(batch.alerts))
        self.send(update or LiveUpdate())
        if self.exporter.exporter is not None and self.parts.call(
                EXPORTER, lambda: self.exporter.update(run, batch.rows) or True) is None:
            self.exporter.close()  # off: a scraper sees it gone rather than stale
            self.exporter.exporter = None

    # -- the kernel's death ----------------------------------------------------------------------------
    def _watch_kernel(self) -> None:
        wait = _death_waiter(self.kernel_pid)
        while not self._quit.is_set():
            if wait(WATCH_PERIOD_S):
                self.shutdown("died")
                os._exit(0)

    def shutdown(self, closed_by: str) -> None:
        """Finalise a run still recording and stop. ``died``: the kernel is gone (end of file
        without a Quit, or the watchdog); ``quit``: the kernel closed the profiler mid-run."""
        self._quit.set()
        with self._run_lock:
            run, self.run = self.run, None
            if run is not None and not run.finished:
                if closed_by == "died":
                    final = End.without_kernel(RunStatus.DIED, "gpuprof: the kernel died during this run; the sampler "
                                               "process saved what it had", time.monotonic(), run.feed.phases,
                                               error="kernel died")
                else:
                    final = End.without_kernel(RunStatus.INTERRUPTED, "gpuprof: the kernel closed the profiler during "
                                               "this run", time.monotonic(), run.feed.phases)
                run.end(final)
        self.exporter.close()
        self.session.close()


def _warm_up(done: threading.Event) -> None:
    """Import what a run needs while the kernel is still busy elsewhere (the process starts at
    ``%load_ext``), so the first profiled cell does not pay for it: what ``begin`` needs first,
    then the summary for ``end``. Not pandas: nothing here needs it (``store.arrow_arrays``,
    ``store.columns``), and importing it cost the first cell 0.15-0.35 s."""
    try:
        from gpuprof_jupyter.core.sources import nvml  # noqa: F401
        from gpuprof_jupyter.core.store import samples_file  # noqa: F401
        from gpuprof_jupyter.sampler_process import run  # noqa: F401
        from gpuprof_jupyter.core.analysis import summary  # noqa: F401
        import numpy.ma  # noqa: F401  (np.unique, in the summary, imports it on first use: 25 ms)
    except Exception:  # noqa: BLE001 - the run will import (and report) it itself
        pass
    finally:
        done.set()  # the session record may open NVML now


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
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    install_fake_nvml_if_asked()
    conn = Connection(args.fd)
    SamplerProcess(conn, args.kernel_pid).serve()
    sys.exit(0)


if __name__ == "__main__":
    main()
