"""The zero-code hooks in a child process of a profiled job, started by the startup hook
(``kernel/startup/sitecustomize.py``) or, in a fork, by ``forked``.

Runs in the kernel's and gpuprof run's child processes: a script under ``gpuprof run``, a
``torchrun`` rank, a profiled cell's spawned or forked child.

The child records as the kernel does (``TrainingHooks`` append events to an ``ActivityLog``'s
buffer: one append per event) but folds nothing: a sender thread takes the pending events
twice a second and sends them as they are over the run's channel (``core/child_channel.py``);
the process holding the run folds them (``kernel/runtime/children.py``). ``step()``,
``track()``, ``phase()`` and ``log()`` record here too. At exit the child sends what its hooks
saw (loader settings, optimizers, autocast...), its phases, ``log()`` values and the error that
ended it, if any.

It connects only once it has something to send, so processes that never train (DataLoader
workers, ``torchrun``'s agent, helpers) never do. A child that cannot connect removes its hooks,
runs unprofiled, and says so once in the run's notes file.
"""

from __future__ import annotations

import atexit
import importlib.abc
import importlib.util
import json
import os
import socket
import sys
import threading
import time

from gpuprof_jupyter.core.child_channel import (CHANNEL_ENV, EVENTS, FINAL, HELLO, NOTES_ENV, T0_ENV, TRACE_ENV,
                                                TRACE_RANKS_ENV, WALL0_ENV, append_run_metrics, encode, identity,
                                                pack_events, traced)
from gpuprof_jupyter.kernel.runtime.activity import ActivityLog
from gpuprof_jupyter.kernel.runtime.settings import dataloader_settings, torch_filled
from gpuprof_jupyter.kernel.runtime.torch_hooks import TrainingHooks
from gpuprof_jupyter.kernel.runtime.used_settings import used_settings

SEND_INTERVAL_S = 0.5  # as the kernel hands its events over
SESSION_MODULE = "gpuprof_jupyter.kernel.runtime.session"

_run: "ChildRun | None" = None


class _AfterImport(importlib.abc.MetaPathFinder):
    """Calls ``callback(module)`` once ``name`` has been imported (by whoever imports it)."""

    def __init__(self, name: str, callback, failed) -> None:
        self.name, self.callback, self.failed = name, callback, failed

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)  # once; and find the real spec without us
        spec = importlib.util.find_spec(fullname)
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        original, callback, failed = loader.exec_module, self.callback, self.failed

        def exec_module(module):
            original(module)
            try:
                callback(module)
            except Exception as exc:  # noqa: BLE001 - the user's import goes on; a note in the run
                failed(f"hooking {fullname} at its import", exc)

        loader.exec_module = exec_module
        return spec


def after_import(name: str, callback, failed) -> None:
    """``callback(module)`` now if ``name`` is imported, else right after it is; its failure
    goes to ``failed(what, exc)``, never to the code that imported it."""
    module = sys.modules.get(name)
    if module is None:
        sys.meta_path.insert(0, _AfterImport(name, callback, failed))
        return
    try:
        callback(module)
    except Exception as exc:  # noqa: BLE001
        failed(f"hooking {name}", exc)


