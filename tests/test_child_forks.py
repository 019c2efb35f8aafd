"""Forks of a profiled process (``runtime/jobs/child.py``): a script that forks while it
trains, under ``gpuprof run`` and inside ``gp.profile`` (a profiled cell). Each fork that steps
is a child of its own; DataLoader workers stay silent; nothing hangs, nothing is counted twice,
the parent's connection is never written by a fork."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuprof_jupyter.cli import main
from gpuprof_jupyter.core.store.directory import Store

SCRIPT = Path(__file__).resolve().parent / "data" / "scripts" / "train_forks.py"
FORKS = 12  # often enough that a fork lands while the sender thread holds its lock
TROUBLE = ("without saying goodbye", "could not be read", "could not reach", "unprofiled", "did not end")


def _fork_ranks(ranks: dict) -> list[int]:
    return sorted(info["steps"] for info in ranks.values())


@pytest.mark.process
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
    from gpuprof_jupyter.core.analysis.diagnosis import diagnose

    assert not {"straggler-rank", "ranks-waiting"} & {f.id for f in diagnose(exp)}  # forks are no peers
    assert all("sync_wait_p50_s" not in figures for key, figures in exp.summary["ranks"].items() if key != "0")
    assert not [n for n in exp.meta.notes if any(t in n for t in TROUBLE)], exp.meta.notes


@pytest.mark.process
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


HELD_LOCK_FORK = """
import os, sys, time
import gpuprof_jupyter as gp
from gpuprof_jupyter.runtime.jobs import child

for _ in range(4):
    gp.step()
run = child._run
run.send_events()  # connected: the fork inherits a live connection
assert run._sock is not None
run._lock.acquire()  # as if the sender thread were mid-send at the fork
pid = os.fork()
if pid == 0:
    for _ in range(3):
        gp.step()
    sys.exit(0)
deadline = time.monotonic() + 60
while os.waitpid(pid, os.WNOHANG) == (0, 0):
    if time.monotonic() > deadline:
        os.kill(pid, 9)
        sys.exit("the fork hung at its exit")
    time.sleep(0.05)
run._lock.release()
for _ in range(4):
    gp.step()
"""


@pytest.mark.process
def test_a_fork_made_while_the_sender_holds_its_lock_exits_and_reports_on_its_own_connection():
    import time

    from gpuprof_jupyter.runtime.jobs.children_listener import ChildListener

    listener = ChildListener(time.monotonic(), time.time()).start()
    try:
        done = subprocess.run([sys.executable, "-c", HELD_LOCK_FORK], env={**os.environ, **listener.environ()},
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        listener.close()
        steps = {child.rank: len(child.activity.steps) for child in listener.children}
        assert steps == {0: 8, 1: 3}, (steps, listener.notes)
        assert listener.children[1].hello["forked_from"] == listener.children[0].hello["pid"]
        assert not [n for n in listener.notes if any(t in n for t in TROUBLE)], listener.notes
    finally:
        listener.close(timeout=0)
        listener.remove_files()
