"""Zero-code hooks into torch for one session: optimizer steps, DataLoader waits, what was used.

Runs in any process that holds a run: the kernel, or a script under ``gpuprof run``.

Installed when the session starts and removed when it stops (``session.py``: on error and
interrupt too), only when the user's code has already imported torch (the profiler never
imports it). While installed:

* torch's global optimizer hooks (``register_optimizer_step_pre_hook``/``_post_hook``,
  docs/facts.md, "torch's optimizer hooks") append ``OPT_PRE``/``OPT_POST`` events; the
  ActivityLog turns them into steps;
* ``_BaseDataLoaderIter.__next__`` (every DataLoader iterator, wherever the loader was made)
  appends ``WAIT_START``/``WAIT_END`` around the batch, with the batch's sample count;
* ``DataLoader.__iter__`` notes the loaders iterated (their settings, once per loader, and a
  weak reference so the run's settings can name the variable holding each: ``settings.py``);
* ``GradScaler.step`` brackets the optimizer step, so a step the scaler skips (inf/NaN) is
  seen as a skipped step;
* ``autocast.__enter__`` and ``torch.compile`` note what the forward pass ran under;
* at each step boundary (after ``optimizer.step()``, before ``step()``'s event) the memory
  probe (``memory_hooks.StepMemory``) reads and resets torch's allocator peak when the user's
  code initialised CUDA, and counts one sampled step's memory breakdown.
* ``Module.__call__`` (with gradients disabled), transformers' ``generate()`` and pipelines
  mark serving requests (``requests.py``); a training run sets the Module hook aside at its
  first optimizer step while no request was seen, and the user's own ``no_grad``,
  ``inference_mode`` or ``eval()`` brings it back.

Per batch and per optimizer step the hot path is a clock read and a tuple appended to the
event buffer (``benchmarks/bench_hooks.py`` measures it). Everything else the hooks do is
guarded, each read of a user's object (a batch's shape) included: a failure is counted and
becomes one note (``notes()``), the value is unknown, and the user's call goes on exactly as
without the hook. At ``remove()`` every patch is undone; one that another library wrapped
since stays in its chain, inert (``ended``): it records nothing more.
"""

from __future__ import annotations

import sys
import weakref

from gpuprof_jupyter.runtime.hooks.activity import NO_BATCH
from gpuprof_jupyter.runtime.record.batch_size import batch_size
from gpuprof_jupyter.runtime.record.events import LOOP_END, OPT_POST, OPT_PRE, SCALER_POST, SCALER_PRE, WAIT_END, WAIT_START
from gpuprof_jupyter.runtime.hooks.memory_hooks import StepMemory
from gpuprof_jupyter.runtime.hooks.requests import RequestHooks
from gpuprof_jupyter.runtime.record.settings import loader_settings


