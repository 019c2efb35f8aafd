"""Gates on serving figures with units: ``latency_p99 < 50 ms``, ``requests_per_s > 200``."""

from __future__ import annotations

import re
import time

import pytest
import torch

import gpuprof_jupyter as gp
from gpuprof_jupyter.cli import main
from gpuprof_jupyter.core.analysis.rules import RuleError, evaluate_rule, parse_rule


class Tail(torch.nn.Module):
    """2 ms a request, except every 20th: 80 ms (a slow tail that p99 sees and p50 does not)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear, self.calls = torch.nn.Linear(4, 4), 0

    def forward(self, x):
        self.calls += 1
        time.sleep(0.08 if self.calls % 20 == 0 else 0.002)
        return self.linear(x)


@pytest.mark.process
def test_a_p99_gate_fails_on_a_planted_slow_tail_and_says_why(tmp_path, capsys):
    store = tmp_path / "store"
    model = Tail().eval()
    with gp.profile("tail", source="sim", store=store, interval=0.05,
                    checks=["latency_p99 < 50 ms", "latency_p50 < 50 ms", "requests_per_s > 200"]) as p:
        with torch.no_grad():
            for _ in range(100):
                model(torch.randn(1, 4))
    results = {r["rule"]: r for r in p.experiment.meta.checks}
    p99 = results["latency_p99 < 50 ms"]
    assert not p99["passed"] and p99["measured"] >= 0.08  # the planted tail: at least its 80 ms sleep
    assert re.match(r"latency_p99_s = \d+\.\d\d ms \(figure; needs < 50\.00 ms\)", p99["detail"]), p99["detail"]
    assert results["latency_p50 < 50 ms"]["passed"]
    assert not results["requests_per_s > 200"]["passed"]  # ~ 1 / 6 ms
    assert main(["check", "tail", "--store", str(store), "--rule", "latency_p99 < 50 ms"]) == 1
    assert "FAIL latency_p99 < 50 ms" in capsys.readouterr().out
    assert main(["check", "tail", "--store", str(store), "--rule", "latency_p99 < 0.1 s"]) == 0
    assert main(["check", "tail", "--store", str(store), "--rule", "latency_p99 < 50 GiB"]) == 2
    assert "'GiB' is not a unit of 'latency_p99' (a time in seconds): it takes ms or s" in capsys.readouterr().err


@pytest.mark.parametrize("rule, metric, value", [
    ("latency_p99 < 50 ms", "latency_p99_s", 0.05),
    ("latency_p50 <= 0.02 s", "latency_p50_s", 0.02),
    ("requests_per_s > 200", "requests_per_s", 200.0),
    ("gpu_mem_peak_bytes < 20 GiB", "gpu_mem_peak_bytes", 20 * 2 ** 30),
    ("rss_bytes < 512 MiB for >=90%", "rss_bytes", 512 * 2 ** 20),
    ("sm_util > 60 % for >=80%", "sm_util", 60.0),
    ("data_wait_frac < 10 %", "data_wait_frac", 0.10),
    ("accuracy >= 92%", "accuracy", 92.0),  # a logged value: '%' is the writer's note, as before
])
def test_rules_take_the_units_their_metric_has(rule, metric, value):
    parsed = parse_rule(rule)
    assert parsed.metric == metric and parsed.value == pytest.approx(value)


@pytest.mark.parametrize("rule, message", [
    ("requests_per_s > 200 ms", "'ms' is not a unit of 'requests_per_s' (a rate or count): it takes a plain number"),
    ("sm_util > 60 ms", "'ms' is not a unit of 'sm_util' (a percentage): it takes %"),
    ("gpu_mem_peak_bytes < 20 s", "'s' is not a unit of 'gpu_mem_peak_bytes' (bytes): it takes GiB or MiB"),
    ("accuracy > 3 GiB", "'GiB' is not a unit of 'accuracy' (a logged value of unknown unit)"),
])
def test_a_wrong_unit_is_a_clear_error(rule, message):
    with pytest.raises(RuleError, match=re.escape(message)):
        parse_rule(rule)


def test_a_serving_gate_on_a_run_without_requests_says_so():
    from tests.simexp import requests_frame, sim_experiment

    training = sim_experiment("compute-bound", seconds=2)
    result = evaluate_rule(training, "latency_p99 < 50 ms")
    assert not result.passed and "serving figure and this run recorded no requests" in result.detail
    serving = sim_experiment("compute-bound", seconds=2, requests=requests_frame([0.01] * 50 + [0.2], gaps=0.005))
    result = evaluate_rule(serving, "latency_p99 < 50 ms")
    assert not result.passed and result.measured > 0.05
    assert evaluate_rule(serving, "latency_p50 < 50 ms").passed


@pytest.mark.process
def test_a_script_under_gpuprof_run_is_served_and_gated_with_units(tmp_path, capsys, monkeypatch):
    """gpuprof run: the script runs in a child process; its requests reach the run like steps."""
    import sys
    from pathlib import Path

    from gpuprof_jupyter.core.store.directory import Store

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    script = Path(__file__).resolve().parent / "data" / "scripts" / "serve_plain.py"
    store = tmp_path / "store"
    rc = main(["run", "--store", str(store), "--source", "sim", "--interval", "0.05", "-n", "served",
               "--check", "latency_p99 < 5 s", "--check", "requests_per_s > 100000", "--",
               sys.executable, str(script), "--requests", "40"])
    exp = Store(store).load("served")
    r = exp.summary["requests"]
    assert r["count"] == 40 and r["batch"] == 3 and exp.summary["run_kind"] == "serving"
    results = {c["rule"]: c["passed"] for c in exp.meta.checks}
    assert results == {"latency_p99 < 5 s": True, "requests_per_s > 100000": False} and rc == 1
    assert exp.meta.params["serving.batch_size"] == 3 and exp.meta.params["serving.model"] == "Sequential"


from hypothesis import given, settings  # noqa: E402 - beside the test that uses it
from hypothesis import strategies as st  # noqa: E402
from tests.property_budget import examples  # noqa: E402


@settings(max_examples=examples(200), deadline=None)
@given(value=st.floats(0, 1e6, allow_nan=False).map(lambda v: round(v, 3)),
       unit=st.sampled_from(["ms", "s", "GiB", "MiB", "%", None]),
       metric=st.sampled_from(["latency_p99", "gpu_mem_peak_bytes", "sm_util", "data_wait_frac", "requests_per_s"]))
def test_a_number_with_a_unit_is_the_metric_s_unit_or_a_clear_error(value, unit, metric):
    """Rules are what users type: every unit either converts exactly or is refused by name."""
    from gpuprof_jupyter.core.analysis.rule_units import UNITS

    text = f"{metric} < {value:g}{'' if unit is None else ' ' + unit}"
    allowed = {"latency_p99": {"ms", "s"}, "gpu_mem_peak_bytes": {"GiB", "MiB"}, "sm_util": {"%"},
               "data_wait_frac": {"%"}, "requests_per_s": set()}[metric]
    if unit is not None and unit not in allowed:
        with pytest.raises(RuleError, match=f"'{re.escape(unit)}' is not a unit of '{metric}'"):
            parse_rule(text)
        return
    if unit is None and metric == "latency_p99":  # a short name: 50 alone would be read as seconds
        with pytest.raises(RuleError, match="write its unit, ms or s"):
            parse_rule(text)
        return
    if unit is None and metric == "data_wait_frac" and float(f"{value:g}") > 1:  # a share is 0..1
        with pytest.raises(RuleError, match="a share from 0 to 1"):
            parse_rule(text)
        return
    rule = parse_rule(text)
    number = float(f"{value:g}")
    expected = number if unit is None else (number / 100 if metric == "data_wait_frac" else number * UNITS[unit][1])
    assert rule.value == pytest.approx(expected)
