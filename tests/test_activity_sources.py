"""Step reporting, the simulated GPU it drives, scenarios, and the host process tree."""

from __future__ import annotations

import math
import subprocess
import sys
import time

import psutil
import pytest

import gpuprof_jupyter as gp
from gpuprof_jupyter.runtime.hooks.activity import ActivityLog
from gpuprof_jupyter.core.protocol import Events
from gpuprof_jupyter.sampler_process.kernel_feed import KernelFeed
from gpuprof_jupyter.core.sources.host import HostSource, allowed_cpus
from gpuprof_jupyter.core.sources.simulated import SCENARIOS, SimulatedSource, parse_sim_spec
from tests.fakes import FakeClock, wait_for
from tests.simexp import sm_util_during_steps


def _hand_over(log: ActivityLog, feed: KernelFeed, now: float) -> None:
    """What the session's hand-over does, ~4 times a second (runtime/session.py)."""
    feed.add(Events(as_of=now, transitions=log.take_transitions(), reported=log.reported))


def test_busy_share_counts_time_inside_steps_not_waiting():
    """The kernel folds its events; the sampler process derives the simulated load from them."""
    clock = FakeClock(0.0)
    log = ActivityLog(t0=0.0, clock=clock)
    feed = KernelFeed(t0=0.0)
    _hand_over(log, feed, clock.now)
    assert feed.busy_share(0.0, 1.0) is None  # nothing reported: the simulator plays a scenario
    for _ in range(5):  # each step: wait 0.06 s for data, compute 0.04 s
        log.wait_started(); clock.now += 0.06; log.wait_ended()
        clock.now += 0.04; log.step(32)
    _hand_over(log, feed, clock.now)
    assert feed.covered_until == pytest.approx(0.5)
    assert feed.busy_share(0.0, 0.5) == pytest.approx(0.4)
    assert [round(s.wait_s, 6) for s in log.steps] == [0.06] * 5
    assert log.steps[1].duration_s == pytest.approx(0.1)
    log.loop_ended()
    clock.now += 1.0
    _hand_over(log, feed, clock.now)
    assert feed.busy_share(0.5, 1.5) == pytest.approx(0.0)  # the loop ended: the GPU is idle


def test_simulated_source_reads_only_the_time_the_kernel_events_cover():
    clock = FakeClock(10.0)
    feed = KernelFeed(t0=10.0)
    source = SimulatedSource("sim", busy_share=feed.busy_share, covered=lambda: feed.covered_until,
                             clock=clock, interval=0.1, wall_clock=lambda: clock.now + 1000.0)
    source.open()
    clock.now = 11.0
    assert source.read_batch() == []  # no events yet: nothing is known after 10.0
    feed.add(Events(as_of=10.55, transitions=[(10.0, 1)], reported=True))
    batch = source.read_batch()
    assert [round(t.mono, 6) for t in batch] == [10.1, 10.2, 10.3, 10.4, 10.5]
    assert batch[0].wall == pytest.approx(1010.1)
    assert all(t.reading["gpu0"]["sm_util"] > 80 for t in batch)  # busy all along
    assert source.read_batch() == []


def test_step_and_track_are_noops_without_session():
    assert list(gp.track([1, 2, 3])) == [1, 2, 3]
    gp.step(10)
    with gp.phase("anything"):
        pass
    assert len(gp.track([1, 2])) == 2
    with pytest.raises(RuntimeError, match="none is running"):
        gp.log(accuracy=0.9)


def test_sim_spec_parsing():
    assert parse_sim_spec("sim") == ("input-bound", 1)
    assert parse_sim_spec("sim:compute-bound:8") == ("compute-bound", 8)
    with pytest.raises(ValueError, match="unknown simulated scenario 'fast'"):
        parse_sim_spec("sim:fast")
    with pytest.raises(ValueError, match="1..64"):
        parse_sim_spec("sim:input-bound:0")


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_scenarios_are_deterministic_and_labelled(scenario):
    readings = []
    for _ in range(2):
        clock = FakeClock(0.0)
        source = SimulatedSource(f"sim:{scenario}:2", clock=clock)
        devices = source.open()
        assert all(d.simulated and "simulated" in d.name for d in devices)
        run = []
        for _ in range(30):
            clock.now += 0.1
            run.append(source.read())
        readings.append(run)
    assert readings[0] == readings[1]
    assert all(tag == "simulated" for tags in source.provenance().values() for tag in tags.values())


