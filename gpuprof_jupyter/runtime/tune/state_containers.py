"""The namespace's lists, dicts and sets, kept before tuning and put back in place.

Runs in any process that holds a run: the kernel, or a script under ``gpuprof run``.

A trial that appends to ``history["loss"]`` or clears ``seen`` must not leave that behind. Each
list, dict and set reachable from a binding through other builtin containers (tuples included,
cycles allowed) keeps a shallow copy of its items, and ``restore`` puts them back into the same
object, so names elsewhere that share it see the old contents. The items themselves are not
copied: a tensor or array changed in place stays changed (docs/tune.md). A binding whose
containers hold more than ``MAX_ITEMS`` items in all is left alone and named, since a copy per
trial of a large cache costs memory and time the user did not ask for.

Walking stops at anything that is not a builtin container; ``found(binding, obj)`` hands
modules, optimizers, tensors and other objects met on the way to the caller
(runtime/tune/state.py).
"""

from __future__ import annotations

from typing import Callable

MAX_ITEMS = 100_000  # items (all nested containers together) per namespace binding kept for restore

_KEPT = (list, dict, set)
_ATOMIC = frozenset({int, float, str, bytes, bool, complex, type(None)})  # nothing inside to walk or keep


class Containers:
    """Builtin containers reachable from ``bindings``; ``restore()`` puts their items back."""

    def __init__(self, bindings: dict, found: Callable[[str, object], None]) -> None:
        self.kept: list[tuple[str, object, list]] = []  # (binding, container, its items as they were)
        self.too_large: list[tuple[str, object, int]] = []  # (binding, container, its length then)
        done: set[int] = set()  # containers kept through an earlier binding
        for name, value in bindings.items():
            if name.startswith("__"):  # __builtins__ of a script's globals is a dict, and not the user's
                continue
            kept, others, count = self._walk(value, done)
            if count > MAX_ITEMS:
                self.too_large.append((name, value, len(value)))
                continue
            done.update(id(c) for c, _ in kept)
            self.kept += [(name, c, items) for c, items in kept]
            for obj in others:
                found(name, obj)

    @staticmethod
    def _walk(root, done: set[int]) -> tuple[list, list, int]:
        """Containers under ``root`` not kept before, the other objects met, and the items counted."""
        kept, others, count, stack, seen = [], [], 0, [root], set()
        while stack:
            value = stack.pop()
            if id(value) in seen or id(value) in done:
                continue
            seen.add(id(value))
            if isinstance(value, dict):
                items = list(value.items())
                stack += [v for _, v in items if type(v) not in _ATOMIC]
            elif isinstance(value, (list, set, tuple)):
                items = list(value)
                stack += [v for v in items if type(v) not in _ATOMIC]
            else:
                others.append(value)
                continue
            count += len(items)
            if count > MAX_ITEMS:
                return [], [], count
            if isinstance(value, _KEPT):
                kept.append((value, items))
        return kept, others, count

    def restore(self) -> dict[str, str]:
        """Put every changed container back; what could not be (``"name (type)"``) -> why."""
        failed: dict[str, str] = {}
        for name, container, items in self.kept:
            if not _changed(container, items):
                continue
            try:
                if isinstance(container, list):
                    container[:] = items
                else:  # dict or set
                    container.clear()
                    container.update(items)
            except Exception as exc:  # noqa: BLE001 - a user's subclass may refuse; named, not raised
                failed.setdefault(f"{name} ({type(container).__name__})", f"{type(exc).__name__}: {exc}")
        return failed

    def notes(self) -> list[str]:
        """The containers left alone for their size, and whether the trials changed their size."""
        out = []
        for name, container, length in self.too_large:
            changed = "" if len(container) == length else "; changed by the trials"
            out.append(f"{name} ({type(container).__name__}, over {MAX_ITEMS:,} items in all) was not kept "
                       f"for restore{changed}")
        return out


def _changed(container, items: list) -> bool:
    """Compared by identity: never calls the items' own ``==`` (arrays and tensors refuse it)."""
    if isinstance(container, dict):
        now = list(container.items())
        return len(now) != len(items) or any(k is not k0 or v is not v0 for (k, v), (k0, v0) in zip(now, items))
    if isinstance(container, set):
        return len(container) != len(items) or {id(x) for x in container} != {id(x) for x in items}
    return len(container) != len(items) or any(a is not b for a, b in zip(container, items))


__all__ = ["MAX_ITEMS", "Containers"]
