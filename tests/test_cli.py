"""`gpuprof run/check/compare/export/report` outside notebooks, for CI."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

import gpuprof_jupyter as gp
from gpuprof_jupyter.cli import main

SCRIPT = textwrap.dedent("""
    import sys, time
    import gpuprof_jupyter
    time.sleep(0.3)
    gpuprof_jupyter.log(accuracy=float(sys.argv[1]))
    sys.exit(int(sys.argv[2]))
""")


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(SCRIPT)
    return str(path)


def run(store_dir, script, *extra, accuracy="0.93", exit_code="0"):
    return main(["run", "--store", str(store_dir), "--source", "sim:compute-bound", "--interval", "0.03", *extra,
                 "--", sys.executable, script, accuracy, exit_code])


@pytest.mark.process
def test_run_with_passing_rules(store_dir, script, capsys):
    rc = run(store_dir, script, "--name", "ci", "--param", "batch_size=64",
             "--check", "sm_util > 60 for >=80%", "--check", "accuracy >= 0.92")
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "PASS sm_util > 60 for >=80%" in out and "PASS accuracy >= 0.92" in out and "SIMULATED" in out
    exp = gp.load("ci", store=store_dir)
    assert exp.status == "ok" and exp.meta.user_metrics == {"accuracy": 0.93}
    assert exp.meta.params == {"batch_size": 64} and exp.meta.context["command"][-2:] == ["0.93", "0"]


@pytest.mark.process
def test_run_with_failing_rule_exits_1(store_dir, script, capsys):
    rc = run(store_dir, script, "--name", "ci-fail", "--check", "accuracy >= 0.95")
    assert rc == 1
    assert "FAIL accuracy >= 0.95" in capsys.readouterr().out
    assert gp.load("ci-fail", store=store_dir).meta.checks[0]["passed"] is False


@pytest.mark.process
def test_run_failing_script_passes_its_status_through(store_dir, script, capsys):
    assert run(store_dir, script, "--name", "crash", exit_code="3") == 3
    exp = gp.load("crash", store=store_dir)
    assert exp.status == "error" and "exited with status 3" in exp.meta.error


def test_run_usage_errors(store_dir, script, capsys):
    assert run(store_dir, script, "--check", "sm_util >> 60") == 2
    assert "expected a number" in capsys.readouterr().err
    assert main(["run", "--store", str(store_dir), "--source", "sim"]) == 2
    assert not store_dir.exists() or not gp.Store(store_dir).list()


@pytest.mark.process
def test_check_experiment_or_store(store_dir, script, capsys):
    run(store_dir, script, "--name", "ci", "--check", "sm_util > 60 for >=80%")
    capsys.readouterr()
    assert main(["check", "ci", "--store", str(store_dir), "--rule", "sm_util > 60 for >=80%"]) == 0
    assert main(["check", str(store_dir), "--rule", "accuracy >= 0.99"]) == 1  # a store: its latest run
    exp = gp.load("ci", store=store_dir)
    assert main(["check", str(store_dir / exp.id), "--rule", "sm_util < 50 for <=30%"]) == 0  # a directory
    assert main(["check", str(store_dir)]) == 0  # its own rules
    out = capsys.readouterr().out
    assert "FAIL accuracy >= 0.99" in out and "PASS sm_util < 50 for <=30%" in out
    assert main(["check", "nope", "--store", str(store_dir), "--rule", "accuracy > 1"]) == 2
    assert main(["check", "ci", "--store", str(store_dir), "--rule", "sm_utl > 1 for 5%"]) == 2
    assert "did you mean sm_util?" in capsys.readouterr().err


@pytest.mark.process
def test_compare_export_report(store_dir, script, tmp_path, capsys):
    run(store_dir, script, "--name", "base", "--param", "batch_size=32")
    run(store_dir, script, "--name", "b64", "--param", "batch_size=64")
    capsys.readouterr()
    assert main(["compare", "--store", str(store_dir), "--price-kwh", "0.3"]) == 0
    out = capsys.readouterr().out
    assert "baseline 'base'" in out and "64 *" in out and "cost" in out
    pipeline = tmp_path / "pipeline.yaml"
    assert main(["export", "b64", "--store", str(store_dir), "--path", str(pipeline)]) == 0
    assert "batch_size: 64  # 32 -> 64; alone in b64 against base" in pipeline.read_text()
    pipeline.write_text("workflow: [")
    assert main(["export", "b64", "--store", str(store_dir), "--path", str(pipeline)]) == 2
    assert "not valid YAML" in capsys.readouterr().err
    report = tmp_path / "r.html"
    assert main(["report", "--store", str(store_dir), "-o", str(report)]) == 0
    assert report.stat().st_size > 100_000 and "Bokeh" in report.read_text()


@pytest.mark.process
def test_console_script_entry_point(store_dir, script):
    """The installed `gpuprof` runs as its own process (python -m form: same entry point)."""
    proc = subprocess.run([sys.executable, "-m", "gpuprof_jupyter.cli", "run", "--store", str(store_dir),
                           "--source", "sim:compute-bound", "--interval", "0.03", "--check", "accuracy >= 0.95",
                           "--", sys.executable, script, "0.9", "0"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert "FAIL accuracy >= 0.95" in proc.stdout
