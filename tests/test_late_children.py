"""Late children (runtime/jobs/child.py, runtime/jobs/children_listener.py): a child that starts before
the run's end has its steps kept or noted. Its first message goes out at once (not after a send
interval), and the listener reads the connections still pending when the run ends."""

from __future__ import annotations

import json
import multiprocessing
import os
import socket
import time

import pytest

from gpuprof_jupyter.core.child_channel import EVENTS, HELLO, encode, pack_events
from gpuprof_jupyter.runtime.jobs import child as child_module
from gpuprof_jupyter.runtime.jobs import children_listener as children_module
from gpuprof_jupyter.runtime.jobs.children_listener import ChildListener
from gpuprof_jupyter.runtime.record.events import STEP

CHILDREN, STEPS, LATE = 5, 5, 4


def _train(index: int, folder: str) -> None:
    """A fork child: 5 steps, their times written down; the last child then sleeps 4 s."""
    import gpuprof_jupyter as gp

    times = []
    for _ in range(STEPS):
        gp.step()
        times.append(time.monotonic())
    with open(os.path.join(folder, f"child-{index}.json"), "w", encoding="utf-8") as f:
        json.dump({"pid": os.getpid(), "times": times}, f)
    if index == LATE:
        time.sleep(4.0)


@pytest.mark.process
def test_five_fork_children_and_a_late_one_lose_no_step_without_a_note(store_dir, tmp_path):
    import gpuprof_jupyter as gp

    fork = multiprocessing.get_context("fork")
    with gp.profile("late-children", source="sim", store=store_dir, interval=0.05) as p:
        processes = [fork.Process(target=_train, args=(i, str(tmp_path))) for i in range(CHILDREN)]
        for process in processes:
            process.start()
        time.sleep(0.3)
        inside = time.monotonic()  # every step before this is inside the run
    try:
        exp = p.experiment
        ranks = {entry["pid"]: entry for entry in exp.meta.context.get("ranks", {}).values()}
        for i in range(CHILDREN):
            path = tmp_path / f"child-{i}.json"
            deadline = time.monotonic() + 60
            while not path.exists():
                assert time.monotonic() < deadline, f"child {i} never trained"
                time.sleep(0.05)
            said = json.loads(path.read_text())
            before_end = sum(t <= inside for t in said["times"])
            kept = ranks.get(said["pid"], {}).get("steps", 0)
            noted = [n for n in exp.meta.notes if f"pid {said['pid']}" in n]
            assert kept >= before_end or noted, (i, said, kept, exp.meta.context.get("ranks"), exp.meta.notes)
    finally:
        for process in processes:
            process.join(10)
            if process.is_alive():
                process.kill()
                process.join()


def test_a_childs_first_message_goes_out_at_once(monkeypatch):
    """Its first send waits for no send interval: a run may end within one."""
    monkeypatch.setattr(child_module, "SEND_INTERVAL_S", 3600.0)
    listener = ChildListener(time.monotonic(), time.time()).start()
    run = child_module.ChildRun(listener.path, listener.notes_path, listener.t0)
    try:
        run._start_sender()
        run.activity.step()
        deadline = time.monotonic() + 60
        while not (listener.children and listener.children[0].activity.steps):
            assert time.monotonic() < deadline, "the first step never arrived"
            time.sleep(0.01)
    finally:
        run._stop.set()
        listener.close(timeout=0)
        listener.remove_files()


def test_connections_pending_when_the_run_ends_are_read(monkeypatch):
    """Children that connected just before the end, not accepted yet (the accepting thread is
    behind until the run ends): their steps count."""
    listener = ChildListener(time.monotonic(), time.time()).start()
    real_peer_pid = children_module._peer_pid

    def behind(conn):
        while not listener.closed:
            time.sleep(0.005)
        return real_peer_pid(conn)

    monkeypatch.setattr(children_module, "_peer_pid", behind)
    try:
        for rank in range(3):
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.connect(listener.path)
                now = time.monotonic()  # before the run's end
                sock.sendall(encode(HELLO, pid=os.getpid(), rank=rank)
                             + encode(EVENTS, **pack_events([(STEP, now, None)]), as_of=now))
        listener.close(timeout=5)
        assert sorted(c.rank for c in listener.children) == [0, 1, 2], listener.notes
        assert all(len(c.activity.steps) == 1 for c in listener.children), [(c.rank, len(c.activity.steps), c.late_events, c.dropped, c.bad_events) for c in listener.children]
    finally:
        listener.close(timeout=0)
        listener.remove_files()
