"""What the profiled code calls: ``step()``, ``request()``, ``track()``, ``phase()``, ``log()``.

Runs in any process that holds a run: the kernel, or a script under ``gpuprof run``.

All are cheap no-ops when nothing is being profiled, so they can stay in training code.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterable, Iterator, TypeVar

from gpuprof_jupyter.runtime import session as _session
from gpuprof_jupyter.runtime.hooks.activity import NO_BATCH
from gpuprof_jupyter.runtime.record.batch_size import batch_size
from gpuprof_jupyter.runtime.record.events import REQ_MARKED

T = TypeVar("T")


def step(n_samples: float | None = None) -> None:
    """Mark the end of one training step (``n_samples``: batch size, for samples/s)."""
    current = _session._current
    if current is not None and current.activity is not None:
        current.activity.step(n_samples)


class request:
    """``with request(batch_size=8):`` marks one serving request by hand, for servers the
    request hooks cannot see (requests.py). When the code marks any, only the marked ones are
    the run's requests. Timed as the hooks time theirs (CUDA events when the code uses CUDA);
    ``tokens`` may be set inside the block (``r.tokens = n``) for tokens/s. A no-op when
    nothing is being profiled. Requests inside a request are not counted again.
    """

    __slots__ = ("batch_size", "_tokens", "_timer", "_token")

    def __init__(self, batch_size: int | None = None) -> None:
        self.batch_size = _count("request(batch_size=...)", batch_size)
        self._tokens: int | None = None
        self._timer = self._token = None

    @property
    def tokens(self) -> int | None:
        return self._tokens

    @tokens.setter
    def tokens(self, value: int | None) -> None:
        self._tokens = _count("request().tokens", value)

    def __enter__(self) -> "request":
        current = _session._current
        if current is not None and current.activity is not None:
            self._timer = current.activity.request_timer
            self._token = self._timer.begin(REQ_MARKED, self.batch_size)
        return self

    def __exit__(self, *exc) -> None:
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.end(self._token, self._tokens)


def _count(what: str, value):
    """An int >= 0 (numpy ints too), or None; a ValueError that says which argument otherwise."""
    if value is None:
        return None
    if hasattr(value, "item") and not isinstance(value, bool):
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{what} takes a count (an int >= 0), got {value!r}")
    return value


class track:
    """``for batch in track(loader):`` records how long each batch was waited for, and its
    size (``runtime.record.batch_size``). For iterables the DataLoader hook cannot see (generators,
    other libraries' loaders); around a torch DataLoader nothing is counted twice.

    Wraps any iterable; ``len()`` passes through. Costs one global lookup per batch when
    nothing is being profiled.
    """

    def __init__(self, iterable: Iterable[T]) -> None:
        self.iterable = iterable

    def __len__(self) -> int:
        return len(self.iterable)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[T]:
        iterator = iter(self.iterable)
        current = _session._current
        hooks = getattr(current, "hooks", None) if current is not None else None
        if hooks is not None:  # a DataLoader iterated here is one the run used (its settings are recorded)
            try:
                hooks.note_iterated(self.iterable)
            except Exception as exc:  # noqa: BLE001 - the user's loop goes on; the hooks' note tells it
                hooks.failed("reading the DataLoader's settings", exc)
        try:
            while True:
                current = _session._current
                activity = current.activity if current is not None else None
                if activity is None:
                    try:
                        item = next(iterator)
                    except StopIteration:
                        return
                    yield item
                    continue
                activity.wait_started()
                n = NO_BATCH
                try:
                    item = next(iterator)
                    n = batch_size(item, getattr(getattr(current, "hooks", None), "failed", None))
                except StopIteration:
                    return
                finally:
                    activity.wait_ended(n)
                yield item
        finally:
            current = _session._current
            if current is not None and current.activity is not None:
                current.activity.loop_ended()


@contextmanager
def phase(name: str):
    """``with phase("data-loading"):`` marks a labelled span on the plots and in the summary."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError("phase name must be a non-empty string")
    current = _session._current
    if current is None or current.activity is None:
        yield
        return
    record = current.activity.phase_started(name)
    try:
        yield
    finally:
        current.activity.phase_ended(record)


def log(**metrics) -> None:
    """Attach results (``accuracy=0.923``) to the experiment being profiled."""
    current = _session._current
    if current is None or current.activity is None:
        from gpuprof_jupyter.core.child_channel import append_run_metrics

        if append_run_metrics(metrics):  # `gpuprof run` names a file for the script it runs
            return
        raise RuntimeError("gpuprof_jupyter.log() records into the running experiment, and none is running")
    for key, value in metrics.items():
        if hasattr(value, "item"):
            value = value.item()
        if not isinstance(value, (int, float, str, bool)) and value is not None:
            raise TypeError(f"log({key}=...) takes a number, string or bool, got {type(value).__name__}")
        current.activity.user_metrics[key] = value
