"""The exporter's HTTP server, bounded: another local user cannot pin its threads or memory.

Runs in the sampler process.

``wsgiref`` with ``ThreadingMixIn`` gave every accepted connection a thread before it had sent
anything: 300 idle connections from a second user gave the sampler process 305 threads, 2,000
gave 400 threads and +135 MiB in 2 s. Here a connection waits in one selector thread, holding
no thread, until its request's headers have all arrived (it reads what arrives, so it waits
for more rather than spinning on a stalled request; ``wsgiref`` then reads the request from
those bytes and the socket, and parses it as before). Only then does one of ``MAX_WORKERS`` threads answer
it, and the token is checked (``endpoint._guarded``) before anything else is read: a body is
never read at all. At most ``MAX_WAITING`` connections wait; one more closes the oldest
waiting one, so a scraper that sends its request at once is answered however many idle
connections a neighbour keeps opening. A connection whose headers have not arrived within
``REQUEST_TIMEOUT_S`` is closed, and the same timeout bounds each read and write after.

The waiting room never dies: a socket closed in one turn of its loop is skipped in the rest of
that turn, and any exception in a turn is one note (``notes``, which the sampler process copies
into the running experiment) and the loop goes on.
"""

from __future__ import annotations

import io
import selectors
import socket
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from wsgiref.simple_server import WSGIServer

MAX_WAITING = 64  # connections whose request has not fully arrived
MAX_WORKERS = 4  # requests answered at once
MAX_QUEUED = 16  # complete requests waiting for a worker; more are closed (a flood, not a scraper)
REQUEST_TIMEOUT_S = 5.0  # for the headers to arrive, then for each read or write
LOOP_PAUSE_S = 0.05  # after a failed turn of the waiting room, before the next
HEADER_BYTES = 65536  # a header block this long without its end goes to wsgiref, which refuses it
_HEADERS_END = (b"\r\n\r\n", b"\n\n")


class _PrefixedReader(io.RawIOBase):
    """The bytes the waiting room read, then the rest from the socket."""

    def __init__(self, prefix: bytes, sock: socket.socket) -> None:
        super().__init__()
        self._prefix, self._sock = memoryview(prefix), sock

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        if len(self._prefix):
            count = min(len(buffer), len(self._prefix))
            buffer[:count] = self._prefix[:count]
            self._prefix = self._prefix[count:]
            return count
        return self._sock.recv_into(buffer)


class _Replayed:
    """A connection whose first bytes the waiting room already read: ``makefile("rb")`` gives
    them back before the rest (wsgiref reads the request through it); all else is the socket's."""

    def __init__(self, sock: socket.socket, prefix: bytes) -> None:
        self._sock, self._prefix = sock, prefix

    def makefile(self, mode: str = "r", *args, **kwargs):
        if mode == "rb":
            return io.BufferedReader(_PrefixedReader(self._prefix, self._sock))
        return self._sock.makefile(mode, *args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self._sock, name)


