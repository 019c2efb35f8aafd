"""Memory in rules and gates (docs/memory.md, "Rules"): ``peak_memory < 70 GiB`` and
``memory_headroom > 10 %`` judged by --check, ``gpuprof check`` and export; a wrong unit is a
clear error; an alert on them says what to watch live instead; a run that recorded no memory
cannot be judged (never a pass)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from gpuprof_jupyter.cli import main
from gpuprof_jupyter.core.analysis.live_alerts import parse_alerts
from gpuprof_jupyter.core.analysis.rules import RuleError, evaluate_rule, parse_rule
from gpuprof_jupyter.core.analysis.summary import summary_of
from gpuprof_jupyter.core.store.directory import Store
from tests.memexp import memory_run

# memory_run(64): a peak of 10.25 GiB on the simulated GPU's 40 GiB (74.4 % left)


@pytest.mark.parametrize("text, verdict", [
    ("peak_memory < 70 GiB", "PASS"), ("peak_memory < 10 GiB", "FAIL"), ("peak_memory < 10500 MiB", "PASS"),
    ("memory_headroom > 10 %", "PASS"), ("memory_headroom > 80 %", "FAIL"),
])
def test_peak_and_headroom_rules_are_judged_in_their_units(text, verdict):
    result = evaluate_rule(memory_run(64), parse_rule(text))
    assert result.verdict == verdict, result
    if text.startswith("peak_memory"):
        assert "10.25 GiB" in result.detail, result.detail  # said in the rule's unit, not 1.1e+10 B


@pytest.mark.parametrize("text, said", [
    ("peak_memory < 70 ms", "'ms' is not a unit of 'peak_memory' (bytes): it takes GiB or MiB"),
    ("memory_headroom > 10 GiB", "'GiB' is not a unit of 'memory_headroom'"),
])
def test_a_wrong_unit_is_a_clear_error(text, said):
    with pytest.raises(RuleError, match=said.replace("(", r"\(").replace(")", r"\)")):
        parse_rule(text)


def test_a_run_that_recorded_no_memory_cannot_be_judged():
    result = evaluate_rule(memory_run(64, breakdown=False, step_peaks=False), parse_rule("peak_memory < 70 GiB"))
    assert result.verdict == "CANNOT JUDGE" and not result.passed, result


def test_alerts_on_the_runs_peak_say_what_to_watch_live():
    with pytest.raises(RuleError, match="known at its end.*step_peak_memory_bytes"):
        parse_alerts(["peak_memory > 70 GiB"])
    rule, = parse_alerts(["step_peak_memory_bytes > 70 GiB"])
    assert rule.value == 70 * 1024**3


def test_gpuprof_check_gates_on_memory(store_dir, capsys):
    store = Store(store_dir)
    run = memory_run(64, name="mem")
    summary_of(run)  # kept in the metadata, as a finished run's is
    store.create(run.meta)
    store.save_steps(run.meta, pa.Table.from_pandas(run.steps, preserve_index=False))
    store.save_meta(run.meta)
    assert main(["check", "mem", "--store", str(store_dir), "--rule", "peak_memory < 70 GiB",
                 "--rule", "memory_headroom > 10 %"]) == 0
    assert main(["check", "mem", "--store", str(store_dir), "--rule", "peak_memory < 8 GiB"]) == 1
    out = capsys.readouterr().out
    assert "FAIL peak_memory < 8 GiB" in out and "10.25 GiB" in out, out