def test_input_bound_vs_compute_bound_levels():
    def mean_sm(spec):
        clock = FakeClock(0.0)
        source = SimulatedSource(spec, clock=clock)
        source.open()
        values = []
        for _ in range(100):
            clock.now += 0.1
            values.append(source.read()["gpu0"]["sm_util"])
        return sum(values) / len(values)

    assert mean_sm("sim:input-bound") < 50 < 90 < mean_sm("sim:compute-bound")


@pytest.mark.process
def test_driven_sim_follows_the_real_workload(store_dir):
    """Less waiting for data -> higher simulated SM: adding workers really raises it."""
    def run(wait_s):
        with gp.profile(source="sim", store=store_dir, interval=0.02) as p:
            for _ in gp.track(_SlowLoader(12, wait_s)):
                time.sleep(0.02)
                gp.step(16)
        return p.experiment

    starved, fed = run(0.06), run(0.005)
    assert starved.summary["steps"]["data_wait_frac"] > 0.5 > fed.summary["steps"]["data_wait_frac"]
    assert sm_util_during_steps(starved) + 20 < sm_util_during_steps(fed)
    assert "driven mode" in " ".join(fed.meta.notes)


class _SlowLoader:
    def __init__(self, n, wait_s):
        self.n, self.wait_s = n, wait_s

    def __iter__(self):
        for i in range(self.n):
            time.sleep(self.wait_s)
            yield i


@pytest.mark.process
def test_host_cpu_util_counts_child_processes():
    source = HostSource()
    source.open()
    child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    worker = psutil.Process(child.pid)
    try:
        time.sleep(1.3)  # let the 1 Hz tree refresh see the worker
        source.read()
        before, t_before = sum(worker.cpu_times()[:2]), time.monotonic()
        time.sleep(1.0)
        values = source.read()["host"]
        after, t_after = sum(worker.cpu_times()[:2]), time.monotonic()
    finally:
        child.kill()
        child.wait()
    # The worker's own CPU time over the window, as a share of the CPUs we may use (the
    # machine may be busy, so compare with what the worker really got, not with one core).
    worker_share = 100.0 * (after - before) / ((t_after - t_before) * source.cpus)
    assert worker_share > 5
    assert values["cpu_util"] >= 0.8 * worker_share
    assert values["rss_bytes"] > 0
    assert not math.isnan(values["host_cpu_util"])


def test_allowed_cpus_honours_cgroup_quota(tmp_path):
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert allowed_cpus(tmp_path) == pytest.approx(min(1.5, len(__import__("os").sched_getaffinity(0))))
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert allowed_cpus(tmp_path) == len(__import__("os").sched_getaffinity(0))


def test_host_slow_metrics_once_a_second_never_repeated():
    clock = FakeClock(0.0)
    source = HostSource(clock=clock)
    source.open()
    keys = []
    for _ in range(25):
        clock.now += 0.1
        keys.append(set(source.read()["host"]))
    slow = {"rss_bytes", "host_cpu_util", "disk_read_bytes_s", "disk_write_bytes_s"}
    with_slow = [i for i, k in enumerate(keys) if slow & k]
    assert with_slow[0] == 0  # the first reading has everything
    assert all(b - a >= 9 for a, b in zip(with_slow, with_slow[1:]))  # then once a second
    assert all("cpu_util" in k for k in keys)


@pytest.mark.process
def test_descendants_finds_grandchildren():
    from gpuprof_jupyter.core.sources.host import descendants

    code = "import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)']); time.sleep(30)"
    child = subprocess.Popen([sys.executable, "-c", code])
    try:
        def with_grandchild():  # (this process may have other children: the sampler process)
            found = descendants(psutil.Process())
            return found if any(p.ppid() == child.pid for p in found) else None

        found = wait_for(with_grandchild, 10, "the child's own child")
        assert child.pid in {p.pid for p in found}
        assert any(p.ppid() == child.pid for p in found)
    finally:
        for p in psutil.Process(child.pid).children(recursive=True):
            p.kill()
        child.kill()
        child.wait()


