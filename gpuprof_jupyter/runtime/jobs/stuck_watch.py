"""The stuck watch: a process or rank of the run that stops making progress is caught, every
thread's stack of it and of the job's other ranks saved into the experiment, and said
(docs/flight-recorder.md).

Runs in any process that holds a run: the kernel, or ``gpuprof run``.

``check()`` runs on the link's thread at each hand-over (once a second: the wake-up that hands
the events over anyway), on the steps already folded there: the watch adds no thread while the
run goes and no work on the training thread (``benchmarks/bench_stuck.py``). The judgement is
``core/analysis/stuck.py``'s: stuck after ten times the median recent step without a step or a
batch, at least ``--stuck-after`` seconds, and never before the first step.

When a process crosses its threshold, a short-lived thread takes the stacks without stopping
anyone: the holding process's own with ``sys._current_frames()``, each connected child's by
``STACKS_SIGNAL``, on which the child runtime registered ``faulthandler`` (``runtime/jobs/
child.py``: written from C, without the GIL, also while the rank is blocked in a collective).
Only a child whose stacks file exists is signalled (registration writes it): the signal's
default action would end any other process. The stacks are saved as ``stacks-<who>.txt`` beside
the samples; the episode (``context["stuck"]``) names them; ``said(record)`` raises the live
alert and, under ``gpuprof run --on-stuck stop``, stops the job. A process is caught once per
episode: it is watched again after it moved.
"""

from __future__ import annotations

import linecache
import os
import re
import sys
import threading
import time
import traceback
from dataclasses import dataclass

from gpuprof_jupyter.core.analysis.stuck import (CANDIDATE_SHARE, RECENT_STEPS, STUCK_MIN_S, format_threads,
                                                 parse_faulthandler, stuck_threshold, waiting_for_others, where)
from gpuprof_jupyter.core.child_channel import STACKS_FILE, STACKS_SIGNAL
from gpuprof_jupyter.runtime.hooks.activity import ActivityLog

STACKS_WAIT_S = 2.0  # for the children's faulthandler to finish writing (it takes milliseconds)
STACKS_POLL_S = 0.02
OWN = "the profiled process"  # the run's own process, by default (a kernel's: "the profiled cell")


@dataclass
class Watched:
    """One process whose progress is watched: the run's own, or a connected child."""

    who: str  # "rank 1", or OWN
    rank: int | None
    activity: ActivityLog
    pid: int | None
    own: bool = False


@dataclass
class _State:
    process: Watched
    progress: float  # its last step's end or last batch (monotonic s)
    threshold: float
    idle: float


def own_threads(skip: int | None = None) -> list[dict]:
    """This process's threads as ``core/analysis/stuck.parse_faulthandler`` gives a child's,
    from ``sys._current_frames()`` (no pause beyond taking the GIL once); ``skip``: a thread id
    left out (the one asking)."""
    names = {t.ident: t.name for t in threading.enumerate()}
    main = threading.main_thread().ident
    threads = []
    for ident, frame in sys._current_frames().items():
        if ident == skip:
            continue
        frames = [[f.filename, f.lineno, f.name] for f in reversed(traceback.extract_stack(frame))]
        threads.append({"thread": f"0x{ident:016x}", "name": names.get(ident), "main": ident == main, "frames": frames})
    threads.sort(key=lambda t: t["main"])  # the main thread last, as faulthandler lists it
    return threads


def dump_child_stacks(folder: str, pids: list[int], wait_s: float = STACKS_WAIT_S) -> dict[int, str]:
    """Each child's stacks, dumped by its faulthandler on ``STACKS_SIGNAL`` into its file in
    ``folder``: {pid: text (its main-thread line, then this dump)}. A pid without a file (it
    never registered) is not signalled; one whose dump does not come within ``wait_s`` is left out."""
    pending: dict[int, tuple[str, int]] = {}
    for pid in pids:
        path = os.path.join(folder, STACKS_FILE.format(pid=pid))
        try:
            before = os.path.getsize(path)
            os.kill(pid, STACKS_SIGNAL)
        except OSError:
            continue
        pending[pid] = (path, before)
    dumps, last = {}, {}
    deadline = time.monotonic() + wait_s
    while pending and time.monotonic() < deadline:
        time.sleep(STACKS_POLL_S)
        for pid, (path, before) in list(pending.items()):
            try:
                size = os.path.getsize(path)
            except OSError:
                pending.pop(pid)
                continue
            if size > before and last.get(pid) == size:  # grown, and no longer growing
                with open(path, encoding="utf-8", errors="replace") as f:
                    header = f.readline()
                    f.seek(before)
                    dumps[pid] = header + f.read(size - before)
                pending.pop(pid)
            last[pid] = size
    return dumps


def _file_name(who: str, episode: int) -> str:
    slug = re.sub(r"[^a-z0-9]+", "", who.lower().replace("the profiled ", ""))
    return f"stacks-{slug}{'' if episode == 1 else f'-{episode}'}.txt"


