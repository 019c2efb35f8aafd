"""The kernel's end of the sampler process: start it, ask it things, feed it, hear from it.

Runs in the kernel (or the profiled script).

One ``SamplerLink`` per kernel (``sampler_link()``). The process is started with spawn
semantics (``subprocess``: a fresh interpreter, never a fork of a threaded torch kernel) and
reused by every run. Messages are pickled tuples on one socket pair:

    kernel -> process   ("begin"|"end"|"probe"|"ping"|"serve", request_id, payload)
                        ("events", batch)            the kernel's step events, 2 Hz
                        ("quit",)
    process -> kernel   ("ready", pid)
                        ("reply", request_id, ok, result_or_error, traceback)
                        ("live", {"rows": [(mono, device, values)], "gaps": [...]})

The link's thread receives, and during a run every ``HANDOVER_PERIOD_S`` asks the running session for its
events batch and sends it. If the process dies, pending requests fail at once with
``SamplerGone``; the next ``ensure()`` starts a new process.
"""

from __future__ import annotations

import atexit
import itertools
import os
import subprocess
import sys
import threading
import time
from multiprocessing import Pipe
from typing import Callable

LIVE_ROWS_PER_S = 20  # per device, at most, in the live rows the process sends the kernel
HANDOVER_PERIOD_S = 0.5  # the kernel's events to the sampler process, twice a second
IDLE_POLL_S = 2.0  # no run: the link's thread only waits for the process's messages
START_TIMEOUT_S = 60.0  # a cold start on a loaded machine: python + numpy + pyarrow + pynvml


class SamplerGone(RuntimeError):
    """The sampler process is not running (it crashed, was killed or could not start)."""


class SamplerLink:
    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.conn = None
        self.pid: int | None = None
        self._lock = threading.Lock()  # start/stop
        self._send_lock = threading.Lock()
        self._ready = threading.Event()
        self._replies: dict[int, list] = {}
        self._waiting: dict[int, threading.Event] = {}
        self._ids = itertools.count(1)
        self._thread: threading.Thread | None = None
        self._gone: str | None = None
        # the running session: gives an events batch (``handover()``), takes live batches
        self.handover: Callable[[], dict | None] | None = None
        self.on_live: Callable[[dict], None] | None = None
        self.on_gone: Callable[[str], None] | None = None
        self.starts = 0

    # -- the process -------------------------------------------------------------------------------
    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None and self._gone is None

    def ensure(self) -> "SamplerLink":
        """Start the process if it is not running (returns at once; requests wait for it)."""
        with self._lock:
            if self.alive:
                return self
            self._close_quietly()
            ours, theirs = Pipe(duplex=True)
            env = dict(os.environ)
            env.setdefault("PYTHONUNBUFFERED", "1")
            env["CUDA_MODULE_LOADING"] = "LAZY"
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "gpuprof_jupyter.sampler_process", "--kernel-pid", str(os.getpid()),
                 "--fd", str(theirs.fileno())],
                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, env=env, close_fds=True,
                start_new_session=True,  # Kernel > Interrupt signals the kernel's process group (SIGINT)
            )
            theirs.close()
            self.conn, self.pid, self._gone = ours, self.proc.pid, None
            self._ready.clear()
            self.starts += 1
            self._thread = threading.Thread(target=self._receive, args=(ours, self.proc), name="gpuprof-link",
                                            daemon=True)
            self._thread.start()
        return self

    def close(self, timeout: float = 5.0) -> None:
        """Ask the process to stop (it finalises a run still recording) and wait for it."""
        with self._lock:
            proc, conn = self.proc, self.conn
            if proc is None:
                return
            try:
                self._send(("quit",))
            except SamplerGone:
                pass
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5.0)
            self._close_quietly()

    def _close_quietly(self) -> None:
        if self.conn is not None:
            try:
                self.conn.close()
            except OSError:
                pass
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5.0)
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(2.0)
        self.proc = self.conn = self._thread = None

    # -- requests ------------------------------------------------------------------------------------
    def request(self, kind: str, payload=None, timeout: float = 30.0):
        """Send a request and wait for its reply; raises SamplerGone or RuntimeError (the
        process's own error, as text)."""
        self.ensure()
        if not self._ready.wait(START_TIMEOUT_S) or self._gone:
            raise SamplerGone(self._gone or f"the sampler process did not start within {START_TIMEOUT_S:.0f} s")
        request_id = next(self._ids)
        event = threading.Event()
        self._waiting[request_id] = event
        try:
            self._send((kind, request_id, payload))
            if not event.wait(timeout):
                raise SamplerGone(self._gone or f"the sampler process did not answer {kind!r} within {timeout:.0f} s")
            reply = self._replies.pop(request_id, None)
            if reply is None:
                raise SamplerGone(self._gone or "the sampler process stopped")
        finally:
            self._waiting.pop(request_id, None)
        ok, result, trace = reply
        if not ok:
            raise SamplerError(result, trace)
        return result

    def _send(self, message: tuple) -> None:
        conn = self.conn
        if conn is None or self._gone:
            raise SamplerGone(self._gone or "the sampler process is not running")
        with self._send_lock:
            try:
                conn.send(message)
            except (OSError, ValueError) as exc:
                raise SamplerGone(f"the sampler process is gone ({type(exc).__name__}: {exc})") from None

    # -- the link's thread ---------------------------------------------------------------------------
    def _receive(self, conn, proc) -> None:
        next_handover = time.monotonic() + HANDOVER_PERIOD_S
        try:
            while True:
                if self.handover is None:  # nothing to hand over: wake only for messages
                    next_handover = time.monotonic() + IDLE_POLL_S
                timeout = max(0.0, next_handover - time.monotonic())
                if conn.poll(timeout):
                    self._dispatch(conn.recv())
                if time.monotonic() >= next_handover:
                    next_handover = time.monotonic() + HANDOVER_PERIOD_S
                    self._hand_over()
        except (EOFError, OSError, ValueError, TypeError):
            pass
        if self.conn is not conn:
            return  # closed on purpose, a new process may already run
        code = proc.poll()
        if code is None:
            try:
                code = proc.wait(2.0)
            except subprocess.TimeoutExpired:
                code = None
        self._gone = (f"the sampler process (pid {proc.pid}) stopped unexpectedly"
                      + (f" (exit code {code})" if code is not None else ""))
        self._ready.set()
        for event in list(self._waiting.values()):
            event.set()
        callback = self.on_gone
        if callback is not None:
            try:
                callback(self._gone)
            except Exception:  # noqa: BLE001
                pass

    def _dispatch(self, message: tuple) -> None:
        kind = message[0]
        if kind == "reply":
            _, request_id, ok, result, trace = message
            self._replies[request_id] = [ok, result, trace]
            event = self._waiting.get(request_id)
            if event is not None:
                event.set()
        elif kind == "live":
            callback = self.on_live
            if callback is not None:
                callback(message[1])
        elif kind == "ready":
            self._ready.set()

    def _hand_over(self) -> None:
        handover = self.handover
        if handover is None:
            return
        try:
            batch = handover()
        except Exception:  # noqa: BLE001 - the session notes its own failures at stop
            return
        if batch is not None:
            self._send(("events", batch))


