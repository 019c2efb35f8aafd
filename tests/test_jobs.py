"""Issue 38: jobs across hosts. A job's identity from its launcher (torchrun, Slurm), each node's
part written by its own agent, the parts read as one experiment (``core/job.py``) on one clock
(``core/analysis/clock.py``), and the findings that only a job has (a slow node, missing ranks).
Parts are written straight into a store here (``tests/jobparts.py``); the launchers themselves
run in the ``process`` tests at the end (two torchrun agents on one machine; Slurm's tasks as
``srun`` starts them)."""

from __future__ import annotations

import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests import jobparts
import gpuprof_jupyter as gp
from gpuprof_jupyter import api
from gpuprof_jupyter.cli import main
from gpuprof_jupyter.core.child_channel import EVENTS, FINAL, HELLO, encode, identity, pack_events
from gpuprof_jupyter.core.job import load_job
from gpuprof_jupyter.core.job_identity import agent_job, rank_identity
from gpuprof_jupyter.core.store.directory import Store
from gpuprof_jupyter.core.store.experiment import ExperimentMeta
from gpuprof_jupyter.core.store.index import INDEX_NAME

SCRIPTS = Path(__file__).resolve().parent / "data" / "scripts"
TORCHRUN = ["python", "-m", "torch.distributed.run"]


def _two_nodes(store, job="ft-0412", skew_s=0.0, waits=None, world=4, **kw):
    jobparts.write_part(store, job, host="node-a", node=0, ranks=[0, 1], world=world, waits=waits, **kw)
    return jobparts.write_part(store, job, host="node-b", node=1, ranks=[2, 3], world=world, waits=waits,
                               skew_s=skew_s, **kw)


# -- 1. identity ---------------------------------------------------------------------------------
def test_job_identity_from_torchrun_and_slurm():
    command = [*TORCHRUN, "--nnodes", "1:2", "--node-rank=1", "--rdzv-id", "ft-0412", "train.py", "--rdzv-id", "x"]
    job = agent_job({"GPUPROF_HOST": "node-b"}, command)
    assert (job["id"], job["key"], job["launcher"], job["node_rank"], job["part"], job["parts"], job["host"]) == \
        ("ft-0412", "ft-0412", "torchrun", 1, 1, 2, "node-b")
    assert agent_job({}, ["torchrun", "--rdzv-id", "none", "t.py"]) is None  # torchrun's default is no id
    assert agent_job({}, ["python", "train.py"]) is None
    slurm = {"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_NODEID": "1", "SLURM_PROCID": "3",
             "SLURM_NTASKS": "4", "SLURM_LOCALID": "1"}
    job = agent_job(slurm, ["python", "train.py"])
    assert (job["key"], job["launcher"], job["node_rank"], job["part"], job["parts"]) == ("4242.0", "slurm", 1, 3, 4)
    ranked = {"TORCHELASTIC_RUN_ID": "none", "GROUP_RANK": "1", "TORCHELASTIC_RESTART_COUNT": "2", **slurm}
    assert rank_identity(ranked) | {"host": None} == {"host": None, "node_rank": 1, "restart_count": 2,
                                                       "job": "4242.0", "launcher": "slurm"}  # "none" is no id
    one_node = {"TORCHELASTIC_RUN_ID": "f7ca8c26-1e08-4e09-be81-12cea0f47382", "GROUP_WORLD_SIZE": "1"}
    assert rank_identity(one_node)["job"] is None  # torchrun's random id for a run on one node: no job
    assert rank_identity({**one_node, "GROUP_WORLD_SIZE": "2"})["job"] == one_node["TORCHELASTIC_RUN_ID"]
    assert agent_job({"SLURM_JOB_ID": "9", "SLURM_NTASKS": "1"}, ["python", "train.py"]) is None  # one task
    hello = identity(slurm)  # a rank started by srun whose script set no RANK: Slurm's numbers
    assert (hello["rank"], hello["local_rank"], hello["world_size"], hello["node_rank"]) == (3, 1, 4, 1)


