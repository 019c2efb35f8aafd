"""The user's state before tuning, put back after every trial (bitwise).

Runs in any process that holds a run: the kernel, or a script under ``gpuprof run``.

Kept: every ``torch.nn.Module`` bound in the namespace or held in its lists, dicts, sets and
tuples (parameters, buffers and gradients copied in place so references held elsewhere stay
valid; the module tree, hooks, training modes and ``requires_grad`` in
runtime/tune/state_modules.py),
optimizers (state, parameter groups) and LR schedulers (their ``state_dict``), the Python,
NumPy and torch random generators, the namespace's own bindings (a variable the cell rebinds
points to its old object again; one it creates is removed), its builtin containers in place
(runtime/tune/state_containers.py, bounded in size) and ``os.environ``. Not kept, and said in
docs/tune.md: files the cell writes, tensors and arrays changed in place outside a module (a
tensor's in-place changes are seen and named, never copied: a dataset may be most of the
memory), attributes of other objects, objects reachable only from outside the namespace,
external services. ``not_restored()`` names what was left as the trials made it.

The copies cost what torch's own ``clone()`` and ``copy_()`` of the same tensors cost, and as
much memory as the tensors they copy, on the tensors' device (benchmarks/bench_tune.py,
docs/tune.md). Before copying, the tensors' bytes on the host are weighed against the memory
available (psutil): a snapshot that would not fit is refused (``SnapshotTooLarge``), nothing
copied, rather than swapping or killed by the kernel's OOM killer midway.
"""

from __future__ import annotations

import copy
import os
import random
import sys

from gpuprof_jupyter.core.format import fmt_bytes
from gpuprof_jupyter.runtime.tune.state_containers import Containers
from gpuprof_jupyter.runtime.tune.state_modules import ModuleTree

_IPYTHON_NAMES = frozenset({"_", "__", "___", "_i", "_ii", "_iii", "_ih", "_oh", "Out", "In", "_dh", "exit", "quit",
                            "get_ipython", "_exit_code"})


def _is_ipython_name(name: str) -> bool:
    return name in _IPYTHON_NAMES or (name.startswith("_i") and name[2:].isdigit()) or (
        name.startswith("_") and name[1:].isdigit())


class SnapshotTooLarge(ValueError):
    """The snapshot would not fit in the host memory available: refused before any copy."""


def check_fits(host_bytes: int) -> None:
    """Raise ``SnapshotTooLarge`` when ``host_bytes`` of copies exceed the memory available
    now (psutil's ``available``: free memory plus what the kernel can reclaim without swapping).
    Memory that cannot be read is not weighed: the snapshot goes on, as before this check."""
    import psutil

    try:
        available = psutil.virtual_memory().available
    except Exception:  # noqa: BLE001 - an unreadable /proc/meminfo must not stop a tuning run
        return
    if host_bytes > available:
        raise SnapshotTooLarge(
            f"--tune needs a copy of the state it restores after every trial: {fmt_bytes(host_bytes)} of tensors "
            f"in host memory (the models' parameters, buffers and gradients and the optimizers' state), but only "
            f"{fmt_bytes(available)} is available; nothing was run. Free memory (del what the cell does not need, "
            f"or restart the kernel) or tune a smaller model (docs/tune.md, \"What the snapshot costs\")")


