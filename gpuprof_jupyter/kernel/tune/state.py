"""The user's state before tuning, put back after every trial (bitwise).

Runs in the kernel (or the profiled script).

Kept: every ``torch.nn.Module`` (parameters and buffers, copied in place so references held
elsewhere stay valid), optimizer and LR scheduler in the namespace (their ``state_dict``), the
Python, NumPy and torch random generators, and the namespace's own bindings (a variable the
cell rebinds points to its old object again; one it creates is removed). Not kept, and said in
docs/tune.md: files the cell writes, objects reachable only from outside the namespace,
external services.
"""

from __future__ import annotations

import copy
import random
import sys

_IPYTHON_NAMES = frozenset({"_", "__", "___", "_i", "_ii", "_iii", "_ih", "_oh", "Out", "In", "_dh", "exit", "quit",
                            "get_ipython", "_exit_code"})


def _is_ipython_name(name: str) -> bool:
    return name in _IPYTHON_NAMES or (name.startswith("_i") and name[2:].isdigit()) or (
        name.startswith("_") and name[1:].isdigit())


class Snapshot:
    """``Snapshot(namespace)`` now; ``restore()`` as often as needed."""

    def __init__(self, namespace: dict) -> None:
        self.namespace = namespace
        self.bindings = {k: v for k, v in namespace.items() if not _is_ipython_name(k)}
        self.modules: list[tuple] = []  # (module, {name: tensor copy}, {name: grad copy or None})
        self.stateful: list[tuple] = []  # (optimizer or scheduler, deep-copied state_dict)
        self.rng = self._rng_state()
        torch = sys.modules.get("torch")
        if torch is None:
            return
        seen: set[int] = set()
        for value in self.bindings.values():
            if id(value) in seen:
                continue
            seen.add(id(value))
            if isinstance(value, torch.nn.Module):
                self.modules.append((value, {k: t.detach().clone() for k, t in self._tensors(value)},
                                     {k: None if p.grad is None else p.grad.detach().clone()
                                      for k, p in value.named_parameters(remove_duplicate=False)}))
            elif isinstance(value, torch.optim.Optimizer) or _is_scheduler(torch, value):
                self.stateful.append((value, copy.deepcopy(value.state_dict())))

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
        """Put everything back. Raises only after trying every part (the first error)."""
        errors = []
        for part in (self._restore_bindings, self._restore_modules, self._restore_stateful, self._restore_rng):
            try:
                part()
            except Exception as exc:  # noqa: BLE001 - try the other parts, then report
                errors.append(exc)
        if errors:
            raise errors[0]

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
                        param.grad = None if grad is None else grad.clone()

    def _restore_stateful(self) -> None:
        for obj, state in self.stateful:
            obj.load_state_dict(copy.deepcopy(state))

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
        return sum(t.numel() * t.element_size() for _, saved, _ in self.modules for t in saved.values())


_MISSING = object()


def _is_scheduler(torch, value) -> bool:
    lr = getattr(getattr(torch, "optim", None), "lr_scheduler", None)
    bases = tuple(c for c in (getattr(lr, "LRScheduler", None), getattr(lr, "ReduceLROnPlateau", None)) if c)
    return bool(bases) and isinstance(value, bases)


__all__ = ["Snapshot"]
