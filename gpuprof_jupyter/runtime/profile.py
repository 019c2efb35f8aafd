"""``profile()`` for code outside the magic: a context manager and a decorator.

    with gpuprof_jupyter.profile(name="train", source="sim"):
        train()

    @gpuprof_jupyter.profile(name="train")      # the seeds' @profiling.collect()
    def train(): ...

Each ``with`` block or decorated call is one experiment; an exception is recorded as
status "error" (KeyboardInterrupt: "interrupted") and propagates unchanged.
"""

from __future__ import annotations

import functools

from .session import ProfileSession


def status_for(exc: BaseException | None) -> str:
    if exc is None:
        return "ok"
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted"
    return "error"


def describe_error(exc: BaseException | None) -> str | None:
    return None if exc is None else f"{type(exc).__name__}: {exc}"


class profile:
    def __init__(self, name: str | None = None, **options) -> None:
        self.name = name
        self.options = options
        self.session: ProfileSession | None = None
        self.experiment = None

    def __enter__(self) -> "profile":
        self.session = ProfileSession(self.name, **self.options).start()
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        self.experiment = self.session.stop(status_for(exc), describe_error(exc))
        return False  # never swallow the user's exception

    def __call__(self, func):
        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            with profile(self.name or func.__qualname__, **self.options):
                return func(*args, **kwargs)

        return wrapper
