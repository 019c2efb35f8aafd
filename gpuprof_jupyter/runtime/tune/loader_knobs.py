"""DataLoader settings applied during one trial, without touching the user's code.

Runs in any process that holds a run: the kernel, or a script under ``gpuprof run``.

Knobs that change speed, never results: ``num_workers``, ``prefetch_factor``,
``persistent_workers`` and ``pin_memory``. Two ways to reach a loader:

* built during the trial (in the cell, or by a trainer the cell calls): ``DataLoader.__init__``
  gets the trial's values in place of the caller's;
* built before the cell: the settings torch lets change on a live loader (``num_workers``,
  ``prefetch_factor``, ``pin_memory``) are set on its first ``__iter__`` in the trial and put
  back after it. ``persistent_workers`` cannot be changed there (torch forbids it after
  construction): that knob is named as unreachable, with the reason.

At the end of a trial every worker the trial started is shut down, so nothing keeps running.
"""

from __future__ import annotations

import sys
import weakref

from gpuprof_jupyter.core.torch_defaults import LOADER_KNOBS, NEEDS_WORKERS, TORCH_PREFETCH_DEFAULT

_SETTABLE_LIVE = ("num_workers", "prefetch_factor", "pin_memory")


class LoaderKnobs:
    """Context manager: ``settings`` (a subset of LOADER_KNOBS) on every loader of the trial."""

    def __init__(self, settings: dict) -> None:
        self.settings = {k: v for k, v in settings.items() if k in LOADER_KNOBS}
        self.reached: dict[str, str] = {}  # knob -> "built in the trial" / "set on a loader built before"
        self.unreachable: dict[str, str] = {}  # knob -> why it could not be applied
        self._built: weakref.WeakSet = weakref.WeakSet()
        self._restore: list[tuple] = []  # (loader, name, old value)
        self._iterators: list[weakref.ref] = []
        self._loaders: weakref.WeakSet = weakref.WeakSet()
        self._undo: list = []

    def __enter__(self) -> "LoaderKnobs":
        torch = sys.modules.get("torch")
        if torch is None:
            if self.settings:
                self.unreachable.update({k: "torch is not imported, so no DataLoader exists" for k in self.settings})
            return self
        from torch.utils.data import DataLoader

        original_init, original_iter = DataLoader.__init__, DataLoader.__iter__
        knobs = self

        def __init__(loader, *args, **kwargs):
            if knobs.settings:
                args, kwargs = knobs._for_new_loader(original_init, loader, args, kwargs)
            original_init(loader, *args, **kwargs)
            knobs._built.add(loader)

        def __iter__(loader):
            knobs._before_iter(loader)
            iterator = original_iter(loader)
            knobs._iterators.append(weakref.ref(iterator))
            return iterator

        DataLoader.__init__, DataLoader.__iter__ = __init__, __iter__

        def undo():
            if DataLoader.__init__ is __init__:
                DataLoader.__init__ = original_init
            if DataLoader.__iter__ is __iter__:
                DataLoader.__iter__ = original_iter
        self._undo.append(undo)
        return self

    def _for_new_loader(self, original_init, loader, args, kwargs) -> tuple[tuple, dict]:
        """The constructor's arguments, all by name, with the trial's settings in place."""
        import inspect

        try:
            bound = inspect.signature(original_init).bind(loader, *args, **kwargs)
        except TypeError:
            return args, kwargs  # let torch report the caller's own mistake
        given = dict(bound.arguments)
        given.pop("self", None)
        extra = given.pop("kwargs", {}) if "kwargs" in given else {}
        workers = int(self.settings.get("num_workers", given.get("num_workers", 0)) or 0)
        if given.get("batch_sampler") is not None and "batch_size" not in kwargs:
            given.pop("batch_size", None)  # torch refuses both; the default 1 was filled in by bind
        new = {**given, **extra, **self.settings}
        if workers == 0:  # a 0-worker loader refuses these even when the caller passed them
            new.pop("prefetch_factor", None)
            new["persistent_workers"] = False
        for knob in self.settings:
            self.reached.setdefault(knob, "built in the trial")
        return (), new

    def _before_iter(self, loader) -> None:
        self._loaders.add(loader)
        if loader in self._built or any(entry[0] is loader for entry in self._restore):
            return
        workers = int(self.settings.get("num_workers", getattr(loader, "num_workers", 0)) or 0)
        settings = dict(self.settings)
        if workers > 0 and getattr(loader, "prefetch_factor", None) is None and "prefetch_factor" not in settings:
            settings["prefetch_factor"] = TORCH_PREFETCH_DEFAULT  # None is refused once workers start
        for knob, value in settings.items():
            if knob not in _SETTABLE_LIVE:
                self.unreachable[knob] = ("the DataLoader was built before the cell, and torch forbids changing "
                                          f"{knob} after a loader is built; build it inside the cell to tune it")
                continue
            if knob in NEEDS_WORKERS and workers == 0:
                continue
            old = getattr(loader, knob, None)
            try:
                setattr(loader, knob, value)
            except (ValueError, AttributeError) as exc:
                self.unreachable[knob] = f"torch refused it on a loader built before the cell ({exc})"
                continue
            self._restore.append((loader, knob, old))
            if knob in self.settings:
                self.reached.setdefault(knob, "set on a loader built before the cell")
        if getattr(loader, "_iterator", None) is not None:  # persistent workers started with the old settings
            self._shutdown(loader._iterator)
            loader._iterator = None

    @staticmethod
    def _shutdown(iterator) -> None:
        shutdown = getattr(iterator, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()

    def __exit__(self, *exc) -> None:
        """Shut down every worker the trial started and put every loader back as it was."""
        try:
            for ref in self._iterators:
                iterator = ref()
                if iterator is not None:
                    self._shutdown(iterator)
            for loader in list(self._loaders):
                if getattr(loader, "_iterator", None) is not None and (loader in self._built or self._restore):
                    self._shutdown(loader._iterator)
                    loader._iterator = None
            for loader, knob, old in reversed(self._restore):
                try:
                    setattr(loader, knob, old)
                except (ValueError, AttributeError):
                    pass
        finally:
            while self._undo:
                self._undo.pop()()
        for knob in self.settings:
            if knob not in self.reached and knob not in self.unreachable:
                self.unreachable[knob] = "no DataLoader was built or iterated during the trial"


__all__ = ["LoaderKnobs"]
