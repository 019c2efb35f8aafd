"""Zero-code request hooks: a serving call's start and end, and its GPU time without a sync.

Runs in any process that holds a run: the kernel, or a script under ``gpuprof run``.

A request is the outermost of: a call of a ``torch.nn.Module`` while gradients are disabled
(``torch.no_grad()``, ``torch.inference_mode()``), a ``transformers`` ``generate()`` call, a
``transformers`` pipeline call, or a ``gpuprof_jupyter.request()`` block. Calls inside a
request (the model's submodules, generate()'s forward passes) are not requests: a per-thread
depth says so. A forward pass with gradients enabled (training) is never a request.

The Module hook wraps every module call, a training forward pass's too. So a training run sets
it aside: at an optimizer step, while no request has been seen, ``Module.__call__`` is torch's
own again (``after_optimizer_step``). It comes back (``arm``) when the user's code enters
``torch.no_grad()`` or ``torch.inference_mode()`` itself (a ``with`` block or a decorated
function of its own; torch's own entries, as in ``clip_grad_norm_``, do not count), calls
``torch.set_grad_enabled(False)`` (as a call, a ``with`` or a decorator), switches a module to
eval mode, or calls ``generate()`` (docs/serving.md, "What a request is"). Another library's patch of
``Module.__call__`` made while the hook is set aside is left alone: the hook cannot come back
under it, and the requests it misses are one note.

Every hook keeps one rule (docs/serving.md, "What is still missed"): it never raises into the
user's code (each read of a user's object, a shape or a length, is guarded: unknown, one note
per run) and never outlives its run: at the run's end each patch is undone, or, where another
library wrapped it since, it is inert (it checks whether its run is still open), and the
Module wrapper puts torch's own back as soon as it finds itself on top again.

Per request the hot path is two clock reads, two appends to the event buffer and the batch
size (``batch_size.py``); ``benchmarks/bench_hooks.py`` measures it. With CUDA already
initialised by the user's code, a CUDA event is recorded on the current stream at entry and
exit; they are read later (``poll``, at each hand-over, never waiting), so the profiler adds
no synchronisation to the loop. Only at the end of the run does ``poll(final=True)`` wait for
the last ones. The profiler never initialises CUDA: no event is made before the user's code
did.

generate()'s time to first token is when its model's first forward pass returns (the
prefill, whose logits give the first token), on the host clock. Its tokens are the output's
new positions times the batch (sequences that ended early count their padding).
"""

from __future__ import annotations

import gc
import itertools
import sys
import threading
from collections import deque

from gpuprof_jupyter.runtime.hooks.fork_locks import hook_lock
from gpuprof_jupyter.runtime.record.batch_size import UNREADABLE, batch_size
from gpuprof_jupyter.runtime.record.events import (GC_END, GC_START, REQ_CUDA, REQ_END, REQ_FIRST, REQ_GENERATE, REQ_GPU,
                                                   REQ_MODULE, REQ_PIPELINE, pack_request)

NAN = float("nan")
ARMING_WAIT_S = 0.5  # the Module hook's swaps take microseconds (a fork's child gets a new lock: fork_locks.py)
UNSEEN = "requests unseen after another library patched Module.__call__"


class _ThreadState(threading.local):
    """Per thread: how deep inside a request the thread is, and generate()'s model until its
    first forward pass returns. Class defaults: a missing attribute of a ``threading.local``
    costs an exception per read (0.35 us), a default one a plain read (0.05 us)."""

    depth = 0
    model = None
    token = None


