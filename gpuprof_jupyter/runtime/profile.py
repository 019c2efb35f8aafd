"""``profile()`` for code outside the magic: a context manager and a decorator.

Runs in any process that holds a run: the kernel, or a script under ``gpuprof run``.

    with gpuprof_jupyter.profile(name="train", source="sim"):
        train()

    @gpuprof_jupyter.profile(name="train")      # a decorator, like @profiling.collect()
    def train(): ...

Each ``with`` block or decorated call is one experiment; an exception is recorded as
status "error" (KeyboardInterrupt: "interrupted") and propagates unchanged. One that is
``torch.OutOfMemoryError`` is explained on stderr first (render/oom_text.py; docs/memory.md).

``sample=0.1`` profiles one call (or ``with`` entry) in ten, the first included: a mode for
production. ``GPUPROF_DISABLE=1`` turns profiling off: a decorated function is returned
unchanged and a ``with`` block does nothing. ``checks=[...]`` evaluates rules when the
experiment stops; ``fail_on_check=True`` then raises ``RuleFailed`` after saving when one failed
or could not be judged (analysis.rules: CANNOT JUDGE never passes).
The other keywords are a run's options (the table's, ``runtime/option_table.py``: ``OPTIONS``
here); a wrong keyword is a TypeError at the call, a bad value a ValueError when the block is entered.
"""

from __future__ import annotations

import functools
import os

from gpuprof_jupyter.runtime.option_table import PROFILE, options_of
from gpuprof_jupyter.runtime.session import ProfileSession
from gpuprof_jupyter.core.store.experiment import RunStatus


def status_for(exc: BaseException | None) -> str:
    if exc is None:
        return RunStatus.OK
    if isinstance(exc, KeyboardInterrupt):
        return RunStatus.INTERRUPTED
    return RunStatus.ERROR


def describe_error(exc: BaseException | None) -> str | None:
    return None if exc is None else f"{type(exc).__name__}: {exc}"


def disabled() -> bool:
    """True when GPUPROF_DISABLE is set to anything but "", "0", "false" or "no"."""
    return os.environ.get("GPUPROF_DISABLE", "").strip().lower() not in ("", "0", "false", "no")


# The keywords profile() passes on to ProfileSession: the table's run options for profile()
# (interval, devices, source, store, params, checks, trace, alerts, ...; README's API table), its
# observers, and whether its child processes are told of the run through os.environ. Its own
# (name, sample, fail_on_check) are its parameters, spelled out; the table declares them too.
RUN_KEYWORDS = tuple(o.name for o in options_of(PROFILE) if o.record and o.name != "name")
OPTIONS = RUN_KEYWORDS + ("observers", "child_environ")
# DOCUMENTED are those docs/configuration.md lists ("profile() keywords", checked by
# tests/test_messages.py) and the only ones a TypeError names; child_environ is the gpuprof command's.
DOCUMENTED = RUN_KEYWORDS + ("observers",)


class profile:
    def __init__(self, name: str | None = None, *, sample: float = 1.0, fail_on_check: bool = False,
                 **options) -> None:
        unknown = sorted(set(options) - set(OPTIONS))
        if unknown:
            raise TypeError(f"profile() got unknown keyword(s) {', '.join(unknown)}; it takes name, sample, "
                            f"fail_on_check, {', '.join(DOCUMENTED)}")
        if isinstance(sample, bool) or not isinstance(sample, (int, float)) or not 0 < sample <= 1:
            raise ValueError(f"sample must be a share in (0, 1], e.g. 0.1 for one call in ten; got {sample!r}")
        self.name = name
        self.options = options
        self.sample = float(sample)
        self.fail_on_check = fail_on_check
        self._credit = 1.0  # the first call is always profiled
        self.session: ProfileSession | None = None
        self.experiment = None

    def _take_sample(self) -> bool:
        if self.sample >= 1.0:
            return True
        if self._credit >= 1.0 - 1e-9:
            self._credit -= 1.0
            self._credit += self.sample
            return True
        self._credit += self.sample
        return False

    def __enter__(self) -> "profile":
        self.session = None
        if disabled() or not self._take_sample():
            return self
        self.session = ProfileSession(self.name, **self.options).start()
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if self.session is None:
            return False
        self.session.record_error(exc)
        self.experiment = self.session.stop(status_for(exc), describe_error(exc))
        if exc is not None:  # out of memory: why and what fits, before the traceback (render.oom_text)
            from gpuprof_jupyter.render.oom_text import explain_oom

            explain_oom(self.experiment)
        if exc is None and self.fail_on_check:
            from gpuprof_jupyter.core.analysis.rules import raise_if_failed

            raise_if_failed(self.experiment)
        return False  # never swallow the user's exception

    def __call__(self, func):
        if disabled():
            return func  # costs nothing: the function itself
        sampler = profile(self.name or func.__qualname__, sample=self.sample,
                          fail_on_check=self.fail_on_check, **self.options)

        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            if disabled() or not sampler._take_sample():
                return func(*args, **kwargs)
            with profile(sampler.name, fail_on_check=self.fail_on_check, **self.options):
                return func(*args, **kwargs)

        return wrapper
