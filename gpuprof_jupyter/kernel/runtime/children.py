"""The run's end of the child processes' channel.

Runs in the kernel (or ``gpuprof run``): the process that holds the run.

A ``ChildListener`` owns a unix socket in a private directory (mode 0700) and names it in the
environment its children get (``environ()``), with the startup directory first on their
``PYTHONPATH`` (``kernel/startup/sitecustomize.py``). Each child that trains connects
(``kernel/runtime/child.py``) and sends its events in batches; they are folded here, one
``ActivityLog`` per child, with the same rules as the kernel's own (docs/events.md).

Children are keyed by rank: ``RANK`` when set (torchrun, accelerate), else
``torch.multiprocessing.spawn``'s process index, else the order they connected in.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
import threading
import time
from dataclasses import dataclass

from gpuprof_jupyter.core.child_channel import (CHANNEL_ENV, EVENTS, FINAL, HELLO, MAX_LINE, NOTES_ENV, T0_ENV,
                                                TRACE_ENV, TRACE_RANKS_ENV, WALL0_ENV, decode, unpack_events)
from gpuprof_jupyter.core.store.directory import TRACE_NAME
from gpuprof_jupyter.kernel.runtime.activity import ActivityLog, PhaseRecord
from gpuprof_jupyter.kernel.runtime.used_settings import serving_batch_size

STARTUP_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "startup")
PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
CLOSE_TIMEOUT_S = 5.0  # after the job ended, for the last children to finish sending


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

    @property
    def label(self) -> str:
        return f"rank {self.rank}"


class ChildListener:
    """Accepts the run's children and folds what they send. ``start()``, ``environ()``, ``close()``."""

    def __init__(self, t0: float, wall0: float) -> None:
        self.t0, self.wall0 = t0, wall0
        self.trace: tuple[str, str] | None = None  # gpuprof run --trace: (window, ranks) for the children
        self.children: list[Child] = []
        self.notes: list[str] = []
        self._lock = threading.Lock()
        self._dir = tempfile.mkdtemp(prefix="gpuprof-children-")  # 0700: only this user's processes connect
        self.path = os.path.join(self._dir, "channel.sock")
        self.notes_path = os.path.join(self._dir, "unprofiled.jsonl")
        self._server: socket.socket | None = None
        self._threads: list[threading.Thread] = []
        self.closed = False

    def start(self) -> "ChildListener":
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(self.path)
        server.listen(64)
        self._server = server
        thread = threading.Thread(target=self._accept, name="gpuprof-children", daemon=True)
        thread.start()
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
    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return  # closed
            thread = threading.Thread(target=self._read, args=(conn,), name="gpuprof-child-reader", daemon=True)
            with self._lock:
                self._threads.append(thread)
            thread.start()

    def _read(self, conn: socket.socket) -> None:
        child = None
        try:
            with conn, conn.makefile("rb") as stream:
                for line in stream:
                    if len(line) > MAX_LINE:
                        raise ValueError("message too long")
                    message = decode(line)
                    kind = message["type"]
                    if kind == HELLO and child is None:
                        child = self._add(message)
                    elif kind == EVENTS and child is not None:
                        emit = child.activity.emit
                        for event in unpack_events(message):
                            emit(event)
                        child.as_of = float(message["as_of"])
                    elif kind == FINAL and child is not None:
                        child.final = message
        except (OSError, ValueError, KeyError, TypeError) as exc:
            with self._lock:
                self.notes.append(f"gpuprof: a child's messages could not be read ({type(exc).__name__}: {exc}); "
                                  "what it sent before is kept")
        finally:
            if child is not None:
                child.closed = True

    def _add(self, hello: dict) -> Child:
        with self._lock:
            taken = {c.rank for c in self.children}
            rank = hello.get("rank")
            if rank is None:
                rank = hello.get("process_index")
            if rank is None or rank in taken:
                rank = next(i for i in range(len(taken) + 1) if i not in taken)
            child = Child(hello, ActivityLog(self.t0), rank, as_of=time.monotonic())
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
            out += [(s.t_end_s, s.duration_s, s.wait_s, s.n_samples, s.n_batches, s.skipped, child.rank)
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
        """Stop accepting; wait (bounded) for connected children to finish sending; fold the rest.
        Once: a second call does nothing."""
        if self.closed:
            return
        self.closed = True
        if self._server is not None:
            try:
                self._server.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread (close alone does not)
            except OSError:
                pass
            self._server.close()
            self._server = None
        deadline = time.monotonic() + timeout
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        for child in self.children:
            child.activity.close()
            if not child.closed:
                self.notes.append(f"gpuprof: {child.label} (pid {child.hello.get('pid')}) was still running when the "
                                  "run ended; its steps until then are kept")
            elif child.final is None:
                self.notes.append(f"gpuprof: {child.label} (pid {child.hello.get('pid')}) ended without saying goodbye "
                                  "(killed, or it called os._exit); its steps until then are kept")
        self.notes += self._unprofiled()

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




_forks_hooked = False


def hook_forks() -> None:
    """Once per process: a fork made while a run records reports to it (``runtime.child.forked``)."""
    global _forks_hooked
    if not _forks_hooked and hasattr(os, "register_at_fork"):
        from gpuprof_jupyter.kernel.runtime.child import forked

        os.register_at_fork(after_in_child=forked)
        _forks_hooked = True


def merge_children(listener: ChildListener, meta, activity: ActivityLog, notes: list[str], error: str | None) -> str | None:
    """What the children said, into the run (after ``listener.close()``): their notes, phases,
    ``log()`` values (the run's own process, then the lowest rank, win), one entry per rank in
    ``context.ranks`` (its process, devices, steps, settings, error), and, when the run's own
    process reported no steps, the primary child's settings and step origin as the run's.
    Returns ``error`` naming the ranks that failed (or as it was)."""
    children = listener.children
    notes.extend(n for n in listener.notes if n not in notes)
    if not children:
        return error
    several = len(children) > 1
    ranks = {}
    for child in children:
        final, hello = child.final or {}, child.hello
        notes.extend(f"gpuprof: {child.label}: {n.removeprefix('gpuprof: ')}" for n in final.get("notes") or ())
        for p in final.get("phases") or ():
            activity.phases.append(PhaseRecord((f"{child.label}: " if several else "") + p["name"], p["start_s"], p["end_s"]))
        for key, value in (final.get("user_metrics") or {}).items():
            activity.user_metrics.setdefault(key, value)
        ranks[str(child.rank)] = {
            "pid": hello.get("pid"), "local_rank": hello.get("local_rank"), "world_size": hello.get("world_size"),
            "cuda_visible_devices": hello.get("cuda_visible_devices"), "device": final.get("device"),
            "steps": len(child.activity.steps), "steps_from": child.activity.steps_origin,
            "params": final.get("params") or {}, "error": final.get("error"),
            "ended": "error" if final.get("error") else ("ok" if child.final is not None else "without goodbye"),
        }
    meta.context["ranks"] = ranks
    meta.context["training_hooks"] = f"installed in {len(children)} child process(es)"
    primary = listener.primary()
    if primary is not None and not activity.steps:
        final = primary.final or {}
        filled = [key for key in final.get("torch_filled") or () if key not in meta.params]
        if filled:
            meta.context["torch_filled"] = filled
        meta.params = {**serving_batch_size(primary.activity.requests.records), **(final.get("params") or {}),
                       **meta.params}
        meta.context["steps_from"] = primary.activity.steps_origin
        if several:
            meta.context["steps_rank"] = primary.rank
    failed = [c for c in children if (c.final or {}).get("error")]
    for child in failed:
        notes.append(f"gpuprof: {child.label} (pid {child.hello.get('pid')}) failed: {child.final['error']}")
    if failed and error:
        error = f"{error}; " + "; ".join(f"{c.label} failed: {c.final['error']}" for c in failed)
    return error


def save_rank_traces(listener: ChildListener, store, meta, notes: list[str]) -> None:
    """``gpuprof run --trace``: each traced rank's window into the experiment, the lowest
    rank's as its trace (``trace.json.gz``), the others' as ``trace-rank<N>.json.gz``, all listed
    in ``meta.trace["ranks"]`` (``Experiment.rank_traces``)."""
    import gzip

    ranks: dict[str, dict] = {}
    for child in listener.children:
        info = dict((child.final or {}).get("trace") or {})
        if not info:
            continue
        path = info.pop("file", None)
        if path and os.path.dirname(path) == listener._dir and os.path.exists(path):
            try:
                with gzip.open(path, "rt", encoding="utf-8") as f:
                    trace = json.load(f)
                info["file"] = store.save_trace(meta, trace, TRACE_NAME if not any(
                    r.get("file") for r in ranks.values()) else f"trace-rank{child.rank}.json.gz")
            except (OSError, ValueError, EOFError) as exc:
                notes.append(f"gpuprof: {child.label}'s trace could not be kept ({type(exc).__name__}: {exc})")
        ranks[str(child.rank)] = info
    if ranks:
        first = next((info for info in ranks.values() if info.get("file")), next(iter(ranks.values())))
        meta.trace = {**first, "ranks": ranks}


__all__ = ["Child", "ChildListener", "STARTUP_DIR", "hook_forks", "merge_children", "save_rank_traces"]
