"""A run that stopped moving: when a process or rank counts as stuck, where its stacks say it
is, what the alert says, and the finding.

Runs in any process (core): the process holding a run judges its ranks and reads their stacks
(``runtime/jobs/stuck_watch.py``); every view renders the finding from ``context["stuck"]``.

A process is stuck when it made at least one step and then no progress (no step ended, no
batch fetched) for longer than its threshold: ``STUCK_FACTOR`` times the median of its recent
steps, and at least ``--stuck-after`` seconds (default ``STUCK_MIN_S``). A process whose steps
are merely slow stays under ten times its own median; one waiting before its first step
(``input()``, a slow start) has no median yet and is never stuck.

Stacks come as ``faulthandler`` writes them (``Thread 0x... (most recent call first):`` then
``  File "f.py", line 57 in main``); the holding process's own are formatted the same way
(``format_threads``). Where a process "is" is its main thread's innermost frame in the user's
own code (not the standard library, an installed package or this profiler), with that line's
source: ``train.py:57 `dist.all_reduce(t)```.
"""

from __future__ import annotations

import math
import os
import re
import statistics
import sysconfig

from gpuprof_jupyter.core.analysis.finding import Finding
from gpuprof_jupyter.core.format import fmt_time, fmt_unit

STUCK_FACTOR = 10.0  # no progress for this many times the median recent step...
STUCK_MIN_S = 30.0  # ...and at least this long (--stuck-after changes it)
RECENT_STEPS = 256  # the median is over this many latest steps
CANDIDATE_SHARE = 0.5  # ranks idle for this share of their threshold are stuck in the same episode
MAX_SOURCE = 60  # characters of a line's source in the alert
# a main thread inside these waits for other ranks (a collective, DDP's backward all-reduce)
WAITING_IN = ("/torch/distributed/", "/torch/autograd/", "/torch/_tensor.py", "/torch/nn/parallel/")

_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+)(?: \[(.*)\])? \(most recent call first\):")
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.*)$')
_MAIN = re.compile(r"^gpuprof main thread (0x[0-9a-fA-F]+)")
_ASSIGNED = re.compile(r"^[\w\.\[\]\(\), \*]+?\s*(?:[-+*/|&%@]|//|\*\*)?=(?!=)\s*(.+)$")
_LIBRARY_DIRS = tuple({os.path.realpath(p) + os.sep for key in ("stdlib", "platstdlib", "purelib", "platlib")
                       if (p := sysconfig.get_paths().get(key))})
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep


def parse_stuck_after(value) -> float | None:
    """``--stuck-after``: seconds > 0, ``off`` (or 0: no watchdog, returned as 0.0), or None
    (the default, ``STUCK_MIN_S``). ValueError names the flag."""
    if value is None:
        return None
    if isinstance(value, str):
        text = value.strip().lower().removesuffix("s")
        if text in ("off", "0", "none"):
            return 0.0
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"--stuck-after takes seconds (like 300) or off, got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or value < 0 \
            or math.isinf(value):
        raise ValueError(f"--stuck-after takes seconds >= 0 (0: off), got {value!r}")
    return float(value)


def stuck_threshold(durations, stuck_after: float | None) -> float:
    """Seconds without progress after which a process with these recent step ``durations`` is
    stuck: ``STUCK_FACTOR`` x their median, at least ``stuck_after`` (None: ``STUCK_MIN_S``)."""
    floor = STUCK_MIN_S if stuck_after is None else stuck_after
    recent = [d for d in list(durations)[-RECENT_STEPS:] if d == d]
    return max(floor, STUCK_FACTOR * statistics.median(recent)) if recent else floor


# -- stacks ----------------------------------------------------------------------------------------
def parse_faulthandler(text: str) -> list[dict]:
    """Threads from ``faulthandler``'s text: ``{"thread": "0x...", "name", "main", "frames":
    [[file, line, function], ...]}``, innermost frame first. The main thread is the one a
    ``gpuprof main thread 0x...`` line names (the child runtime writes it), else the last one
    listed (faulthandler lists the main thread last)."""
    main_id, threads = None, []
    for line in text.splitlines():
        if (m := _MAIN.match(line)) is not None:
            main_id = int(m.group(1), 16)
        elif (m := _THREAD.match(line)) is not None:
            threads.append({"thread": m.group(2), "name": m.group(3), "main": False, "frames": []})
        elif threads and (m := _FRAME.match(line)) is not None:
            threads[-1]["frames"].append([m.group(1), int(m.group(2)), m.group(3)])
    main = [t for t in threads if main_id is not None and int(t["thread"], 16) == main_id] or threads[-1:]
    for thread in main[:1]:
        thread["main"] = True
    return threads