def test_a_ray_train_worker_takes_its_job_and_ranks_from_rays_context(monkeypatch):
    from types import SimpleNamespace

    from gpuprof_jupyter.runtime.jobs.ray_train import ray_train_identity

    assert ray_train_identity() == {} or "ray.train" in sys.modules  # no Ray imported: nothing added
    context = SimpleNamespace(get_experiment_name=lambda: "ray-ft", get_world_rank=lambda: 5, get_local_rank=lambda: 1,
                              get_world_size=lambda: 8, get_node_rank=lambda: 2)
    monkeypatch.setitem(sys.modules, "ray.train", SimpleNamespace(get_context=lambda: context))
    assert ray_train_identity() == {"job": "ray-ft", "launcher": "ray", "rank": 5, "local_rank": 1, "world_size": 8,
                                    "node_rank": 2}

    def no_session():
        raise RuntimeError("not in a training session")
    monkeypatch.setitem(sys.modules, "ray.train", SimpleNamespace(get_context=no_session))
    assert ray_train_identity() == {}


def test_an_elastic_restart_is_a_new_attempt_of_the_same_rank():
    from gpuprof_jupyter.runtime.hooks.activity import ActivityLog
    from gpuprof_jupyter.runtime.jobs.children_listener import ChildListener
    from gpuprof_jupyter.runtime.jobs.children_merge import merge_children
    from gpuprof_jupyter.runtime.record.events import STEP

    listener = ChildListener(time.monotonic(), time.time()).start()
    try:
        for restart, steps in ((0, 3), (1, 5)):  # torchrun restarted its workers: RANK 1 again, next count
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.connect(listener.path)
                t = time.monotonic()
                sock.sendall(encode(HELLO, pid=os.getpid(), rank=1, world_size=2, host="node-a", node_rank=0,
                                    restart_count=restart, job="ft")
                             + encode(EVENTS, **pack_events([(STEP, t + i * 0.001, None) for i in range(steps)]),
                                      as_of=t + 0.01) + encode(FINAL))
            deadline = time.monotonic() + 60
            while not (len(listener.children) == restart + 1 and listener.children[-1].closed):
                assert time.monotonic() < deadline
                time.sleep(0.01)
    finally:
        listener.close(timeout=0)
        listener.remove_files()
    assert [c.rank for c in listener.children] == [1, 1]  # not a second rank 2
    meta = ExperimentMeta(id="x", name="x", context={"job": {"id": "ft", "key": "ft", "launcher": "torchrun"}})
    merge_children(listener, meta, ActivityLog(0.0), [], None)
    info = meta.context["ranks"]
    assert list(info) == ["1"] and info["1"]["attempts"] == 2 and info["1"]["restart_count"] == 1, info
    assert info["1"]["steps"] == 8 and info["1"]["host"] == "node-a"
    assert meta.context["job"]["restart_count"] == 1 and meta.context["job"]["node_rank"] == 0


