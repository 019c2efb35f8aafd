"""The kernel's end of the sampler process: start it, ask it things, feed it, hear from it.

Runs in any process that holds a run: the kernel, or a script under ``gpuprof run``.

One ``SamplerLink`` per kernel (``sampler_link()``). The process is started with spawn
semantics (``subprocess``: a fresh interpreter, never a fork of a threaded torch kernel) and
reused by every run. Messages are ``core/protocol.py``'s dataclasses, pickled on one socket
pair that only this kernel and its process hold: requests (``Request``) are answered by a
``Reply``, whose typed error is raised here as the caller expects (a ValueError for a usage
error, ExporterBindError for a taken port, else SamplerError); the kernel's step events
(``Events``), the live view's target (``LiveTarget``) and the process's live updates
(``LiveUpdate``, with the plots' changes ready to forward) flow without replies.

The link's thread receives, and during a run asks the running session for its events batch and
sends it: right after each live update it receives (once a second, so the thread wakes once a
second for both: every wake-up of a kernel thread costs the training thread more than its own
CPU, benchmarks/README.md), or after ``HANDOVER_PERIOD_S`` when no update came.
``hand_over_soon()`` (a child's steps arrived) makes it do so at once, at most once per
``EARLY_HANDOVER_GAP_S``, so a child's steps wait for no extra period. With no run the thread
wakes only for the process's messages: nothing of ours runs in the kernel between profiled cells
(a run's start wakes it, ``hand_over_soon``). If the process dies, pending requests fail at once with
``SamplerGone``; the next ``ensure()`` starts a new process. ``kill()`` ends it for good
(the kernel then owns the run: docs/architecture.md).
"""

from __future__ import annotations

import atexit
import itertools
import os
import pickle
import subprocess
import sys
import threading
import time
from multiprocessing import Pipe
from multiprocessing.connection import wait
from typing import Callable

from gpuprof_jupyter.core.protocol import (PORT_TAKEN, PROTOCOL_VERSION, USAGE, Cancel, ExporterBindError,
                                           LiveUpdate, Quit, Ready, RemoteError, Reply, Request, SessionNotice, Status,
                                           check, is_kernel_setting, timeout_s)
from gpuprof_jupyter.core.format import fmt_unit

HANDOVER_PERIOD_S = 1.25  # the kernel's events to the sampler process when no live update brings them (a bit
# longer than the updates' period, so that the timer and an update never make two wake-ups)
HANDOVER_WITH_UPDATE_S = 0.5  # a live update brings the hand-over along when the last one is this old
EARLY_HANDOVER_GAP_S = 0.1  # hand_over_soon(): never more often than this
START_TIMEOUT_S = 60.0  # a cold start on a loaded machine: python + numpy + pyarrow + pynvml
CANCEL_TIMEOUT_S = 5.0  # a process that does not answer a Cancel is killed
KILL_WAIT_S = 30.0


class SamplerGone(RuntimeError):
    """The sampler process is not running (it crashed, was killed or could not start)."""