def format_threads(threads: list[dict]) -> str:
    """Threads as ``faulthandler`` writes them, so every saved stack reads the same."""
    lines = []
    for thread in threads:
        name = f" [{thread['name']}]" if thread.get("name") else ""
        main = " (main thread)" if thread.get("main") else ""
        lines.append(f"Thread {thread['thread']}{name} (most recent call first):{main}")
        lines += [f'  File "{f}", line {n} in {fn}' for f, n, fn in thread["frames"]]
        lines.append("")
    return "\n".join(lines)


def _is_library(path: str) -> bool:
    if path.startswith("<") and not path.startswith("<ipython-input"):
        return True  # <frozen runpy>, <string>
    real = os.path.realpath(path) if os.path.isabs(path) else path
    return real.startswith(_PACKAGE_DIR) or any(real.startswith(d) for d in _LIBRARY_DIRS) \
        or "/site-packages/" in real or "/dist-packages/" in real


def main_frames(threads: list[dict]) -> list:
    return next((t["frames"] for t in threads if t.get("main")), [])


def user_frame(frames: list) -> list | None:
    """The innermost frame in the user's own code (else the innermost one), or None."""
    return next((f for f in frames if not _is_library(f[0])), frames[0] if frames else None)


def waiting_for_others(threads: list[dict]) -> bool:
    """Whether the main thread is inside a collective (torch.distributed, DDP's backward)."""
    return any(part in f[0] for f in main_frames(threads) for part in WAITING_IN)


def where(threads: list[dict], getline=None) -> str | None:
    """``train.py:57 `dist.all_reduce(t)``` for the main thread (``getline(file, line)``: the
    source line, e.g. ``linecache.getline``); None without stacks."""
    frame = user_frame(main_frames(threads))
    if frame is None:
        return None
    path, line, function = frame
    source = re.sub(r"\s+#[^'\"]*$", "", (getline(path, line) if getline is not None else "").strip())  # no comment
    if (m := _ASSIGNED.match(source)) is not None and "(" not in source.split("=", 1)[0]:
        source = m.group(1)  # loss = model(x): the call, not the name it goes to
    if len(source) > MAX_SOURCE:
        source = source[:MAX_SOURCE - 3] + "..."
    name = "cell" if "/ipykernel_" in path or path.startswith("<ipython-input") else \
        os.path.basename(path) if not path.startswith("<") else path
    return f"{name}:{line} `{source}`" if source else f"{name}:{line} in {function}"


# -- what is said -----------------------------------------------------------------------------------
def stuck_message(record: dict) -> str:
    """'rank 1 has made no step for 42 s: in train.py:57 `x` (rank 0 is in train.py:88 `y`)'."""
    text = f"{record['who']} has made no step for {fmt_unit(record['for_s'], 's', 0)}"
    if record.get("where"):
        text += f": in {record['where']}"
    others = [f"{o['who']} is in {o['where']}" for o in record.get("others") or () if o.get("where")]
    return text + (f" ({'; '.join(others)})" if others else "")


def stuck_finding(experiment) -> Finding | None:
    """The first stuck episode of the run (``context["stuck"]``), its stacks named."""
    episodes = [e for e in (getattr(experiment.meta, "context", None) or {}).get("stuck") or () if isinstance(e, dict)]
    if not episodes:
        return None
    first = episodes[0]
    evidence = stuck_message(first) + f" (threshold {fmt_time(first.get('threshold_s'))})"
    files = list((first.get("stacks") or {}).items())
    if files:
        evidence += "; every thread's stack saved: " + ", ".join(f"{who}: {name}" for who, name in files)
    elif first.get("stacks_note"):
        evidence += f"; {first['stacks_note']}"
    if first.get("resumed_at_s") is not None:
        evidence += f"; it moved again at t={fmt_unit(first['resumed_at_s'], 's', 1)}"
    if first.get("stopped"):
        evidence += "; the job was stopped (--on-stuck stop)"
    if len(episodes) > 1:
        evidence += f"; {len(episodes) - 1} more time(s) later in the run"
    step = ("read the saved stacks: a rank outside a collective is the one the others wait for (a dead DataLoader "
            "worker, a deadlock, a rank that skipped a collective); in CI, gpuprof run --on-stuck stop ends a hung job")
    return Finding("stuck", f"{first['who'].capitalize()} stuck: no step for {fmt_time(first.get('for_s'))}", "high",
                   evidence, step, {"rank": first.get("rank"), "for_s": first.get("for_s"),
                                    "stacks": dict(files), "episodes": len(episodes)})


__all__ = ["CANDIDATE_SHARE", "RECENT_STEPS", "STUCK_FACTOR", "STUCK_MIN_S", "format_threads", "main_frames",
           "parse_faulthandler", "parse_stuck_after", "stuck_finding", "stuck_message", "stuck_threshold",
           "user_frame", "waiting_for_others", "where"]
