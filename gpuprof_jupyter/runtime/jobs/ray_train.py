"""A Ray Train worker's place in its job, from Ray Train's own context.

Runs in any process that holds a run as a child: a Ray Train worker, started by a raylet that
inherited the run's environment (docs/multi-node.md, "Ray Train").

Ray Train names the job (its run: ``RunConfig(name=...)``) and each worker's node rank only
through ``ray.train.get_context()``, not in the worker's environment (its torch backend sets
``RANK``, ``LOCAL_RANK`` and ``WORLD_SIZE``; the context says them too). So a worker's ``hello``
(``core/child_channel.py``) takes them from there, when ``ray.train`` is already imported (the
profiler never imports Ray) and a training session is on; elsewhere it adds nothing.

Ray Train ends its workers with ``ray.kill`` once each has returned from ``shutdown()`` (or
after 5 s): no ``atexit`` handler runs in a killed actor, so a worker would never say goodbye
(its settings, ``log()`` values and last events lost, and the run told it was killed).
``say_goodbye_at_shutdown`` has the worker say it in ``shutdown()``, before the kill. Ray
Train v2 (the default since Ray 2.43) only: a legacy v1 worker that Ray kills still ends
without goodbye (docs/multi-node.md).
"""

from __future__ import annotations

import functools
import sys

RAY_TRAIN_WORKER_MODULE = "ray.train.v2._internal.execution.worker_group.worker"


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


def say_goodbye_at_shutdown(module, finish) -> None:
    """Wrap ``RayTrainWorker.shutdown`` in ``module`` (a Ray Train v2 worker) so it calls
    ``finish()`` (the child's goodbye) first; once per class, whatever the goodbye raises."""
    worker = module.RayTrainWorker
    original = worker.shutdown
    if getattr(original, "gpuprof_goodbye", False):
        return

    @functools.wraps(original)
    def shutdown(self, *args, **kwargs):
        try:
            finish()
        except Exception:  # noqa: BLE001 - Ray's shutdown goes on; the run notes a rank without goodbye
            pass
        return original(self, *args, **kwargs)

    shutdown.gpuprof_goodbye = True
    worker.shutdown = shutdown


__all__ = ["RAY_TRAIN_WORKER_MODULE", "ray_train_identity", "say_goodbye_at_shutdown"]