# -- 2. the job as one experiment -----------------------------------------------------------------
def test_a_job_is_one_experiment_keyed_by_global_rank_with_hosts(store_dir, tmp_path, capsys):
    store = Store(store_dir)
    _two_nodes(store, waits={3: 0.05})
    job = api.load("ft-0412", store_dir)
    assert job.id == "ft-0412" and job.status == "ok"
    ranks = job.summary["ranks"]
    assert {r: (f["host"], f["node_rank"]) for r, f in ranks.items()} == {
        "0": ("node-a", 0), "1": ("node-a", 0), "2": ("node-b", 1), "3": ("node-b", 1)}
    frames = job.rank_steps()
    assert sorted(frames) == [0, 1, 2, 3] and {"rank", "host"} <= set(frames[3].columns)
    assert set(frames[3]["host"]) == {"node-b"} and set(frames[3]["rank"]) == {3}
    assert [p["host"] for p in job.meta.context["job"]["parts"]] == ["node-a", "node-b"]
    straggler = next(f for f in api.diagnose(job) if f.id == "straggler-rank")
    assert (straggler.numbers["rank"], straggler.numbers["host"]) == (3, "node-b")
    assert straggler.title.startswith("Rank 3 on node-b is the straggler")
    # everything that takes an experiment takes the job
    assert main(["check", "ft-0412", "--store", str(store_dir), "--rule", "data_wait_frac < 50%"]) == 0
    assert main(["report", "ft-0412", "--store", str(store_dir), "-o", str(tmp_path / "r.html")]) == 0
    assert "node-b" in (tmp_path / "r.html").read_text()
    assert main(["compare", "ft-0412", "ft-0412", "--store", str(store_dir)]) == 0
    assert main(["export", "ft-0412", "--store", str(store_dir), "--path", str(tmp_path / "p.yaml")]) == 0
    assert main(["list", "--store", str(store_dir)]) == 0
    out = capsys.readouterr().out
    assert "Rank 3 on node-b is the straggler" in out
    from gpuprof_jupyter.render.summary_html import render_summary_text

    text = render_summary_text(job)
    assert "job: ft-0412 (torchrun): 2 of 2 parts (node-a, node-b)" in text and "rank: rank 3 on node-b; steps: 20" in text
    listed = out.split("store ")[-1].splitlines()
    assert "1 experiment" in listed[0] and "ft-0412" in listed[2] and "2/2" in listed[2], listed


def test_check_judges_the_job_with_every_parts_rules_per_rank_naming_host_and_rank(store_dir, capsys):
    from gpuprof_jupyter.core.analysis.rules import evaluate_rule

    store = Store(store_dir)
    for node, rule in ((0, "steps >= 8"), (1, "sm_util > 60 for >=80% per step")):  # each node's own --check
        meta = jobparts.write_part(store, "ft", host=f"node-{'ab'[node]}", node=node, ranks=[2 * node, 2 * node + 1],
                                   world=4)
        meta.checks = [evaluate_rule(store.load(meta.id), rule).to_dict()]
        store.save_meta(meta)
    results = api.check("ft", store=store_dir)  # the job's gate: both parts' rules, judged on the whole job
    assert [r.rule for r in results] == ["steps >= 8", "sm_util > 60 for >=80% per step"]
    assert results[0].passed and not results[1].judged
    assert "rank 0 on node-a" in results[1].detail and "rank 3 on node-b" in results[1].detail, results[1].detail
    assert main(["check", "ft", "--store", str(store_dir)]) != 0  # node-b's rule counts, not only the first part's
    out = capsys.readouterr().out
    assert "steps >= 8" in out and "cannot judge rank 0 on node-a, rank 1 on node-a, rank 2 on node-b" in out, out


def test_a_gpu_is_named_by_its_host(store_dir):
    import pandas as pd

    store = Store(store_dir)
    metas = [jobparts.write_part(store, "g", host=h, node=n, ranks=[n], world=2) for n, h in enumerate(("a", "b"))]
    for meta in metas:  # each part sampled its own gpu0; rank n trained on it
        meta.devices = [{"key": "gpu0", "kind": "gpu", "index": 0, "name": "Simulated"}]
        meta.context["ranks"][str(meta.context["job"]["node_rank"])].update(device="cuda:0", cuda_visible_devices=None)
        store.save_meta(meta)
    job = api.load("g", store_dir)
    assert [d["key"] for d in job.meta.gpu_devices] == ["a/gpu0", "b/gpu0"]
    assert {r: f["gpu"] for r, f in job.summary["ranks"].items()} == {"0": "a/gpu0", "1": "b/gpu0"}
    assert isinstance(job.samples, pd.DataFrame)