class Snapshot:
    """``Snapshot(namespace)`` now; ``restore()`` as often as needed. Raises ``SnapshotTooLarge``
    (copying nothing) when its copies would not fit in the host memory available."""

    def __init__(self, namespace: dict) -> None:
        self.namespace = namespace
        self.bindings = {k: v for k, v in namespace.items() if not _is_ipython_name(k)}
        self.modules: list[tuple] = []  # (module, {name: tensor copy}, {name: grad copy or None})
        self.optimizers: list[tuple] = []  # (optimizer, {param: state copy}, [(group, params list, its items,
        #                                     hyper-parameters)])
        self.schedulers: list[tuple] = []  # (scheduler, deep-copied state_dict)
        self.failed: dict[str, str] = {}  # what the last restore could not put back -> why
        self.rng = self._rng_state()
        self.environ = dict(os.environ)
        self.tensors: list[tuple] = []  # (binding, tensor, its version counter): watched, never copied
        torch = sys.modules.get("torch")
        objects: dict[int, tuple] = {}
        self.containers = Containers(self.bindings, lambda name, obj: objects.setdefault(id(obj), (name, obj)))
        self.copied_bytes: dict[str, int] = {}  # the copies' bytes by device type ("cpu", "cuda", ...)
        if torch is None:
            self.tree = ModuleTree([])
            return
        for tensor in self.tensors_to_copy([value for _, value in objects.values()]):
            kind = tensor.device.type
            self.copied_bytes[kind] = self.copied_bytes.get(kind, 0) + tensor.numel() * tensor.element_size()
        check_fits(self.copied_bytes.get("cpu", 0))
        for name, value in objects.values():
            if isinstance(value, torch.nn.Module):
                self.modules.append((value, {k: t.detach().clone() for k, t in self._tensors(value)},
                                     {k: None if p.grad is None else p.grad.detach().clone()
                                      for k, p in value.named_parameters(remove_duplicate=False)}))
            elif isinstance(value, torch.optim.Optimizer):
                self.optimizers.append((value, {p: {k: _copy(v) for k, v in st.items()} for p, st in value.state.items()},
                                        [(g, g["params"], list(g["params"]),
                                          {k: copy.deepcopy(v) for k, v in g.items() if k != "params"})
                                         for g in value.param_groups]))
            elif _is_scheduler(torch, value):
                self.schedulers.append((value, copy.deepcopy(value.state_dict())))
            elif isinstance(value, torch.Tensor) and _version(value) is not None:
                self.tensors.append((name, value, _version(value)))
        self.tree = ModuleTree([m for m, _, _ in self.modules])
        restored = {id(t) for module, _, _ in self.modules for _, t in self._tensors(module)}
        restored |= {id(v) for _, state, _ in self.optimizers for st in state.values() for v in st.values()}
        self.tensors = [entry for entry in self.tensors if id(entry[1]) not in restored]

    @classmethod
    def tensors_to_copy(cls, found: list):
        """Every tensor a snapshot of the objects ``found`` clones, as it clones them (a tied
        weight twice): the modules' parameters, buffers and gradients, the optimizers' state."""
        torch = sys.modules["torch"]
        for value in found:
            if isinstance(value, torch.nn.Module):
                yield from (t for _, t in cls._tensors(value))
                yield from (p.grad for _, p in value.named_parameters(remove_duplicate=False) if p.grad is not None)
            elif isinstance(value, torch.optim.Optimizer):
                yield from (v for st in value.state.values() for v in st.values() if isinstance(v, torch.Tensor))

    @staticmethod
    def _tensors(module):
        yield from module.named_parameters(remove_duplicate=False)
        yield from ((k, b) for k, b in module.named_buffers(remove_duplicate=False) if b is not None)

    @staticmethod
    def _rng_state() -> dict:
        state = {"python": random.getstate()}
        numpy = sys.modules.get("numpy")
        if numpy is not None:
            state["numpy"] = numpy.random.get_state()
        torch = sys.modules.get("torch")
        if torch is not None:
            state["torch"] = torch.get_rng_state()
            cuda = getattr(torch, "cuda", None)
            if cuda is not None and cuda.is_initialized():  # never initialise CUDA ourselves
                state["cuda"] = cuda.get_rng_state_all()
        return state

    def restore(self) -> None:
        """Put everything back. Never raises: what could not be put back is in ``not_restored()``."""
        self.failed = {}
        parts = {"the namespace's bindings": self._restore_bindings,
                 "the namespace's containers": self._restore_containers,
                 "the module tree, hooks, training modes and requires_grad": self.tree.restore,
                 "the models' parameters and buffers": self._restore_modules,
                 "the optimizers": self._restore_optimizers, "the LR schedulers": self._restore_schedulers,
                 "the random generators": self._restore_rng, "os.environ": self._restore_environ}
        for what, part in parts.items():  # the tree before the values: names lead to the old tensors again
            try:
                part()
            except Exception as exc:  # noqa: BLE001 - try the other parts, then say what stayed changed
                self.failed[what] = f"{type(exc).__name__}: {exc}"

    def not_restored(self) -> list[str]:
        """What the trials may have left changed: tensors they changed in place (torch counts each
        in-place change in ``_version``), containers too large to keep, parts that failed."""
        changed = [f"{name} (a tensor) was changed in place by the trials" for name, tensor, version in self.tensors
                   if _version(tensor) != version]
        return [*changed, *self.containers.notes(),
                *(f"{what} could not be restored ({why})" for what, why in self.failed.items())]

    def _restore_containers(self) -> None:
        self.failed.update(self.containers.restore())

    def _restore_environ(self) -> None:
        for key in [k for k in os.environ if k not in self.environ]:
            del os.environ[key]
        for key, value in self.environ.items():
            if os.environ.get(key) != value:
                os.environ[key] = value

    def _restore_bindings(self) -> None:
        ns = self.namespace
        for name in [k for k in ns if not _is_ipython_name(k) and k not in self.bindings]:
            del ns[name]
        for name, value in self.bindings.items():
            if ns.get(name, _MISSING) is not value:
                ns[name] = value

    def _restore_modules(self) -> None:
        torch = sys.modules["torch"] if self.modules else None
        for module, saved, grads in self.modules:
            current = dict(self._tensors(module))
            with torch.no_grad():
                for name, tensor in saved.items():
                    target = current.get(name)
                    if target is None:
                        continue
                    if target.shape != tensor.shape or target.dtype != tensor.dtype:
                        target.data = tensor.clone()
                    else:
                        target.copy_(tensor)
                for name, grad in grads.items():
                    param = current.get(name)
                    if param is not None:
                        param.grad = None if grad is None else _into(param.grad, grad)

    def _restore_optimizers(self) -> None:
        """In place (a 100M-parameter SGD's ``load_state_dict`` takes seconds, this a few ms):
        the state tensors get their saved values, state the trials added is dropped."""
        torch = sys.modules["torch"] if self.optimizers else None
        for optimizer, saved, groups in self.optimizers:
            with torch.no_grad():
                for param in [p for p in optimizer.state if p not in saved]:
                    del optimizer.state[param]
                for param, state in saved.items():
                    current = optimizer.state[param]
                    for key in [k for k in current if k not in state]:
                        del current[key]
                    for key, value in state.items():
                        current[key] = _into(current.get(key), value)
            optimizer.param_groups[:] = [group for group, _, _, _ in groups]  # a group the trial added goes
            for group, params, items, hyper in groups:
                params[:] = items
                for key in [k for k in group if k != "params" and k not in hyper]:
                    del group[key]
                group.update(copy.deepcopy(hyper))
                group["params"] = params

    def _restore_schedulers(self) -> None:
        for scheduler, state in self.schedulers:
            scheduler.load_state_dict(copy.deepcopy(state))

    def _restore_rng(self) -> None:
        random.setstate(self.rng["python"])
        if "numpy" in self.rng:
            sys.modules["numpy"].random.set_state(self.rng["numpy"])
        if "torch" in self.rng:
            torch = sys.modules["torch"]
            torch.set_rng_state(self.rng["torch"])
            if "cuda" in self.rng:
                torch.cuda.set_rng_state_all(self.rng["cuda"])

    def size_bytes(self) -> int:
        """Bytes of tensors the snapshot holds, all devices together."""
        return sum(self.copied_bytes.values())


_MISSING = object()


def _version(tensor) -> int | None:
    """torch's count of in-place changes; None for a tensor without one (made under inference_mode)."""
    try:
        return tensor._version
    except RuntimeError:
        return None


def _copy(value):
    """A tensor detached and cloned, anything else deep-copied."""
    return value.detach().clone() if hasattr(value, "detach") and hasattr(value, "clone") else copy.deepcopy(value)


def _into(target, saved):
    """``saved``'s value, copied into ``target`` when it is a tensor of the same kind, else a copy."""
    if (hasattr(saved, "copy_") and hasattr(target, "copy_") and target.shape == saved.shape
            and target.dtype == saved.dtype and target.device == saved.device):
        target.copy_(saved)
        return target
    return _copy(saved)


def _is_scheduler(torch, value) -> bool:
    lr = getattr(getattr(torch, "optim", None), "lr_scheduler", None)
    bases = tuple(c for c in (getattr(lr, "LRScheduler", None), getattr(lr, "ReduceLROnPlateau", None)) if c)
    return bool(bases) and isinstance(value, bases)


__all__ = ["Snapshot", "SnapshotTooLarge", "check_fits"]
