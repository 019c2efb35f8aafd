"""Findings across a job's ranks: a straggler (or a slow node), ranks waiting on each other, a rank on the wrong GPU.

Runs in any process (core).

Each rank's figures are the summary's ``ranks``; ``ranks_params`` reads one rank's recorded settings.
Thresholds are module constants so tests and users can see them.
"""

from __future__ import annotations

import numpy as np

from gpuprof_jupyter.core.analysis.finding import Finding
from gpuprof_jupyter.core.analysis.job_findings import median_of, slow_node
from gpuprof_jupyter.core.analysis.provenance import gpu_measured
from gpuprof_jupyter.core.analysis.summary import summary_of
from gpuprof_jupyter.core.analysis.finding_text import step_fig
from gpuprof_jupyter.core.analysis.input_findings import input_advice
from gpuprof_jupyter.core.analysis.ranks import cuda_index, job_hosts, listed, physical_gpu, rank_host, rank_name


STRAGGLER_SHARE = 0.20  # a rank whose data wait per step exceeds the others' by this share of its step
STRAGGLER_RATIO = 1.25  # or whose step time is this many times the others' (ranks not in lockstep)
RANK_WAIT_SHARE = 0.30  # a rank spending this share of its step beyond compute and data wait: waiting


def _ms(seconds: float) -> str:
    """A rank's time per step (its median), measured by its step hooks."""
    return step_fig(seconds, "time")


def _rank_figures(experiment) -> dict[int, dict]:
    ranks = (summary_of(experiment).get("ranks") or {})
    return {int(r): f for r, f in ranks.items() if f.get("count") and "forked_from" not in f}  # forks: no peers


def straggler_rank(experiment) -> Finding | None:
    """The rank whose data wait, or (ranks not in step) step time, stands out, with the cause;
    in a job, a host whose every rank stands out so is a slow node (``job_findings.slow_node``)."""
    ranks = _rank_figures(experiment)
    if len(ranks) < 2:
        return None
    waits = {r: f["wait_p50_s"] for r, f in ranks.items()}
    slow = max(waits, key=waits.get)
    others = [w for r, w in waits.items() if r != slow]
    step = ranks[slow]["step_time_p50_s"]
    name = rank_name(experiment, slow)
    if waits[slow] - float(np.median(others)) >= STRAGGLER_SHARE * step:
        node = slow_node(experiment, ranks, slow, waits, lambda r, rest: waits[r] - median_of(waits, rest)
                         >= STRAGGLER_SHARE * ranks[r]["step_time_p50_s"], "data", "data wait per step",
                         gpu=gpu_measured(experiment.meta))
        if node is not None:
            return node
        workers = ranks_params(experiment, slow).get("num_workers")
        return Finding("straggler-rank", f"{name[0].upper()}{name[1:]} is the straggler: its data loading", "high",
                       f"{name} waited {_ms(waits[slow])} per step for data (median) while the other "
                       f"{len(others)} rank(s) waited {_ms(float(np.median(others)))}; its steps took {_ms(step)}, "
                       "and in synchronous training every other rank waits for it",
                       f"speed up {name}'s input: " + input_advice(workers, gpu=gpu_measured(experiment.meta))
                       + "; check its data shard (size, storage) and its host's CPUs",
                       {"rank": slow, "host": rank_host(experiment, slow), "cause": "data", "wait_p50_s": waits[slow],
                        "others_wait_p50_s": float(np.median(others))})
    times = {r: f["step_time_p50_s"] for r, f in ranks.items()}
    slow = max(times, key=times.get)
    name = rank_name(experiment, slow)
    median = float(np.median([t for r, t in times.items() if r != slow]))
    if times[slow] < STRAGGLER_RATIO * median:
        return None  # steps in lockstep (synchronous training) or alike: the waiting finding tells
    node = slow_node(experiment, ranks, slow, times, lambda r, rest: times[r] >= STRAGGLER_RATIO * median_of(times, rest),
                     "compute", "step time", gpu=gpu_measured(experiment.meta))
    if node is not None:
        return node
    gpu = ranks[slow].get("gpu") or ranks[slow].get("device") or "its device"
    where = (f"{name}'s GPU ({gpu}): throttling, other processes on it, its link" if gpu_measured(experiment.meta)
             else f"{name}'s CPUs (no GPU was read): other processes on them, its threads (torch.set_num_threads)")
    return Finding("straggler-rank", f"{name[0].upper()}{name[1:]} is the straggler: its compute", "high",
                   f"{name}'s steps took {_ms(times[slow])} (median) against {_ms(median)} on the other ranks, "
                   f"with no more data wait ({_ms(waits[slow])})",
                   f"look at {where}; and at whether its batch or shard is larger",
                   {"rank": slow, "host": rank_host(experiment, slow), "cause": "compute", "step_time_p50_s": times[slow]})