def test_slurm_job_loads_by_id_or_by_step(store_dir):
    store = Store(store_dir)
    for step in ("0", "1"):
        for n in (0, 1):
            jobparts.write_part(store, "4242", host=f"n{n}", node=n, ranks=[n], world=2, launcher="slurm", step=step,
                              start_s=60.0 * int(step))
    assert api.load("4242.0", store_dir).meta.context["job"]["key"] == "4242.0"
    latest = api.load("4242", store_dir)  # without its step: the latest step
    assert latest.id == "4242.1" and sorted(latest.rank_steps()) == [0, 1]


def test_copying_each_nodes_store_folder_into_one_store_gives_the_same_job(tmp_path):
    node_a, node_b, shared = tmp_path / "a", tmp_path / "b", tmp_path / "shared"
    jobparts.write_part(Store(node_a), "ft", host="node-a", node=0, ranks=[0, 1], world=4)
    jobparts.write_part(Store(node_b), "ft", host="node-b", node=1, ranks=[2, 3], world=4, skew_s=1.0)
    api.experiments(node_a), api.experiments(node_b)  # each has its own index: never copied over the other
    for node in (node_a, node_b):
        shutil.copytree(node, shared, dirs_exist_ok=True, ignore=shutil.ignore_patterns(".*"))
    copied = api.load("ft", shared)
    together = tmp_path / "together"
    _two_nodes(Store(together), job="ft", skew_s=1.0)
    written = api.load("ft", together)
    assert copied.meta.context["job"]["missing_ranks"] == [] and sorted(copied.rank_steps()) == [0, 1, 2, 3]
    for rank, frame in copied.rank_steps().items():
        assert frame["t_end_s"].round(6).tolist() == written.rank_steps()[rank]["t_end_s"].round(6).tolist()
    assert copied.summary["ranks"] == written.summary["ranks"]


def test_two_writer_processes_on_one_store_corrupt_neither_the_index_nor_each_other(store_dir):
    writers = [subprocess.Popen([sys.executable, str(Path(jobparts.__file__)), str(store_dir), "job", str(part), "6"])
               for part in (0, 1)]
    assert [w.wait(timeout=300) for w in writers] == [0, 0]
    store = Store(store_dir)
    entries = store.entries()
    assert len(entries) == 12 and not store.problems
    for i in range(6):
        job = api.load(f"job-{i}", store_dir)
        assert [p["host"] for p in job.meta.context["job"]["parts"]] == ["node0", "node1"]
        assert sorted(job.rank_steps()) == [0, 1, 2, 3] and all(len(f) == 5 for f in job.rank_steps().values())
    with sqlite3.connect(Path(store_dir) / INDEX_NAME) as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        assert db.execute("SELECT count(*) FROM entries WHERE job IS NOT NULL").fetchone() == (12,)


def test_a_part_is_created_without_the_stores_lock_or_its_index(store_dir):
    store = Store(store_dir)
    with store.locked():  # held by another process, or a network file system without flock
        meta = jobparts.write_part(store, "ft", host="node-a", node=0, ranks=[0], world=1)
    assert (Path(store_dir) / meta.id / "meta.json").is_file() and not (Path(store_dir) / INDEX_NAME).exists()


# -- 3. one clock ----------------------------------------------------------------------------------
def test_a_node_whose_clock_is_2_5_s_ahead_is_put_back_within_50_ms(store_dir):
    _two_nodes(Store(store_dir), skew_s=2.5)
    job = api.load("ft-0412", store_dir)
    node_b = job.meta.context["job"]["parts"][1]["clock"]
    assert abs(node_b["offset_s"] - 2.5) < 0.05 and 0 <= node_b["error_s"] < 0.05, node_b
    ends = {rank: frame["t_end_s"].to_numpy() for rank, frame in job.rank_steps().items()}
    assert max(abs(ends[3] - ends[0])) < 0.05  # one timeline: the shared step ends line up again
    assert job.summary["job"]["clock"]["error_s"] == node_b["error_s"]
    from gpuprof_jupyter.render.summary_html import render_summary_text

    assert "clock offsets against node-a (estimated from the step ends all ranks share): node-b +2.5 s ± " \
        in render_summary_text(job)


