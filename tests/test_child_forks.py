"""Forks of a profiled process (``kernel/runtime/child.py``): a script that forks while it
trains, under ``gpuprof run`` and inside ``gp.profile`` (a profiled cell). Each fork that steps
is a child of its own; DataLoader workers stay silent; nothing hangs, nothing is counted twice,
the parent's connection is never written by a fork."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from gpuprof_jupyter.cli import main
from gpuprof_jupyter.core.store.directory import Store

SCRIPT = Path(__file__).resolve().parent / "data" / "scripts" / "train_forks.py"
FORKS = 12  # often enough that a fork lands while the sender thread holds its lock
TROUBLE = ("without saying goodbye", "could not be read", "could not reach", "unprofiled", "did not end")


def _fork_ranks(ranks: dict) -> list[int]:
    return sorted(info["steps"] for info in ranks.values())


def test_forks_under_gpuprof_run_are_children_of_their_own(store_dir, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    rc = main(["run", "--store", str(store_dir), "--source", "sim", "--interval", "0.05", "-n", "forks", "--",
               sys.executable, str(SCRIPT), "--forks", str(FORKS)])
    exp = Store(store_dir).load("forks")
    assert rc == 0 and exp.status == "ok", (exp.meta.error, exp.meta.notes)
    ranks = exp.meta.context["ranks"]
    parent = ranks["0"]
    assert parent["steps"] == 100 and exp.summary["steps"]["count"] == 100, ranks  # the fork's steps are not its
    forks = {key: info for key, info in ranks.items() if key != "0"}
    assert _fork_ranks(forks) == [5] + [7] * FORKS, ranks  # the DataLoader workers: none
    assert {info["pid"] for info in forks.values()}.isdisjoint({parent["pid"]})
    assert {info["forked_from"] for info in forks.values()} == {parent["pid"]}
    assert not [n for n in exp.meta.notes if any(t in n for t in TROUBLE)], exp.meta.notes


def test_forks_inside_a_profiled_block_report_and_never_end_its_run(store_dir):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, str(SCRIPT), "--forks", str(FORKS), "--profile", str(store_dir)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    exp = Store(store_dir).load("forks-in-a-cell")
    assert exp.status == "ok" and exp.summary["steps"]["count"] == 100, (exp.meta.error, exp.meta.notes)
    ranks = exp.meta.context["ranks"]
    assert _fork_ranks(ranks) == [5] + [7] * FORKS, ranks
    assert not [n for n in exp.meta.notes if any(t in n for t in TROUBLE)], exp.meta.notes
    assert len(Store(store_dir).list()) == 1  # no fork saved a run of its own
