"""Each benchmark module runs in its tiny mode and produces its JSON keys (no timing asserts)."""

from __future__ import annotations

import json

import pytest

from benchmarks import _common

FAST = ["sampler_cost", "cadence", "startup", "long_run", "trace", "alert_trace", "hooks", "tune", "store_scale", "stuck", "job_scale", "session"]


def _check(name: str, data: dict) -> None:
    assert data["figures"], name
    for f in data["figures"]:
        assert {"id", "label", "value", "unit", "target", "gated", "ok"} <= set(f), f
    saved = json.loads((_common.RESULTS / f"{name}.tiny.json").read_text())
    assert saved["benchmark"] == name and saved["mode"] == "tiny" and "machine" in saved
    assert [f["id"] for f in saved["figures"]] == [f["id"] for f in data["figures"]]


@pytest.mark.process
@pytest.mark.parametrize("name", FAST)
def test_benchmark_runs_tiny(name):
    import importlib

    data = importlib.import_module(f"benchmarks.bench_{name}").run("tiny")
    _check(name, data)


@pytest.mark.kernel
def test_overhead_benchmark_runs_tiny():
    from benchmarks import bench_overhead

    data = bench_overhead.run("tiny")
    _check("overhead", data)
    assert {"kernel_cpu_1gpu", "kernel_cpu_8gpu", "wall_ratio_1gpu", "wall_ratio_1gpu_busy", "wall_ratio_8gpu", "process_p99_late_ms_8gpu",
            "live_ratio_unplaced_1gpu", "live_ratio_unplaced_1gpu_busy", "live_ratio_unplaced_8gpu",
            "live_ratio_unplaced_8gpu_busy", "live_training_waits_unplaced_1gpu",
            "live_threads_added_unplaced_8gpu"} <= {f["id"] for f in data["figures"]}



@pytest.mark.browser
@pytest.mark.timeout(600)
def test_live_browser_benchmark_runs_tiny():
    """The page-open run: JupyterLab and Chromium really ran the blocks, and the Jupyter server's
    and Chromium's CPU were read in both states."""
    from benchmarks import bench_live_browser

    data = bench_live_browser.run("tiny")
    _check("live_browser", data)
    ids = {f["id"] for f in data["figures"]}
    assert {"live_ratio_lab_1gpu", "live_ratio_lab_1gpu_busy", "live_training_waits_lab_1gpu",
            "page_cpu_chromium_lab_1gpu", "page_cpu_server_lab_1gpu_busy"} <= ids, ids
    quiet = data["runs"]["lab_1gpu"]
    assert quiet["rounds"] == 2, quiet
    assert {"Chromium (every process)", "the Jupyter server"} <= set(quiet["on"]["watched_pct"]), quiet["on"]

@pytest.mark.process
def test_runner_table_and_missing_ui_benchmark(monkeypatch):
    from benchmarks import __main__ as runner

    fig = _common.figure("x", "a figure", 1.5, "ms", "<= 2 ms", 2.0, gated=True)
    text = runner.table({"cadence": {"figures": [fig]}, "ui_traffic": {"missing": "not there", "figures": []}}, "tiny", {"cadence": 1.0})
    assert "| cadence | a figure | 1.5 ms | <= 2 ms | met |" in text
    assert "not run" in text



def test_rows_of_a_benchmark_rerun_alone_go_in_the_runners_order():
    """``--only NAME``: its rows replace its own where they are; a benchmark new to the table
    goes after the rows of the benchmarks before it in ORDER, not at the table's end."""
    from benchmarks import __main__ as runner

    lines = ["| benchmark | figure |", "| --- | --- |", "| overhead | a |", "| overhead | b |", "| ui_traffic | c |",
             "| session | d |"]
    placed = runner._rows_placed(lines, "live_browser")
    assert placed == lines[:4] + [runner._PLACE] + lines[4:]
    assert runner._rows_placed(placed[:4] + ["| live_browser | x |"] + placed[5:], "live_browser") == placed
    first = runner._rows_placed(lines[:2] + ["| ui_traffic | c |"], runner.ORDER[0])
    assert first == lines[:2] + [runner._PLACE, "| ui_traffic | c |"]

def test_gpu_check_exits_clearly_without_gpu(monkeypatch, capsys):
    import shutil

    from benchmarks import gpu_check

    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(SystemExit) as exc:
        gpu_check.require_gpu()
    assert exc.value.code == 3
    assert "no NVIDIA GPU" in capsys.readouterr().err