class SamplerTimeout(SamplerGone):
    """The sampler process did not answer in time (it may still be working on the request)."""


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
        self.on_handover_failed: Callable[[BaseException], None] | None = None  # ``handover()`` raised
        self.on_notice: Callable[[SessionNotice], None] | None = None  # the session record's (notebook/session_cells.py)
        self.starts = 0
        self.ignored = 0  # messages from the process that were not the protocol's
        self._owner = os.getpid()  # a fork inherits this object: only its maker may end the process
        self._wake_r, self._wake_w = os.pipe()  # hand_over_soon() wakes the link's thread
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)

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
        """Ask the process to stop (it finalises a run still recording) and wait for it. In a
        fork of the kernel, nothing: the process, the connection and the lock are the kernel's."""
        if os.getpid() != self._owner:
            return
        with self._lock:
            proc = self.proc
            if proc is None:
                return
            try:
                self._send(Quit())
            except SamplerGone:
                pass
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5.0)
            self._close_quietly()

    def kill(self) -> int | None:
        """End the process now and reap it (SIGKILL: a stopped or stuck process too), so that
        nothing it still holds can be written after this returns. Its pid, or None if none ran.
        The next request starts a new process."""
        with self._lock:
            pid = self.pid if self.proc is not None else None
            if self.proc is not None:
                self._gone = f"the sampler process (pid {pid}) was stopped by the kernel"
                self.proc.kill()
                try:
                    self.proc.wait(KILL_WAIT_S)
                except subprocess.TimeoutExpired:  # in an uninterruptible call (NFS): it dies when that returns,
                    pass  # never running our code again
            self._close_quietly()
        for event in list(self._waiting.values()):
            event.set()
        return pid

    def cancel(self, token: str) -> int | None:
        """Tell the process to drop the begin ``token`` (the kernel stopped waiting for it); if it
        does not answer within CANCEL_TIMEOUT_S, kill it. The killed pid, else None."""
        try:
            self.request(Cancel(token), timeout=timeout_s("CANCEL", CANCEL_TIMEOUT_S))
            return None
        except SamplerGone:
            return self.kill()

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
    def request(self, body, timeout: float = 30.0):
        """Send a request (a ``protocol.REQUESTS`` message) and wait for its reply. Raises
        SamplerGone (SamplerTimeout when it did not answer in time), or the process's error as
        the caller expects it (``remote_exception``)."""
        self.ensure()
        if not self._ready.wait(START_TIMEOUT_S) or self._gone:
            raise SamplerGone(self._gone or f"the sampler process did not start within {fmt_unit(START_TIMEOUT_S, 's', 0)}")
        request_id = next(self._ids)
        event = threading.Event()
        self._waiting[request_id] = event
        try:
            self._send(Request(request_id, body))
            if not event.wait(timeout):
                if self._gone:
                    raise SamplerGone(self._gone)
                raise SamplerTimeout(f"the sampler process did not answer {type(body).__name__} within {fmt_unit(timeout, 's')}")
            reply = self._replies.pop(request_id, None)
            if reply is None:
                raise SamplerGone(self._gone or "the sampler process stopped")
        finally:
            self._waiting.pop(request_id, None)
        if reply.error is not None:
            raise remote_exception(reply.error)
        return reply.result

    def tell(self, message) -> None:
        """Send a message that has no reply (``LiveTarget``); SamplerGone when the process is."""
        self._send(message)

    def _send(self, message) -> None:
        conn = self.conn
        if conn is None or self._gone:
            raise SamplerGone(self._gone or "the sampler process is not running")
        with self._send_lock:
            try:
                conn.send(message)
            except (OSError, ValueError) as exc:
                raise SamplerGone(f"the sampler process is gone ({type(exc).__name__}: {exc})") from None

    def hand_over_soon(self) -> None:
        """Any thread: hand the session's events over now, not at the next period (a child's
        steps arrived: they already waited for the child's own send)."""
        try:
            os.write(self._wake_w, b"\0")
        except OSError:  # full: already woken
            pass

    # -- the link's thread ---------------------------------------------------------------------------
    def _receive(self, conn, proc) -> None:
        next_handover = time.monotonic() + HANDOVER_PERIOD_S
        last_handover = 0.0
        idle = True
        try:
            while True:
                # no run: wake only for the process's messages or hand_over_soon(), never on a timer
                ready = wait([conn, self._wake_r], None if idle else max(0.0, next_handover - time.monotonic()))
                if self.handover is None:
                    idle = True
                elif idle:  # a run began (its start wakes us, session.py): its period starts now
                    idle, next_handover = False, time.monotonic() + HANDOVER_PERIOD_S
                if conn in ready:
                    live = self._dispatch(conn.recv_bytes())
                    if live and self.handover is not None:  # this wake-up does both
                        next_handover = min(next_handover, last_handover + HANDOVER_WITH_UPDATE_S)
                if self._wake_r in ready:
                    try:
                        os.read(self._wake_r, 4096)
                    except OSError:
                        pass
                    if self.handover is not None:
                        next_handover = min(next_handover, last_handover + EARLY_HANDOVER_GAP_S)
                if not idle and time.monotonic() >= next_handover:
                    last_handover = time.monotonic()
                    next_handover = last_handover + HANDOVER_PERIOD_S
                    self._hand_over()
        except (EOFError, OSError):
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

    def _dispatch(self, raw: bytes) -> bool:
        """Act on one message of the process; True when it was a live update."""
        try:
            message = check(pickle.loads(raw), (Reply, LiveUpdate, Ready, SessionNotice))
        except Exception:  # noqa: BLE001 - not the protocol's: counted, never fatal
            self.ignored += 1
            return False
        if isinstance(message, Reply):
            if message.id is None:
                return False  # the process could not read something we sent (counted there, noted in its run)
            event = self._waiting.get(message.id)
            if event is not None:  # else its asker gave up waiting
                self._replies[message.id] = message
                event.set()
        elif isinstance(message, SessionNotice):
            callback = self.on_notice
            if callback is not None:
                try:
                    callback(message)
                except Exception:  # noqa: BLE001 - a notice is best effort
                    pass
        elif isinstance(message, LiveUpdate):
            callback = self.on_live
            if callback is not None:
                try:
                    callback(message)
                except Exception:  # noqa: BLE001 - the view is best effort; the store has everything
                    pass
            return True
        elif message.version != PROTOCOL_VERSION:
            self._gone = (f"the sampler process speaks protocol {message.version}, this kernel "
                          f"{PROTOCOL_VERSION} (an older install?)")
            self._ready.set()
        else:
            self._ready.set()
        return False

    def _hand_over(self) -> None:
        handover = self.handover
        if handover is None:
            return
        try:
            batch = handover()
        except Exception as exc:  # noqa: BLE001 - told to the session (a note), tried again next period
            failed = self.on_handover_failed
            if failed is not None:
                try:
                    failed(exc)
                except Exception:  # noqa: BLE001 - the link's thread outlives any callback
                    pass
            return
        if batch is not None:
            self._send(batch)


