"""A torch model's shape and switches before tuning: its module tree, training modes, frozen layers.

Runs in any process that holds a run: the kernel, or a script under ``gpuprof run``.

A tuning cell commonly calls ``model.train()``, unfreezes a layer, replaces a head
(``model[3] = nn.Linear(...)``) or registers a hook on every run. Copying tensor values back is
not enough then: the optimizer built before the cell holds the old layer's parameters, so it
would never update the model's layer again, and a model left in train mode evaluates
differently. For every module in the
tree this keeps its children, parameters, buffers and hooks (the objects, not the tensors'
values: those are kept by runtime/tune/state.py), its ``training`` flag and each parameter's
``requires_grad``, and ``restore`` puts the same objects back into the same dicts.
"""

from __future__ import annotations

_SLOTS = ("_modules", "_parameters", "_buffers")


def _slots(module) -> list[str]:
    """The dicts kept: children, parameters, buffers, and every hook dict torch has (the forward,
    backward and state-dict hooks; their names vary between torch versions)."""
    return [*_SLOTS, *(k for k, v in vars(module).items() if "hooks" in k and isinstance(v, dict))]


class ModuleTree:
    """The tree under ``roots`` (each module once, shared ones included); ``restore()`` any time."""

    def __init__(self, roots) -> None:
        self.modules: list[tuple] = []  # (module, training, {slot: dict copy}, non-persistent buffer names,
        #                                  _is_full_backward_hook)
        self.grad_flags: list[tuple] = []  # (parameter, requires_grad)
        seen: set[int] = set()
        for root in roots:
            for module in root.modules():
                if id(module) in seen:
                    continue
                seen.add(id(module))
                slots = {slot: dict(getattr(module, slot)) for slot in _slots(module)}
                self.modules.append((module, module.training, slots,
                                     set(getattr(module, "_non_persistent_buffers_set", ())),
                                     getattr(module, "_is_full_backward_hook", None)))
                self.grad_flags += [(p, p.requires_grad) for p in slots["_parameters"].values() if p is not None]

    def restore(self) -> None:
        for module, training, slots, non_persistent, full_backward in self.modules:
            for slot, saved in slots.items():
                current = getattr(module, slot)
                if current.keys() != saved.keys() or any(current[k] is not v for k, v in saved.items()):
                    current.clear()
                    current.update(saved)
            if hasattr(module, "_non_persistent_buffers_set"):
                module._non_persistent_buffers_set.intersection_update(non_persistent)
                module._non_persistent_buffers_set.update(non_persistent)
            if hasattr(module, "_is_full_backward_hook"):
                module._is_full_backward_hook = full_backward  # which kind of backward hook it holds
            module.training = training  # this module only: .train() would recurse into changed children
        for param, requires_grad in self.grad_flags:
            if param.requires_grad != requires_grad:
                param.requires_grad_(requires_grad)


__all__ = ["ModuleTree"]
