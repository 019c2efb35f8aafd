"""Sampler: cadence without drift, gaps recorded (not interpolated), errors contained, stop."""

from __future__ import annotations

import threading
import time

import pytest

from gpuprof_jupyter.sampler_process.sampler import Sampler
from tests.fakes import FakeClock, ScriptedSource, wait_for


def run_fake(sampler: Sampler, clock: FakeClock, until: float) -> None:
    """Run the sampler thread until the fake clock passes ``until`` seconds."""
    sampler.start()
    try:
        wait_for(lambda: clock.now >= until, 10, f"the fake clock to pass {until} s", poll_s=0.001)
    finally:
        sampler.stop()


def make(source, clock, interval=0.1, **kwargs):
    ticks, gaps, errors = [], [], []
    sampler = Sampler([source], ticks.append, interval, on_gap=gaps.append, on_error=errors.append,
                      clock=clock, wall_clock=lambda: 0.0, sleep=clock.sleep, **kwargs)
    return sampler, ticks, gaps, errors


def test_fixed_cadence_does_not_drift_with_read_cost():
    clock = FakeClock()
    source = ScriptedSource(clock=clock, read_cost_s=0.03)  # each read takes 30 ms
    sampler, ticks, gaps, errors = make(source, clock)
    run_fake(sampler, clock, clock.now + 10.0)
    times = [t.mono - ticks[0].mono for t in ticks[:50]]
    # Readings start 30 ms into each slot, slots stay exactly 100 ms apart: no drift.
    assert times[49] == pytest.approx(4.9, abs=1e-6)
    assert not gaps and not errors


def test_late_tick_becomes_a_gap_and_is_not_filled():
    clock = FakeClock()
    stall_at = 20

    def script(i):
        if i == stall_at:
            clock.now += 2.5  # the main thread held the GIL for 2.5 s
        return {"gpu0": {"sm_util": 50.0}}

    sampler, ticks, gaps, errors = make(ScriptedSource(script=script), clock)
    run_fake(sampler, clock, clock.now + 6.0)
    assert len(gaps) == 1
    assert gaps[0].duration_s == pytest.approx(2.6, abs=0.11)
    # No fabricated samples inside the gap.
    inside = [t for t in ticks if gaps[0].start < t.mono < gaps[0].end]
    assert inside == []


def test_small_lateness_is_not_a_gap():
    clock = FakeClock()

    def script(i):
        if i == 5:
            clock.now += 0.09  # 1.9 intervals after the previous sample: still a sample, not a gap
        return {"gpu0": {"sm_util": 1.0}}

    sampler, ticks, gaps, _ = make(ScriptedSource(script=script), clock)
    run_fake(sampler, clock, clock.now + 2.0)
    assert gaps == []


def test_a_sample_more_than_two_intervals_after_the_previous_is_a_gap():
    """The one gap rule (protocol.is_gap), the same as the sources': spacing, not lateness."""
    clock = FakeClock()

    def script(i):
        if i == 5:
            clock.now += 0.11  # 2.1 intervals after the previous sample
        return {"gpu0": {"sm_util": 1.0}}

    sampler, ticks, gaps, _ = make(ScriptedSource(script=script), clock)
    run_fake(sampler, clock, clock.now + 2.0)
    assert len(gaps) == 1 and gaps[0].duration_s == pytest.approx(0.21, abs=1e-6)


def test_source_exception_is_contained_and_noted_once():
    clock = FakeClock()

    def script(i):
        if i % 2:
            raise RuntimeError("driver hiccup")
        return {"gpu0": {"sm_util": 1.0}}

    good = ScriptedSource(name="good", script=lambda i: {"host": {"cpu_util": 5.0}})
    bad = ScriptedSource(name="bad", script=script)
    ticks, errors = [], []
    sampler = Sampler([bad, good], ticks.append, 0.1, on_error=errors.append, clock=clock, sleep=clock.sleep)
    run_fake(sampler, clock, clock.now + 2.0)
    assert len(errors) == 1 and "driver hiccup" in errors[0]
    assert all("host" in t.reading for t in ticks)  # the other source kept going


def test_stop_interrupts_the_wait_for_the_next_tick():
    """With a 1-hour interval, a stop that waited out the interval would never return: the
    stopper thread must end (the bound is a hang detector, not a timing claim)."""
    ticks = []
    sampler = Sampler([ScriptedSource()], ticks.append, interval=3600.0)
    sampler.start()
    time.sleep(0.05)
    stopper = threading.Thread(target=sampler.stop)
    stopper.start()
    stopper.join(timeout=60)
    assert not stopper.is_alive(), "stop() waited for the next tick"
    assert not sampler.running
    assert not [t for t in threading.enumerate() if t.name == "gpuprof-sampler"]