class TrainingHooks:
    """The hooks of one session. ``install()`` then ``remove()`` (idempotent, never raises
    for a hook that is already gone)."""

    def __init__(self, activity) -> None:
        self.activity = activity
        self.torch_seen = False  # torch was imported when the session started
        # (weakref or None, settings when first iterated) of each DataLoader iterated, in order
        self.loaders: list[tuple[object, dict]] = []
        self.optimizers: dict[int, dict] = {}  # id -> {"class", "parameters", "dtypes"} at first step
        self.scalers: dict[int, object] = {}  # GradScalers stepped (kept to read their state at the end)
        self.autocast: dict[tuple, int] = {}  # (device, dtype, enabled) -> times entered
        self.compiled: list[dict] = []  # torch.compile calls: {"mode", "backend"}
        self.failures: dict[str, list] = {}  # hook -> [count, first error]
        self.memory = StepMemory(activity)  # per-step peaks and the sampled step's breakdown
        self._loader_refs: dict[int, object] = {}  # id -> weakref of the loaders seen
        self.requests: RequestHooks | None = None  # serving calls (requests.py)
        self._undo: list = []
        self.ended = False  # remove() was called: a wrapper of ours left in another's chain records nothing

    # -- install / remove ------------------------------------------------------------------
    def install(self) -> "TrainingHooks":
        torch = sys.modules.get("torch")
        if torch is None or not hasattr(torch, "optim"):
            return self
        self.torch_seen = True
        emit, clock = self.activity.emit, self.activity.clock
        self._optimizer_hooks(torch, emit, clock)
        self._loader_hooks(emit, clock)
        self._scaler_hook(torch, emit, clock)
        self._autocast_hook(torch)
        self._compile_hook(torch)
        self._memory_hooks()
        self.requests = RequestHooks(self.activity.request_timer, self._patch, self._undo.append).install(torch)
        return self

    def remove(self) -> None:
        """Undo every hook, last first; a failing undo does not stop the others (re-raised last)."""
        self.ended = True
        error = None
        while self._undo:
            undo = self._undo.pop()
            try:
                undo()
            except Exception as exc:  # noqa: BLE001 - try the rest, then report
                error = exc
        if error is not None:
            raise error

    def _patch(self, owner, name: str, wrapper) -> None:
        """``owner.name = wrapper`` until ``remove()``; restored only while still ours."""
        had = name in vars(owner)
        original = vars(owner).get(name)
        setattr(owner, name, wrapper)

        def undo():
            if vars(owner).get(name) is wrapper:
                if had:
                    setattr(owner, name, original)
                else:
                    delattr(owner, name)
        self._undo.append(undo)

    def failed(self, hook: str, exc: BaseException) -> None:
        """Count a hook's failure (``notes()`` tells them, once per hook)."""
        entry = self.failures.setdefault(hook, [0, f"{type(exc).__name__}: {exc}"])
        entry[0] += 1

    # -- optimizer steps -----------------------------------------------------------------------
    def _optimizer_hooks(self, torch, emit, clock) -> None:
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        seen, activity, memory = self.optimizers, self.activity, self.memory

        def pre(optimizer, args, kwargs):
            emit((OPT_PRE, clock(), id(optimizer)))
            if id(optimizer) not in seen:
                self._see_optimizer(optimizer)

        def post(optimizer, args, kwargs):
            try:  # before the step's event: its peak counts for the step it ends
                memory.boundary(optimizer)
            except Exception as exc:  # noqa: BLE001 - the user's step goes on
                self.failed("reading the step's memory", exc)
            emit((OPT_POST, clock(), id(optimizer)))
            requests = self.requests
            if requests is not None and requests.armed:  # a training run sets the Module hook aside
                requests.after_optimizer_step()
            if activity.step_listeners:  # --trace: its window opens and closes at step boundaries
                try:
                    activity.notify_steps()
                except Exception as exc:  # noqa: BLE001 - the user's step goes on
                    self.failed("telling the trace window of the step", exc)

        for register, hook in ((register_optimizer_step_pre_hook, pre), (register_optimizer_step_post_hook, post)):
            handle = register(hook)
            self._undo.append(handle.remove)

    def _see_optimizer(self, optimizer) -> None:
        try:
            params = {id(p): p for group in optimizer.param_groups for p in group["params"]}
            self.optimizers[id(optimizer)] = {
                "class": type(optimizer).__name__,
                "parameters": sum(int(p.numel()) for p in params.values()),
                "dtypes": sorted({str(p.dtype).replace("torch.", "") for p in params.values()}),
                "device": str(next(iter(params.values())).device) if params else None,
            }
        except Exception as exc:  # noqa: BLE001 - an unexpected optimizer subclass: a note
            self.optimizers[id(optimizer)] = {"class": type(optimizer).__name__}
            self.failed("reading the optimizer's parameters", exc)

    def _memory_hooks(self) -> None:
        """``step()`` calls end a step too: the probe runs before their event (guarded)."""
        activity, memory = self.activity, self.memory
        try:
            memory.start()
        except Exception as exc:  # noqa: BLE001 - the first step's peak then counts from earlier
            self.failed("resetting torch's memory peak", exc)

        def before_step():
            try:
                memory.boundary()
            except Exception as exc:  # noqa: BLE001 - the user's step goes on
                self.failed("reading the step's memory", exc)

        activity.before_step = before_step

        def undo():
            memory.close()
            if activity.before_step is before_step:
                activity.before_step = None
        self._undo.append(undo)

    # -- DataLoader ----------------------------------------------------------------------------
    def _loader_hooks(self, emit, clock) -> None:
        from torch.utils.data import DataLoader
        from torch.utils.data.dataloader import _BaseDataLoaderIter

        original_next = _BaseDataLoaderIter.__next__
        original_iter = DataLoader.__iter__
        failed = self.failed

        def __next__(iterator):
            if self.ended:
                return original_next(iterator)
            emit((WAIT_START, clock(), None))
            try:
                batch = original_next(iterator)
            except StopIteration:
                emit((WAIT_END, clock(), NO_BATCH))
                emit((LOOP_END, clock(), None))
                raise
            except BaseException:
                emit((WAIT_END, clock(), NO_BATCH))
                raise
            emit((WAIT_END, clock(), batch_size(batch, failed)))
            return batch

        def __iter__(loader):
            seen = self._loader_refs.get(id(loader))
            if not self.ended and (seen is None or seen() is not loader):  # a new loader (maybe at a freed one's address)
                self._see_loader(loader)
            return original_iter(loader)

        self._patch(_BaseDataLoaderIter, "__next__", __next__)
        self._patch(DataLoader, "__iter__", __iter__)

    def note_iterated(self, iterable) -> None:
        """``track(loader)`` iterates ``iterable``: a torch DataLoader's settings count as used
        even when the hooks are not installed (torch imported inside the profiled cell)."""
        data = sys.modules.get("torch.utils.data")
        loader_cls = getattr(data, "DataLoader", None)
        if loader_cls is None or not isinstance(iterable, loader_cls):
            return
        seen = self._loader_refs.get(id(iterable))
        if seen is None or seen() is not iterable:
            self._see_loader(iterable)

    def _see_loader(self, loader) -> None:
        try:
            ref = weakref.ref(loader)
        except TypeError:  # a loader class with __slots__ and no __weakref__: kept unnamed
            ref = None
        self._loader_refs[id(loader)] = ref if ref is not None else (lambda: loader)
        try:
            self.loaders.append((ref, loader_settings(loader)))
        except Exception as exc:  # noqa: BLE001 - a loader without the usual attributes: a note
            self.failed("reading the DataLoader's settings", exc)

    # -- GradScaler, autocast, torch.compile -------------------------------------------------
    def _scaler_hook(self, torch, emit, clock) -> None:
        scaler_cls = getattr(getattr(torch, "amp", None), "GradScaler", None)
        if scaler_cls is None:
            return
        original = scaler_cls.step
        scalers = self.scalers

        def step(scaler, optimizer, *args, **kwargs):
            if self.ended:
                return original(scaler, optimizer, *args, **kwargs)
            emit((SCALER_PRE, clock(), id(optimizer)))
            try:
                return original(scaler, optimizer, *args, **kwargs)
            finally:
                emit((SCALER_POST, clock(), id(optimizer)))
                if id(scaler) not in scalers:
                    scalers[id(scaler)] = scaler

        self._patch(scaler_cls, "step", step)

    def _autocast_hook(self, torch) -> None:
        autocast_cls = getattr(getattr(getattr(torch, "amp", None), "autocast_mode", None), "autocast", None)
        if autocast_cls is None:
            return
        original = autocast_cls.__enter__
        observed = self.autocast

        def __enter__(ctx):
            result = original(ctx)
            if self.ended:
                return result
            try:
                key = (str(ctx.device), str(ctx.fast_dtype).replace("torch.", ""), bool(ctx._enabled))
                observed[key] = observed.get(key, 0) + 1
            except Exception as exc:  # noqa: BLE001 - a different autocast: a note
                self.failed("reading autocast's settings", exc)
            return result

        self._patch(autocast_cls, "__enter__", __enter__)

    def _compile_hook(self, torch) -> None:
        original = getattr(torch, "compile", None)
        if original is None:
            return

        def compile(*args, **kwargs):
            if not self.ended:
                try:
                    self.compiled.append({"mode": str(kwargs.get("mode") or "default"),
                                          "backend": str(kwargs.get("backend", "inductor"))})
                except Exception as exc:  # noqa: BLE001 - an odd backend object: a note
                    self.failed("reading torch.compile's settings", exc)
            return original(*args, **kwargs)

        compile.__wrapped__ = original
        compile.__doc__ = original.__doc__
        self._patch(torch, "compile", compile)

    # -- after the run -------------------------------------------------------------------------
    def notes(self) -> list[str]:
        """One note per hook that failed (how often, the first error)."""
        return [f"gpuprof: a training hook failed {count} time(s) while {hook} ({error}); the run went on unchanged"
                for hook, (count, error) in self.failures.items()] + self.activity.request_timer.notes() + (
                    self.requests.notes() if self.requests is not None else [])


__all__ = ["TrainingHooks"]