def test_ranks_not_in_lockstep_keep_their_wall_clocks_and_say_so(store_dir):
    store = Store(store_dir)
    jobparts.write_part(store, "loose", host="a", node=0, ranks=[0], world=2)
    jobparts.write_part(store, "loose", host="b", node=1, ranks=[1], world=2, steps=8)
    meta = store.read_meta(store.entries()[-1].id)  # node b's steps: every other one 60 ms late
    import pyarrow as pa

    steps = api.load(meta.id, store_dir).all_steps
    steps.loc[::2, "t_end_s"] += 0.06
    store.save_steps(meta, pa.Table.from_pandas(steps, preserve_index=False))
    clock = api.load("loose", store_dir).meta.context["job"]["parts"][1]["clock"]
    assert clock["offset_s"] is None and "not in lockstep" in clock["basis"], clock


# -- 4. findings across hosts ------------------------------------------------------------------------
def test_a_slow_node_is_told_apart_from_a_slow_rank(store_dir):
    _two_nodes(Store(store_dir), waits={2: 0.05, 3: 0.05})
    findings = {f.id: f for f in api.diagnose("ft-0412", store_dir)}
    assert "straggler-rank" not in findings
    node = findings["slow-node"]
    assert node.numbers["host"] == "node-b" and node.numbers["ranks"] == [2, 3] and "node-b" in node.title


def test_a_rank_that_never_reported_is_named_missing(store_dir, capsys):
    store = Store(store_dir)
    jobparts.write_part(store, "ft", host="node-a", node=0, ranks=[0, 1], world=4)
    job = api.load("ft", store_dir)
    assert job.meta.context["job"]["missing_ranks"] == [2, 3] and job.meta.context["job"]["missing_parts"] == [1]
    missing = next(f for f in api.diagnose(job) if f.id == "ranks-missing")
    assert missing.numbers == {"ranks": [2, 3], "parts": [1]} and "rank 2, 3 of 4" in missing.evidence
    assert main(["list", "--store", str(store_dir)]) == 0
    assert "1/2 (missing: 1)" in capsys.readouterr().out
    frame = gp.experiments(store_dir)  # one row, as gpuprof list shows it
    assert list(frame["id"]) == ["ft"] and frame["parts"][0] == "1/2 (missing: 1)" and len(frame["part_ids"][0]) == 1


def test_a_part_still_running_is_listed_as_running(store_dir, capsys):
    store = Store(store_dir)
    jobparts.write_part(store, "ft", host="node-a", node=0, ranks=[0, 1], world=4)
    running = jobparts.write_part(store, "ft", host="node-b", node=1, ranks=[2, 3], world=4, status="running")
    running.pid, running.host = os.getpid(), socket.gethostname()  # its writer: alive
    store.save_meta(running)
    assert main(["list", "--store", str(store_dir)]) == 0
    line = capsys.readouterr().out.splitlines()[-1]
    assert "running" in line and "2/2 (running: node-b)" in line, line
    assert api.load("ft", store_dir).meta.context["job"]["running_parts"] == [running.id]
    jupyter_side = api.experiments(store_dir)
    assert len(jupyter_side) == 1 and jupyter_side["parts"][0] == "2/2 (running: node-b)"
    assert jupyter_side["status"][0] == "running"


