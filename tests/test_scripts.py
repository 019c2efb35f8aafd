"""Issue 20: zero-code in every Python process of a profiled job. Unmodified scripts under
``gpuprof run`` (a plain one, a two-rank DDP job under torchrun on gloo), and the children a
profiled cell starts with ``torch.multiprocessing.spawn``. CPU only; tiny models, few steps."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuprof_jupyter.cli import gate_status, main
from gpuprof_jupyter.core.analysis.rules import RuleResult
from gpuprof_jupyter.core.store.directory import Store

SCRIPTS = Path(__file__).resolve().parent / "data" / "scripts"
GATE = "sm_util > 60 for >=80% per step"


def _torchrun(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
            "--monitor-interval", "0.1", str(SCRIPTS / "train_ddp.py"), *args]


def _run(store_dir, name: str, *command: str) -> int:
    return main(["run", "--store", str(store_dir), "--source", "sim", "--interval", "0.05", "-n", name,
                 "--check", GATE, "--", *command])


@pytest.fixture(autouse=True)
def _one_thread(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # 2 shared cores: ranks must not fight for threads


@pytest.mark.process
def test_plain_script_gets_steps_loader_settings_and_the_per_step_gate(store_dir, tmp_path, monkeypatch, capsys):
    marker = tmp_path / "own-sitecustomize-ran"
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(SCRIPTS / "own_site"), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("OWN_SITECUSTOMIZE_MARKER", str(marker))
    rc = _run(store_dir, "nightly", sys.executable, str(SCRIPTS / "train_plain.py"), "--steps", "6", "--workers", "2")
    out = capsys.readouterr().out
    exp = Store(store_dir).load("nightly")
    steps = exp.summary["steps"]
    assert steps["count"] == 6 and steps["batches"] == 6 and steps["samples"] == 24, steps
    assert 0 < steps["data_wait_frac"] < 0.9  # measured; the first batch waits for the workers to start
    p = exp.meta.params
    assert (p["batch_size"], p["num_workers"], p["optimizer"], p["dataset"]) == (4, 2, "SGD", "TensorDataset")
    assert exp.meta.context["torch_filled"] == ["prefetch_factor"]
    assert list(exp.meta.context["ranks"]) == ["0"] and "ranks" not in exp.summary  # its DataLoader workers: none
    assert exp.meta.context["steps_from"] == "optimizer"
    check, = exp.meta.checks  # how the verdict is judged, never the simulated run's luck
    result = RuleResult.from_dict(check)
    assert check["kind"] == "step-share" and result.simulated, check
    if result.judged:  # steps at least one sample interval long: a per-step verdict, labelled simulated
        assert "of 6 steps" in check["detail"] and f"{result.verdict} (simulated) {GATE}" in out, check
    else:  # shorter steps: CANNOT JUDGE, never a pass
        assert "shorter than" in check["detail"] and exp.summary["steps"]["step_time_p50_s"] < 0.05, check
        assert f"CANNOT JUDGE (simulated) {GATE}" in out
    assert rc == gate_status([result]) and "trained 6 steps" not in out  # the script's output is its own
    assert marker.read_text().strip(), "the user's own sitecustomize did not run"


@pytest.mark.process
def test_torchrun_ddp_ranks_bitwise_and_a_straggler(store_dir, tmp_path, capsys):
    plain = subprocess.run(_torchrun("--slow-rank", "1", "--out", str(tmp_path / "plain")), capture_output=True,
                           text=True, timeout=240)
    assert plain.returncode == 0, plain.stderr[-2000:]
    rc = main(["run", "--store", str(store_dir), "--source", "sim", "--interval", "0.05", "-n", "ddp", "--check", GATE,
               "--trace", "steps=2:4", "--trace-ranks", "all", "--",
               *_torchrun("--slow-rank", "1", "--out", str(tmp_path / "profiled"))])
    exp = Store(store_dir).load("ddp")
    assert exp.status == "ok", (exp.meta.error, exp.meta.notes)
    ranks = exp.rank_steps()
    assert sorted(ranks) == [0, 1] and [len(ranks[r]) for r in (0, 1)] == [6, 6]
    for rank in (0, 1):
        profiled = (tmp_path / f"profiled.rank{rank}").read_bytes()
        assert profiled == (tmp_path / f"plain.rank{rank}").read_bytes(), f"rank {rank} trained differently"
    info = exp.meta.context["ranks"]
    assert [info[r]["world_size"] for r in ("0", "1")] == [2, 2] and info["1"]["device"] == "cpu"
    assert "job" not in exp.meta.context  # torchrun's random run id on one node: no multi-node job (issue 38)
    assert info["0"]["params"]["batch_size"] == 4
    from gpuprof_jupyter.core.analysis.diagnosis import diagnose

    findings = {f.id: f for f in diagnose(exp)}
    straggler = findings["straggler-rank"]
    assert (straggler.numbers["rank"], straggler.numbers["cause"]) == (1, "data"), straggler
    assert findings["ranks-waiting"].numbers["ranks"] == [0]
    ranks = exp.summary["ranks"]
    assert ranks["1"]["wait_p50_s"] > 0.15 > ranks["0"]["wait_p50_s"]
    out = capsys.readouterr().out  # the summary, the comparison and the report have per-rank rows
    assert "rank: rank 1; steps: 6" in out and "Rank 1 is the straggler: its data loading" in out
    assert main(["compare", "--store", str(store_dir)]) == 0
    assert "ranks: experiment: ddp; rank: rank 1; steps: 6" in capsys.readouterr().out
    assert main(["report", "--store", str(store_dir), "-o", str(tmp_path / "report.html")]) == 0
    assert "waiting for other ranks p50" in (tmp_path / "report.html").read_text()
    traces = exp.rank_traces()  # --trace per rank, one track group per rank in the merged trace
    assert sorted(traces) == [0, 1] and exp.meta.trace["ranks"]["1"]["steps"] == 2
    assert main(["trace", "ddp", "--store", str(store_dir), "-o", str(tmp_path / "merged.json")]) == 0
    merged = json.loads((tmp_path / "merged.json").read_text())["traceEvents"]
    groups = {e["pid"]: e["args"]["name"] for e in merged if e.get("name") == "process_name" and e["args"]["name"].startswith("rank")}
    assert sorted(groups.values()) == ["rank 0", "rank 1"]
    assert all(any(e["pid"] == pid and e.get("ph") == "X" for e in merged) for pid in groups)
    check, = exp.meta.checks  # how the verdict is judged, never the simulated run's luck
    assert check["detail"].startswith("judged per rank") and "rank 0: " in check["detail"] and "rank 1: " in check["detail"]
    assert rc == gate_status([RuleResult.from_dict(check)]), (rc, check)


@pytest.mark.process
def test_a_crashing_rank_sets_error_names_it_and_keeps_the_exit_code(store_dir, capsys):
    rc = _run(store_dir, "crash", *_torchrun("--crash-rank", "1"))
    exp = Store(store_dir).load("crash")
    assert rc == 1 and exp.status == "error"
    assert "rank 1 failed: RuntimeError: planted crash on rank 1" in exp.meta.error, exp.meta.error


@pytest.mark.process
def test_children_of_a_profiled_cell_started_with_torch_multiprocessing_spawn(store_dir, monkeypatch):
    import torch.multiprocessing as mp

    import gpuprof_jupyter as gp

    monkeypatch.syspath_prepend(str(SCRIPTS))  # spawn children get the parent's sys.path
    import spawn_worker

    with gp.profile("spawned", source="sim", store=store_dir, interval=0.05) as p:
        mp.spawn(spawn_worker.train, nprocs=2)
    exp = p.experiment
    assert {rank: len(frame) for rank, frame in exp.rank_steps().items()} == {0: 3, 1: 4}
    info = exp.meta.context["ranks"]
    assert (info["0"]["steps_from"], info["1"]["steps_from"]) == ("optimizer", "step()")
    assert {"loss_0", "loss_1"} <= set(exp.meta.user_metrics)
    assert {ph["name"] for ph in exp.meta.phases} >= {"rank 0: train-0", "rank 1: train-1"}
    assert "GPUPROF_CHILD_CHANNEL" not in os.environ  # the cell's environment is as it was


@pytest.mark.process
def test_a_script_with_its_own_profile_still_saves_it(store_dir, tmp_path, capsys):
    script = tmp_path / "own_profile.py"
    script.write_text(
        "import sys, gpuprof_jupyter as gp\n"
        "with gp.profile('inner', source='sim', store=sys.argv[1], interval=0.05):\n"
        "    for _ in range(3):\n"
        "        gp.step()\n"
        "gp.step()\n"  # after it: the run's
    )
    assert main(["run", "--store", str(store_dir), "--source", "sim", "-n", "outer", "--", sys.executable,
                 str(script), str(store_dir)]) == 0
    store = Store(store_dir)
    assert store.load("inner").summary["steps"]["count"] == 3
    assert store.load("outer").summary["steps"]["count"] == 1


def test_events_travel_packed_and_come_back_the_same():
    from gpuprof_jupyter.core.child_channel import EVENTS, encode, pack_events, parse

    events = [(5, 1.5, 140234234234234), (3, 2.0, None), (3, 2.5, -1), (1, 3.0, 8.5), (3, 4.0, 8)]
    assert parse(encode(EVENTS, **pack_events(events), as_of=4.0)).events == events
    assert parse(encode(EVENTS, **pack_events([]), as_of=4.0)).events == []


@pytest.mark.process
def test_children_forked_by_a_profiled_cell_report_too(store_dir, monkeypatch):
    """accelerate.notebook_launcher forks its processes (torch's start_processes with fork)."""
    import torch.multiprocessing as mp

    import gpuprof_jupyter as gp

    monkeypatch.syspath_prepend(str(SCRIPTS))
    import spawn_worker

    with gp.profile("forked", source="sim", store=store_dir, interval=0.05) as p:
        mp.start_processes(spawn_worker.train, nprocs=2, start_method="fork")
    exp = p.experiment
    assert sorted(len(frame) for frame in exp.rank_steps().values()) == [3, 4]
    assert {"loss_0", "loss_1"} <= set(exp.meta.user_metrics)


@pytest.mark.process
def test_a_child_that_cannot_connect_runs_unprofiled_with_one_note():
    import time

    from gpuprof_jupyter.runtime.jobs.children_listener import ChildListener

    listener = ChildListener(time.monotonic(), time.time())  # never started: nothing listens
    code = "import gpuprof_jupyter as gp\nfor _ in range(3):\n    gp.step()\nprint('done')"
    try:
        for _ in range(2):
            child = subprocess.run([sys.executable, "-c", code], env={**os.environ, **listener.environ()},
                                   capture_output=True, text=True, timeout=120)
            assert child.returncode == 0 and child.stdout == "done\n", child.stderr
        listener.close(timeout=0)
        note, = listener.notes
        assert note.startswith("gpuprof: 2 child process(es) could not reach the run and ran unprofiled (pid ")
        assert "could not connect to the run" in note
    finally:
        listener.remove_files()


@pytest.mark.process
def test_trace_ranks_selects_a_child_of_torch_multiprocessing_spawn_without_rank(store_dir, monkeypatch):
    """No RANK in the children: each one's rank is spawn's process index, for the run's ranks
    and for ``--trace-ranks`` alike, so ``--trace-ranks 1`` traces child 1 and only it."""
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    main(["run", "--store", str(store_dir), "--source", "sim", "--interval", "0.05", "-n", "spawned-trace",
          "--trace", "steps=1:3", "--trace-ranks", "1", "--", sys.executable, str(SCRIPTS / "spawn_script.py")])
    exp = Store(store_dir).load("spawned-trace")
    assert exp.status == "ok", (exp.meta.error, exp.meta.notes)
    assert {rank: len(frame) for rank, frame in exp.rank_steps().items()} == {0: 3, 1: 4}
    assert list(exp.meta.trace.get("ranks") or {}) == ["1"], (exp.meta.trace, exp.meta.notes)
    assert sorted(exp.rank_traces()) == [1] and exp.meta.trace["ranks"]["1"]["steps"] == 2