class BoundedWSGIServer(WSGIServer):
    """A ``WSGIServer`` whose threads and waiting connections are capped (module docstring).
    ``serve_forever`` runs the waiting room; ``shutdown`` stops it and the workers."""

    max_waiting = MAX_WAITING
    max_workers = MAX_WORKERS
    request_timeout_s = REQUEST_TIMEOUT_S
    request_queue_size = 128  # the listen backlog: a burst of connections is accepted, not retried a second later

    def __init__(self, *args, **kwargs) -> None:
        self._waiting: OrderedDict[socket.socket, tuple] = OrderedDict()  # -> (deadline, address, bytes read)
        self._in_pool = 0
        self._queued: set[_Replayed] = set()  # handed to the pool, not yet picked up
        self._count_lock = threading.Lock()
        self._stop = threading.Event()
        self._stopped = threading.Event()
        self._wake_r, self._wake_w = socket.socketpair()
        self.dropped = {"oldest": 0, "timeout": 0, "flood": 0}  # connections closed unanswered, by reason
        self.notes: list[str] = []  # the serve loop's own failures, one per kind (``_loop_failed``)
        self.loop_failures = 0
        self._pool = ThreadPoolExecutor(self.max_workers, thread_name_prefix="gpuprof-exporter-request")
        super().__init__(*args, **kwargs)  # binds: on failure it calls server_close, which needs the above
        self.socket.setblocking(False)  # accepted until none is left (``_accept``)

    # -- the waiting room ---------------------------------------------------------------------
    def serve_forever(self, poll_interval: float = 0.5) -> None:
        self._stopped.clear()
        try:
            with selectors.DefaultSelector() as selector:
                selector.register(self.socket, selectors.EVENT_READ)
                selector.register(self._wake_r, selectors.EVENT_READ)
                while not self._stop.is_set():
                    try:
                        self._serve_once(selector, poll_interval)
                    except Exception as exc:  # noqa: BLE001 - a dead loop would hang every later scrape
                        self._loop_failed(selector, exc)
                for sock in list(self._waiting):
                    self._close_waiting(selector, sock)
        finally:
            self._stopped.set()

    def _serve_once(self, selector, poll_interval: float) -> None:
        """One turn of the waiting room: what is ready, then the timeouts. A socket closed earlier
        in the same turn (``_accept`` closes the oldest waiting one when the room is full, and it
        may also be among this turn's ready events) is skipped."""
        deadline = next(iter(self._waiting.values()))[0] if self._waiting else None
        timeout = poll_interval if deadline is None else max(0.0, min(poll_interval, deadline - time.monotonic()))
        for key, _ in selector.select(timeout):
            if key.fileobj is self.socket:
                self._accept(selector)
            elif key.fileobj is self._wake_r:
                self._wake_r.recv(4096)
            elif key.fileobj in self._waiting:
                self._check(selector, key.fileobj)
        self._expire(selector)

    def _loop_failed(self, selector, exc: Exception) -> None:
        """A turn of the waiting room raised: one note per kind of failure, the loop goes on. Its
        waiting sockets are dropped (their state is in doubt; a scraper retries) and the loop
        pauses a moment, so a failure that repeats cannot spin a core."""
        self.loop_failures += 1
        note = (f"gpuprof: the exporter's waiting room failed ({type(exc).__name__}: {exc}); its waiting "
                "connections were closed and it went on")
        if note not in self.notes:
            self.notes.append(note)
        for sock in list(self._waiting):
            self._close_waiting(selector, sock)
        self._stop.wait(LOOP_PAUSE_S)

    def _accept(self, selector) -> None:
        """Every connection the listening socket holds, into the waiting room."""
        while True:
            try:
                sock, address = self.socket.accept()
            except OSError:  # none left (BlockingIOError), or a peer gave up before we accepted
                return
            if len(self._waiting) >= self.max_waiting:
                self.dropped["oldest"] += 1
                self._close_waiting(selector, next(iter(self._waiting)))
            sock.setblocking(False)
            self._waiting[sock] = (time.monotonic() + self.request_timeout_s, address, bytearray())
            selector.register(sock, selectors.EVENT_READ)

    def _check(self, selector, sock: socket.socket) -> None:
        """Read what arrived (so the selector waits for more, never spins on it); hand ``sock``
        to a worker once its headers are all there; close it if its peer left."""
        _, address, seen = self._waiting[sock]
        try:
            chunk = sock.recv(HEADER_BYTES - len(seen))
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._close_waiting(selector, sock)
            return
        seen += chunk
        if len(seen) < HEADER_BYTES and not any(end in seen for end in _HEADERS_END):
            return
        del self._waiting[sock]
        selector.unregister(sock)
        request = _Replayed(sock, bytes(seen))
        with self._count_lock:
            flood = self._in_pool >= self.max_workers + MAX_QUEUED
            if not flood:
                self._in_pool += 1
                self._queued.add(request)
        if flood:
            self.dropped["flood"] += 1
            self.shutdown_request(sock)
            return
        sock.setblocking(True)
        sock.settimeout(self.request_timeout_s)
        self._pool.submit(self._answer, request, address)

    def _expire(self, selector) -> None:
        now = time.monotonic()
        while self._waiting:
            sock, (deadline, *_) = next(iter(self._waiting.items()))
            if deadline > now:
                return
            self.dropped["timeout"] += 1
            self._close_waiting(selector, sock)

    def _close_waiting(self, selector, sock: socket.socket) -> None:
        self._waiting.pop(sock, None)
        try:
            selector.unregister(sock)
        except (KeyError, ValueError):
            pass
        self.shutdown_request(sock)

    # -- the workers --------------------------------------------------------------------------
    def _answer(self, sock: _Replayed, address) -> None:
        with self._count_lock:
            self._queued.discard(sock)
        try:
            self.finish_request(sock, address)
        except Exception:  # noqa: BLE001 - socketserver's own policy: report, close, go on
            self.handle_error(sock, address)
        finally:
            self.shutdown_request(sock)
            with self._count_lock:
                self._in_pool -= 1

    def handle_error(self, request, client_address) -> None:
        pass  # a peer that hung up or timed out mid-answer is not news (and stderr is the kernel's log)

    # -- stopping -----------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Stop the waiting room (its connections closed) and wait for the answers in flight
        (each bounded by ``request_timeout_s``)."""
        self._stop.set()
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        self._stopped.wait()
        self._pool.shutdown(wait=True, cancel_futures=True)
        with self._count_lock:
            never_answered, self._queued = self._queued, set()
        for sock in never_answered:
            self.shutdown_request(sock)

    def server_close(self) -> None:
        super().server_close()
        self._wake_r.close()
        self._wake_w.close()
        self._pool.shutdown(wait=False)  # no thread was started unless a request was answered

__all__ = ["BoundedWSGIServer", "MAX_WAITING", "MAX_WORKERS", "REQUEST_TIMEOUT_S"]