def test_restart_makes_a_new_thread_that_samples():
    ticks = []
    sampler = Sampler([ScriptedSource()], ticks.append, interval=0.01)
    for _ in range(3):
        before = len(ticks)
        sampler.start()
        wait_for(lambda: len(ticks) > before, 30, "a tick after the restart")  # nvitop's collector: none
        sampler.stop()


def test_interval_must_be_positive():
    with pytest.raises(ValueError, match="interval"):
        Sampler([], lambda t: None, interval=0)


# -- the process's periodic work runs in the gap after a tick (docs/sampling.md, "Cadence") --------
def test_after_next_tick_returns_once_the_next_tick_is_recorded():
    """Work started there has the gap to itself: the tick it waited for is recorded (on_tick
    returned) before it goes on, whatever the machine's speed (a 1-hour fallback never fires)."""
    recorded = []
    sampler = Sampler([ScriptedSource()], recorded.append, interval=0.05)
    sampler.start()
    try:
        wait_for(lambda: recorded, 30, "a first tick")
        for _ in range(3):
            before = len(recorded)
            sampler.after_next_tick()
            assert len(recorded) > before, "it returned before a tick was recorded"
    finally:
        sampler.stop()


def test_after_next_tick_goes_on_without_a_tick():
    """A lane that never ticks (stopped, or a source stuck in a call) must not hold the writer
    or the live update: a stopped lane returns at once, a stuck one within two intervals."""
    sampler = Sampler([ScriptedSource()], lambda tick: None, interval=0.05)
    sampler.after_next_tick()  # never started

    release = threading.Event()
    stuck = ScriptedSource(script=lambda i: release.wait(60) and {} if i else {"gpu0": {"sm_util": 0.0}})
    sampler = Sampler([stuck], lambda tick: None, interval=0.05)
    sampler.start()
    try:
        wait_for(lambda: stuck.calls >= 2, 30, "the source stuck in its second read")
        waiter = threading.Thread(target=sampler.after_next_tick)
        waiter.start()
        waiter.join(30)  # the bound is a hang detector: it returns after 0.1 s
        assert not waiter.is_alive(), "after_next_tick waited for a tick that never came"
    finally:
        release.set()
        sampler.stop()


def test_stop_releases_work_waiting_for_a_tick():
    sampler = Sampler([ScriptedSource()], lambda tick: None, interval=3600.0)
    sampler.start()
    wait_for(lambda: sampler.ticks >= 1, 30, "the first tick")
    waiter = threading.Thread(target=sampler.after_next_tick)
    waiter.start()
    time.sleep(0.05)
    sampler.stop()
    waiter.join(30)  # the fallback would be a second; a stop must not wait for it either way
    assert not waiter.is_alive()


def test_the_writer_flushes_only_once_its_pace_lets_it(tmp_path):
    """The writer waits for the lane's next tick (``pace``) before each flush: while the pace
    holds it, no row reaches the file; once it lets go, the rows are written."""
    from gpuprof_jupyter.core.protocol import Tick
    from gpuprof_jupyter.core.store.samples_file import SampleStreamWriter, samples_schema
    from gpuprof_jupyter.sampler_process.recorder import Recorder

    gate, paced = threading.Event(), []
    writer = SampleStreamWriter(tmp_path, samples_schema(["sm_util"]))
    recorder = Recorder(0.0, ["sm_util"], writer=writer, flush_every_s=0.01)
    recorder.pace = lambda: (paced.append(True), gate.wait(60))
    recorder.on_tick(Tick(0.1, 0.0, {"gpu0": {"sm_util": 1.0}}))
    recorder.start_writing()
    try:
        wait_for(lambda: paced, 30, "the writer waiting for its pace")
        assert writer.rows == 0
        gate.set()
        wait_for(lambda: writer.rows == 1, 30, "the flush, once paced")
    finally:
        gate.set()
        recorder.close(retries=0)
        writer.close()


def test_the_live_update_is_prepared_just_after_a_tick(monkeypatch):
    """The sampler process's live loop waits for the run's next tick before each update."""
    import types

    from gpuprof_jupyter.sampler_process import main

    order, quit_ = [], threading.Event()

    class Run:
        finished = False

        def after_next_tick(self):
            order.append("tick")

    def send(run):
        order.append("send")
        if len(order) >= 4:
            quit_.set()

    monkeypatch.setattr(main, "LIVE_PERIOD_S", 0.01)
    main.SamplerProcess._live_loop(types.SimpleNamespace(_quit=quit_, run=Run(), _send_live=send))
    assert order == ["tick", "send", "tick", "send"]
