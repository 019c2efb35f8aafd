"""A fault in any step of the profiler's own work never wedges the extension.

The steps are not listed by hand: a clean profiled cell is run first with every step's name
recorded (``core.guarded.call``), then a fault is injected into each of them in turn. After
each fault no profiler thread runs, ``%gpuprofile status`` shows nothing running, the saved
experiment carries the note, the cell's own result stands and the next profiled cell works.
"""

from __future__ import annotations

import threading

import pytest
from IPython.core.interactiveshell import InteractiveShell

import gpuprof_jupyter as gp
from gpuprof_jupyter.core.analysis.rules import RuleFailed
from gpuprof_jupyter.core import guarded
from gpuprof_jupyter.core.protocol import Ping
from gpuprof_jupyter.core.fault_injection import FAULT_STEP_ENV as FAULT_ENV
from gpuprof_jupyter.runtime.link import sampler_link
from gpuprof_jupyter.notebook import magic, profiled_cell

KERNEL_STEPS = [  # what a profiled cell does in the kernel, in order (the live dashboard as observer)
    "creating the live dashboard", "starting the sampler process", "starting Observer",
    "installing the training hooks", "listening for child processes", "recording DataLoader settings",
    "capturing variables", "finishing the stuck watch", "removing the training hooks", "closing the activity log",
    "recording the settings the run used", "reading torch memory peaks", "closing the child processes' channel",
    "finishing the experiment", "finishing Observer", "checking the rules' results",
]
SAMPLER_STEPS = [  # and in the sampler process
    "opening sources", "creating the experiment", "opening the sample file", "starting the sampler",
    "stopping the sampler", "taking the last sample", "closing the sample file", "finishing the metadata",
    "converting samples to Parquet (they stay in samples.arrows)", "saving steps", "summarising",
    "evaluating rules", "saving the metadata",
]


class Observer:
    """Stands for the live dashboard: records what it is told."""

    def started(self, session) -> None:
        self.session = session

    def live(self, update) -> None:
        pass

    def finished(self, experiment) -> None:
        self.experiment = experiment


@pytest.fixture
def shell(monkeypatch):
    shell = InteractiveShell.instance()
    magic.load_ipython_extension(shell)
    monkeypatch.setattr(profiled_cell, "make_live_dashboard", Observer)
    yield shell
    magic.unload_ipython_extension(shell)


def _cell(store, name: str, live: bool = True) -> str:
    # the rule reads a figure, not a sampled metric: an instant cell is too short to judge sm_util
    return (f"%%gpuprofile --source sim --interval 0.02 --store {store} -n {name} --capture v "
            f"--check 'duration_s >= 0' --fail-on-check{'' if live else ' --no-live'}\n"
            "v = 7\nv * 6")


def _visited(monkeypatch, shell, store) -> tuple[list[str], list[str]]:
    """(the kernel's steps, the sampler process's steps) of clean profiled cells."""
    names: list[str] = []
    in_sampler: list[str] = []

    def record(name, fn):
        names.append(name)
        return fn()

    monkeypatch.setattr(guarded, "call", record)
    for live in (True, False):
        assert shell.run_cell(_cell(store, "clean", live)).result == 42
        in_sampler.extend(sampler_link().request(Ping())["last_steps_run"])
    monkeypatch.setattr(guarded, "call", lambda name, fn: fn())
    return list(dict.fromkeys(names)), list(dict.fromkeys(in_sampler))


def _profiler_threads() -> list[str]:
    """gpuprof threads of the kernel beyond its link to the sampler process, which lives as long
    as the kernel; and whether the sampler process still records."""
    extra = [t.name for t in threading.enumerate() if t.name.startswith("gpuprof") and t.name != "gpuprof-link"]
    running = sampler_link().request(Ping())["running"]
    return extra + ([f"sampler process recording {running!r}"] if running else [])


@pytest.mark.process
def test_every_step_is_enumerated(monkeypatch, shell, store_dir):
    kernel, sampler = _visited(monkeypatch, shell, store_dir)
    assert kernel == KERNEL_STEPS + ["showing the summary"]
    assert sampler == SAMPLER_STEPS


@pytest.mark.process
def test_a_fault_in_any_step_leaves_the_next_cell_working(monkeypatch, shell, store_dir, capsys):
    kernel, sampler = _visited(monkeypatch, shell, store_dir)
    assert len(kernel) + len(sampler) >= 25
    for i, target in enumerate(kernel + sampler):
        raised = []

        def faulty(name, fn, target=target, raised=raised):
            if name == target and not raised:  # once: a retry (saving the metadata again) may succeed
                raised.append(name)
                raise RuntimeError(f"injected into {name}")
            return fn()

        if target in kernel:
            monkeypatch.setattr(guarded, "call", faulty)
        else:  # the sampler process fails this step of its own (GPUPROF_FAULT_STEP)
            monkeypatch.setenv(FAULT_ENV, target)
        with pytest.warns(RuntimeWarning, match="injected"):
            result = shell.run_cell(_cell(store_dir, f"fault-{i}", live=target != "showing the summary"))
        monkeypatch.setattr(guarded, "call", lambda name, fn: fn())
        monkeypatch.delenv(FAULT_ENV, raising=False)
        if target in kernel:
            assert raised == [target], target
        else:  # the sampler process says which of its steps raised (its last run's)
            assert sampler_link().request(Ping())["last_faults_raised"] == [target], target
        # the cell's own value stands; --fail-on-check may fail closed when a fault left nothing measured
        assert result.result == 42, target
        assert result.error_in_exec is None or isinstance(result.error_in_exec, RuleFailed), target
        assert _profiler_threads() == [], target
        capsys.readouterr()
        shell.run_line_magic("gpuprofile", f"status --store {store_dir}")
        assert "profiling: nothing running" in capsys.readouterr().out, target
        experiment = gp.load(f"fault-{i}", store=store_dir)
        assert any(f"{target} failed (RuntimeError: injected" in note for note in experiment.meta.notes), target
        after = shell.run_cell(_cell(store_dir, f"after-{i}"))
        assert after.result == 42 and after.error_in_exec is None, target
        assert gp.load(f"after-{i}", store=store_dir).status == "ok"