def ranks_waiting(experiment) -> Finding | None:
    """Ranks whose step time is well above their compute plus data wait: waiting for the others."""
    ranks = _rank_figures(experiment)
    waiting = {r: f for r, f in ranks.items()
               if f.get("sync_wait_p50_s", 0) >= RANK_WAIT_SHARE * f["step_time_p50_s"] > 0}
    if len(ranks) < 2 or not waiting:
        return None
    names = listed(waiting)
    first = next(iter(waiting.values()))
    slowest = [r for r in ranks if r not in waiting]
    return Finding("ranks-waiting", f"Ranks wait for each other (rank {names})", "medium",
                   f"rank {names}: steps of {_ms(first['step_time_p50_s'])} (median) of which compute is about "
                   f"{_ms(first['compute_p50_s'])} and data wait {_ms(first['wait_p50_s'])}; the remaining "
                   f"{_ms(first['sync_wait_p50_s'])} ({step_fig(first['sync_wait_p50_s'] / first['step_time_p50_s'], 'share')}) "
                   "is spent waiting at the synchronisation"
                   + (f" for rank {listed(slowest)}" if slowest else ""),
                   "make the slowest rank faster (its finding, if any, says why it is slow); balance the shards and "
                   "the batch per rank", {"ranks": list(waiting), "sync_wait_p50_s": first["sync_wait_p50_s"]})


def rank_gpu_mismatch(experiment) -> Finding | None:
    """A rank on another GPU than its neighbours assume (device = LOCAL_RANK), or ranks sharing one."""
    info = experiment.meta.context.get("ranks") or {}
    on_gpu = {int(r): i for r, i in info.items() if cuda_index(i) is not None}
    if len(on_gpu) < 2:
        return None
    physical = {r: physical_gpu(i) for r, i in on_gpu.items()}
    shared = {}
    for r, gpu in physical.items():  # in a job, GPU 0 of one host is not GPU 0 of another
        if gpu is not None:
            shared.setdefault((on_gpu[r].get("host"), gpu), []).append(r)
    for (host, gpu), ranks in shared.items():
        if len(ranks) > 1:
            where = f"GPU {gpu}" + (f" on {host}" if host and len(job_hosts(experiment)) > 1 else "")
            return Finding("rank-gpu-mismatch", f"Ranks {listed(ranks)} share {where}", "high",
                           f"ranks {listed(ranks)} all put their parameters on {where} "
                           f"({listed(on_gpu[r]['device'] for r in ranks)})",
                           "call torch.cuda.set_device(int(os.environ['LOCAL_RANK'])) before building the model, "
                           "and pass device_ids=[local_rank] to DistributedDataParallel", {"gpu": gpu, "ranks": ranks})
    follows = {r: cuda_index(i) == i.get("local_rank") for r, i in on_gpu.items() if i.get("local_rank") is not None}
    odd = [r for r, ok in follows.items() if not ok]
    if odd and len(odd) < len(follows):
        r = odd[0]
        return Finding("rank-gpu-mismatch", f"Rank {r} is not on the GPU its neighbours assume", "high",
                       f"rank {r} (LOCAL_RANK {on_gpu[r]['local_rank']}) trains on {on_gpu[r]['device']}, while the "
                       "other ranks train on cuda:LOCAL_RANK",
                       f"set rank {r}'s device from LOCAL_RANK (torch.cuda.set_device) and check its CUDA_VISIBLE_DEVICES "
                       f"({on_gpu[r].get('cuda_visible_devices')!r})", {"rank": r, "device": on_gpu[r]["device"]})
    return None


def ranks_params(experiment, rank: int) -> dict:
    return ((experiment.meta.context.get("ranks") or {}).get(str(rank)) or {}).get("params") or {}
