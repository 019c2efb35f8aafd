"""A Ray Train worker's place in its job, from Ray Train's own context.

Runs in any process that holds a run as a child: a Ray Train worker, started by a raylet that
inherited the run's environment (docs/multi-node.md, "Ray Train").

Ray Train names the job (its run: ``RunConfig(name=...)``) and each worker's node rank only
through ``ray.train.get_context()``, not in the worker's environment (its torch backend sets
``RANK``, ``LOCAL_RANK`` and ``WORLD_SIZE``; the context says them too). So a worker's ``hello``
(``core/child_channel.py``) takes them from there, when ``ray.train`` is already imported (the
profiler never imports Ray) and a training session is on; elsewhere it adds nothing.
"""

from __future__ import annotations

import sys


def ray_train_identity() -> dict:
    """The ``hello`` fields of a Ray Train worker ({} outside one, or when Ray says nothing)."""
    train = sys.modules.get("ray.train")
    if train is None:
        return {}
    try:
        context = train.get_context()
        return {"job": str(context.get_experiment_name()), "launcher": "ray", "rank": int(context.get_world_rank()),
                "local_rank": int(context.get_local_rank()), "world_size": int(context.get_world_size()),
                "node_rank": int(context.get_node_rank())}
    except Exception:  # noqa: BLE001 - no session here, or another Ray: the environment's identity stands
        return {}


__all__ = ["ray_train_identity"]