@pytest.mark.process
def test_a_session_left_running_is_stopped_when_a_profiled_cell_starts(shell, store_dir):
    left = gp.profile("left-open", source="sim", store=store_dir, interval=0.02)
    left.__enter__()  # never exited
    assert shell.run_cell(_cell(store_dir, "next")).result == 42
    stale = gp.load("left-open", store=store_dir)
    assert stale.status == "error" and any("stopped when a profiled cell started" in n for n in stale.meta.notes)
    assert _profiler_threads() == []


@pytest.mark.process
def test_a_silent_profiled_cell_is_stopped_when_the_next_cell_starts(shell, store_dir):
    shell.run_cell(f"%%gpuprofile --source sim --store {store_dir} -n silent --quiet\nw = 1", silent=True)
    shell.run_cell("w + 1")
    silent = gp.load("silent", store=store_dir)
    assert silent.status == "ok" and any("end was not seen" in n for n in silent.meta.notes)
    assert _profiler_threads() == []


@pytest.mark.parametrize("value, expected", [
    ("torch.ones(3)", "Tensor(shape=(3,), dtype=torch.float32)"),
    ("torch.tensor(2.5)", 2.5),
    ("np.zeros((2, 3))", "ndarray(shape=(2, 3), dtype=float64)"),
    ("np.int64(64)", 64),
    ("BadRepr()", "<BadRepr object: repr failed (ValueError)>"),
])
def test_captured_values_are_short_descriptions(value, expected):
    import numpy as np
    import torch

    from gpuprof_jupyter.runtime.record.settings import jsonable

    class BadRepr:
        def __repr__(self):
            raise ValueError("no repr")

    captured = jsonable(eval(value, {"torch": torch, "np": np, "BadRepr": BadRepr}))
    assert captured == expected and type(captured) is type(expected)



def _ctrl_c(monkeypatch, shell, name: str, *, before_call: int | None = None) -> None:
    """Ctrl-C lands in IPython's ``shell.<name>``: before its ``before_call``-th call, or (None)
    just after its first call returns."""
    original, calls = getattr(shell, name), []

    async def interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == before_call:
            raise KeyboardInterrupt
        outcome = await original(*args, **kwargs)
        if before_call is None:
            raise KeyboardInterrupt
        return outcome

    monkeypatch.setattr(shell, name, interrupted)


@pytest.mark.process
@pytest.mark.parametrize("name, before_call", [
    ("run_code", 3),  # between the cell's 2nd and 3rd statements: IPython says error_before_exec
    ("run_ast_nodes", None),  # after the statements: IPython's result carries a new ExecutionInfo
])
def test_a_ctrl_c_anywhere_in_the_cell_saves_the_run_as_interrupted(monkeypatch, shell, store_dir, name, before_call):
    _ctrl_c(monkeypatch, shell, name, before_call=before_call)
    result = shell.run_cell(f"%%gpuprofile --source sim --store {store_dir} -n stopped --no-live\n"
                            "started = True\nended = True")
    monkeypatch.setattr(shell, name, getattr(InteractiveShell, name).__get__(shell))
    assert isinstance(result.error_before_exec or result.error_in_exec, KeyboardInterrupt)
    assert gp.load("stopped", store=store_dir).status == "interrupted"
    assert profiled_cell._run is None and _profiler_threads() == []
    assert shell.run_cell("1 + 1").result == 2


@pytest.mark.process
def test_a_second_ctrl_c_while_the_run_finishes_still_stops_and_saves_it(monkeypatch, shell, store_dir, capsys):
    def interrupted(name, fn):
        if name == "recording DataLoader settings":  # the first thing the cell's end does
            raise KeyboardInterrupt
        return fn()

    monkeypatch.setattr(guarded, "call", interrupted)
    shell.run_cell(f"%%gpuprofile --source sim --store {store_dir} -n twice --no-live\nv = 1")
    monkeypatch.setattr(guarded, "call", lambda name, fn: fn())
    assert "KeyboardInterrupt" in capsys.readouterr().out  # IPython shows it (its post_run_cell handler)
    assert gp.load("twice", store=store_dir).status == "interrupted"
    assert profiled_cell._run is None and _profiler_threads() == []
    assert shell.run_cell(_cell(store_dir, "after-twice")).result == 42
