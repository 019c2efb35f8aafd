"""Issue 41 part 1: a stuck run caught. The judgement (core/analysis/stuck.py) and the watch
(runtime/jobs/stuck_watch.py) on a fake clock; the stack dump with real processes; the run's
own process, a slow run and a run with no step yet through ``profile()``; a two-rank torchrun
job whose rank 1 blocks for ever before its 20th step, under ``gpuprof run --on-stuck stop``."""

from __future__ import annotations

import linecache
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from gpuprof_jupyter.core.analysis.stuck import (STUCK_MIN_S, format_threads, parse_faulthandler, parse_stuck_after,
                                                 stuck_finding, stuck_message, stuck_threshold, waiting_for_others,
                                                 where)
from gpuprof_jupyter.core.child_channel import STACKS_FILE, STACKS_SIGNAL
from gpuprof_jupyter.core.store.directory import Store
from gpuprof_jupyter.runtime.hooks.activity import ActivityLog
from gpuprof_jupyter.runtime.jobs.stuck_watch import StuckWatch, dump_child_stacks, own_threads
from gpuprof_jupyter.runtime.record.events import STEP, WAIT_END, WAIT_START
from gpuprof_jupyter.runtime.run_options import RunOptions

SCRIPTS = Path(__file__).resolve().parent / "data" / "scripts"


# -- the judgement --------------------------------------------------------------------------------
def test_the_threshold_is_ten_median_steps_at_least_stuck_after():
    assert stuck_threshold([], None) == STUCK_MIN_S == 30.0  # no step yet: the floor
    assert stuck_threshold([0.1] * 50, None) == 30.0
    assert stuck_threshold([5.0] * 9 + [100.0], None) == 50.0  # a slow run: ten of its own steps
    assert stuck_threshold([0.01] * 20, 2.0) == 2.0
    assert stuck_threshold([1.0] * 20, 2.0) == 10.0  # --stuck-after is a floor, never below 10x the median


@pytest.mark.parametrize("given,expected", [(None, None), ("300", 300.0), ("90s", 90.0), ("off", 0.0), (0, 0.0),
                                            (2.5, 2.5)])
def test_stuck_after_reads_seconds_or_off(given, expected):
    assert parse_stuck_after(given) == expected


@pytest.mark.parametrize("bad", ["soon", -1, float("nan"), True])
def test_a_bad_stuck_after_names_the_flag(bad):
    with pytest.raises(ValueError, match="--stuck-after"):
        parse_stuck_after(bad)
    with pytest.raises(ValueError, match="--stuck-after"):
        RunOptions(stuck_after=bad)


def test_gpuprof_run_refuses_a_bad_stuck_after_before_anything_starts(store_dir, capsys):
    from gpuprof_jupyter.cli import EXIT_USAGE, main

    assert main(["run", "--store", str(store_dir), "--stuck-after", "soon", "--", "true"]) == EXIT_USAGE
    assert "--stuck-after takes seconds" in capsys.readouterr().err
    assert main(["run", "--store", str(store_dir), "--stuck-after", "off", "--on-stuck", "stop", "--", "true"]) \
        == EXIT_USAGE
    assert "--on-stuck stop needs the stuck watch" in capsys.readouterr().err
    assert not list(store_dir.glob("*/meta.json"))  # nothing started
    assert RunOptions(stuck_after="off").stuck_after == 0.0 and RunOptions().stuck_after is None