class RequestTimer:
    """One session's request producer: numbers, the per-thread depth, the CUDA events not read yet.

    ``begin()``/``end()`` bracket a request (the hooks and ``request()`` both use them); a call
    made while the thread is inside a request returns None from ``begin()`` and records nothing.
    """

    def __init__(self, emit, clock) -> None:
        self.emit, self.clock = emit, clock
        self._numbers = itertools.count()
        self.local = _ThreadState()
        self._pending: deque = deque()  # (number, start event, end event, host start and end times)
        self.open: set[int] = set()  # numbers of the requests under way, all threads (add/discard: atomic)
        self.failures: dict[str, list] = {}
        self.begun = False  # a request has begun in this run (a training run sets the Module hook aside until then)

    def depth(self) -> int:
        return self.local.depth

    def begin(self, kind: int, batch) -> tuple | None:
        local = self.local
        if local.depth:
            local.depth += 1
            return None
        local.depth = 1
        self.begun = True
        number = next(self._numbers)
        self.open.add(number)
        t = self.clock()
        self.emit((kind, t, number if batch is None else number + ((batch + 1) << 32)))  # pack_request, inlined
        return (number, t, self._cuda_start(number) if self._cuda_seen() else None)

    def end(self, token: tuple | None, tokens: int | None = None) -> None:
        local = self.local
        local.depth -= 1
        if token is None:
            return
        number, started, start_event = token
        self.open.discard(number)
        ended = self.clock()
        self.emit((REQ_END, ended, number if tokens is None else pack_request(number, tokens)))
        if start_event is not None:
            self._cuda_end(number, start_event, started, ended)

    def first_token(self, token: tuple) -> None:
        self.emit((REQ_FIRST, self.clock(), token[0]))

    # -- CUDA events ---------------------------------------------------------------------------
    def _cuda_seen(self) -> bool:
        """CUDA initialised by the user's code (never by us): then requests are timed by events."""
        cuda = getattr(sys.modules.get("torch"), "cuda", None)
        return cuda is not None and cuda.is_initialized()

    def _record_event(self, where: str):
        """A timing CUDA event recorded on the current stream, or None (a note) when that fails."""
        try:
            event = sys.modules["torch"].cuda.Event(enable_timing=True)
            event.record()
            return event
        except Exception as exc:  # noqa: BLE001 - the host time stands; a note
            self.failed(f"recording a CUDA event at a request's {where}", exc)
            return None

    def _cuda_start(self, number: int):
        event = self._record_event("start")
        if event is not None:
            self.emit((REQ_CUDA, self.clock(), number))
        return event

    def _cuda_end(self, number: int, start_event, started: float, ended: float) -> None:
        self._pending.append((number, start_event, self._record_event("end"), started, ended))

    def poll(self, final: bool = False) -> None:
        """Read the CUDA events whose work is done, oldest first; stop at the first not done
        (``final``: wait for them: the run is over). Each read becomes a ``REQ_GPU`` event at
        the host start time plus the GPU time between the events, and never before the host
        returned (the end event cannot complete before it was recorded). GPU work queued before
        the request's start event is not in it: the latency is a lower bound then. Events that
        cannot be read give a ``REQ_GPU`` at the host's end marked unreadable (``events.py``):
        never a NaN time, which a child could not send (``core/child_channel.py``)."""
        pending = self._pending
        while pending:
            number, start, end, started, ended = pending[0]
            value = number
            try:
                if end is None:
                    raise RuntimeError("no end event")
                if not final and not end.query():
                    return
                if final:
                    end.synchronize()
                done = max(started + start.elapsed_time(end) / 1000.0, ended)  # ms -> s
            except Exception as exc:  # noqa: BLE001 - unreadable: the host time stands (never a NaN time)
                self.failed("reading a request's CUDA events", exc)
                done, value = ended, pack_request(number, 0)
            pending.popleft()
            self.emit((REQ_GPU, done, value))

    def failed(self, what: str, exc: BaseException) -> None:
        entry = self.failures.setdefault(what, [0, f"{type(exc).__name__}: {exc}"])
        entry[0] += 1

    def notes(self) -> list[str]:
        return [f"gpuprof: a request hook failed {count} time(s) while {what} ({error}); the run went on unchanged"
                for what, (count, error) in self.failures.items()]


def first_tensor_batch(args: tuple, kwargs: dict, failed=None):
    """The batch size of a call: the first tensor argument's first dimension (positional first).
    None when unknown, also when reading an argument raised (a nested tensor has no shape):
    ``failed(what, exc)`` is told then."""
    try:
        if args:
            shape = getattr(args[0], "shape", None)  # the usual call, model(x): one attribute read
            if shape is not None and type(shape) is not property:
                try:
                    return int(shape[0])
                except (TypeError, IndexError, ValueError):  # a 0-d tensor, an odd shape: the long way
                    pass
        for value in (*args, *kwargs.values()):
            if getattr(value, "shape", None) is not None:
                return batch_size(value, failed)
        return batch_size(args[0], failed) if args else None
    except Exception as exc:  # noqa: BLE001 - the user's object: unknown, never the user's error
        if failed is not None:
            failed(UNREADABLE, exc)
        return None