class SamplerError(RuntimeError):
    """The sampler process failed to do what was asked (its message, its kind, its traceback)."""

    def __init__(self, message: str, kind: str = "failed", trace: str | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.remote_traceback = trace


def remote_exception(error: RemoteError) -> Exception:
    """The process's error as the caller expects it: a usage error is the caller's ValueError, a
    taken port ExporterBindError, anything else SamplerError."""
    if error.kind == USAGE:
        return ValueError(error.message)
    if error.kind == PORT_TAKEN:
        return ExporterBindError(error.errno or 0, error.message)
    return SamplerError(error.message, error.kind, error.trace)


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


def _forget_link_in_fork() -> None:
    """A fork of the kernel starts its own link if it profiles (never the kernel's)."""
    global _link, _link_lock
    _link, _link_lock = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_link_in_fork)


def cuda_visible_devices() -> str | None:
    """The kernel's CUDA_VISIBLE_DEVICES now (notebooks change os.environ between cells)."""
    return os.environ.get("CUDA_VISIBLE_DEVICES")


def kernel_settings_environ() -> dict[str, str]:
    """The kernel's GPUPROF_* settings now (a notebook may set them in os.environ); the sampler
    process applies them at each run, with the kernel's working directory (the config file's)."""
    return {k: v for k, v in os.environ.items() if is_kernel_setting(k)}


def probe_gpus() -> tuple[list[dict], str | None]:
    """(visible GPUs as dicts, None) or ([], why not), asked of the sampler process: the
    kernel itself never opens NVML. Never raises."""
    try:
        result = sampler_link().request(Status(cuda_visible_devices()))
    except Exception as exc:  # noqa: BLE001
        return [], f"the sampler process could not be asked ({exc})"
    return result["devices"], result["problem"]


def gpu_available() -> bool:
    """True when NVML sees at least one visible GPU (used to pick the demo's source)."""
    return bool(probe_gpus()[0])
