"""Issue 10 part 8, wired: --alert rules judged in the sampler process while a run goes on,
sent to the kernel (the live header) and kept with the experiment (meta.alerts)."""

from __future__ import annotations

import time

import pytest

import gpuprof_jupyter as gp
from gpuprof_jupyter.render.alerts_html import alert_header_html
from tests.fakes import wait_for


def _batches(n: int, wait_s: float):
    for _ in range(n):
        time.sleep(wait_s)
        yield 32


@pytest.mark.process
def test_alerts_fire_live_and_are_kept(store_dir):
    with gp.profile(name="alerted", source="sim:input-bound", store=store_dir, interval=0.02,
                    alerts=["sm_util < 50 for >30% within step", "power_w > 100000"]) as p:
        # Each step waits 0.15 s for data, then computes for 0.1 s. Once the kernel's events reach
        # the sampler process (the link's first hand-over: within 2 s), the simulated GPU follows
        # them and idles 60 % of every step; before that it plays its scenario, whose phase against
        # the steps is luck. So the steps outlast the first hand-over, and the verdict never
        # depends on where it fell.
        for _ in gp.track(_batches(12, wait_s=0.15)):
            time.sleep(0.1)
            gp.step(32)
        # exchanges are once a second; a loaded machine is slower
        live = list(wait_for(lambda: p.session.alerts_fired, 10, "the alert, live in the kernel"))
    stored = gp.load("alerted", store=store_dir).meta.alerts
    assert stored and all(a["rule"] == "sm_util < 50 for >30% within step" for a in stored)
    assert stored[0]["span"] == "step" and "of step" in stored[0]["evidence"]
    assert live and live[0] == stored[0]  # the same alert, live in the kernel and saved
    assert "sm_util &lt; 50" in alert_header_html(live)
    assert len(stored) == 1  # the rate limit: once per 30 s (the run lasts ~3 s)
