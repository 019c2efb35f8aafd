"""The run's end of the child processes' channel: the listener.

Runs in any process that holds a run: the kernel, or ``gpuprof run``.

A ``ChildListener`` owns a unix socket in a private directory (mode 0700) and names it in the
environment its children get (``environ()``), with the startup directory first on their
``PYTHONPATH`` (``runtime/startup/sitecustomize.py``). Each child that trains connects
(``runtime/jobs/child.py``) and sends its events in batches; they are folded here, one
``ActivityLog`` per child, with the same rules as the kernel's own (docs/events.md).

Children are keyed by rank (``core/child_channel.resolve_rank``: ``RANK``, else ``LOCAL_RANK``,
else ``torch.multiprocessing.spawn``'s process index), else the order they connected in; a fork
of a child (``Hello.forked_from``) takes a key of its own after the job's ranks.

What a child sends is checked field by field (``core/child_channel.parse``) and read with
bounds: a line of at most ``MAX_LINE`` bytes, a rate per connection and per run (a faster
sender waits: nothing is dropped), at most ``MAX_CONNECTIONS`` connections a run. A child
whose message is malformed is cut off with one note naming it (what it sent before is kept);
an event whose kind, time or value is wrong (``runtime/record/event_check.py``) is dropped
before it is folded, and counted in one note naming its child, which stays connected;
no failure of a reader ends it without a note, and none touches another child or the run's
own steps. At the run's end (``close``) the listener reads the connections still pending, and
those made while other children finish sending (a child that trained just before the end);
every connection is closed within a bounded time: events timed after the end are counted in a
note, never folded. What the children said then goes into the run in ``children_merge.py``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import select
import shutil
import socket
import stat
import struct
import tempfile
import threading
import time
from dataclasses import dataclass

from gpuprof_jupyter.core.child_channel import (CHANNEL_ENV, MAX_LINE, NOTES_ENV, T0_ENV, TRACE_ENV, TRACE_RANKS_ENV,
                                                TRACE_REQUEST, WALL0_ENV, Batch, Capture, Final, Hello, Malformed,
                                                encode, parse, resolve_rank)
from gpuprof_jupyter.runtime.hooks.activity import ActivityLog
from gpuprof_jupyter.runtime.record.event_check import keep_valid
from gpuprof_jupyter.runtime.record.events import OPT_POST, SCALER_POST, STEP
from gpuprof_jupyter.runtime.record.request_log import open_requests_note
from gpuprof_jupyter.core.format import fmt_bytes

STARTUP_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "startup")
PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
CLOSE_TIMEOUT_S = 5.0  # after the job ended, for the last children to finish sending
EXIT_GRACE_S = 1.0  # at the end, for a child whose process still runs (two of its send intervals)
CUT_WAIT_S = 1.0  # for a reader to end once its connection is shut down
MAX_CONNECTIONS = 512  # a run's children, all together
# per connection: bytes and messages a second, bursts of twice that (4 MiB: ~190,000 events a
# second, what a training process makes in a second at the very most; a step makes 2 to 6)
CONNECTION_RATE = (4 << 20, 200)
RUN_RATE = 16 << 20  # bytes a second, all connections together
MAX_READ_NOTES = 8  # notes about connections that failed; the rest are counted in one
STEP_ENDS = frozenset((STEP, OPT_POST, SCALER_POST))  # event kinds that may end a step
DIR_PREFIX = "gpuprof-children-"
OWNER_FILE = "owner"  # in a listener's folder: "<pid> <its start time>", for remove_stale_dirs


@dataclass
class Child:
    """One connected child: who it is, its folded activity, what it said at its exit."""

    hello: dict
    activity: ActivityLog
    rank: int = -1
    final: dict | None = None
    closed: bool = False
    steps_sent: int = 0
    as_of: float = 0.0  # its events are known up to this time (monotonic s)
    late_events: int = 0  # timed after the run's end: counted, not folded
    bad_events: int = 0  # a field of theirs was wrong (runtime/record/event_check.py): dropped, counted
    first_bad: str | None = None  # what was wrong with the first of them
    dropped: bool = False  # cut off for a malformed message or a failed read (noted then)
    numbered: bool = False  # its rank is the run's numbering (connection order, a fork's key), not its own

    @property
    def label(self) -> str:
        return f"rank {self.rank}"


@dataclass
class _Reader:
    """One accepted connection and the thread reading it."""

    conn: socket.socket
    peer: int | None  # the connecting process's pid (SO_PEERCRED)
    thread: threading.Thread | None = None
    child: Child | None = None  # once its hello came
    cut: bool = False  # shut down by close(): what ends its thread is not a failure
    since: float = dataclasses.field(default_factory=time.monotonic)  # accepted at (monotonic s)


class _Rate:
    """A token bucket: ``take(n)`` waits until ``n`` more fit in ``per_s`` (bursts of
    ``2 * per_s``), or until ``stop`` is set. A message bigger than the burst waits its time."""

    def __init__(self, per_s: float) -> None:
        self.per_s, self.burst = per_s, 2 * per_s
        self.level, self.at = self.burst, time.monotonic()
        self._lock = threading.Lock()

    def take(self, n: float, stop: threading.Event) -> None:
        with self._lock:
            now = time.monotonic()
            self.level = min(self.burst, self.level + (now - self.at) * self.per_s) - n
            self.at = now
            wait = -self.level / self.per_s
        if wait > 0:
            stop.wait(wait)


def remove_stale_dirs(root: str | None = None) -> int:
    """Remove the folders of listeners whose process is gone (a SIGKILLed kernel never removes
    its own); returns how many. Only this user's real folders named ``gpuprof-children-*``
    whose owner file names a process that no longer runs (or a pid now another process's);
    a folder without that file, a link, another user's folder is left as it is."""
    removed = 0
    try:
        entries = list(os.scandir(root or tempfile.gettempdir()))
    except OSError:
        return 0
    for entry in entries:
        if not entry.name.startswith(DIR_PREFIX):
            continue
        try:
            info = entry.stat(follow_symlinks=False)
            if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
                continue
            with open(os.path.join(entry.path, OWNER_FILE), encoding="utf-8") as f:
                pid, started = f.read().split()
            if _runs(int(pid), float(started)):
                continue
        except (OSError, ValueError):
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        removed += 1
    return removed


def _runs(pid: int, started: float) -> bool:
    """Whether process ``pid`` runs and is the one that started at ``started`` (psutil's
    create_time); what cannot be read counts as running (never remove a folder on a doubt)."""
    import psutil

    try:
        process = psutil.Process(pid)
        return process.status() != psutil.STATUS_ZOMBIE and process.create_time() == started
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:
        return True


def _peer_pid(conn: socket.socket) -> int | None:
    """The pid of the process at the other end, as the kernel knows it (not as it says)."""
    try:
        return struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))[0]
    except (OSError, AttributeError, struct.error):
        return None