class ChildRun:
    """This process's part of a run: what ``step()``/``track()``/``phase()``/``log()`` and the
    training hooks record into (``activity``), and the channel that carries it to the run."""

    yields_to_sessions = True  # the script's own profile() records while it runs (runtime.session)

    def __init__(self, path: str, notes_path: str | None, t0: float) -> None:
        self.path, self.notes_path = path, notes_path
        self.activity = ActivityLog(t0)
        self.hooks = TrainingHooks(self.activity)
        self.process_index: int | None = None  # torch.multiprocessing.spawn's index of this child
        self.error: str | None = None
        self._sock: socket.socket | None = None
        self._gave_up = False
        self._lock = threading.Lock()  # one sender at a time (the thread, then the exit)
        self._stop = threading.Event()
        self._finished = False
        self.window = None  # gpuprof run --trace: this rank's TraceWindow (runtime.trace_window)
        self.trace_notes: list[str] = []

    # -- start --------------------------------------------------------------------------------
    def start(self) -> "ChildRun":
        after_import(SESSION_MODULE, self._be_current, self.hooks.failed)
        after_import("torch", self._torch_imported, self.hooks.failed)
        previous = sys.excepthook

        def excepthook(kind, value, tb):
            self.error = f"{kind.__name__}: {value}"
            previous(kind, value, tb)

        sys.excepthook = excepthook
        threading.Thread(target=self._send_loop, name="gpuprof-child", daemon=True).start()
        atexit.register(self.finish)
        return self

    def start_forked(self) -> "ChildRun":
        """In a fork of the profiled process: its hooks are already installed (inherited); only
        the sender and the end (multiprocessing ends its forks with os._exit: a finalizer, not
        atexit) are this process's own."""
        import multiprocessing.util

        threading.Thread(target=self._send_loop, name="gpuprof-child", daemon=True).start()
        # a multiprocessing Process clears the finalizers it inherited, then runs its after-fork
        # callbacks: the finalizer is registered from there
        multiprocessing.util.register_after_fork(
            self, lambda run: multiprocessing.util.Finalize(None, run.finish, exitpriority=100))
        atexit.register(self.finish)  # a plain os.fork() child that exits normally
        return self

    def _be_current(self, session_module) -> None:
        """``step()``, ``track()``, ``phase()`` and ``log()`` find the run through the session module."""
        if session_module._current is None:
            session_module._current = self

    def _torch_imported(self, torch) -> None:
        self.hooks.install()
        spec = os.environ.get(TRACE_ENV)
        if spec and traced(identity()["rank"], os.environ.get(TRACE_RANKS_ENV, "0")):
            self._open_trace_window(spec)
        spawn = sys.modules.get("torch.multiprocessing.spawn")  # the module (the package's ``spawn`` is a function)
        wrap = getattr(spawn, "_wrap", None)
        if wrap is not None:  # torch.multiprocessing.spawn(fn) calls _wrap(fn, i, ...) in child i

            def _wrap(fn, i, *args, **kwargs):
                self.process_index = i
                return wrap(fn, i, *args, **kwargs)

            spawn._wrap = _wrap

    def _open_trace_window(self, spec: str) -> None:
        """``--trace`` in this rank: the window starts and stops at its step boundaries, on the
        thread that imported torch (the training thread); this process then folds its events
        too, to count the steps, and forwards them as they were."""
        from gpuprof_jupyter.kernel.runtime.trace_window import TraceWindow, parse_trace

        try:
            wall0 = float(os.environ.get(WALL0_ENV, ""))
        except ValueError:
            wall0 = time.time() - (time.monotonic() - self.activity.t0)
        window = TraceWindow(parse_trace(spec), self.activity.t0, wall0, self.trace_notes)
        self.activity.forward = []
        self.activity.step_listeners.append(window.on_step)
        self.window = window
        window.begin()

    def _close_trace_window(self) -> dict:
        """At exit (the main thread): the window closed, its trace written beside the socket."""
        window = self.window
        window.close(len(self.activity.steps))

        def save(trace: dict) -> str:
            import gzip

            path = os.path.join(os.path.dirname(self.path), f"trace-{os.getpid()}.json.gz")
            with gzip.open(path, "wt", encoding="utf-8", compresslevel=1) as f:
                json.dump(trace, f, separators=(",", ":"))
            return path

        return window.finish(save)

    # -- sending --------------------------------------------------------------------------------
    def _send_loop(self) -> None:
        while not self._stop.wait(SEND_INTERVAL_S):
            self.send_events()

    def send_events(self) -> None:
        """The pending events, and up to when they cover this process (sent also when there
        are none, once connected: a batched simulated GPU waits for that time)."""
        with self._lock:
            as_of = time.monotonic()
            activity = self.activity
            activity.request_timer.poll(final=self._finished)  # CUDA-timed requests whose work is done
            events = activity.events.drain() if activity.forward is None else activity.take_forwarded()
            if (events or self._sock is not None) and self._connected():
                self._send(encode(EVENTS, **pack_events(events), as_of=as_of))

    def _connected(self) -> bool:
        """Connect on first use (a DataLoader worker never gets here: it emits nothing)."""
        if self._sock is not None:
            return True
        if self._gave_up or _is_dataloader_worker():
            return False
        try:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(self.path)
            sock.sendall(encode(HELLO, **identity(), argv=sys.argv[:8], process_index=self.process_index))
        except OSError as exc:
            self._give_up(f"could not connect to the run ({type(exc).__name__}: {exc})")
            return False
        self._sock = sock
        return True

    def _send(self, message: bytes) -> None:
        try:
            self._sock.sendall(message)
        except OSError as exc:
            self._give_up(f"lost the connection to the run ({type(exc).__name__}: {exc})")

    def _give_up(self, why: str) -> None:
        """Run on unprofiled: hooks removed, nothing more recorded; one line in the notes file."""
        self._gave_up, self._sock = True, None
        self._stop.set()
        try:
            self.hooks.remove()
        except Exception:  # noqa: BLE001 - the user's code goes on whatever our hooks do
            pass
        self.activity.events.drain()
        session = sys.modules.get(SESSION_MODULE)
        if session is not None and session._current is self:
            session._current = None  # log() falls back to gpuprof run's metrics file
        if self.notes_path:
            try:
                with open(self.notes_path, "a", encoding="utf-8") as f:
                    f.write(json.dumps({"pid": os.getpid(), "why": why}) + "\n")
            except OSError:
                pass

    # -- the end --------------------------------------------------------------------------------
    def finish(self) -> None:
        """At exit: the last events, then what this process's hooks saw (only if it trained). Once."""
        if self._finished:
            return
        self._finished = True
        self._stop.set()
        trace = None
        if self.window is not None:
            try:
                trace = self._close_trace_window()
            except Exception as exc:  # noqa: BLE001 - the exit goes on; the run is told
                self.trace_notes.append(f"gpuprof: the trace window failed at exit ({type(exc).__name__}: {exc})")
        try:
            self.hooks.remove()
        except Exception:  # noqa: BLE001
            pass
        self.send_events()
        with self._lock:
            said = self.activity.user_metrics or self.activity.phases
            if self._sock is None and not (said and self._connected()):
                if said and self._gave_up and self.activity.user_metrics:
                    self._log_elsewhere()
                return  # never trained nor said anything, or could not connect (noted)
            self._send(encode(FINAL, **self._final(), trace=trace))
            try:
                self._sock.close()
            except OSError:
                pass
            self._sock = None

    def _log_elsewhere(self) -> None:
        """``log()`` values recorded before the channel failed: where an unprofiled child's go."""
        try:
            append_run_metrics(self.activity.user_metrics)
        except Exception:  # noqa: BLE001 - no run to tell: they are lost, as the note says
            pass

    def _final(self) -> dict:
        hooks, activity = self.hooks, self.activity
        loaders = dataloader_settings({}, hooks.loaders)
        for record in activity.phases:
            if record.end_s is None:
                record.end_s = time.monotonic() - activity.t0
        return {
            "params": {**used_settings(hooks), **loaders}, "torch_filled": torch_filled(loaders),
            "phases": [{"name": p.name, "start_s": p.start_s, "end_s": p.end_s} for p in activity.phases],
            "user_metrics": activity.user_metrics, "notes": hooks.notes() + self.trace_notes, "error": self.error,
            "device": _device(hooks), "process_index": self.process_index,
        }


