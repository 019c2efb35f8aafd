"""The zero-code hooks in a child process of a profiled job, started by the startup hook
(``runtime/startup/sitecustomize.py``) or, in a fork, by ``forked``.

Runs in any process that holds a run as a child: a script under ``gpuprof run``, a
``torchrun`` rank, a profiled cell's spawned or forked child.

The child records as the kernel does (``TrainingHooks`` append events to an ``ActivityLog``'s
buffer: one append per event) but folds nothing: a sender thread takes the pending events
twice a second and sends them as they are over the run's channel (``core/child_channel.py``);
the process holding the run folds them (``runtime/jobs/children_listener.py``). ``step()``,
``track()``, ``phase()`` and ``log()`` record here too. At exit the child sends what its hooks
saw (loader settings, optimizers, autocast...), its phases, ``log()`` values and the error that
ended it, if any.

It connects only once it has something to send, so processes that never train (DataLoader
workers, ``torchrun``'s agent, helpers) never do; its first message goes out as soon as it has
(``_send_loop``), not a send interval later. A child that cannot connect removes its hooks,
runs unprofiled, and says so once in the run's notes file. Once connected it registers
``faulthandler`` on ``STACKS_SIGNAL``, so the run can save every thread's stack if it gets stuck
(``runtime/jobs/stuck_watch.py``); a fork drops that registration until it connects itself.

A fork of a child (``os.fork``, ``multiprocessing``'s fork, DataLoader workers) inherits the
socket, the locks and the pending events as they were, held or not (docs/scripts.md). An
``os.register_at_fork`` handler drops them in the fork: it never writes to its parent's
connection, never waits on a lock its parent held, never sends its parent's events; if it
trains it connects as a child of its own (``Hello.forked_from``), else it stays silent.
"""

from __future__ import annotations

import atexit
import faulthandler
import importlib.abc
import importlib.util
import json
import os
import socket
import sys
import threading
import time

from gpuprof_jupyter.core.child_channel import (CHANNEL_ENV, EVENTS, FINAL, HELLO, MAX_EVENTS_PER_MESSAGE, MAX_LINE,
                                                MEMORY_HISTORY_ENV, NOTES_ENV, STACKS_FILE, STACKS_SIGNAL, T0_ENV, TRACE_ENV,
                                                TRACE_RANKS_ENV, WALL0_ENV, append_run_metrics, encode, identity, pack_sendable,
                                                resolve_rank,
                                                traced)
from gpuprof_jupyter.runtime.jobs.ray_train import RAY_TRAIN_WORKER_MODULE, ray_train_identity, say_goodbye_at_shutdown
from gpuprof_jupyter.runtime.hooks.activity import ActivityLog
from gpuprof_jupyter.runtime.jobs.child_capture import RequestedCaptures
from gpuprof_jupyter.runtime.hooks.oom_record import MemoryHistory, is_out_of_memory, oom_context
from gpuprof_jupyter.core.torch_defaults import torch_filled
from gpuprof_jupyter.runtime.record.settings import dataloader_settings
from gpuprof_jupyter.runtime.hooks.torch_hooks import TrainingHooks
from gpuprof_jupyter.runtime.record.used_settings import used_settings
from gpuprof_jupyter.core.format import fmt_bytes

SEND_INTERVAL_S = 0.5  # as the kernel hands its events over
FIRST_SEND_POLL_S = 0.05  # until its first message: a length read this often, so its first events go at once
SESSION_MODULE = "gpuprof_jupyter.runtime.session"

_run: "ChildRun | None" = None
_torch_wrap = None  # torch.multiprocessing.spawn's own _wrap, once _spawn_wrap stands in for it


