"""Issue 20 part 2: the ranks of a distributed run, on simulated experiments (no processes):
the per-step gate judged per rank on its own GPU, a compute straggler, ranks on the wrong GPU."""

from __future__ import annotations

import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuprof_jupyter.core.analysis.diagnosis import diagnose
from gpuprof_jupyter.core.analysis.rules import evaluate_rules
from tests.simexp import sim_experiment, steps_frame


def _ranked(frames: dict[int, pd.DataFrame]) -> pd.DataFrame:
    return pd.concat([f.assign(rank=rank) for rank, f in frames.items()], ignore_index=True)


def _two_ranks(steps, devices, scenario="compute-bound", visible=None):
    exp = sim_experiment(scenario, gpus=2, seconds=6, steps=steps)
    exp.meta.context["ranks"] = {str(r): {"device": d, "local_rank": r, "world_size": len(devices),
                                          "cuda_visible_devices": visible, "ended": "ok"}
                                 for r, d in enumerate(devices)}
    return exp


def test_per_step_gate_is_judged_per_rank_on_its_gpu_and_fails_if_one_rank_fails():
    steps = _ranked({0: steps_frame(20, 6, 0.0), 1: steps_frame(20, 6, 0.0)})
    exp = _two_ranks(steps, ["cuda:0", "cuda:1"], scenario="lagging")  # the last GPU runs at ~59 % SM
    result, = evaluate_rules(exp, ["sm_util > 60 for >=80% per step"])
    assert not result.passed and result.detail.startswith("judged per rank, failed on rank 1:"), result.detail
    assert "rank 0: sm_util > 60 % in 20 of 20 steps" in result.detail
    assert len(exp.steps) == 20 and set(exp.rank_steps()) == {0, 1}  # the run's steps: the lowest rank's
    assert {f.id for f in diagnose(exp)} & {"straggler-rank", "ranks-waiting", "rank-gpu-mismatch"} == set()


def test_a_rank_slow_in_its_compute_is_named_with_its_gpu():
    steps = _ranked({0: steps_frame(20, 3, 0.0), 1: steps_frame(10, 3, 0.0)})  # not in lockstep: rank 1 twice slower
    exp = _two_ranks(steps, ["cuda:0", "cuda:1"])
    finding = next(f for f in diagnose(exp) if f.id == "straggler-rank")
    assert (finding.numbers["rank"], finding.numbers["cause"]) == (1, "compute") and "gpu1" in finding.next_step
    assert exp.summary["ranks"]["1"]["gpu"] == "gpu1"


def test_ranks_sharing_a_gpu_and_a_rank_off_its_local_rank():
    steps = _ranked({0: steps_frame(20, 6, 0.0), 1: steps_frame(20, 6, 0.0)})
    shared = next(f for f in diagnose(_two_ranks(steps, ["cuda:0", "cuda:0"])) if f.id == "rank-gpu-mismatch")
    assert shared.title == "Ranks 0, 1 share GPU 0"
    exp = _two_ranks(steps, ["cuda:0", "cuda:1"])
    exp.meta.context["ranks"]["2"] = {"device": "cuda:0", "local_rank": 2, "cuda_visible_devices": "2"}
    odd = next(f for f in diagnose(exp) if f.id == "rank-gpu-mismatch")
    assert odd.title == "Rank 2 is not on the GPU its neighbours assume" and "'2'" in odd.next_step


def test_live_header_step_time_per_rank():
    from types import SimpleNamespace

    from gpuprof_jupyter.runtime.hooks.activity import ActivityLog
    from gpuprof_jupyter.runtime.record.events import STEP
    from gpuprof_jupyter.render.live_header import rank_step_times

    children = []
    for rank, step_s in ((0, 0.2), (1, 0.25)):
        log = ActivityLog(t0=0.0)
        for i in range(1, 11):
            log.emit((STEP, i * step_s, 8))
        children.append(SimpleNamespace(rank=rank, activity=log))
    text = rank_step_times(SimpleNamespace(children=children), now_s=3.0)
    assert text == "step time per rank (last 10 s): 0 200 ms · 1 250 ms", text
    assert rank_step_times(SimpleNamespace(children=children[:1]), now_s=3.0) == ""


