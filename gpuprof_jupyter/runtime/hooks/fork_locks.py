"""Locks the hooks take, replaced by new ones in a forked child.

Runs in any process that holds a run: the kernel, or a script under ``gpuprof run``, and in
their forks (DataLoader workers, ``multiprocessing`` children).

A fork copies every lock as it was and only the forking thread (docs/architecture.md, section 5): a lock another
thread held at that moment (the request hook's swap, the hand-over's fold) stays held in the
child for ever, and each of the child's calls that takes it would wait. So every lock a hook
takes is made here, and an ``os.register_at_fork`` handler gives each owner a new one in the
child, before the child's own code runs. No hook holds its lock across a call that could fork.
"""

from __future__ import annotations

import os
import threading
import weakref

_owners: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # owner -> names of its lock attributes


def hook_lock(owner, name: str) -> threading.Lock:
    """A new lock for ``owner.<name>``: in every fork of this process, ``owner.<name>`` is set
    to another new lock."""
    _owners.setdefault(owner, set()).add(name)
    return threading.Lock()


def _renew_in_child() -> None:
    for owner, names in list(_owners.items()):
        for name in names:
            setattr(owner, name, threading.Lock())


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_renew_in_child)

__all__ = ["hook_lock"]
