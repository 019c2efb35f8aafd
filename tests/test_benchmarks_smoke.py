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


@pytest.mark.process
def test_runner_table_and_missing_ui_benchmark(monkeypatch):
    from benchmarks import __main__ as runner

    fig = _common.figure("x", "a figure", 1.5, "ms", "<= 2 ms", 2.0, gated=True)
    text = runner.table({"cadence": {"figures": [fig]}, "ui_traffic": {"missing": "not there", "figures": []}}, "tiny", {"cadence": 1.0})
    assert "| cadence | a figure | 1.5 ms | <= 2 ms | met |" in text
    assert "not run" in text


def test_gpu_check_exits_clearly_without_gpu(monkeypatch, capsys):
    import shutil

    from benchmarks import gpu_check

    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(SystemExit) as exc:
        gpu_check.require_gpu()
    assert exc.value.code == 3
    assert "no NVIDIA GPU" in capsys.readouterr().err
