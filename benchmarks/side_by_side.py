"""This checkout against another one, in the same run.

``python -m benchmarks.side_by_side OTHER_CHECKOUT --overhead [--rounds N] [--pairs P]``: the
profiled/plain wall ratio at 1 GPU (``bench_overhead``: short A-B pairs, placement, interference
rule), with this checkout's benchmark code and each checkout's profiler in the kernel, rounds
alternated (this, other, other, this, ...). Prints each checkout's ratio over all its kept pairs.

``python -m benchmarks.side_by_side OTHER_CHECKOUT [--rounds N]``: whole profiled cells
(``bench_startup.LIVE_CELLS``: the first one right after ``%load_ext``, warm ones, the static
ending), the kernel's profiler threads at 8 GPUs (``bench_overhead._run_kernel``) and the NVML
source's Python per sample at 8 x H100 (``_measure.worker``), each run in fresh processes of
both checkouts, alternated, so a shared machine's load hits both alike. Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile

from ._common import ROOT, run_json_subprocess
from .bench_startup import LIVE_CELLS

KERNEL_CPU = """
import json, os, sys
sys.path.insert(0, os.getcwd())
from benchmarks.bench_overhead import CFG, _run_kernel
share = _run_kernel(8, CFG["quick"], abba=False)["share"]
threads = {}
for key, ns in share["cpu"].items():
    threads[key.split(":")[0]] = threads.get(key.split(":")[0], 0) + ns
print(json.dumps({"pct": 100 * sum(threads.values()) / 1e9 / share["wall"],
                  "ms_per_s": {k: v / 1e6 / share["wall"] for k, v in threads.items()}}))
"""
PER_SAMPLE = """
import json
from benchmarks._measure import worker
r = worker("ours", 8, "h100", 100)
print(json.dumps({"python_us": r["nvml"]["cpu_us_python"]}))
"""


OVERHEAD = """
import json, sys
sys.path.insert(0, {harness!r})  # this checkout's benchmark; the kernel imports the profiler from PYTHONPATH
from benchmarks.bench_overhead import CFG, _run_kernel
r = _run_kernel(1, dict(CFG["quick"], pairs={pairs}, share_s=3.0), abba=True)
print(json.dumps({{"pairs": r["pairs"], "placed": r["placed"]}}))
"""


def overhead(other: str, rounds: int, pairs: int) -> dict:
    """Each checkout's profiler under this checkout's overhead benchmark, alternated A-B-B-A by round."""
    from .bench_overhead import wall_ratio

    trees = {"this": str(ROOT), "other": os.path.abspath(other)}
    kept: dict = {name: [] for name in trees}
    for k in range(rounds):
        order = list(trees.items()) if k % 2 == 0 else list(trees.items())[::-1]
        for name, root in order:
            result = run_json_subprocess(OVERHEAD.format(harness=str(ROOT), pairs=pairs), 1200, root=root)
            kept[name] += result["pairs"]
    return {name: {"tree": trees[name], **wall_ratio(pairs_)} for name, pairs_ in kept.items()}


def _run(root: str, code: str, cache: str) -> dict:
    return run_json_subprocess(code, 900, {"XDG_CACHE_HOME": cache}, root=root)


def compare(other: str, rounds: int) -> dict:
    trees = {"this": str(ROOT), "other": os.path.abspath(other)}
    runs: dict = {name: {"cells": [], "kernel_cpu": [], "per_sample": []} for name in trees}
    with tempfile.TemporaryDirectory() as cache:
        _run(trees["this"], LIVE_CELLS.format(pause=0.0, warm=4), cache)  # fills the template cache
        for k in range(rounds):
            order = list(trees.items()) if k % 2 == 0 else list(trees.items())[::-1]
            for name, root in order:
                runs[name]["cells"].append(_run(root, LIVE_CELLS.format(pause=0.0, warm=4), cache))
                runs[name]["kernel_cpu"].append(_run(root, KERNEL_CPU, cache))
                runs[name]["per_sample"].append(_run(root, PER_SAMPLE, cache))
    out = {}
    for name, r in runs.items():
        cells = r["cells"]
        out[name] = {
            "tree": trees[name],
            "first_cell_over_plain_ms": statistics.median(c["first_s"] - c["plain_first_s"] for c in cells) * 1e3,
            "warm_cell_over_plain_ms": statistics.median(c["warm_s"] - c["plain_s"] for c in cells) * 1e3,
            "quiet_cell_over_plain_ms": statistics.median(c["quiet_s"] - c["plain_s"] for c in cells) * 1e3,
            "static_ending_ms": statistics.median(c["ending_s"] for c in cells) * 1e3,
            "first_static_ending_ms": statistics.median(c["first_ending_s"] for c in cells) * 1e3,
            "kernel_cpu_pct_8gpu": statistics.median(c["pct"] for c in r["kernel_cpu"]),
            "nvml_python_us_h100x8": statistics.median(c["python_us"] for c in r["per_sample"]),
            "runs": r,
        }
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m benchmarks.side_by_side", description=__doc__)
    parser.add_argument("other", help="another checkout of this repository (e.g. a worktree of main)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--overhead", action="store_true", help="the wall ratio at 1 GPU only")
    parser.add_argument("--pairs", type=int, default=20, help="A-B pairs per round (--overhead)")
    args = parser.parse_args()
    result = overhead(args.other, args.rounds, args.pairs) if args.overhead else compare(args.other, args.rounds)
    print(json.dumps(result, indent=1))
