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
        self.optimizers: list[tuple] = []  # (optimizer, {param: state copy}, [param group hyper-parameters])
        self.schedulers: list[tuple] = []  # (scheduler, deep-copied state_dict)
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
            elif isinstance(value, torch.optim.Optimizer):
                self.optimizers.append((value, {p: {k: _copy(v) for k, v in st.items()} for p, st in value.state.items()},
                                        [{k: copy.deepcopy(v) for k, v in g.items() if k != "params"}
                                         for g in value.param_groups]))
            elif _is_scheduler(torch, value):
                self.schedulers.append((value, copy.deepcopy(value.state_dict())))

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
        for part in (self._restore_bindings, self._restore_modules, self._restore_optimizers, self._restore_schedulers,
                     self._restore_rng):
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
            for group, hyper in zip(optimizer.param_groups, groups):
                for key in [k for k in group if k != "params" and k not in hyper]:
                    del group[key]
                group.update(copy.deepcopy(hyper))

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
        return sum(t.numel() * t.element_size() for _, saved, _ in self.modules for t in saved.values())


_MISSING = object()


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


__all__ = ["Snapshot"]