# -- 7. many ranks -----------------------------------------------------------------------------------
def test_a_job_of_many_ranks_shows_a_distribution_and_the_outliers_not_every_rank(store_dir):
    from gpuprof_jupyter.render.ranks_table import MAX_RANK_ROWS, rank_rows
    from gpuprof_jupyter.render.summary_html import render_summary_text

    store = Store(store_dir)
    for node in range(4):  # 32 ranks; rank 21 (node 2) waits for data
        jobparts.write_part(store, "wide", host=f"n{node}", node=node, ranks=list(range(8 * node, 8 * node + 8)),
                            world=32, parts=4, steps=10, waits={21: 0.05})
    job = api.load("wide", store_dir)
    assert len(job.summary["ranks"]) == 32 > MAX_RANK_ROWS
    rows = rank_rows(job)
    assert rows[0]["rank"] == "all 32 ranks: min / median / max" and rows[0]["ended"] == "ok: 32"
    assert rows[1]["rank"] == "rank 21 on n2" and len(rows) <= 1 + 3 * 3  # the outliers, the slowest first
    text = render_summary_text(job)
    assert "(n0, n1, n2, n3)" in text and len([line for line in text.splitlines() if "rank: " in line]) == len(rows)
    waiting = next(f for f in api.diagnose(job) if f.id == "ranks-waiting")
    assert "and 23 more" in waiting.title  # 31 ranks wait for rank 21: named up to 8, the rest counted


# -- 5. live ----------------------------------------------------------------------------------------
def _watch_until_seen(store_dir, running, seen_when: str, monkeypatch, **kw) -> None:
    """``gp.watch("ft")`` while ``running`` (a part) runs; it ends once a refresh shows ``seen_when``."""
    store = Store(store_dir)
    running.pid, running.host = os.getpid(), socket.gethostname()  # its writer: alive
    store.save_meta(running)
    seen = threading.Event()

    def end_when_seen():
        seen.wait(60)
        running.status = "ok"
        store.save_meta(running)

    ender = threading.Thread(target=end_when_seen)
    ender.start()
    def spy(*args, **kw):  # the first refresh that shows it lets the job end
        print_(*args, **kw)
        if seen_when in str(args[0]):
            seen.set()

    import builtins

    print_ = builtins.print
    monkeypatch.setattr(builtins, "print", spy)
    try:
        gp.watch("ft", store_dir, every_s=0.01, timeout_s=120, **kw)
    finally:
        monkeypatch.undo()
        seen.set()
        ender.join()


def test_watch_shows_every_rank_until_the_job_ends(store_dir, capsys, monkeypatch):
    store = Store(store_dir)
    jobparts.write_part(store, "ft", host="node-a", node=0, ranks=[0, 1], world=4)
    running = jobparts.write_part(store, "ft", host="node-b", node=1, ranks=[2, 3], world=4, status="running",
                                  waits={3: 0.05})
    _watch_until_seen(store_dir, running, "[running]", monkeypatch)
    out = capsys.readouterr().out
    assert out.startswith("job ft: waiting") or out.startswith("job ft [running]")
    assert "job ft [running]: 2 of 2 parts (node-a, node-b), 1 still running" in out
    final = out.split("job ft [ok]")[-1]  # it ended with the job, showing the last figures
    assert "rank: 3; host: node-b; steps: 20; step time p50: 100 ms; data wait p50: 50 ms" in final


