"""A distributed job's identity, as its launcher names it: which job, which part of it, which rank.

Runs in any process (core): ``gpuprof run`` (each node's agent) reads it from its own
environment and command line; a rank's startup hook reads it from its environment
(``core/child_channel.identity``).

The job's id is the launcher's own (docs/multi-node.md), never one of ours:

* torchrun: ``--rdzv-id`` (``TORCHELASTIC_RUN_ID`` in the ranks, where it names a job only when
  ``GROUP_WORLD_SIZE`` says several nodes: torchrun gives a one-node run a random id; ``none``
  is no id);
  the node's rank is ``GROUP_RANK`` (``--node-rank`` on the agent's command line until the ranks
  say it), and ``TORCHELASTIC_RESTART_COUNT`` counts elastic restarts: a restart is a new attempt
  of the same job, not a new rank.
* Ray Train: the run's name (``RunConfig(name=...)``), which a worker knows only through
  ``ray.train.get_context()``: read there (``runtime/jobs/ray_train.py``), not here.
* Slurm: ``SLURM_JOB_ID`` with its step (``SLURM_STEP_ID``): the job's key is ``4242.0``, and
  ``load("4242")`` takes its latest step, when it runs several tasks or nodes (one task alone,
  a batch script's ``gpuprof run``, is no job's part). The node is ``SLURM_NODEID``; a part is one task
  (``SLURM_PROCID``) of ``SLURM_NTASKS`` when ``gpuprof run`` runs once per task under ``srun``.

``GPUPROF_HOST`` names the host a part records instead of the machine's name: for two agents
of a test on one machine (documented in docs/multi-node.md), or a container whose host name is
meaningless.
"""

from __future__ import annotations

import os
import socket

HOST_ENV = "GPUPROF_HOST"
_TORCHRUN_FLAGS = {"--rdzv-id": "id", "--rdzv_id": "id", "--node-rank": "node_rank", "--node_rank": "node_rank",
                   "--nnodes": "nnodes"}


def host_name(environ=os.environ) -> str:
    """The host a part records: ``GPUPROF_HOST``, else the machine's name."""
    return environ.get(HOST_ENV) or socket.gethostname()


def _int(value) -> int | None:
    try:
        number = int(value)
    except (TypeError, ValueError):
        return None
    return number if number >= 0 else None


def job_key(job_id: str, step) -> str:
    """The job's key in the store: ``4242.0`` for a Slurm step, else the id."""
    return f"{job_id}.{step}" if step not in (None, "") else str(job_id)


def _slurm_job(environ) -> bool:
    """Whether Slurm runs several tasks (``SLURM_NTASKS``) or nodes: one task alone (a batch
    script's ``gpuprof run``) is an experiment of its own, not a part of a job."""
    return bool(environ.get("SLURM_JOB_ID")) and max(_int(environ.get("SLURM_NTASKS")) or 1,
                                                     _int(environ.get("SLURM_NNODES")) or 1) > 1


def torchrun_arguments(command: list[str]) -> dict:
    """``--rdzv-id``, ``--node-rank`` and ``--nnodes`` of a ``torchrun`` (or
    ``python -m torch.distributed.run``) command line; {} for another command. ``--nnodes 1:4``
    (elastic) keeps its upper bound."""
    if not any(os.path.basename(a) == "torchrun" or a == "torch.distributed.run" for a in command[:3]):
        return {}
    found = {}
    for i, arg in enumerate(command):
        flag, eq, value = arg.partition("=")
        if flag in _TORCHRUN_FLAGS:
            if not eq:
                value = command[i + 1] if i + 1 < len(command) else ""
            found[_TORCHRUN_FLAGS[flag]] = value
        elif not arg.startswith("-") and i > 0 and arg.endswith(".py"):
            break  # the training script's own arguments follow
    out = {}
    if found.get("id") and found["id"] != "none":
        out["id"] = found["id"]
    if _int(found.get("node_rank")) is not None:
        out["node_rank"] = _int(found["node_rank"])
    if found.get("nnodes"):
        out["nnodes"] = _int(found["nnodes"].rpartition(":")[2])
    return out


def agent_job(environ=os.environ, command: list[str] | None = None) -> dict | None:
    """The job a ``gpuprof run`` agent's part belongs to, from its command (torchrun's flags) and
    its environment (Slurm's, or torchrun's when the agent itself runs inside a rank), or None
    when it is no job's. Keys: ``id``, ``step``, ``key``, ``launcher``, ``host``, ``node_rank``,
    ``part`` (this agent's place among ``parts`` expected), ``parts``."""
    torchrun = torchrun_arguments(command or [])
    run_id = environ.get("TORCHELASTIC_RUN_ID")
    slurm_id = environ.get("SLURM_JOB_ID")
    job: dict = {"host": host_name(environ)}
    if torchrun.get("id") or (run_id and run_id != "none"):
        job.update(id=torchrun.get("id") or run_id, step=None, launcher="torchrun",
                   node_rank=torchrun.get("node_rank", _int(environ.get("GROUP_RANK"))))
        job.update(part=job["node_rank"], parts=torchrun.get("nnodes"))
    elif slurm_id and _slurm_job(environ):
        job.update(id=slurm_id, step=environ.get("SLURM_STEP_ID"), launcher="slurm",
                   node_rank=_int(environ.get("SLURM_NODEID")), part=_int(environ.get("SLURM_PROCID")),
                   parts=_int(environ.get("SLURM_NTASKS")))
    else:
        return None
    job["key"] = job_key(job["id"], job["step"])
    return job


def rank_identity(environ=os.environ) -> dict:
    """What a rank says of its place in a job (the ``hello`` of ``core/child_channel.py``): its
    host, node rank (``GROUP_RANK``, else ``SLURM_NODEID``), restart count, and the job's id
    (``TORCHELASTIC_RUN_ID`` unless ``none``, else ``SLURM_JOB_ID[.SLURM_STEP_ID]``)."""
    run_id = environ.get("TORCHELASTIC_RUN_ID")
    # torchrun gives every run an id (a random one without --rdzv-id): a job only across nodes
    torchrun = bool(run_id and run_id != "none" and (_int(environ.get("GROUP_WORLD_SIZE")) or 1) > 1)
    job = run_id if torchrun else (
        job_key(environ["SLURM_JOB_ID"], environ.get("SLURM_STEP_ID")) if _slurm_job(environ) else None)
    node = _int(environ.get("GROUP_RANK"))
    return {"host": host_name(environ), "node_rank": node if node is not None else _int(environ.get("SLURM_NODEID")),
            "restart_count": _int(environ.get("TORCHELASTIC_RESTART_COUNT")), "job": job,
            "launcher": "torchrun" if torchrun else "slurm" if job else None}


def slurm_rank(environ=os.environ) -> dict:
    """``RANK``/``LOCAL_RANK``/``WORLD_SIZE`` as a rank started by ``srun`` has them: Slurm's
    ``SLURM_PROCID``, ``SLURM_LOCALID`` and ``SLURM_NTASKS`` where the script did not set them."""
    pairs = (("RANK", "SLURM_PROCID"), ("LOCAL_RANK", "SLURM_LOCALID"), ("WORLD_SIZE", "SLURM_NTASKS"))
    return {ours: environ[theirs] for ours, theirs in pairs if ours not in environ and theirs in environ}


__all__ = ["HOST_ENV", "agent_job", "host_name", "job_key", "rank_identity", "slurm_rank", "torchrun_arguments"]