class SamplerError(RuntimeError):
    """The sampler process raised while doing what was asked (its message and traceback)."""

    def __init__(self, message: str, trace: str | None = None) -> None:
        super().__init__(message)
        self.remote_traceback = trace

    def as_local(self, *types: type[Exception]) -> Exception:
        """The error as one of ``types`` when the process raised one of them (``"Name: message"``),
        so the caller's own handling (a usage error, a busy port) applies; else this error."""
        name, _, message = str(self).partition(": ")
        return next((t(message) for t in types if t.__name__ == name), self)


_link: SamplerLink | None = None
_link_lock = threading.Lock()


def sampler_link() -> SamplerLink:
    """This kernel's link (the process starts on the first ``ensure()`` or request)."""
    global _link
    with _link_lock:
        if _link is None:
            _link = SamplerLink()
            atexit.register(_link.close)
        return _link


def cuda_visible_devices() -> str | None:
    """The kernel's CUDA_VISIBLE_DEVICES now (notebooks change os.environ between cells)."""
    return os.environ.get("CUDA_VISIBLE_DEVICES")


def _is_kernel_setting(key: str) -> bool:
    return key.startswith("GPUPROF_") and key != "GPUPROF_FAKE_NVML"  # the fake is the process's own


def kernel_settings_environ() -> dict[str, str]:
    """The kernel's GPUPROF_* settings now (a notebook may set them in os.environ); the sampler
    process applies them at each run, with the kernel's working directory (the config file's)."""
    return {k: v for k, v in os.environ.items() if _is_kernel_setting(k)}


def apply_kernel_settings(cuda_visible: str | None, settings: dict[str, str] | None = None) -> None:
    """In the sampler process: take the kernel's CUDA_VISIBLE_DEVICES and, when given, its
    GPUPROF_* settings (``kernel_settings_environ``) in place of the ones it had."""
    if settings is not None:
        for key in [k for k in os.environ if _is_kernel_setting(k)]:
            del os.environ[key]
        os.environ.update(settings)
    if cuda_visible is None:
        os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    else:
        os.environ["CUDA_VISIBLE_DEVICES"] = cuda_visible


def probe_gpus() -> tuple[list[dict], str | None]:
    """(visible GPUs as dicts, None) or ([], why not), asked of the sampler process: the
    kernel itself never opens NVML. Never raises."""
    try:
        result = sampler_link().request("probe", {"cuda_visible_devices": cuda_visible_devices()})
    except Exception as exc:  # noqa: BLE001
        return [], f"the sampler process could not be asked ({exc})"
    return result["devices"], result["problem"]


def gpu_available() -> bool:
    """True when NVML sees at least one visible GPU (used to pick the demo's source)."""
    return bool(probe_gpus()[0])
