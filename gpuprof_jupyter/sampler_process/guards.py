"""Guards of the sampler process: optional parts that may fail alone, and calls with a deadline.

Runs in the sampler process. An optional part (the Prometheus exporter, live alerts,
attribution evidence) runs through ``OptionalParts.call``: its first failure turns that part
off with one note, and the caller (the live thread, a lane, the request loop) carries on. A
call that may hang (opening sources, probing NVML) runs through ``call_with_deadline`` on a
thread of its own, so the request loop never waits behind it.
"""

from __future__ import annotations

import threading
from typing import Callable, TypeVar

from gpuprof_jupyter.core import guarded
from gpuprof_jupyter.core.format import fmt_unit

T = TypeVar("T")


class OptionalParts:
    def __init__(self, note: Callable[[str], None]) -> None:
        self._note = note
        self.off: set[str] = set()

    def call(self, part: str, fn: Callable[[], T], action: str = "feeding") -> T | None:
        """``fn()`` unless ``part`` is off; on its failure the part goes off, with one note.
        ``action``: what ``fn`` does to it, naming the step (the fault-injection tests use it)."""
        if part in self.off:
            return None
        try:
            return guarded.call(f"{action} {part}", fn)
        except Exception as exc:  # noqa: BLE001 - an optional part never stops the rest
            self.off.add(part)
            self._note(f"gpuprof: {part} failed ({type(exc).__name__}: {exc}) and is off from now on")
            return None

    def wrap(self, part: str, fn: Callable[..., None]) -> Callable[..., None]:
        """``fn`` as a guarded callback of ``part``."""
        return lambda *args: self.call(part, lambda: fn(*args))

    def turn_on(self, part: str) -> None:
        self.off.discard(part)


def call_with_deadline(name: str, fn: Callable[[], T], deadline_s: float,
                       too_late: Callable[[T], None] | None = None) -> T:
    """``fn()`` on a thread of its own; TimeoutError when it has not returned after
    ``deadline_s``. What it returns after that goes to ``too_late`` (to close it), never to
    the caller. Its exceptions reach the caller."""
    lock = threading.Lock()
    done = threading.Event()
    outcome: dict = {}
    state = {"abandoned": False}

    def target() -> None:
        try:
            outcome["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            outcome["error"] = exc
        with lock:
            done.set()
            late = state["abandoned"]
        if late and too_late is not None and "value" in outcome:
            try:
                too_late(outcome["value"])
            except Exception:  # noqa: BLE001 - nobody is left to tell
                pass

    threading.Thread(target=target, name=f"gpuprof-{name}", daemon=True).start()
    done.wait(deadline_s)
    with lock:
        if not done.is_set():
            state["abandoned"] = True
            raise TimeoutError(f"{name} did not finish within {fmt_unit(deadline_s, 's')} (something it calls hangs)")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]
