"""The profiler's own work, as named steps: a failing step becomes a note, never the user's error.

Runs in any process (core).

Starting and stopping a session, and what the magic does around a cell, are sequences of
steps (open sources, create the experiment, start the sampler, ..., save the metadata). Each
runs through ``run_step``: an exception is written into the experiment's notes and shown as a
warning, and the caller carries on with what it has. So a broken capture, a failing observer
or a full disk never leaves the sampler running or the next cell wedged
(``tests/test_never_wedge.py``).

``call`` is the one place a step's function is called: the fault-injection test replaces it
to raise at each step in turn.
"""

from __future__ import annotations

import warnings
from typing import Callable, TypeVar

T = TypeVar("T")


def call(name: str, fn: Callable[[], T]) -> T:
    return fn()


def replace_call(new: Callable[[str, Callable[[], T]], T]) -> None:
    """Tests: route every step through ``new(name, fn)`` (the sampler process does this when
    a test asks it to fail one named step; ``core/fault_injection.trace_steps``)."""
    global call
    call = new


def run_step(name: str, fn: Callable[[], T], notes: list[str], *, reraise: tuple = ()) -> T | None:
    """``fn()``; on an exception, a note ``gpuprof: NAME failed (...)`` and None.

    ``reraise``: exception types that are the caller's problem, not the profiler's (a bad
    ``--source``: a usage error) and propagate unchanged.
    """
    try:
        return call(name, fn)
    except reraise:
        raise
    except Exception as exc:  # noqa: BLE001 - the point: the profiler's failures are notes
        message = f"gpuprof: {name} failed ({type(exc).__name__}: {exc})"
        notes.append(message)
        warnings.warn(message, RuntimeWarning, stacklevel=2)
        return None


__all__ = ["call", "replace_call", "run_step"]