def _spawn_wrap(fn, i, *args, **kwargs):
    """``torch.multiprocessing.spawn``'s ``_wrap(fn, i, ...)``, run in its child ``i``: the index
    is that process's rank when no ``RANK`` says otherwise. At module level, so that spawn can
    pickle it when the spawning process is itself profiled (a script under ``gpuprof run``)."""
    if _run is not None:
        _run.spawned_as(i)
    original = _torch_wrap or sys.modules["torch.multiprocessing.spawn"]._wrap
    return original(fn, i, *args, **kwargs)


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
        if os.environ.get(MEMORY_HISTORY_ENV):  # --memory-history: begun once CUDA is initialised
            self.hooks.memory.history = MemoryHistory()
            self.hooks.memory.history.directory = os.environ[MEMORY_HISTORY_ENV]
            self.hooks.memory.history.low_name = lambda: self.snapshot_name("memory_snapshot-low-headroom")
        self.oom: dict | None = None  # it died of out-of-memory: what explains it (runtime.hooks.oom_record)
        self.process_index: int | None = None  # torch.multiprocessing.spawn's index of this child
        self._trace_pending = False  # --trace waits for spawn's index to know this process's rank
        self.error: str | None = None
        self._sock: socket.socket | None = None
        self._gave_up = False
        self._lock = threading.Lock()  # one sender at a time (the thread, then the exit)
        self._stop = threading.Event()
        self._finished = False
        self.window = None  # gpuprof run --trace: this rank's TraceWindow (runtime.hooks.trace_window)
        self.trace_notes: list[str] = []
        self.unsent = 0  # events it could not send (a NaN time, a value that is not a number): dropped here
        self.captures = RequestedCaptures(self)  # --trace on-alert: windows the run asks for (runtime.jobs.child_capture)
        self.forked_from: int | None = None  # in a fork of a child: the parent's pid (Hello.forked_from)
        self._rank_at_fork: int | None = None  # RANK as the fork inherited it (not a rank of its own)
        self._stacks_file = None  # open while faulthandler dumps into it on STACKS_SIGNAL (_register_stacks)

    # -- start --------------------------------------------------------------------------------
    def start(self) -> "ChildRun":
        after_import(SESSION_MODULE, self._be_current, self.hooks.failed)
        after_import("torch", self._torch_imported, self.hooks.failed)
        after_import(RAY_TRAIN_WORKER_MODULE, lambda m: say_goodbye_at_shutdown(m, self.finish), self.hooks.failed)
        previous = sys.excepthook

        def excepthook(kind, value, tb):
            self.error = f"{kind.__name__}: {value}"
            if is_out_of_memory(value):  # explained before the traceback; the run explains it in full
                try:
                    self._explain_oom(value)
                except Exception:  # noqa: BLE001 - the traceback still comes
                    pass
            previous(kind, value, tb)

        sys.excepthook = excepthook
        self._start_sender()
        atexit.register(self.finish)
        return self

    def _explain_oom(self, exc: BaseException) -> None:
        """What this process knows (torch's message, the optimizers' tensors, the snapshot) on
        stderr; the run's summary adds the step, the other processes and the largest batch."""
        from gpuprof_jupyter.core.analysis.oom import oom_summary
        from gpuprof_jupyter.render.oom_text import oom_text

        self.oom = oom_context(exc, self.hooks.memory, os.environ.get(MEMORY_HISTORY_ENV) or None,
                               self.snapshot_name("memory_snapshot"))
        oom = oom_summary(self.oom, {}, {}, None, [], None)
        print(oom_text(oom) + "\n  (gpuprof run explains it in full after the run's summary)", file=sys.stderr,
              flush=True)

    def snapshot_name(self, prefix: str) -> str:
        """``PREFIX-rank1.pickle`` (``PREFIX-pid123.pickle`` for a process without a rank): one file per process."""
        rank = self.rank()
        return f"{prefix}-{'rank' + str(rank) if rank is not None else 'pid' + str(os.getpid())}.pickle"

    def _start_sender(self) -> None:
        threading.Thread(target=self._send_loop, name="gpuprof-child", daemon=True).start()

    def after_fork(self) -> None:
        """In a fork of this process (module docstring): the parent's connection, locks and
        pending events and records dropped; a sender and an end of its own."""
        sock, self._sock = self._sock, None
        if sock is not None:
            try:
                sock.close()  # this process's copy of the descriptor: the parent's connection stays open
            except OSError:
                pass
        self._lock, self._stop = threading.Lock(), threading.Event()
        self._drop_stacks()  # its parent's file; it registers its own if it connects
        self.activity.forget_after_fork()
        self.forked_from, self._rank_at_fork = os.getppid(), identity()["rank"]
        self.process_index = self.error = self.window = None
        self.trace_notes, self.unsent = [], 0
        self.captures = RequestedCaptures(self)
        if not (self._gave_up or self._finished):
            self._start_sender()
            _end_in_multiprocessing(self)

    def start_forked(self) -> "ChildRun":
        """In a fork of the profiled process: its hooks are already installed (inherited); only
        the sender and the end (multiprocessing ends its forks with os._exit: a finalizer, not
        atexit) are this process's own."""
        self._start_sender()
        _end_in_multiprocessing(self)
        atexit.register(self.finish)  # a plain os.fork() child that exits normally
        return self

    def _be_current(self, session_module) -> None:
        """``step()``, ``track()``, ``phase()`` and ``log()`` find the run through the session module."""
        if session_module._current is None:
            session_module._current = self

    def _torch_imported(self, torch) -> None:
        global _torch_wrap
        self.hooks.install()
        self.captures.training_thread = threading.get_ident()  # the thread that imported torch trains
        if os.environ.get(TRACE_ENV):
            # multiprocessing's spawn marks its child's command line (sys.argv is the parent's by now)
            if self.rank() is None and "--multiprocessing-fork" in sys.orig_argv:
                self._trace_pending = True  # its rank comes with torch.multiprocessing.spawn's index
            else:
                self._trace_if_chosen()
        spawn = sys.modules.get("torch.multiprocessing.spawn")  # the module (the package's ``spawn`` is a function)
        wrap = getattr(spawn, "_wrap", None)
        if wrap is not None and wrap is not _spawn_wrap:  # spawn(fn) calls _wrap(fn, i, ...) in child i
            _torch_wrap, spawn._wrap = wrap, _spawn_wrap

    def rank(self) -> int | None:
        """This process's rank (``core/child_channel.resolve_rank``), as the run will key it."""
        own = identity()
        return resolve_rank(own["rank"], own["local_rank"], self.process_index)

    def spawned_as(self, index: int) -> None:
        """In ``torch.multiprocessing.spawn``'s child ``index``, before the user's function runs
        (on its training thread): the rank is known now, and so is whether ``--trace`` is ours."""
        self.process_index = index
        if self._trace_pending:
            self._trace_pending = False
            self._trace_if_chosen()

    def _trace_if_chosen(self) -> None:
        """Open the ``--trace`` window when ``--trace-ranks`` names this process's rank."""
        try:
            chosen = traced(self.rank(), os.environ.get(TRACE_RANKS_ENV, "0"))
        except ValueError as exc:
            self.trace_notes.append(f"gpuprof: {exc}; nothing traced")
            return
        if chosen:
            self._open_trace_window(os.environ[TRACE_ENV])

    def _open_trace_window(self, spec: str) -> None:
        """``--trace`` in this rank: the window starts and stops at its step boundaries, on the
        thread that imported torch (the training thread); this process then folds its events
        too, to count the steps, and forwards them as they were."""
        from gpuprof_jupyter.runtime.hooks.trace_window import TraceWindow, parse_trace

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
        """Every ``SEND_INTERVAL_S`` once connected. Before, it looks every ``FIRST_SEND_POLL_S``
        whether anything is pending and sends it then: a child that trains just before the run
        ends (a fork made late in a cell) has its first steps there in time, not half a second on."""
        while not self._stop.wait(SEND_INTERVAL_S if self._sock is not None else FIRST_SEND_POLL_S):
            if self._sock is not None or self._pending():
                self.send_events()
            sock = self._sock
            if sock is not None:  # the run asks for a trace only on this connection (runtime.jobs.child_capture)
                self.captures.poll(sock)

    def _pending(self) -> bool:
        activity = self.activity
        return bool(len(activity.events) or activity.forward)

    def send_events(self) -> None:
        """The pending events, and up to when they cover this process (sent also when there
        are none, once connected: a batched simulated GPU waits for that time), in messages
        of at most ``MAX_EVENTS_PER_MESSAGE`` events."""
        with self._lock:
            as_of = time.monotonic()
            activity = self.activity
            activity.request_timer.poll(final=self._finished)  # CUDA-timed requests whose work is done
            events = activity.events.drain() if activity.forward is None else activity.take_forwarded()
            if (events or self._sock is not None) and self._connected():
                for i in range(0, max(len(events), 1), MAX_EVENTS_PER_MESSAGE):
                    fields, unsent = pack_sendable(events[i:i + MAX_EVENTS_PER_MESSAGE])
                    self.unsent += unsent
                    self._send(encode(EVENTS, **fields, as_of=as_of))

    def _connected(self) -> bool:
        """Connect on first use (a DataLoader worker never gets here: it emits nothing)."""
        if self._sock is not None:
            return True
        if self._gave_up or _is_dataloader_worker():
            return False
        try:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(self.path)
            me = {**identity(), **ray_train_identity()}  # a Ray Train worker: ranks and run from Ray's context
            own_rank = me["rank"] != self._rank_at_fork or self.process_index is not None  # set after the fork
            sock.sendall(encode(HELLO, **me, argv=[str(a) for a in sys.argv[:8]], process_index=self.process_index,
                                forked_from=None if own_rank else self.forked_from))
        except OSError as exc:
            self._give_up(f"could not connect to the run ({type(exc).__name__}: {exc})")
            return False
        self._sock = sock
        self._register_stacks()
        return True

    def _register_stacks(self) -> None:
        """The stack dump (``core/child_channel.STACKS_SIGNAL``): every thread's stack appended to
        this process's file in the channel's folder, written by faulthandler from C without the
        GIL, so also while the main thread is blocked in a collective, and without stopping it
        (runtime/jobs/stuck_watch.py). Registered once connected: the run signals only the
        processes it knows. The first line names the main thread (the training thread)."""
        try:
            f = open(os.path.join(os.path.dirname(self.path), STACKS_FILE.format(pid=os.getpid())), "a",
                     encoding="utf-8")
            f.write(f"gpuprof main thread 0x{threading.main_thread().ident:016x}\n")
            f.flush()
            faulthandler.register(STACKS_SIGNAL, file=f, all_threads=True, chain=False)
        except (OSError, ValueError, RuntimeError) as exc:
            self.trace_notes.append(f"gpuprof: its stacks cannot be dumped if it gets stuck ({type(exc).__name__}: {exc})")
            return
        self._stacks_file = f

    def _drop_stacks(self) -> None:
        """No stack dump in this process any more (a fork's copy, a child that gave up)."""
        f, self._stacks_file = self._stacks_file, None
        if f is None:
            return
        try:
            faulthandler.unregister(STACKS_SIGNAL)
            f.close()  # this process's copy of the descriptor
        except (OSError, ValueError, RuntimeError):
            pass

    def _send(self, message: bytes) -> None:
        if self._sock is None:
            return  # gave up on an earlier message of the same batch
        try:
            self._sock.sendall(message)
        except OSError as exc:
            self._give_up(f"lost the connection to the run ({type(exc).__name__}: {exc})")

    def _give_up(self, why: str) -> None:
        """Run on unprofiled: hooks removed, nothing more recorded; one line in the notes file."""
        self._gave_up, self._sock = True, None
        self._stop.set()
        self._drop_stacks()
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
        if self._trace_pending:
            self.trace_notes.append("gpuprof: --trace: this process has no rank (no RANK or LOCAL_RANK, not started by "
                                    "torch.multiprocessing.spawn), so --trace-ranks could not choose it; not traced")
        if self.window is not None:
            try:
                trace = self._close_trace_window()
            except Exception as exc:  # noqa: BLE001 - the exit goes on; the run is told
                self.trace_notes.append(f"gpuprof: the trace window failed at exit ({type(exc).__name__}: {exc})")
        try:
            self.captures.close()
        except Exception as exc:  # noqa: BLE001 - the exit goes on; the run is told
            self.trace_notes.append(f"gpuprof: the capture asked on alert failed at exit ({type(exc).__name__}: {exc})")
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
            self._send(_fitting_final({**self._final(), "trace": trace}))
            if self._sock is not None:
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

    def _unsent_note(self) -> list[str]:
        if not self.unsent:
            return []
        return [f"gpuprof: {self.unsent} event(s) whose time or value was not a number were dropped before "
                "they were sent; its other events are kept"]

    def _final(self) -> dict:
        hooks, activity = self.hooks, self.activity
        loaders = dataloader_settings(hooks.loaders, _script_globals())
        for record in activity.phases:
            if record.end_s is None:
                record.end_s = time.monotonic() - activity.t0
        return {
            "params": {**used_settings(hooks), **loaders}, "torch_filled": torch_filled(loaders),
            "phases": [{"name": p.name, "start_s": p.start_s, "end_s": p.end_s} for p in activity.phases],
            "user_metrics": activity.user_metrics, "notes": hooks.notes() + self.trace_notes + self._unsent_note(),
            "error": self.error,
            "device": _device(hooks), "process_index": self.process_index,
            "memory": hooks.memory.record,  # the sampled step's breakdown (runtime.hooks.memory_hooks), or None
            "oom": self.oom,  # it died of out-of-memory (runtime.hooks.oom_record), or None
            "memory_history": (hooks.memory.history.low if hooks.memory.history is not None else None),
        }