@pytest.mark.browser
def test_rank_rows_and_findings_in_a_browser(offline_page, artifacts_dir, tmp_path):
    from gpuprof_jupyter.core.analysis.compare import compare_experiments
    from gpuprof_jupyter.render.comparison import comparison_html
    from gpuprof_jupyter.render.summary_html import render_summary_html

    slow = _two_ranks(_ranked({0: steps_frame(20, 6, 0.0), 1: steps_frame(20, 6, 0.8)}), ["cuda:0", "cuda:1"])
    slow.meta.name = "ddp-slow-rank-1"
    fixed = _two_ranks(_ranked({0: steps_frame(20, 3, 0.0), 1: steps_frame(20, 3, 0.05)}), ["cuda:0", "cuda:1"])
    fixed.meta.name = "ddp-fixed"
    page = tmp_path / "ranks.html"
    page.write_text("<html><body>" + render_summary_html(slow)
                    + comparison_html(compare_experiments([slow, fixed]), plots=False) + "</body></html>")
    offline_page.goto(page.as_uri())
    text = offline_page.inner_text("body")
    assert "Rank 1 is the straggler: its data loading" in text and "Ranks wait for each other (rank 0)" in text
    rows = offline_page.locator("table.gpuprof-table tr", has_text="rank 1").count()
    assert rows == 3  # its row in the summary, and in the comparison's ranks table for both runs
    assert "waiting for other ranks p50" in text
    offline_page.screenshot(path=str(artifacts_dir / "ranks.png"), full_page=True)


def test_one_rank_resolver_rank_then_local_rank_then_spawn_index():
    from gpuprof_jupyter.core.child_channel import resolve_rank

    assert resolve_rank(3, 1, 0) == 3  # torchrun: RANK across nodes
    assert resolve_rank(None, 1, 0) == 1  # a launcher that sets only LOCAL_RANK
    assert resolve_rank(None, None, 1) == 1  # torch.multiprocessing.spawn without RANK
    assert resolve_rank(0, None, 5) == 0 and resolve_rank(None, None, None) is None


def test_trace_ranks_grammar_is_strict_and_one():
    from gpuprof_jupyter.core.child_channel import parse_trace_ranks, traced

    assert parse_trace_ranks("all") == "all" and parse_trace_ranks(" 0, 2 ") == {0, 2}
    for bad in ("", "1,,2", "one", "0;1", "all,1", "1-3", "1,"):
        with pytest.raises(ValueError, match="--trace-ranks takes all or ranks separated by commas"):
            parse_trace_ranks(bad)
    with pytest.raises(ValueError):  # the child reads the grammar the command checked
        traced(1, "1,x")
    assert traced(None, "0") and not traced(None, "1") and traced(2, "all") and traced(2, "0,2")


@given(st.lists(st.integers(min_value=0, max_value=10_000), min_size=1), st.sampled_from([",", ", ", " ,"]))
def test_trace_ranks_round_trip(ranks, sep):
    from gpuprof_jupyter.core.child_channel import parse_trace_ranks

    assert parse_trace_ranks(sep.join(map(str, ranks))) == set(ranks)


@given(st.text(max_size=20))
def test_trace_ranks_any_text_is_a_set_all_or_a_valueerror(text):
    from gpuprof_jupyter.core.child_channel import parse_trace_ranks

    try:
        parsed = parse_trace_ranks(text)
    except ValueError:
        return
    assert parsed == "all" or all(isinstance(r, int) for r in parsed)


def test_gpuprof_run_refuses_a_malformed_trace_ranks_before_starting(store_dir, capsys):
    from gpuprof_jupyter.cli import main

    rc = main(["run", "--store", str(store_dir), "--source", "sim", "--trace", "steps=1:2", "--trace-ranks", "0;1",
               "--", "python", "-c", "pass"])
    assert rc == 2 and "--trace-ranks takes all or ranks separated by commas" in capsys.readouterr().err
    assert not list(store_dir.glob("*/meta.json"))