class RequestHooks:
    """Patches ``Module.__call__`` and, when transformers is imported, ``GenerationMixin.generate``
    and ``Pipeline.__call__``. Installed by ``torch_hooks.TrainingHooks`` (its ``_patch`` undoes them)."""

    def __init__(self, timer: RequestTimer, patch, undo) -> None:
        self.timer = timer
        self._patch, self._undo = patch, undo  # undo(fn): called when the hooks are removed
        self._generating = timer.local  # generate()'s model until its first forward returns (per thread)
        self.sources: list[str] = []  # what was hooked
        self.models: dict[int, dict] = {}  # id -> {"class", "dtype", "parameters"} of each model served
        self.armed = False  # Module.__call__ is our wrapper now (after_optimizer_step / arm)
        self._arming = hook_lock(self, "_arming")  # a fresh one in a forked child
        self._module_cls = self._torch_call = self._wrapper = None
        self._removed = False  # the run is over: every wrapper of ours left in place is inert
        self.unseen = 0  # times the code went to serve while another library's patch kept the hook out

    def install(self, torch) -> "RequestHooks":
        self._module_hook(torch)
        self._arming_hooks(torch)
        self._gc_hook()
        transformers = sys.modules.get("transformers")
        if transformers is not None:
            self._transformers_hooks(transformers)
        self._undo(self._removing)  # undone first: nothing arms the hook again once the run ends
        return self

    # -- a training run sets the Module hook aside ---------------------------------------------
    def after_optimizer_step(self) -> None:
        """An optimizer step ended (``torch_hooks``, while ``armed``): with no request seen in
        the run, this is a training run, and each module call stops paying the hook."""
        if not self.timer.begun:
            self._swap(armed=False)

    def arm(self) -> None:
        """The user's code may serve now (no_grad, inference_mode, set_grad_enabled(False), eval
        mode, generate())."""
        if not self.armed and not self._removed:
            self._swap(armed=True)

    def _swap(self, armed: bool) -> None:
        # A bounded wait, though a forked child gets a new lock (fork_locks.py): should a lock
        # still be held for ever, the hook keeps the state it had.
        if not self._arming.acquire(timeout=ARMING_WAIT_S):
            return
        try:
            if self._removed or self.armed == armed:
                return
            now, then = (self._torch_call, self._wrapper) if armed else (self._wrapper, self._torch_call)
            current = vars(self._module_cls).get("__call__")
            if current is now:
                self._module_cls.__call__ = then
                self.armed = armed
            elif armed:  # someone else's patch where torch's was: left alone, and we cannot come back
                self.unseen += 1  # (set aside under a patch over ours, we are still in its chain)
        finally:
            self._arming.release()

    def notes(self) -> list[str]:
        """One note when requests went unseen under another library's patch (``_swap``)."""
        if not self.unseen:
            return []
        return [f"gpuprof: {UNSEEN} while a training step had set the request hook aside (the code went "
                f"to serve {self.unseen} time(s) after that); mark those calls with gpuprof_jupyter.request() "
                "to count them"]

    def _removing(self) -> None:
        held = self._arming.acquire(timeout=ARMING_WAIT_S)  # as above: a fork's inherited lock
        self._removed = True
        if held:
            self._arming.release()

    def _arming_hooks(self, torch) -> None:
        """What arms the Module hook again: the user's own no_grad/inference_mode entries and
        ``set_grad_enabled(False)`` calls (the caller's module is not torch's), a module switched
        to eval mode. Each checks ``armed`` first: once armed they cost one attribute read."""
        arm = self.arm
        torch_code: dict = {}  # code object -> whether it is torch's (an optimizer step's entry: one lookup)

        def from_user_code() -> bool:
            caller = sys._getframe(2)  # what entered the context
            known = torch_code.get(caller.f_code)
            if known is not None:
                return not known
            frame, name = caller, caller.f_globals.get("__name__") or ""
            if name == "torch.autograd.grad_mode" and caller.f_code.co_name == "clone":  # a decorated
                frame = caller.f_back  # function's fresh set_grad_enabled: made by torch's decorator
                name = frame.f_globals.get("__name__") or ""
            by_caller = frame is caller  # the caller's module alone decides: the same next time
            if name == "torch.utils._contextlib":  # a @torch.no_grad() function: whose function it is
                name = getattr(frame.f_locals.get("func"), "__module__", None) or ""
                by_caller = False
            torchs = name == "torch" or name.startswith("torch.")
            if by_caller:
                torch_code[caller.f_code] = torchs
            return not torchs

        for cls in (torch.no_grad, torch.inference_mode):
            original_enter = cls.__enter__

            def __enter__(ctx, _original=original_enter):
                if not self.armed and not self._removed and from_user_code():
                    arm()
                return _original(ctx)

            self._patch(cls, "__enter__", __enter__)
        grad_mode = torch.set_grad_enabled  # a class: its __init__ sets the mode (the call form and the with form)
        original_init = grad_mode.__init__

        def __init__(ctx, mode):
            if not mode and not self.armed and not self._removed and from_user_code():
                arm()
            original_init(ctx, mode)

        self._patch(grad_mode, "__init__", __init__)
        original_train = torch.nn.Module.train

        def train(module, mode=True):
            if not mode and not self.armed:
                arm()
            return original_train(module, mode)

        self._patch(torch.nn.Module, "train", train)

    def _module_hook(self, torch) -> None:
        module_cls = torch.nn.Module
        call = module_cls.__call__
        grad_enabled = torch.is_grad_enabled
        timer, local, generating = self.timer, self.timer.local, self._generating
        begin, end, models, failed = timer.begin, timer.end, self.models, timer.failed

        def __call__(module, *args, **kwargs):
            if self._removed:  # the run is over, and another library had wrapped us: inert,
                if vars(module_cls).get("__call__") is __call__:  # and gone once on top again
                    module_cls.__call__ = call
                return call(module, *args, **kwargs)
            if grad_enabled():  # training (or a forward pass that keeps its graph): no request, and
                return call(module, *args, **kwargs)  # the only other check a training forward pass pays
            if local.depth:
                if generating.model is module:  # generate()'s prefill: the first token
                    generating.model = None
                    try:
                        return call(module, *args, **kwargs)
                    finally:
                        timer.first_token(generating.token)
                return call(module, *args, **kwargs)
            token = begin(REQ_MODULE, first_tensor_batch(args, kwargs, failed))
            if id(module) not in models:
                self._see_model(module)
            try:
                return call(module, *args, **kwargs)
            finally:
                end(token)

        self._module_cls, self._torch_call, self._wrapper = module_cls, call, __call__
        self._patch(module_cls, "__call__", __call__)
        self.armed = True
        self.sources.append("torch.nn.Module")

    def _see_model(self, module) -> None:
        """What a served model is (once per model): its class, parameter count and dtypes."""
        try:
            params = list(module.parameters()) if hasattr(module, "parameters") else []
            self.models[id(module)] = {
                "class": type(module).__name__, "parameters": sum(int(p.numel()) for p in params),
                "dtypes": sorted({str(p.dtype).replace("torch.", "") for p in params})}
        except Exception as exc:  # noqa: BLE001 - an odd module: its class only, and a note
            self.models[id(module)] = {"class": type(module).__name__}
            self.timer.failed("reading a served model's parameters", exc)

    def _gc_hook(self) -> None:
        """Python's collections during requests as events: a slow request can say a pause was
        GC's. Outside requests nothing is recorded (a process that serves nothing sends nothing)."""
        timer = self.timer
        emit, clock = timer.emit, timer.clock
        started = [False]

        def collected(phase, info):
            if phase == "start":
                if timer.open:
                    started[0] = True
                    emit((GC_START, clock(), info.get("generation")))
            elif started[0]:
                started[0] = False
                emit((GC_END, clock(), info.get("generation")))

        gc.callbacks.append(collected)

        def undo():
            if collected in gc.callbacks:
                gc.callbacks.remove(collected)
        self._undo(undo)

    def _transformers_hooks(self, transformers) -> None:
        mixin = _lazy_attr(transformers, "GenerationMixin")
        if mixin is not None and "generate" in vars(mixin):
            self._generate_hook(mixin)
        pipeline = _lazy_attr(transformers, "Pipeline")
        if pipeline is not None and "__call__" in vars(pipeline):
            self._pipeline_hook(pipeline)

    def _generate_hook(self, mixin) -> None:
        original = mixin.generate
        timer, generating = self.timer, self._generating

        def generate(model, *args, **kwargs):
            if self._removed or timer.depth():
                return original(model, *args, **kwargs)
            if not self.armed:  # its first forward pass gives the first token
                self.arm()
            inputs = kwargs.get("input_ids", args[0] if args else kwargs.get("inputs"))
            token = timer.begin(REQ_GENERATE, None if inputs is None else first_tensor_batch((inputs,), {}, timer.failed))
            if id(model) not in self.models:
                self._see_model(model)
            generating.model, generating.token = model, token
            tokens = None
            try:
                output = original(model, *args, **kwargs)
                try:
                    tokens = generated_tokens(model, inputs, output)
                except Exception as exc:  # noqa: BLE001 - an odd output: tokens unknown, a note
                    timer.failed("counting the tokens generate() produced (recorded as unknown)", exc)
                return output
            finally:
                generating.model = None
                timer.end(token, tokens)

        generate.__wrapped__ = original
        generate.__doc__ = original.__doc__
        self._patch(mixin, "generate", generate)
        self.sources.append("transformers generate()")

    def _pipeline_hook(self, pipeline_cls) -> None:
        original = pipeline_cls.__call__
        timer = self.timer

        def __call__(pipeline, inputs=None, *args, **kwargs):
            if self._removed or timer.depth() or _streamed(inputs, timer.failed):  # a dataset or generator:
                return original(pipeline, inputs, *args, **kwargs)  # each forward pass is a request
            batch = len(inputs) if isinstance(inputs, (list, tuple)) else 1
            token = timer.begin(REQ_PIPELINE, batch)
            try:
                return original(pipeline, inputs, *args, **kwargs)
            finally:
                timer.end(token)

        __call__.__wrapped__ = original
        self._patch(pipeline_cls, "__call__", __call__)
        self.sources.append("transformers pipeline")