class StuckWatch:
    """Watches the run's own process and its children (``runtime/jobs/children_listener.ChildListener``).

    ``save(name, text)``: writes a stacks file into the experiment, returns its name (None: not
    saved); ``said(record)``: called with each episode once its stacks are saved."""

    def __init__(self, t0: float, activity: ActivityLog, children, stuck_after: float | None, save, said,
                 notes: list[str], clock=time.monotonic, own: str = OWN) -> None:
        self.own = own
        self.t0, self.activity, self.children, self.stuck_after = t0, activity, children, stuck_after
        self.save, self.said, self.notes, self.clock = save, said, notes, clock
        self.records: list[dict] = []  # the episodes, as context["stuck"] keeps them
        self._open: dict[str, tuple[float, dict | None]] = {}  # who -> (progress when caught, its record)
        self._thread: threading.Thread | None = None
        self._failed = False

    def watched(self) -> list[Watched]:
        out = [Watched(self.own, None, self.activity, os.getpid(), own=True)]
        if self.children is not None:
            out += [Watched(c.label, c.rank, c.activity, c.hello.get("pid")) for c in self.children.connected()]
        return out

    def check(self) -> None:
        """At a hand-over: catch what crossed its threshold. Never raises (one note, then off)."""
        if self._failed or (self._thread is not None and self._thread.is_alive()):
            return
        try:
            self._check(self.clock())
        except Exception as exc:  # noqa: BLE001 - the hand-over goes on; the watch stops
            self._failed = True
            self.notes.append(f"gpuprof: the stuck watch failed ({type(exc).__name__}: {exc}); it is off for this run")

    def _check(self, now: float) -> None:
        states = []
        for process in self.watched():
            steps = process.activity.steps
            if not steps:
                continue  # no step yet (input(), a slow start): never stuck
            progress = max(self.t0 + steps[-1].t_end_s, process.activity.last_batch_t or 0.0)
            if process.who in self._open:
                caught_at, record = self._open[process.who]
                if progress <= caught_at:
                    continue  # still in its episode
                del self._open[process.who]
                if record is not None and record.get("resumed_at_s") is None and record["who"] == process.who:
                    record["resumed_at_s"] = progress - self.t0
            idle = now - progress
            if idle < CANDIDATE_SHARE * (STUCK_MIN_S if self.stuck_after is None else self.stuck_after):
                continue  # under half the floor: not stuck whatever its median (no median taken)
            threshold = stuck_threshold([s.duration_s for s in steps[-RECENT_STEPS:]], self.stuck_after)
            states.append(_State(process, progress, threshold, idle))
        if not any(s.idle >= s.threshold for s in states):
            return
        caught = [s for s in states if s.idle >= CANDIDATE_SHARE * s.threshold]  # stopped with it
        for state in caught:
            self._open[state.process.who] = (state.progress, None)
        self._thread = threading.Thread(target=self._episode, args=(caught, now), name="gpuprof-stuck", daemon=True)
        self._thread.start()

    def _episode(self, caught: list[_State], now: float) -> None:
        try:
            self._record(caught, now)
        except Exception as exc:  # noqa: BLE001 - a note; the run goes on
            self.notes.append(f"gpuprof: saving a stuck run's stacks failed ({type(exc).__name__}: {exc})")

    def _stacks(self) -> dict[str, tuple[list[dict], str]]:
        """Every watched process's threads and text: {who: (threads, text)}."""
        watched = self.watched()
        out = {}
        if self.activity.steps:
            threads = own_threads(skip=threading.get_ident())
            out[self.own] = (threads, format_threads(threads))
        children = [w for w in watched if not w.own and w.pid]
        folder = os.path.dirname(self.children.path) if self.children is not None else None
        dumps = dump_child_stacks(folder, [w.pid for w in children]) if folder and children else {}
        for w in children:
            if w.pid in dumps:
                out[w.who] = (parse_faulthandler(dumps[w.pid]), dumps[w.pid])
        return out

    def _record(self, caught: list[_State], now: float) -> None:
        stacks = self._stacks()
        places = {who: where(threads, linecache.getline) for who, (threads, _) in stacks.items()}
        # the one the others wait for: caught outside a collective, else the longest idle
        subject = min(caught, key=lambda s: (s.process.who in stacks and waiting_for_others(stacks[s.process.who][0]),
                                             -s.idle))
        episode = len(self.records) + 1
        files = {}
        for who, (_, text) in sorted(stacks.items(), key=lambda item: item[0] != subject.process.who):
            name = self.save(_file_name(who, episode), text)
            if name:
                files[who] = name
        idle = {s.process.who: s.idle for s in caught}
        record = {
            "who": subject.process.who, "rank": subject.process.rank, "t_s": round(now - self.t0, 3),
            "for_s": round(subject.idle, 3), "threshold_s": round(subject.threshold, 3),
            "steps": len(subject.process.activity.steps), "where": places.get(subject.process.who),
            "others": [{"who": who, "where": places[who], "for_s": round(idle[who], 3) if who in idle else None}
                       for who in stacks if who != subject.process.who],
            "stacks": files, "stopped": False, "resumed_at_s": None,
        }
        if not files:
            record["stacks_note"] = "no stack could be taken or saved"
        for state in caught:
            if state.process.who in self._open:
                self._open[state.process.who] = (state.progress, record)
        self.records.append(record)
        self.said(record)

    def close(self, timeout: float = STACKS_WAIT_S + 1.0) -> None:
        """At the run's end: an episode being saved finishes first (bounded)."""
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)


__all__ = ["OWN", "StuckWatch", "Watched", "dump_child_stacks", "own_threads"]
