"""The children's channel against children that lie, flood or outlive their run
(``core/child_channel.py``, ``runtime/jobs/children_listener.py``): a malformed message drops only
its child, reads are bounded, a reader never dies without a note, nothing is folded after the
run's end; and the leftovers of a killed kernel and of a cell that edits PYTHONPATH."""

from __future__ import annotations

import json
import os
import pwd
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import pytest

from gpuprof_jupyter.core.child_channel import CHANNEL_ENV, EVENTS, FINAL, HELLO, MAX_LINE, encode, pack_events
from gpuprof_jupyter.runtime.jobs import children_listener as children_module
from gpuprof_jupyter.runtime.jobs.children_listener import DIR_PREFIX, STARTUP_DIR, ChildListener, remove_stale_dirs
from gpuprof_jupyter.runtime.record.events import STEP


def _connect(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    return sock


def _steps(t0: float, n: int, every: float = 0.01) -> bytes:
    return encode(EVENTS, **pack_events([(STEP, t0 + (i + 1) * every, None) for i in range(n)]), as_of=t0 + n * every)


def _wait_for(condition, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.01)


@pytest.fixture
def listener():
    made = ChildListener(time.monotonic(), time.time()).start()
    yield made
    made.close(timeout=0)
    made.remove_files()


@pytest.fixture
def thread_errors(monkeypatch):
    """Exceptions that ended a thread (a reader must never die of one)."""
    seen = []
    monkeypatch.setattr(threading, "excepthook", lambda args: seen.append(args.exc_value))
    return seen


@pytest.mark.process
def test_a_lying_hello_drops_that_child_only_and_the_kernels_steps_survive(store_dir, thread_errors):
    import gpuprof_jupyter as gp

    with gp.profile("hostile", source="sim", store=store_dir, interval=0.05) as p:
        for _ in range(40):
            gp.step()
        with _connect(os.environ[CHANNEL_ENV]) as hostile:
            hostile.sendall(b'{"type":"hello","pid":1,"rank":"0; drop"}\n' + _steps(time.monotonic(), 5))
        good = subprocess.run([sys.executable, "-c", "import gpuprof_jupyter as gp\nfor _ in range(3): gp.step()"],
                              timeout=120)
        assert good.returncode == 0
    exp = p.experiment
    assert exp.status == "ok" and exp.summary["steps"]["count"] == 40, exp.meta.notes
    ranks = exp.meta.context["ranks"]
    assert list(ranks) == ["0"] and ranks["0"]["steps"] == 3, ranks  # the honest child, whole
    named = [n for n in exp.meta.notes if f"pid {os.getpid()}" in n]
    assert len(named) == 1 and "Hello.rank = '0; drop'" in named[0] and "not counted" in named[0], exp.meta.notes
    assert not thread_errors


def test_a_reader_survives_any_malformed_line_with_one_note_each(listener, thread_errors):
    bad_lines = [
        b"[" * 200_000 + b"\n",  # deeper than any parser should recurse
        b"\xff\xfe\n", b"null\n", b'{"type": ["hello"]}\n', b'{"type":"hello"}\n',  # no pid
        b'{"type":"events","kinds":"AQ==","times":"AAAAAAAA8D8=","values":"!!","as_of":1}\n',
        encode(EVENTS, **pack_events([(STEP, 1.0, None)]), as_of=1.0),  # a batch before any hello
        encode(HELLO, pid=1, rank=-3), encode(HELLO, pid=1, world_size=10**30),
        b'{"type":"hello","pid":1}\n{"type":"final","phases":[{"name":1}]}\n',
        b'{"type":"hello","pid":1}\n{"type":"events","kinds":"","times":"","values":"","as_of":NaN}\n',
    ]
    deep = _connect(listener.path)  # read first, noted whatever the order of the others
    deep.sendall(bad_lines[0])
    deep.close()
    _wait_for(lambda: listener.notes)
    assert "nested deeper than 16 levels" in listener.notes[0], listener.notes
    for line in bad_lines[1:]:
        with _connect(listener.path) as sock:
            sock.sendall(line)
    with _connect(listener.path) as good:
        good.sendall(encode(HELLO, pid=os.getpid(), rank=7) + _steps(listener.t0, 4)
                     + encode(FINAL, params={"batch_size": 8}))
    _wait_for(lambda: listener._failed_reads == len(bad_lines)
              and any(c.rank == 7 and c.final is not None for c in listener.children))
    listener.close()
    assert not thread_errors
    named = [n for n in listener.notes if "could not be read" in n and "it is not counted" in n]
    assert len(named) == children_module.MAX_READ_NOTES, listener.notes  # then one note counts the rest
    assert f"gpuprof: {len(bad_lines) - len(named)} more child connection(s) could not be read" in listener.notes
    assert all(f"a child process (pid {os.getpid()}): " in n for n in named)
    seven, = listener.children  # the malformed ones are not counted
    assert seven.rank == 7 and len(seven.activity.steps) == 4 and seven.final["params"] == {"batch_size": 8}


def test_a_child_not_counted_is_named_by_its_own_rank_never_by_its_place_in_the_connection_order(listener,
                                                                                                    thread_errors):
    """The note about a child cut off before any step names what it said it was: a number the
    run gave it in connection order (here 1, as another child came first) depends on timing and
    names no rank of the run. A rank it said itself is kept in the note."""
    first = _connect(listener.path)
    first.sendall(encode(HELLO, pid=os.getpid()))  # no rank of its own: numbered 0
    _wait_for(lambda: len(listener.children) == 1)
    for hello in (encode(HELLO, pid=os.getpid()), encode(HELLO, pid=os.getpid(), rank=5)):
        with _connect(listener.path) as late:
            late.sendall(hello + b'{"type":"final","phases":[{"name":1}]}\n')
    _wait_for(lambda: listener._failed_reads == 2)
    first.close()
    listener.close()
    assert not thread_errors
    unread = sorted(n for n in listener.notes if "could not be read" in n)
    assert len(unread) == 2, listener.notes
    assert unread[0].startswith(f"gpuprof: a child process (pid {os.getpid()}): ") and "not counted" in unread[0]
    assert unread[1].startswith(f"gpuprof: rank 5 (pid {os.getpid()}): ") and "not counted" in unread[1]
    assert [c.rank for c in listener.children] == [0]


LISTENER = """
import json, resource, sys, time
from gpuprof_jupyter.runtime.jobs.children_listener import ChildListener
listener = ChildListener(time.monotonic(), time.time()).start()
print(json.dumps({"path": listener.path, "rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}), flush=True)
sys.stdin.readline()
listener.close()
print(json.dumps({"rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "notes": listener.notes}), flush=True)
listener.remove_files()
"""


@pytest.mark.process
def test_300_mib_without_a_newline_keeps_the_listeners_memory_flat():
    proc = subprocess.Popen([sys.executable, "-c", LISTENER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        started = json.loads(proc.stdout.readline())
        chunk, sent = b"x" * (1 << 20), 0
        with _connect(started["path"]) as flood:
            try:
                for _ in range(300):
                    flood.sendall(chunk)
                    sent += 1
            except OSError:  # the listener hung up once the line passed its limit
                pass
        proc.stdin.write("done\n")
        proc.stdin.flush()
        ended = json.loads(proc.stdout.readline())
    finally:
        proc.kill()
        proc.wait()
    grown_mib = (ended["rss_kib"] - started["rss_kib"]) / 1024
    assert grown_mib < 2 * MAX_LINE / (1 << 20), (grown_mib, sent)
    note, = ended["notes"]
    assert "a message of more than 8 MiB" in note and "not counted" in note


def test_connections_beyond_the_runs_cap_are_refused_with_one_note(listener, monkeypatch):
    monkeypatch.setattr(children_module, "MAX_CONNECTIONS", 3)
    socks = [_connect(listener.path) for _ in range(5)]
    try:
        for i, sock in enumerate(socks[:3]):
            sock.sendall(encode(HELLO, pid=os.getpid(), rank=i) + _steps(listener.t0, 2))
        _wait_for(lambda: sum(len(c.activity.steps) for c in listener.children) == 6)
        for sock in socks[3:]:  # refused: closed by the listener
            sock.settimeout(30)
            assert sock.recv(1) == b""
    finally:
        for sock in socks:
            sock.close()
    listener.close()
    assert [n for n in listener.notes if "refused" in n] == [
        "gpuprof: 2 connection(s) to the children's channel were refused (more than 3 in one run)"]


def test_a_rate_makes_a_fast_sender_wait_its_time_and_drops_nothing():
    waits = []

    class Stop:
        def wait(self, seconds):
            waits.append(seconds)

    rate = children_module._Rate(10.0)
    rate.take(20, Stop())  # the burst: no wait
    rate.take(10, Stop())  # one second's worth beyond it
    assert len(waits) == 1 and 0.9 < waits[0] <= 1.0


def test_a_child_that_outlives_the_run_is_cut_off_and_its_later_events_are_counted(listener):
    with _connect(listener.path) as child:
        child.sendall(encode(HELLO, pid=os.getpid(), rank=0) + _steps(listener.t0, 3))
        _wait_for(lambda: listener.children and len(listener.children[0].activity.steps) == 3)
        closing = threading.Thread(target=listener.close, kwargs={"timeout": 30})
        closing.start()
        _wait_for(lambda: listener.closed)
        end = time.monotonic()
        child.sendall(_steps(end, 4))  # timed after the run's end: counted, not folded
        closing.join(60)  # this process still runs: cut after the grace, not after 30 s
        assert not closing.is_alive()
        assert not [t for t in threading.enumerate() if t.name.startswith("gpuprof-child")]
        with pytest.raises(OSError):
            for _ in range(100):
                child.sendall(_steps(time.monotonic(), 1000))
                time.sleep(0.01)
    zero, = listener.children
    assert len(zero.activity.steps) == 3
    note, = [n for n in listener.notes if "rank 0" in n]
    assert "was still running when the run ended" in note and "connection was closed" in note
    assert "4 event(s) timed after the run's end were not counted" in note


@pytest.mark.process
def test_a_cells_end_is_not_delayed_by_a_child_that_keeps_running(store_dir):
    import gpuprof_jupyter as gp

    code = "import time, gpuprof_jupyter as gp\nwhile True:\n    gp.step()\n    time.sleep(0.005)\n"
    from gpuprof_jupyter.runtime.session import current_session

    with gp.profile("immortal", source="sim", store=store_dir, interval=0.05) as p:
        child = subprocess.Popen([sys.executable, "-c", code])
        listener = current_session().children
        _wait_for(lambda: any(c.activity.steps for c in listener.children))
    try:
        assert child.poll() is None  # the run ended while its child runs on, and nothing reads it any more
        assert not [t.name for t in threading.enumerate() if t.name.startswith("gpuprof-child")]
        exp = p.experiment
        steps = exp.rank_steps()[0]
        assert len(steps) > 0 and steps["t_end_s"].max() <= exp.meta.duration_s
        assert any("was still running when the run ended" in n for n in exp.meta.notes), exp.meta.notes
    finally:
        child.kill()
        child.wait()


@pytest.mark.process
def test_a_sigkilled_owners_folder_is_removed_and_no_other(tmp_path):
    code = ("import time\nfrom gpuprof_jupyter.runtime.jobs.children_listener import ChildListener\n"
            "l = ChildListener(time.monotonic(), time.time()).start()\nprint(l._dir, flush=True)\ntime.sleep(600)\n")
    owner = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    killed_dir = owner.stdout.readline().strip()
    owner.send_signal(signal.SIGKILL)
    owner.wait()
    assert os.path.isdir(killed_dir)
    live = ChildListener(time.monotonic(), time.time())  # the next run's listener cleans up
    assert not os.path.exists(killed_dir)
    root = tempfile.gettempdir()
    no_owner = tempfile.mkdtemp(prefix=DIR_PREFIX)  # not ours to judge: kept
    link = os.path.join(root, DIR_PREFIX + "link")
    os.symlink(str(tmp_path), link)
    (tmp_path / "owner").write_text("999999999 1.0")
    other = tempfile.mkdtemp(prefix=DIR_PREFIX)  # another user's, its owner gone: kept
    with open(os.path.join(other, "owner"), "w") as f:
        f.write("999999999 1.0")
    subprocess.run(["useradd", "--no-create-home", "gpuprof-neighbour"], capture_output=True)
    os.chown(other, pwd.getpwnam("gpuprof-neighbour").pw_uid, -1)
    try:
        remove_stale_dirs()
        assert os.path.isdir(live._dir) and os.path.isdir(no_owner) and os.path.isdir(other)
        assert os.path.islink(link) and (tmp_path / "owner").exists()
    finally:
        live.remove_files()
        for path in (no_owner, other):
            subprocess.run(["rm", "-rf", path])
        os.unlink(link)


@pytest.mark.process
def test_a_pythonpath_change_made_inside_the_cell_is_kept(store_dir, monkeypatch):
    import gpuprof_jupyter as gp

    monkeypatch.setenv("PYTHONPATH", "/before")
    with gp.profile("pythonpath", source="sim", store=store_dir, interval=0.05):
        assert os.environ["PYTHONPATH"].split(os.pathsep) == [STARTUP_DIR, "/before"]
        os.environ["PYTHONPATH"] += os.pathsep + "/added-by-the-cell"
    assert os.environ["PYTHONPATH"] == os.pathsep.join(["/before", "/added-by-the-cell"])
    assert CHANNEL_ENV not in os.environ


@pytest.mark.process
def test_a_childs_steps_reach_the_sampler_without_waiting_for_another_period(store_dir, monkeypatch):
    import gpuprof_jupyter as gp
    from gpuprof_jupyter.core.finish import STEP_FIELDS
    from gpuprof_jupyter.core.protocol import Events
    from gpuprof_jupyter.runtime import link as link_module

    for period in ("HANDOVER_PERIOD_S", "HANDOVER_WITH_UPDATE_S"):  # no regular hand-over during this run
        monkeypatch.setattr(link_module, period, 3600.0)
    handed = []
    send = link_module.SamplerLink._send

    def spy(self, message):
        if isinstance(message, Events):
            handed.extend(step for step in message.steps if len(step) == len(STEP_FIELDS) + 1)  # a child's: with its rank
        return send(self, message)

    monkeypatch.setattr(link_module.SamplerLink, "_send", spy)
    code = "import gpuprof_jupyter as gp\nfor _ in range(3):\n    gp.step()\n"
    try:
        with gp.profile("prompt", source="sim", store=store_dir, interval=0.05):
            assert subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 0
            _wait_for(lambda: len(handed) == 3)  # handed over as they came, not at the next period
    finally:
        monkeypatch.undo()
        link_module.sampler_link().hand_over_soon()  # the link's thread takes its usual periods again


@pytest.mark.process
def test_a_final_message_past_the_limit_loses_only_its_largest_field_with_a_note(listener):
    code = ("import gpuprof_jupyter as gp\nfor _ in range(3):\n    gp.step()\n"
            "with gp.phase('train'):\n    gp.log(blob='x' * (9 << 20), acc=0.9)\n")
    done = subprocess.run([sys.executable, "-c", code], env={**os.environ, **listener.environ()},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    listener.close()
    child, = listener.children
    assert len(child.activity.steps) == 3 and child.final is not None, listener.notes
    assert child.final["user_metrics"] == {} and [p["name"] for p in child.final["phases"]] == ["train"]
    assert child.final["notes"][-1] == "gpuprof: its final message was over 8 MiB: user_metrics could not be sent whole"
    assert not [n for n in listener.notes if "could not be read" in n], listener.notes


@pytest.mark.process
def test_a_launchers_minus_one_is_no_rank_and_the_child_still_counts(listener):
    code = "import gpuprof_jupyter as gp\nfor _ in range(2):\n    gp.step()\n"
    env = {**os.environ, **listener.environ(), "LOCAL_RANK": "-1", "RANK": "-1", "WORLD_SIZE": "1"}
    assert subprocess.run([sys.executable, "-c", code], env=env, timeout=120).returncode == 0
    listener.close()
    child, = listener.children
    assert len(child.activity.steps) == 2 and child.hello["local_rank"] is None, listener.notes