def _alive(pid: int | None) -> bool:
    """Whether the process still runs (a zombie has ended: its last messages are still read)."""
    import psutil

    try:
        return bool(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:
        return True


class ChildListener:
    """Accepts the run's children and folds what they send. ``start()``, ``environ()``, ``close()``."""

    def __init__(self, t0: float, wall0: float) -> None:
        self.t0, self.wall0 = t0, wall0
        self.trace: tuple[str, str] | None = None  # gpuprof run --trace: (window, ranks) for the children
        self.children: list[Child] = []
        self.notes: list[str] = []
        self._lock = threading.Lock()
        remove_stale_dirs()
        self._dir = tempfile.mkdtemp(prefix=DIR_PREFIX)  # 0700: only this user's processes connect
        import psutil

        with open(os.path.join(self._dir, OWNER_FILE), "w", encoding="utf-8") as f:
            f.write(f"{os.getpid()} {psutil.Process().create_time()!r}")
        self.path = os.path.join(self._dir, "channel.sock")
        self.notes_path = os.path.join(self._dir, "unprofiled.jsonl")
        self._server: socket.socket | None = None  # listening until ``_stop_accepting``
        self._wake_r = self._wake_w = -1
        self._readers: list[_Reader] = []
        self._acceptor: threading.Thread | None = None
        self._run_rate = _Rate(RUN_RATE)
        self._closing = threading.Event()  # set at close: no reader waits for its rate any more
        self._ended: float | None = None  # the run's end (monotonic s): later events are not folded
        self._refused = 0  # connections beyond MAX_CONNECTIONS
        self._failed_reads = 0  # connections cut for a malformed message or a failed read
        self.on_steps = None  # called (from a reader) when a batch may have ended steps: hand them over now
        self.on_capture = None  # --trace on-alert: on_capture(rank, window, path) when a rank sends its capture
        self.closed = False

    def start(self) -> "ChildListener":
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(self.path)
        server.listen(64)
        server.setblocking(False)  # accepted until none is pending (``_accept``)
        self._server = server
        self._wake_r, self._wake_w = os.pipe()  # ``_stop_accepting`` wakes the accepting thread
        self._acceptor = threading.Thread(target=self._accept, args=(server, self._wake_r), name="gpuprof-children",
                                          daemon=True)
        self._acceptor.start()
        return self

    def environ(self, base: dict | None = None) -> dict:
        """What a child's environment needs (``base``: the environment it would get; its
        ``PYTHONPATH`` is kept, after the startup directory)."""
        base = os.environ if base is None else base
        path = [STARTUP_DIR] + [p for p in base.get("PYTHONPATH", "").split(os.pathsep) if p and p != STARTUP_DIR]
        environ = {CHANNEL_ENV: self.path, NOTES_ENV: self.notes_path, T0_ENV: repr(self.t0),
                   WALL0_ENV: repr(self.wall0), "GPUPROF_CHILD_PACKAGE": PACKAGE_PARENT,
                   "PYTHONPATH": os.pathsep.join(path)}
        if self.trace is not None:
            environ[TRACE_ENV], environ[TRACE_RANKS_ENV] = self.trace
        return environ

    # -- receiving ------------------------------------------------------------------------------
    def _accept(self, server: socket.socket, wake: int) -> None:
        """Every connection, until ``_stop_accepting`` wakes it: then, once more, every connection
        still pending (a child that connected just before the run's end is read, not refused)."""
        while True:
            try:
                ready, _, _ = select.select([server, wake], [], [])
            except (OSError, ValueError):
                return  # closed
            while True:
                try:
                    conn, _ = server.accept()
                except BlockingIOError:
                    break  # none left
                except OSError:
                    return  # closed
                self._admit(conn)
            if wake in ready:
                return

    def _admit(self, conn: socket.socket) -> None:
        """A reader thread for ``conn`` (or a refusal past ``MAX_CONNECTIONS``)."""
        try:
            conn.setblocking(True)
            with self._lock:
                if len(self._readers) >= MAX_CONNECTIONS:
                    self._refused += 1
                    conn.close()
                    return
                reader = _Reader(conn, _peer_pid(conn))
                reader.thread = threading.Thread(target=self._read, args=(reader,), name="gpuprof-child-reader",
                                                 daemon=True)
                self._readers.append(reader)
            reader.thread.start()
        except Exception as exc:  # noqa: BLE001 - this connection is lost, the listener goes on
            conn.close()
            self._read_failed(f"a child's connection could not be read ({type(exc).__name__}: {exc})")

    def _stop_accepting(self) -> None:
        """No connection after this: the accepting thread reads those pending first, then ends."""
        server, self._server = self._server, None
        if server is None:
            return
        try:
            os.write(self._wake_w, b"\0")
        except OSError:
            pass
        self._acceptor.join(CUT_WAIT_S)
        server.close()
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass

    def _read(self, reader: _Reader) -> None:
        """One connection: a hello, then batches and a final, each line checked (``parse``)."""
        rate, messages = _Rate(CONNECTION_RATE[0]), _Rate(CONNECTION_RATE[1])
        try:
            with reader.conn as conn, conn.makefile("rb") as stream:
                while True:
                    line = stream.readline(MAX_LINE + 1)  # never more than that in memory
                    if not line:
                        break
                    if not line.endswith(b"\n"):
                        raise Malformed(f"a message of more than {fmt_bytes(MAX_LINE, 0)}" if len(line) > MAX_LINE
                                        else "a message cut off by the end of its connection")
                    for bucket, n in ((rate, len(line)), (self._run_rate, len(line)), (messages, 1)):
                        bucket.take(n, self._closing)
                    reader.child = self._take(reader.child, parse(line))
        except Exception as exc:  # noqa: BLE001 - every failure of a reader is a note, never a dead thread
            child = reader.child
            if not reader.cut:  # cut at the end: close() says so
                kept = child is not None and child.activity.steps
                # a child not counted is named by its own rank only: a number the run gave it
                # (in connection order) names no rank of the run and depends on the others' timing
                named = child is not None and (kept or not child.numbered)
                who = f"{child.label} (pid {reader.peer})" if named else f"a child process (pid {reader.peer})"
                self._read_failed(f"{who}: its messages could not be read ({type(exc).__name__}: {exc}); "
                                  + ("the steps it sent before are kept, nothing after" if kept else "it is not counted"))
                if child is not None:
                    child.dropped = True
                    if not kept:
                        with self._lock:
                            self.children.remove(child)
        finally:
            if reader.child is not None:
                reader.child.closed = True

    def _take(self, child: Child | None, message) -> Child:
        """One checked message of a connection; returns its child (made by its hello)."""
        if child is None:
            if not isinstance(message, Hello):
                raise Malformed(f"a {type(message).__name__} before its hello")
            return self._add(message)
        if isinstance(message, Batch):
            events, bad, first = keep_valid(message.events)
            if bad:
                child.bad_events += bad
                child.first_bad = child.first_bad or first
            emit, end, late = child.activity.emit, self._ended, 0
            for event in events:
                if end is not None and event[1] > end:
                    late += 1
                else:
                    emit(event)
            child.late_events += late
            child.as_of = message.as_of if end is None else min(message.as_of, end)
            on_steps = self.on_steps
            if on_steps is not None and end is None and any(e[0] in STEP_ENDS for e in events):
                on_steps()
        elif isinstance(message, Final):
            child.final = dataclasses.asdict(message)
        elif isinstance(message, Capture):
            self._captured(child, dict(message.window))
        else:
            raise Malformed("a second hello")
        return child

    def _captured(self, child: Child, window: dict) -> None:
        """A rank's ``--trace on-alert`` window: numbered by its steps as the run counts them
        (the child counts from when it was asked), its file found beside the socket."""
        if window.get("start_s") is not None and window.get("first_step") is not None:
            first = sum(1 for s in child.activity.steps if s.t_end_s <= window["start_s"])
            shift = first - window["first_step"]
            for key in ("first_step", "end_step"):
                if window.get(key) is not None:
                    window[key] += shift
            if window.get("end_step") is not None:
                window["window"] = f"steps={window['first_step']}:{window['end_step']}"
        path = os.path.join(self._dir, window["file"]) if window.get("file") else None
        if self.on_capture is None:
            return
        try:
            self.on_capture(child.rank, window, path if path and os.path.exists(path) else None)
        except Exception as exc:  # noqa: BLE001 - the child's channel goes on; the run is told
            self.notes.append(f"gpuprof: {child.label}'s capture on alert could not be kept ({type(exc).__name__}: {exc})")

    def _training(self) -> list[_Reader]:
        """The connections of the job's ranks still open (forks of a child left out)."""
        with self._lock:
            return [r for r in self._readers if r.child is not None and not r.child.closed and not r.cut
                    and not r.child.dropped and r.child.hello.get("forked_from") is None]

    def training(self) -> list[int]:
        """The ranks connected now (``--trace on-alert`` asks one of them for a capture)."""
        return [r.child.rank for r in self._training()]

    def request_trace(self, rank: int | None, steps: int, name: str, alert: dict) -> tuple[int | None, str | None]:
        """Ask ``rank``'s process (None: the only child that trains) to trace its next ``steps``
        steps into ``name`` beside the socket. Returns (the rank asked, None), or (None, why not)."""
        training = self._training()
        if rank is None:
            if len(training) != 1:
                return None, (f"the alert names no rank and {len(training)} child processes train (a rule on "
                              "data_wait_frac or step_time_p50_s names the rank)")
            reader = training[0]
        else:
            reader = next((r for r in training if r.child.rank == rank), None)
            if reader is None:
                return None, f"rank {rank} was not connected to the run any more"
        try:
            reader.conn.sendall(encode(TRACE_REQUEST, steps=steps, name=name, alert=alert))
        except OSError as exc:
            return None, f"rank {reader.child.rank} could not be asked ({type(exc).__name__})"
        return reader.child.rank, None

    def _read_failed(self, note: str) -> None:
        with self._lock:
            self._failed_reads += 1
            if self._failed_reads <= MAX_READ_NOTES:
                self.notes.append(f"gpuprof: {note}")

    def _add(self, hello: Hello) -> Child:
        with self._lock:
            taken = {c.rank for c in self.children}
            own = rank = resolve_rank(hello.rank, hello.local_rank, hello.process_index)
            if hello.forked_from is not None:  # its own key, after the job's ranks
                rank = max(hello.world_size or 1, 1)
                while rank in taken:
                    rank += 1
            elif rank in taken and _restarted(hello, [c for c in self.children if c.rank == rank]):
                pass  # an elastic restart: a new attempt of the same rank, its steps after the last's
            elif rank is None or rank in taken:
                rank = next(i for i in range(len(taken) + 1) if i not in taken)
            child = Child(dataclasses.asdict(hello), ActivityLog(self.t0), rank, as_of=time.monotonic(),
                          numbered=hello.forked_from is not None or rank != own)
            self.children.append(child)
            self.children.sort(key=lambda c: c.rank)
        return child

    # -- what the run takes ---------------------------------------------------------------------
    def primary(self) -> Child | None:
        """The child whose steps stand for the run's when the run's own process reported none:
        the lowest rank (with steps; else with requests: a served script)."""
        with self._lock:
            reported = ([c for c in self.children if c.activity.steps]
                        or [c for c in self.children if c.activity.requests.records])  # a serving job
        return reported[0] if reported else None

    def connected(self) -> list[Child]:
        """The children whose connection is open (the stuck watch's ranks: runtime.jobs.stuck_watch)."""
        with self._lock:
            return [c for c in self.children if not c.closed and not c.dropped]

    def new_steps(self) -> list[tuple]:
        """Steps each child ended since the last call, as the kernel's step tuples plus the rank."""
        return self._steps(since_last=True)

    def all_steps(self) -> list[tuple]:
        """Every child's steps so far (a run finished without its sampler process)."""
        return self._steps(since_last=False)

    def _steps(self, since_last: bool) -> list[tuple]:
        out = []
        with self._lock:
            children = list(self.children)
        for child in children:
            steps = child.activity.steps
            out += [(*s.as_tuple(), child.rank)
                    for s in steps[child.steps_sent if since_last else 0:]]
            if since_last:
                child.steps_sent = len(steps)
        return out

    def new_requests(self) -> list[tuple]:
        """Requests each child completed since the last call, each with the child's rank last."""
        out = []
        with self._lock:
            children = list(self.children)
        for child in children:
            out += [(*r, child.rank) for r in child.activity.take_requests()]
        return out

    def all_requests(self) -> list[tuple]:
        """Every child's requests so far (a run finished without its sampler process)."""
        with self._lock:
            children = list(self.children)
        return [(*r, child.rank) for child in children for r in child.activity.requests.all_tuples()]

    def open_requests_notes(self) -> list[str]:
        """At the run's end: per child, its requests still open (``open_requests_note``)."""
        with self._lock:
            children = list(self.children)
        notes = ((child, open_requests_note(child.activity.requests)) for child in children)
        return [f"gpuprof: {child.label}: {note.removeprefix('gpuprof: ')}" for child, note in notes if note]

    def covered(self, now: float) -> float:
        """Up to when every connected child's events are known (``now`` without any open)."""
        with self._lock:
            open_ = [c.as_of for c in self.children if not c.closed]
        return min([now, *open_])

    @property
    def reported(self) -> bool:
        return any(c.activity.reported for c in self.children)

    def take_transitions(self) -> list[tuple[float, int]]:
        """The busy/wait transitions of the primary child (the simulated GPU follows one loop);
        the others' are taken and dropped so they do not pile up."""
        primary = self.primary()
        with self._lock:
            children = list(self.children)
        taken = []
        for child in children:
            transitions = child.activity.take_transitions()
            if child is primary:
                taken = transitions
        return taken

    def close(self, timeout: float = CLOSE_TIMEOUT_S) -> None:
        """The run's end: stop accepting; let children whose process has ended finish sending
        (``timeout``), those still running for ``EXIT_GRACE_S`` at most; then shut every
        connection down and wait (bounded) for its reader to end. Events timed after the end
        are counted, not folded. Once: a second call does nothing."""
        if self.closed:
            return
        self._ended = ended = time.monotonic()  # before ``closed``: whoever sees it closed sees the end set
        self.closed = True
        self._closing.set()
        grace = min(timeout, EXIT_GRACE_S)
        while True:
            with self._lock:
                readers = list(self._readers)
            open_ = [r for r in readers if r.thread.is_alive()]
            now = time.monotonic()
            if self._server is not None and (not open_ or now >= ended + grace):
                self._stop_accepting()  # a child that connects while others still send is read too
                continue
            if not open_ or now >= ended + timeout + CUT_WAIT_S:
                break
            for reader in open_:
                past_grace = now >= max(ended, reader.since) + grace  # from the end, or from a later connection
                if not reader.cut and (now >= ended + timeout or (past_grace and _alive(reader.peer))):
                    reader.cut = True
                    try:
                        reader.conn.shutdown(socket.SHUT_RDWR)  # its blocked read returns: the thread ends
                    except OSError:
                        pass
            open_[0].thread.join(0.02)
        stuck = sum(r.thread.is_alive() for r in readers)
        if stuck:
            self.notes.append(f"gpuprof: {stuck} reader thread(s) of the children's channel did not end")
        cut = {id(r.child) for r in readers if r.cut and r.child is not None}
        for child in self.children:
            child.activity.close()
            named = f"{child.label} (pid {child.hello.get('pid')})"
            who = f"gpuprof: {named}"
            if child.bad_events:
                self.notes.append(f"{who}: {child.bad_events} event(s) with a wrong field were dropped (first: "
                                  f"{child.first_bad}); its other events are kept")
            unfolded = child.activity.unfolded_note(named)
            if unfolded:
                self.notes.append(unfolded)
            if child.dropped:
                continue  # noted when it was dropped
            late = (f"; {child.late_events} event(s) timed after the run's end were not counted"
                    if child.late_events else "")
            if id(child) in cut:
                self.notes.append(f"{who} was still running when the run ended; its steps until then are kept, "
                                  f"its connection was closed{late}")
            elif child.final is None:
                self.notes.append(f"{who} ended without saying goodbye (killed, or it called os._exit); its steps "
                                  f"until then are kept{late}")
            elif late:
                self.notes.append(f"{who}{late}")
        if self._refused:
            self.notes.append(f"gpuprof: {self._refused} connection(s) to the children's channel were refused "
                              f"(more than {MAX_CONNECTIONS} in one run)")
        if self._failed_reads > MAX_READ_NOTES:
            self.notes.append(f"gpuprof: {self._failed_reads - MAX_READ_NOTES} more child connection(s) could not "
                              "be read")
        self.notes += self._unprofiled()

    @property
    def folder(self) -> str:
        """The listener's private folder: the socket, the notes file, the children's trace files."""
        return self._dir

    def remove_files(self) -> None:
        """The socket, the notes file and the children's trace files (once saved)."""
        shutil.rmtree(self._dir, ignore_errors=True)

    def _unprofiled(self) -> list[str]:
        """One note for the children that could not connect and ran unprofiled."""
        try:
            with open(self.notes_path, encoding="utf-8") as f:
                lines = [json.loads(line) for line in f if line.strip()]
        except (OSError, ValueError):
            return []
        if not lines:
            return []
        pids = ", ".join(str(line.get("pid")) for line in lines[:8]) + (" ..." if len(lines) > 8 else "")
        return [f"gpuprof: {len(lines)} child process(es) could not reach the run and ran unprofiled "
                f"(pid {pids}; first: {lines[0].get('why')})"]


def _restarted(hello: Hello, before: list[Child]) -> bool:
    """Whether ``hello`` is a later attempt (``TORCHELASTIC_RESTART_COUNT``) of the rank
    ``before`` held, whose connections have all ended: torchrun restarted its workers."""
    counts = [c.hello.get("restart_count") for c in before]
    return (hello.restart_count is not None and all(c is not None and c < hello.restart_count for c in counts)
            and all(c.closed for c in before))


_forks_hooked = False


def hook_forks() -> None:
    """Once per process: a fork made while a run records reports to it (``runtime.jobs.child.forked``)."""
    global _forks_hooked
    if not _forks_hooked and hasattr(os, "register_at_fork"):
        from gpuprof_jupyter.runtime.jobs.child import forked

        os.register_at_fork(after_in_child=forked)
        _forks_hooked = True


__all__ = ["Child", "ChildListener", "STARTUP_DIR", "hook_forks", "remove_stale_dirs"]