def _script_globals() -> dict:
    """The script's top-level variables (``__main__``), which name the loaders it iterated."""
    main = sys.modules.get("__main__")
    try:
        return dict(vars(main)) if main is not None else {}
    except TypeError:  # a __main__ without a namespace
        return {}


def _fitting_final(fields: dict) -> bytes:
    """The final message, within the run's ``MAX_LINE``: the largest fields are emptied, one at
    a time, until it fits, and a note names them (the run would refuse the whole line)."""
    message, dropped = encode(FINAL, **fields), []
    while len(message) > MAX_LINE:
        left = [k for k in fields if k not in ("notes", "error") and fields[k]]
        if not left:  # its own notes and error are that long: their starts
            fields["notes"], fields["error"] = [n[:1000] for n in fields["notes"][:32]], (fields["error"] or "")[:10000]
            left = ["notes"]
        name = max(left, key=lambda k: len(json.dumps(fields[k], default=repr)))
        dropped.append(name)
        if name != "notes":
            fields[name] = type(fields[name])() if isinstance(fields[name], (dict, list)) else None
        note = (f"gpuprof: its final message was over {fmt_bytes(MAX_LINE, 0)}: {', '.join(dropped)} "
                "could not be sent whole")
        message = encode(FINAL, **{**fields, "notes": [*fields["notes"], note]})
    return message


def _device(hooks) -> str | None:
    """The device the first optimizer's parameters live on (``cuda:1``), as this rank sees it."""
    return next((info.get("device") for info in hooks.optimizers.values() if info.get("device")), None)


def _end_in_multiprocessing(run: ChildRun) -> None:
    """A ``multiprocessing`` fork clears the finalizers it inherited, then runs its after-fork
    callbacks, and ends with ``os._exit`` (no atexit): a finalizer registered from there sends
    the fork's end. Nothing when multiprocessing was never imported (the fork is not its)."""
    util = sys.modules.get("multiprocessing.util")
    if util is not None:
        util.register_after_fork(run, lambda r: util.Finalize(None, r.finish, exitpriority=100))


def _after_fork_in_child() -> None:
    """``os.register_at_fork(after_in_child=...)``: a fork of a child process (module docstring)."""
    if _run is not None:
        try:
            _run.after_fork()
        except Exception:  # noqa: BLE001 - the fork runs on; at worst unprofiled
            pass


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
        run.hooks.activity = run.activity  # not the session's (its lock may be held by a thread left behind)
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


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)

__all__ = ["ChildRun", "after_import", "forked", "start"]
