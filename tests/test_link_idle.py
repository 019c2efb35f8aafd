"""Between profiled cells the link's thread runs nothing on a timer: every wake-up of a kernel
thread costs the training thread more than its own CPU (benchmarks/README.md), and a plain
cell's training is no exception."""

from __future__ import annotations

import threading
import time
from multiprocessing import Pipe

from gpuprof_jupyter.core.protocol import Ready
from gpuprof_jupyter.runtime import link as link_module


class Proc:
    pid = 0

    def poll(self):
        return 0


def _until(condition, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "the link's thread did not get there"
        time.sleep(0.01)


def test_between_runs_the_links_thread_sleeps_until_a_message_and_a_run_starts_its_period(monkeypatch):
    timeouts: list = []
    real_wait = link_module.wait

    def spy(objects, timeout=None):
        timeouts.append(timeout)
        return real_wait(objects, timeout)

    monkeypatch.setattr(link_module, "wait", spy)
    link = link_module.SamplerLink()
    ours, theirs = Pipe(duplex=True)
    thread = threading.Thread(target=link._receive, args=(ours, Proc()), daemon=True)
    thread.start()
    _until(lambda: len(timeouts) >= 1)
    theirs.send(Ready(0))  # a message: handled, then back to sleep
    _until(lambda: link._ready.is_set() and len(timeouts) >= 2)
    assert timeouts == [None, None]  # no run: no timer
    handed = threading.Event()
    link.handover = lambda: handed.set()  # a run begins (session.start) and wakes the thread
    link.hand_over_soon()
    _until(handed.is_set)
    _until(lambda: len(timeouts) >= 4)
    assert timeouts[2] is not None and timeouts[2] <= link_module.HANDOVER_PERIOD_S  # the run's period
    link.handover = None
    theirs.close()  # the process is gone: the thread ends
    thread.join(10)
    assert not thread.is_alive()