def test_watch_shows_each_nodes_gpus_through_prometheus_beside_the_ranks(store_dir, capsys, monkeypatch):
    from tests.prometheus_server import fake_prometheus

    store = Store(store_dir)
    jobparts.write_part(store, "ft", host="n1", node=0, ranks=[0, 1], world=4)  # n1: the fake's one GPU
    running = jobparts.write_part(store, "ft", host="node-b", node=1, ranks=[2, 3], world=4, status="running")
    with pytest.raises(ValueError, match="through Prometheus only"):
        gp.watch("ft", store_dir, source="nvml")
    with pytest.raises(ValueError, match="unreachable"):
        gp.watch("ft", store_dir, source=f"prometheus=http://127.0.0.1:{_free_port()}")
    from IPython.core.error import UsageError
    from IPython.core.interactiveshell import InteractiveShell

    from gpuprof_jupyter.notebook.magic import GpuProfileMagics

    shell = InteractiveShell.instance()
    shell.register_magics(GpuProfileMagics)
    try:
        with pytest.raises(UsageError, match="through Prometheus only"):  # %gpuprofile watch JOB_ID --source ...
            shell.run_line_magic("gpuprofile", f"watch ft --store {store_dir} --source nvml")
    finally:
        InteractiveShell.clear_instance()  # the watch below prints, as outside a notebook
    with fake_prometheus() as prometheus:
        _watch_until_seen(store_dir, running, "SM: 50 %", monkeypatch, source=f"prometheus={prometheus.url}")
    out = capsys.readouterr().out
    final = out.split("job ft [ok]")[-1]
    assert "rank: 1; host: n1; steps: 20;" in final and "its node's GPUs, SM: 50 % (simulated)" in final, final
    assert "rank: 2; host: node-b;" in final and "its node's GPUs, SM: no GPU on Prometheus" in final
    assert f"GPUs through Prometheus at {prometheus.url}" in final
    assert "node: n1; gpu: gpu0; SM: 50 % (simulated); power: n/a; memory used: 1.0 GiB (simulated)" in final