def _real_dump(tmp_path) -> str:
    """faulthandler's own text for a process whose main thread sleeps while a helper thread waits."""
    code = textwrap.dedent(f"""
        import faulthandler, signal, threading, time
        f = open({str(tmp_path / 'dump.txt')!r}, "a")
        f.write("gpuprof main thread 0x%016x\\n" % threading.main_thread().ident); f.flush()
        faulthandler.register({STACKS_SIGNAL}, file=f, all_threads=True, chain=False)
        threading.Thread(target=threading.Event().wait, daemon=True, name="helper").start()
        def main():
            total = all_reduce()
        def all_reduce():
            print("ready", flush=True)
            time.sleep(60)
        main()
    """)
    (tmp_path / "job.py").write_text(code)
    proc = subprocess.Popen([sys.executable, str(tmp_path / "job.py")], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        path = tmp_path / "dump.txt"
        header = path.read_text()
        sleeping = f"line {code.splitlines().index('    time.sleep(60)') + 1} in all_reduce"
        for _ in range(100):  # until the dump finds it inside the sleep (not still returning from print)
            path.write_text(header)  # faulthandler appends (O_APPEND): each try starts clean
            os.kill(proc.pid, STACKS_SIGNAL)
            while "in <module>" not in path.read_text():  # the main thread comes last
                time.sleep(0.02)
            if sleeping in path.read_text():
                break
        assert proc.poll() is None  # dumped without stopping it
        return path.read_text()
    finally:
        proc.kill()
        proc.wait()


def test_faulthandler_text_gives_each_thread_and_where_the_main_one_is(tmp_path):
    text = _real_dump(tmp_path)
    threads = parse_faulthandler(text)
    assert len(threads) == 2
    main, = [t for t in threads if t["main"]]
    assert [f[2] for f in main["frames"][:2]] == ["all_reduce", "main"], main
    line = (tmp_path / "job.py").read_text().splitlines().index("    time.sleep(60)") + 1
    assert where(threads, linecache.getline) == f"job.py:{line} `time.sleep(60)`"
    assert not waiting_for_others(threads)
    again = parse_faulthandler(format_threads(threads))  # the holding process's own are saved the same way
    assert [t["frames"] for t in again] == [t["frames"] for t in threads] and again[-1]["main"]


def test_where_names_the_innermost_frame_of_the_users_code_and_its_call():
    lib = os.path.dirname(os.__file__)
    threads = [{"thread": "0x1", "name": None, "main": True, "frames": [
        [f"{lib}/threading.py", 320, "wait"],
        ["/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", 2500, "all_reduce"],
        ["/home/me/train.py", 57, "main"], ["/home/me/train.py", 90, "<module>"]]}]
    lines = {57: "        total = dist.all_reduce(t)  # sum the losses\n"}
    assert where(threads, lambda path, n: lines.get(n, "")) == "train.py:57 `dist.all_reduce(t)`"
    assert waiting_for_others(threads)
    assert where(threads) == "train.py:57 in main"  # no source to read


def test_the_message_and_the_finding_name_every_rank_and_its_stacks():
    record = {"who": "rank 1", "rank": 1, "for_s": 42.2, "threshold_s": 30.0, "where": "train.py:57 `dist.all_reduce(t)`",
              "others": [{"who": "rank 0", "where": "train.py:88 `next(loader)`"}],
              "stacks": {"rank 1": "stacks-rank1.txt", "rank 0": "stacks-rank0.txt"}, "stopped": True}
    assert stuck_message(record) == ("rank 1 has made no step for 42 s: in train.py:57 `dist.all_reduce(t)` "
                                     "(rank 0 is in train.py:88 `next(loader)`)")

    class Meta:
        context = {"stuck": [record]}

    class Experiment:
        meta = Meta()

    finding = stuck_finding(Experiment())
    assert finding.id == "stuck" and finding.severity == "high" and finding.title.startswith("Rank 1 stuck")
    assert "stacks-rank1.txt" in finding.evidence and "stacks-rank0.txt" in finding.evidence
    assert "stopped (--on-stuck stop)" in finding.evidence
    Meta.context = {}
    assert stuck_finding(Experiment()) is None


# -- the watch, on a fake clock ---------------------------------------------------------------------
class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _watch(clock, stuck_after=None, said=None):
    activity = ActivityLog(clock.now, clock)
    saved = {}

    def save(name, text):
        saved[name] = text
        return name

    records = []
    watch = StuckWatch(clock.now, activity, None, stuck_after, save, said or records.append, [], clock=clock)
    return watch, activity, saved, records


def _steps(activity, clock, n, every):
    for _ in range(n):
        clock.now += every
        activity.emit((STEP, clock.now, None))


def _settle(watch):
    watch.check()
    watch.close()


def test_a_process_blocked_after_its_steps_is_caught_once_and_seen_moving_again():
    clock = Clock()
    watch, activity, saved, records = _watch(clock, stuck_after=2.0)
    _steps(activity, clock, 10, 0.05)
    clock.now += 1.9
    _settle(watch)
    assert records == []  # under its threshold
    clock.now += 0.2
    _settle(watch)
    record, = records
    assert record["who"] == "the profiled process" and record["steps"] == 10 and record["for_s"] >= 2.0
    assert record["stacks"] == {"the profiled process": "stacks-process.txt"}
    assert "test_stuck.py" in saved["stacks-process.txt"]  # this thread's own stack, taken without stopping it
    clock.now += 30
    _settle(watch)
    assert len(records) == 1  # one episode, not an alert a second
    _steps(activity, clock, 1, 0.05)
    _settle(watch)
    assert record["resumed_at_s"] == pytest.approx(clock.now - watch.t0)
    clock.now += 3
    _settle(watch)
    assert len(records) == 2 and records[1]["stacks"] == {"the profiled process": "stacks-process-2.txt"}


def test_slow_steps_are_not_stuck_and_no_step_yet_is_not_stuck():
    clock = Clock()
    watch, activity, _, records = _watch(clock, stuck_after=1.0)
    clock.now += 600  # waiting for input() before any step
    _settle(watch)
    _steps(activity, clock, 5, 2.0)  # each step longer than --stuck-after
    clock.now += 19.0  # under 10 x the median (20 s)
    _settle(watch)
    assert records == []


def test_a_batch_fetched_is_progress_an_evaluation_loop_is_not_stuck():
    clock = Clock()
    watch, activity, _, records = _watch(clock, stuck_after=1.0)
    _steps(activity, clock, 5, 0.01)
    for _ in range(10):  # no optimizer step, but batches keep coming
        clock.now += 0.5
        activity.emit((WAIT_START, clock.now - 0.01, None))
        activity.emit((WAIT_END, clock.now, 4))
        _settle(watch)
    assert records == []


def test_the_watch_is_off_with_stuck_after_off_and_a_failing_save_is_one_note():
    clock = Clock()
    watch, activity, _, records = _watch(clock, stuck_after=0.5)

    def broken(name, text):
        raise OSError("disk full")

    watch.save = broken
    _steps(activity, clock, 3, 0.01)
    clock.now += 5
    _settle(watch)
    assert records == [] and any("saving a stuck run's stacks failed" in n for n in watch.notes)


def test_own_threads_name_the_main_thread():
    threads = own_threads()
    main, = [t for t in threads if t["main"]]
    assert any(f[2] == "test_own_threads_name_the_main_thread" for f in main["frames"])


def test_a_child_is_signalled_only_once_it_registered(tmp_path):
    """The signal's default action would end a process that never registered faulthandler."""
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert dump_child_stacks(str(tmp_path), [sleeper.pid], wait_s=0.2) == {}
        time.sleep(0.1)
        assert sleeper.poll() is None
    finally:
        sleeper.kill()
        sleeper.wait()


def test_dump_child_stacks_reads_what_the_child_wrote(tmp_path):
    code = textwrap.dedent(f"""
        import faulthandler, threading, time
        f = open({str(tmp_path)!r} + "/" + {STACKS_FILE!r}.format(pid=__import__("os").getpid()), "a")
        f.write("gpuprof main thread 0x%016x\\n" % threading.main_thread().ident); f.flush()
        faulthandler.register({STACKS_SIGNAL}, file=f, all_threads=True, chain=False)
        print("ready", flush=True)
        while True:
            time.sleep(0.01)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        first = dump_child_stacks(str(tmp_path), [proc.pid])[proc.pid]
        second = dump_child_stacks(str(tmp_path), [proc.pid])[proc.pid]
        for text in (first, second):  # each dump alone, after the main thread's line
            assert text.startswith("gpuprof main thread 0x") and text.count("(most recent call first)") == 1
            assert parse_faulthandler(text)[0]["main"]
        assert proc.poll() is None
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()


# -- real runs -----------------------------------------------------------------------------------
@pytest.mark.process
def test_a_profiled_block_sleeping_in_its_loop_is_caught_with_its_stack(store_dir):
    import gpuprof_jupyter as gp
    from gpuprof_jupyter.runtime import session as sessions

    with gp.profile("hung", source="sim", interval=0.05, stuck_after=1, store=store_dir) as run:
        for step in range(8):
            time.sleep(0.01)
            while step == 5 and "stuck" not in sessions.current_session().meta.context: time.sleep(0.05)  # noqa: E701
            gp.step()
    exp = Store(store_dir).load("hung")
    record, = exp.meta.context["stuck"]
    assert record["who"] == "the profiled process" and record["steps"] == 5
    assert record["where"].startswith(f"test_stuck.py:{_line_of('while step == 5')} `while step == 5 and")  # one line
    assert (Store(store_dir).directory(exp.meta) / "stacks-process.txt").read_text().count("(most recent call first)") >= 2
    assert record["resumed_at_s"] is not None and exp.summary["steps"]["count"] == 8  # nothing lost
    from gpuprof_jupyter.render.alerts_html import alert_header_html

    assert "the profiled process has made no step for" in str(alert_header_html(run.session.alerts_fired))  # live


def _line_of(text: str) -> int:
    return next(i for i, line in enumerate(Path(__file__).read_text().splitlines(), 1)
                if text in line and "_line_of" not in line)


@pytest.mark.process
def test_a_run_whose_steps_are_merely_slow_or_not_started_is_not_stuck(store_dir):
    import gpuprof_jupyter as gp

    with gp.profile("slow", source="sim", interval=0.05, stuck_after=0.3, store=store_dir):
        time.sleep(2.5)  # before any step: waiting for input(), say
        for _ in range(3):
            time.sleep(1.2)  # each step four times --stuck-after
            gp.step()
    exp = Store(store_dir).load("slow")
    assert "stuck" not in exp.meta.context and exp.summary["steps"]["count"] == 3


def _torchrun(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
            "--monitor-interval", "0.1", str(SCRIPTS / "train_ddp.py"), *args]


@pytest.mark.process
def test_a_rank_blocked_for_ever_is_caught_its_stacks_saved_and_the_job_stopped(store_dir, tmp_path, monkeypatch,
                                                                               capsys):
    from gpuprof_jupyter.cli import EXIT_STUCK, main

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    rc = main(["run", "--store", str(store_dir), "--source", "sim", "--interval", "0.05", "-n", "hang",
               "--stuck-after", "3", "--on-stuck", "stop", "--",
               *_torchrun("--steps", "40", "--hang-rank", "1", "--hang-step", "19")])
    out, err = capsys.readouterr()
    exp = Store(store_dir).load("hang")
    assert rc == EXIT_STUCK and exp.status == "stuck", (rc, exp.meta.error, exp.meta.notes)
    record, = exp.meta.context["stuck"]
    assert (record["who"], record["rank"], record["stopped"]) == ("rank 1", 1, True)
    assert record["for_s"] >= record["threshold_s"] >= 3.0
    assert record["where"] == "train_ddp.py:" + str(_script_line("time.sleep(3600)")) + " `time.sleep(3600)`"
    rank0, = record["others"]
    assert rank0["who"] == "rank 0" and "`loss.backward()`" in rank0["where"]  # waiting in DDP's all-reduce
    assert record["stacks"] == {"rank 1": "stacks-rank1.txt", "rank 0": "stacks-rank0.txt"}
    for name in record["stacks"].values():
        assert "train_ddp.py" in (Store(store_dir).directory(exp.meta) / name).read_text()
    assert "rank 1 has made no step for" in err and "stopping the job" in err
    assert "Rank 1 stuck" in out and "stacks-rank0.txt" in out  # the finding, in the summary
    steps = exp.rank_steps()
    assert [len(steps[r]) for r in (0, 1)] == [19, 19]  # every step before the hang kept
    assert main(["report", "--store", str(store_dir), "-o", str(tmp_path / "report.html")]) == 0
    report = (tmp_path / "report.html").read_text()
    assert "Rank 1 stuck" in report and "stacks-rank1.txt" in report


def _script_line(text: str) -> int:
    return next(i for i, line in enumerate((SCRIPTS / "train_ddp.py").read_text().splitlines(), 1) if text in line)
