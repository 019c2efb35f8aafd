"""A torch model's shape and switches before tuning: its module tree, training modes, frozen layers.

Runs in the kernel (or the profiled script).

A tuning cell commonly calls ``model.train()``, unfreezes a layer or replaces a head
(``model[3] = nn.Linear(...)``). Copying tensor values back is not enough then: the optimizer
built before the cell holds the old layer's parameters, so it would never update the model's
layer again, and a model left in train mode evaluates differently. For every module in the
tree this keeps its children, parameters and buffers (the objects, not their values: those are
kept by kernel/tune/state.py), its ``training`` flag and each parameter's ``requires_grad``,
and ``restore`` puts the same objects back into the same dicts.
"""

from __future__ import annotations

_SLOTS = ("_modules", "_parameters", "_buffers")


class ModuleTree:
    """The tree under ``roots`` (each module once, shared ones included); ``restore()`` any time."""

    def __init__(self, roots) -> None:
        self.modules: list[tuple] = []  # (module, training, {slot: dict copy}, non-persistent buffer names)
        self.grad_flags: list[tuple] = []  # (parameter, requires_grad)
        seen: set[int] = set()
        for root in roots:
            for module in root.modules():
                if id(module) in seen:
                    continue
                seen.add(id(module))
                slots = {slot: dict(getattr(module, slot)) for slot in _SLOTS}
                self.modules.append((module, module.training, slots,
                                     set(getattr(module, "_non_persistent_buffers_set", ()))))
                self.grad_flags += [(p, p.requires_grad) for p in slots["_parameters"].values() if p is not None]

    def restore(self) -> None:
        for module, training, slots, non_persistent in self.modules:
            for slot, saved in slots.items():
                current = getattr(module, slot)
                if current.keys() != saved.keys() or any(current[k] is not v for k, v in saved.items()):
                    current.clear()
                    current.update(saved)
            if hasattr(module, "_non_persistent_buffers_set"):
                module._non_persistent_buffers_set.intersection_update(non_persistent)
                module._non_persistent_buffers_set.update(non_persistent)
            module.training = training  # this module only: .train() would recurse into changed children
        for param, requires_grad in self.grad_flags:
            if param.requires_grad != requires_grad:
                param.requires_grad_(requires_grad)


__all__ = ["ModuleTree"]
