"""The child processes' event channel: messages from a profiled child process to its run.

Runs in both ends: the child (``kernel/runtime/child.py``, started by the startup hook in every
Python process of a profiled job) and the process that holds the run (``kernel/runtime/
children.py``: the kernel, or ``gpuprof run``). A to-be-merged part of the typed kernel/sampler
protocol (issue 18); kept apart so the two can be folded together.

The channel is a unix stream socket named in the child's environment, in a directory only the
run's user can enter. One JSON object per line, in this order on one connection:

* ``hello``: who the child is (pid, rank, local rank, world size, visible devices, argv);
* ``events``: a batch of ``(kind, monotonic time, value)`` events, exactly as the kernel's
  ``EventBuffer.drain()`` gives them (docs/events.md), packed (``pack_events``), twice a second
  once connected, with the time they cover up to (``as_of``);
* ``final``: at the child's exit: the settings its hooks saw, phases, ``log()`` values, its
  notes, the device its tensors used, the error that ended it, if one did, its ``--trace``
  window (``trace``: the window's record, its ``file`` a gzipped trace beside the socket) and
  its sampled step's memory breakdown (``memory``, docs/memory.md).

A child that cannot connect appends one line (``{"pid", "why"}``) to the notes file named
beside the socket and runs unprofiled.
"""

from __future__ import annotations

import base64
import json
import math
import os
from array import array

CHANNEL_ENV = "GPUPROF_CHILD_CHANNEL"  # the socket's path; absent: the startup hook does nothing
NOTES_ENV = "GPUPROF_CHILD_NOTES"  # where a child that cannot connect says so
T0_ENV = "GPUPROF_CHILD_T0"  # the run's start, time.monotonic() (one clock for every process on a host)
RUN_METRICS_ENV = "GPUPROF_RUN_METRICS"  # gpuprof run: the file log() writes to outside a run
WALL0_ENV = "GPUPROF_CHILD_WALL0"  # the run's start, time.time() (a trace window's clock)
TRACE_ENV = "GPUPROF_CHILD_TRACE"  # gpuprof run --trace: the window (steps=A:B), traced in the child
TRACE_RANKS_ENV = "GPUPROF_CHILD_TRACE_RANKS"  # --trace-ranks: "all", or ranks separated by commas

HELLO, EVENTS, FINAL = "hello", "events", "final"
MAX_LINE = 64 << 20  # a final message with many settings stays far below this


def encode(kind: str, **fields) -> bytes:
    """One message: a JSON line. Non-JSON values (numpy scalars, objects) become their repr."""
    return (json.dumps({"type": kind, **fields}, default=repr, separators=(",", ":")) + "\n").encode()


def pack_events(events: list[tuple]) -> dict:
    """``events`` fields of an ``events`` message: kinds, times and values as packed arrays
    (base64), about 4x cheaper to encode than JSON lists in the training process (the values,
    ints, floats or None, travel as float64 with NaN for None: an optimizer's id, a batch size
    and NO_BATCH are exact)."""
    if not events:
        return {"kinds": "", "times": "", "values": ""}
    kinds, times, values = zip(*events)
    nan = math.nan
    return {"kinds": base64.b64encode(bytes(kinds)).decode(),
            "times": base64.b64encode(array("d", times).tobytes()).decode(),
            "values": base64.b64encode(array("d", [nan if v is None else v for v in values]).tobytes()).decode()}


def unpack_events(message: dict) -> list[tuple]:
    """The ``(kind, time, value)`` events of an ``events`` message (ints back where exact)."""
    kinds = base64.b64decode(message["kinds"])
    times, values = array("d"), array("d")
    times.frombytes(base64.b64decode(message["times"]))
    values.frombytes(base64.b64decode(message["values"]))
    if not len(kinds) == len(times) == len(values):
        raise ValueError("an events message whose arrays differ in length")
    return [(k, t, None if v != v else (int(v) if v.is_integer() else v)) for k, t, v in zip(kinds, times, values)]


def decode(line: bytes) -> dict:
    """A message; ValueError for a line that is not one."""
    message = json.loads(line)
    if not isinstance(message, dict) or message.get("type") not in (HELLO, EVENTS, FINAL):
        raise ValueError(f"not a child message: {line[:80]!r}")
    return message


def traced(rank: int | None, ranks: str) -> bool:
    """Whether ``rank`` (None: a process without one, traced as rank 0) is among ``--trace-ranks``."""
    if ranks.strip() == "all":
        return True
    return (rank or 0) in {int(r) for r in ranks.split(",") if r.strip().lstrip("-").isdigit()}


def append_run_metrics(metrics: dict) -> bool:
    """``log()`` in a process of ``gpuprof run`` that reports to no run (its hooks could not
    connect, or an older child): one JSON line in the run's metrics file, read when the
    command ends. False when there is no such file."""
    path = os.environ.get(RUN_METRICS_ENV)
    if not path:
        return False
    clean = {k: (v.item() if hasattr(v, "item") else v) for k, v in metrics.items()}
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(clean, default=repr) + "\n")
    return True


def identity(environ=os.environ) -> dict:
    """The ``hello`` fields a child reads from its own environment."""
    def number(name):
        try:
            return int(environ[name])
        except (KeyError, ValueError):
            return None
    return {"pid": os.getpid(), "rank": number("RANK"), "local_rank": number("LOCAL_RANK"),
            "world_size": number("WORLD_SIZE"), "cuda_visible_devices": environ.get("CUDA_VISIBLE_DEVICES")}


__all__ = ["RUN_METRICS_ENV", "append_run_metrics", "CHANNEL_ENV", "EVENTS", "FINAL", "HELLO", "MAX_LINE", "NOTES_ENV", "T0_ENV", "TRACE_ENV",
           "TRACE_RANKS_ENV", "WALL0_ENV", "decode", "encode", "identity", "pack_events", "traced", "unpack_events"]