@pytest.mark.process
def test_plain_sim_is_idle_until_the_first_report(store_dir):
    """Plain ``sim`` invents no load: before the loop reports anything the GPU is idle."""
    with gp.profile(source="sim", store=store_dir, interval=0.02) as p:
        time.sleep(0.4)
        for _ in gp.track(_SlowLoader(10, 0.0)):
            time.sleep(0.03)
            gp.step(16)
    frame = p.experiment.device_frame("gpu0", ["sm_util"])
    # windows from the run's own steps, never from its start: the sampler process's start
    # (cold on a loaded machine) comes before the 0.4 s of nothing
    first, last = p.experiment.steps["t_end_s"].iloc[[0, -1]]
    before = frame[frame["t"] < first - 0.1]["sm_util"]
    after = frame[(frame["t"] > first) & (frame["t"] <= last)]["sm_util"]
    assert len(before) and before.max() < 5, before.tolist()
    assert after.mean() > 60, after.tolist()


@pytest.mark.process
@pytest.mark.parametrize("spec, steps, words", [
    ("sim", 6, "its load followed the reported training steps; driven mode"),
    ("sim:input-bound", 6, "input-bound until steps were reported, then its load followed them; driven mode"),
    ("sim", 0, "its load follows reported steps; none were, so it stayed idle"),
    ("sim:input-bound", 0, "input-bound unless steps are reported"),
])
def test_a_simulated_run_carries_its_simulated_note_once(store_dir, spec, steps, words):
    """One note says the GPU is simulated and what its load followed; the summary prints it once."""
    from gpuprof_jupyter.render.summary_html import render_summary_text

    with gp.profile(source=spec, store=store_dir, interval=0.02) as p:
        for _ in range(steps):
            time.sleep(0.02)
            gp.step(4)
        time.sleep(0.1)
    notes = [n for n in p.experiment.meta.notes if "simulated" in n.lower()]
    assert notes == [f"simulated GPU ({words}): these are not measurements"], p.experiment.meta.notes
    assert render_summary_text(p.experiment).count("note: simulated GPU") == 1


def _ticking_source(clock, busy_cores: float, cpus: float = 2.0) -> HostSource:
    """A host source whose tree's CPU time grows at ``busy_cores`` and is read, as Linux counts
    it, in whole 10 ms clock ticks."""
    source = HostSource(clock=clock)
    source.open()
    source.cpus = cpus
    start = clock.now
    source._cpu_time = lambda proc: math.floor(busy_cores * (clock.now - start) / 0.01 + 1e-9) * 0.01 + 0.01
    source._procs = {source._root.pid: source._root}
    source._refresh_tree = lambda force=False: None  # the tree is this one process: a child an earlier test
    source._cpu_prev = {source._root.pid: 0.01}      # left running would be counted with the same fake time
    return source


def test_the_first_cpu_reading_is_missing_not_0_and_none_exceeds_100():
    """Issue 36: the first reading, a few ms after open, read 0 (or 205 %) from one clock tick."""
    clock = FakeClock(0.0)
    source = _ticking_source(clock, busy_cores=1.0)
    clock.now += 0.012
    first = source.read()["host"]
    assert math.isnan(first["cpu_util"])  # 12 ms is one tick: not a reading
    assert math.isnan(first["host_cpu_util"])  # whole-host CPU counts ticks too
    readings = []
    for _ in range(30):
        clock.now += 0.1
        readings.append(source.read()["host"]["cpu_util"])
    assert not any(math.isnan(r) for r in readings)  # the first window carried on: nothing lost
    assert readings[0] == pytest.approx(50.0, abs=6)  # one busy core of two, from t=0 on
    assert sum(readings) / len(readings) == pytest.approx(50.0, abs=1)


def test_a_cpu_reading_never_exceeds_its_units_maximum():
    clock = FakeClock(0.0)
    source = _ticking_source(clock, busy_cores=2.0, cpus=2.0)  # the whole allowance is busy
    readings = []
    for _ in range(40):
        clock.now += 0.0985  # windows that end just before a tick: rounding adds a tick per core
        readings.append(source.read()["host"]["cpu_util"])
    valid = [r for r in readings if not math.isnan(r)]
    assert valid and max(valid) <= 100.0
    assert min(valid) > 80.0


def test_a_steady_fast_cadence_keeps_every_cpu_reading_and_a_last_short_one_is_missing():
    clock = FakeClock(0.0)
    source = _ticking_source(clock, busy_cores=1.0)
    readings = []
    for i in range(40):
        clock.now += 0.03 + 0.004 * (i % 3)  # --interval 0.03 with jitter: under CPU_MIN_WINDOW_S, yet steady
        readings.append(source.read()["host"]["cpu_util"])
    assert all(not math.isnan(r) for r in readings[4:]), readings  # the first ones carry on to 80 ms
    clock.now += 0.004  # the run's last reading, just after a tick
    assert math.isnan(source.read()["host"]["cpu_util"])