def _streamed(inputs, failed) -> bool:
    """A pipeline fed a dataset or a generator returns an iterator that runs later, one
    forward pass per item: the call itself is no request (its forward passes are). An input
    whose attributes cannot be read (a nested tensor's shape raises) is one request."""
    if inputs is None or isinstance(inputs, (list, tuple, str, bytes, dict)):
        return False
    try:
        if hasattr(inputs, "shape"):
            return False
        return hasattr(inputs, "__iter__") or hasattr(inputs, "__getitem__") and hasattr(inputs, "__len__")
    except Exception as exc:  # noqa: BLE001 - the user's object: one request, a note
        failed("reading a pipeline's inputs", exc)
        return False


def _lazy_attr(module, name: str):
    try:
        return getattr(module, name, None)
    except Exception:  # noqa: BLE001 - transformers' lazy import of a missing backend: not hooked
        return None


def generated_tokens(model, inputs, output) -> int | None:
    """Tokens generate() produced: the output's new positions times its rows (None if unknown)."""
    sequences = getattr(output, "sequences", output)
    shape = getattr(sequences, "shape", None)
    if shape is None or len(shape) != 2:
        return None
    config = getattr(model, "config", None)
    if getattr(config, "is_encoder_decoder", False):
        new = int(shape[1]) - 1  # the decoder starts from one start token
    else:
        in_shape = getattr(inputs, "shape", None)
        new = int(shape[1]) - (int(in_shape[-1]) if in_shape is not None and len(in_shape) else 0)
    return max(new, 0) * int(shape[0])


__all__ = ["RequestHooks", "RequestTimer", "first_tensor_batch", "generated_tokens"]