# -- 6. the launchers for real, on one machine --------------------------------------------------------
def _agent(store_dir, host: str, command: list[str], *, prefix=(), env=None) -> subprocess.Popen:
    return subprocess.Popen([*prefix, sys.executable, "-m", "gpuprof_jupyter.cli", "run", "--store", str(store_dir),
                             "--source", "sim:compute-bound:2", "--interval", "0.05", "-n", "ft", "--", *command],
                            env={**os.environ, "OMP_NUM_THREADS": "1", "GPUPROF_HOST": host, **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun_two_nodes(out: Path) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "2",
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{_free_port()}", "--rdzv-id", "ft-0412",
            "--monitor-interval", "0.1", str(SCRIPTS / "train_ddp.py"), "--slow-rank", "3", "--steps", "8",
            "--out", str(out)]


@pytest.mark.process
def test_two_torchrun_agents_one_job_one_clock_and_a_straggler_named_by_host(store_dir, tmp_path, capsys):
    faketime = shutil.which("faketime")
    if faketime is None:
        pytest.skip("Debian's faketime is missing (apt-get install faketime): it plants the +2.5 s clock skew")
    plain = _torchrun_two_nodes(tmp_path / "plain")  # the same job without the profiler: its weights
    nodes = [subprocess.Popen(plain, env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    outputs = [n.communicate(timeout=400)[0] for n in nodes]
    assert [n.returncode for n in nodes] == [0, 0], [o[-3000:] for o in outputs]
    command = _torchrun_two_nodes(tmp_path / "profiled")
    agents = [_agent(store_dir, "node-a", command),
              _agent(store_dir, "node-b", command, prefix=(faketime, "-f", "+2.5s"))]  # its clock 2.5 s ahead
    outputs = [a.communicate(timeout=400)[0] for a in agents]
    assert [a.returncode for a in agents] == [0, 0], [o[-3000:] for o in outputs]
    for rank in range(4):  # every rank of both nodes trained exactly as without the profiler
        assert (tmp_path / f"profiled.rank{rank}").read_bytes() == (tmp_path / f"plain.rank{rank}").read_bytes(), rank
    job = api.load("ft-0412", store_dir)
    parts = job.meta.context["job"]["parts"]
    assert sorted(p["node_rank"] for p in parts) == [0, 1] and job.meta.context["job"]["missing_ranks"] == []
    second = next(p for p in parts if p["node_rank"] == 1)  # the rendezvous, not the order, names the nodes
    ranks = job.summary["ranks"]
    assert sorted(ranks) == ["0", "1", "2", "3"] and ranks["3"]["node_rank"] == 1
    assert ranks["3"]["host"] == second["host"] and {ranks[r]["host"] for r in ranks} == {"node-a", "node-b"}
    offset = {p["host"]: p["clock"]["offset_s"] for p in parts}  # against whichever node drew node rank 0
    assert abs(offset["node-b"] - offset["node-a"] - 2.5) < 0.05, parts  # faketime's +2.5 s, found again
    assert max(p["clock"]["error_s"] for p in parts) < 0.05, parts
    straggler = next(f for f in api.diagnose(job) if f.id == "straggler-rank")
    assert (straggler.numbers["rank"], straggler.numbers["host"], straggler.numbers["cause"]) == \
        (3, second["host"], "data"), straggler
    assert {d["key"] for d in job.meta.gpu_devices} == {f"{h}/gpu{i}" for h in ("node-a", "node-b") for i in (0, 1)}
    assert main(["check", "ft-0412", "--store", str(store_dir), "--rule", "steps >= 8"]) == 0
    assert main(["list", "--store", str(store_dir)]) == 0
    assert "2/2" in capsys.readouterr().out.splitlines()[-1]


@pytest.mark.process
def test_slurm_tasks_as_srun_starts_them_one_agent_per_rank(store_dir):
    port = _free_port()
    agents = []
    for rank in (0, 1):  # what srun gives each task of `srun -N2 --ntasks-per-node=1 gpuprof run ...`
        slurm = {"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_PROCID": str(rank), "SLURM_LOCALID": "0",
                 "SLURM_NODEID": str(rank), "SLURM_NTASKS": "2", "SLURM_NNODES": "2",
                 "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        agents.append(_agent(store_dir, f"cn{rank + 1}", [sys.executable, str(SCRIPTS / "train_ddp.py"), "--slurm",
                                                          "--steps", "24", "--step-sleep", "0.15"], env=slurm))
    live = []  # what a reader on another host sees while the job runs: the parts write their steps

    def watching():
        while any(a.poll() is None for a in agents):
            job = load_job(Store(store_dir), "4242", live=True)
            if job is not None:
                live.append((job.status, sum(len(f) for f in job.rank_steps().values())))
            time.sleep(0.1)

    watcher = threading.Thread(target=watching)
    watcher.start()
    outputs = [a.communicate(timeout=400)[0] for a in agents]
    watcher.join()
    assert [a.returncode for a in agents] == [0, 0], [o[-3000:] for o in outputs]
    assert any(status == "running" and 0 < steps < 48 for status, steps in live), live
    for key in ("4242", "4242.0"):
        job = api.load(key, store_dir)
        assert job.id == "4242.0" and job.meta.context["job"]["launcher"] == "slurm"
        assert {r: (f["host"], f["node_rank"], f["count"]) for r, f in job.summary["ranks"].items()} == \
            {"0": ("cn1", 0, 24), "1": ("cn2", 1, 24)}


@pytest.mark.process
def test_ray_train_workers_are_a_jobs_ranks_without_a_code_change(store_dir):
    pytest.importorskip("ray.train.torch", reason="Ray Train is not installed (pip install 'ray[train]'): its test "
                        "starts a local Ray cluster with two CPU workers")
    agent = _agent(store_dir, "ray-head", [sys.executable, str(SCRIPTS / "train_ray.py"), "--name", "ray-ft",
                                           "--steps", "6"])
    output = agent.communicate(timeout=600)[0]
    assert agent.returncode == 0, output[-3000:]
    job = api.load("ray-ft", store_dir)  # the run's RunConfig name, read in each worker from Ray's context
    assert job.meta.context["job"]["launcher"] == "ray"
    assert {r: (f["host"], f["node_rank"], f["count"], f["ended"]) for r, f in job.summary["ranks"].items()} == \
        {"0": ("ray-head", 0, 3, "ok"), "1": ("ray-head", 0, 3, "ok")}  # 24 samples, a DistributedSampler, batches of 4
    # Ray kills its workers after shutdown(): each said goodbye there (runtime/jobs/ray_train.py), with its loader
    assert job.meta.params.get("batch_size") == 4 and not any("without saying goodbye" in n for n in job.meta.notes)
