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
    assert "PASS (simulated) sm_util > 60 for >=80%" in out and "PASS accuracy >= 0.92" in out  # logged: not simulated
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
    assert "FAIL accuracy >= 0.99" in out and "PASS (simulated) sm_util < 50 for <=30%" in out
    assert main(["check", "nope", "--store", str(store_dir), "--rule", "accuracy > 1"]) == 2
    assert main(["check", "ci", "--store", str(store_dir), "--rule", "sm_utl > 1 for 5%"]) == 2
    assert "did you mean sm_util?" in capsys.readouterr().err


STEPS = textwrap.dedent("""
    import sys, time
    import gpuprof_jupyter
    for _ in range(int(sys.argv[1])):
        time.sleep(float(sys.argv[2]))
        gpuprof_jupyter.step(8)
""")


@pytest.fixture
def steps_script(tmp_path):
    path = tmp_path / "steps.py"
    path.write_text(STEPS)
    return str(path)


@pytest.mark.process
def test_per_step_gate_without_a_gpu_cannot_judge(store_dir, steps_script, capsys):
    """CPU-only CI: the GPU gate says CANNOT JUDGE and exits 3 (never PASS), the host gates on
    steps, data wait and throughput are judged; --accept-unjudged lets the unjudged rule through."""
    gate = ["--check", "sm_util > 60 for >=80% per step", "--check", "steps >= 8", "--check", "data_wait_frac < 50%",
            "--check", "samples_per_s > 1"]
    rc = main(["run", "--store", str(store_dir), "--source", "host", "--interval", "0.03", "-n", "cpu-ci", *gate,
               "--", sys.executable, steps_script, "8", "0.1"])
    out = capsys.readouterr().out
    assert rc == 3, out
    assert "CANNOT JUDGE sm_util > 60 for >=80% per step: no step had a sm_util reading" in out
    assert "read no GPU: judge it on a GPU runner" in out and "PASS sm_util" not in out
    assert "PASS steps >= 8" in out and "PASS data_wait_frac < 50%" in out and "PASS samples_per_s > 1" in out
    stored, *_ = gp.load("cpu-ci", store=store_dir).meta.checks
    assert (stored["passed"], stored["judged"]) == (False, False) and "GPU runner" in stored["to_judge"]
    assert main(["check", "cpu-ci", "--store", str(store_dir)]) == 3
    assert main(["check", "cpu-ci", "--store", str(store_dir), "--accept-unjudged"]) == 0
    assert main(["check", "cpu-ci", "--store", str(store_dir), "--accept-unjudged", "--rule", "steps >= 9",
                 "--rule", "sm_util > 60 for >=80%"]) == 1  # a failure is a failure
    assert "FAIL steps >= 9" in capsys.readouterr().out
    assert main(["run", "--store", str(store_dir), "--source", "host", "--interval", "0.03", "--accept-unjudged",
                 *gate, "--", sys.executable, steps_script, "8", "0.1"]) == 0


@pytest.mark.process
def test_per_step_gate_on_steps_shorter_than_the_interval_cannot_judge(store_dir, steps_script, capsys):
    """gpuprof run --source sim with 10 ms steps under 0.2 s samples: each step's sm_util would
    repeat its neighbours' readings, so the gate cannot judge it, and says it is simulated."""
    rc = main(["run", "--store", str(store_dir), "--source", "sim", "--interval", "0.2", "-n", "short",
               "--check", "sm_util > 60 for >=80% per step", "--", sys.executable, steps_script, "80", "0.01"])
    out = capsys.readouterr().out
    assert rc == 3, out
    line, = [ln.strip() for ln in out.splitlines() if "per step" in ln and "sm_util > 60" in ln]
    assert line.startswith("CANNOT JUDGE (simulated) sm_util > 60 for >=80% per step: steps last"), line
    assert "shorter than sm_util's native window (0.2 s" in line and "make each reported step last at least 0.2 s" in line
    assert "PASS" not in line


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
def test_list_names_the_store_it_read(store_dir, script, tmp_path, monkeypatch, capsys):
    """Two stores on one machine: the listing says which one it read (--store, $GPUPROF_STORE,
    or the default .gpuprof/ of the working directory)."""
    run(store_dir, script, "--name", "listed")
    capsys.readouterr()
    assert main(["list", "--store", str(store_dir)]) == 0
    first, header, row = capsys.readouterr().out.splitlines()
    assert first == f"store {store_dir.absolute()}: 1 experiment" and "listed" in row
    monkeypatch.setenv("GPUPROF_STORE", str(store_dir))
    assert main(["list"]) == 0 and capsys.readouterr().out.startswith(f"store {store_dir.absolute()}: ")
    monkeypatch.delenv("GPUPROF_STORE")
    monkeypatch.chdir(tmp_path)
    assert main(["list"]) == 0
    assert capsys.readouterr().out == f"no experiments in store {tmp_path / '.gpuprof'}\n"
    assert not (tmp_path / ".gpuprof").exists()  # listing creates nothing


@pytest.mark.process
def test_console_script_entry_point(store_dir, script):
    """The installed `gpuprof` runs as its own process (python -m form: same entry point)."""
    proc = subprocess.run([sys.executable, "-m", "gpuprof_jupyter.cli", "run", "--store", str(store_dir),
                           "--source", "sim:compute-bound", "--interval", "0.03", "--check", "accuracy >= 0.95",
                           "--", sys.executable, script, "0.9", "0"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert "FAIL accuracy >= 0.95" in proc.stdout
