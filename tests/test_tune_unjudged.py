"""tune() on a host-only source: the cell's GPU rules cannot be judged there, which is neither a
failed check nor a pass; the search still finds its winner on the rules it can judge."""

from __future__ import annotations

import time

import pytest

import gpuprof_jupyter as gp


def _train():
    for _ in range(30):  # 5 warm-up + 12 measured steps a trial, with room
        time.sleep(0.02)
        gp.step(8)


@pytest.mark.process
def test_tune_on_a_host_source_says_its_gpu_rules_cannot_be_judged(store_dir):
    report = gp.tune(_train, source="host", store=store_dir, interval=0.02, budget="60s", trial_steps=12,
                     checks=["sm_util > 60 for >=80%", "steps >= 100"])
    text = str(report)
    assert "check failed: sm_util" not in text, text
    assert "cannot be judged: sm_util > 60 for >=80% (sm_util was not measured in the steady steps: sm_util is a " \
           "GPU metric and this run's source (host) read no GPU)" in text, text
    assert "check failed: steps >= 100" in text  # what can be judged still fails
    trials = report.result.trials
    assert trials and all(t.figures.checks_failed == ["steps >= 100"] for t in trials)
    assert all(len(t.figures.checks_not_judged) == 1 for t in trials)
    judged = gp.tune(_train, source="host", store=store_dir, interval=0.02, budget="60s", trial_steps=12,
                     checks=["sm_util > 60 for >=80%", "steps >= 5"])
    assert judged.winner is not None, str(judged)  # an unjudged GPU rule does not bar every trial
    assert "gpuprof-tune-steady" not in str(judged)