def _device(hooks) -> str | None:
    """The device the first optimizer's parameters live on (``cuda:1``), as this rank sees it."""
    return next((info.get("device") for info in hooks.optimizers.values() if info.get("device")), None)


def _is_dataloader_worker() -> bool:
    data = sys.modules.get("torch.utils.data")
    try:
        return data is not None and data.get_worker_info() is not None
    except Exception:  # noqa: BLE001
        return False


def forked() -> None:
    """``os.register_at_fork(after_in_child=...)``: a fork of a process whose run is recording
    (a profiled cell's ``accelerate.notebook_launcher``, ``multiprocessing`` with fork) reports
    to that run as a child. Its inherited hooks append to the inherited event buffer, which
    this process now sends; what the parent had not handed over yet stays the parent's."""
    global _run
    session = sys.modules.get(SESSION_MODULE)
    current = getattr(session, "_current", None)
    children = getattr(current, "children", None)
    if children is None or children.closed or not getattr(current, "child_environ", False):
        return
    try:
        run = ChildRun(children.path, children.notes_path, current.t0)
        inherited = current.activity
        inherited.events.drain()
        run.activity.events, run.activity.emit = inherited.events, inherited.emit
        run.hooks = current.hooks
        session._current, _run = run, run
        run.start_forked()
    except Exception:  # noqa: BLE001 - this process runs unprofiled, as it would have
        pass


def start() -> ChildRun | None:
    """Start this process's hooks when the run's channel is named (the startup hook calls it)."""
    global _run
    path = os.environ.get(CHANNEL_ENV)
    if not path or _run is not None:
        return _run
    try:
        t0 = float(os.environ.get(T0_ENV, ""))
    except ValueError:
        t0 = time.monotonic()
    _run = ChildRun(path, os.environ.get(NOTES_ENV), t0).start()
    return _run


__all__ = ["ChildRun", "after_import", "forked", "start"]
