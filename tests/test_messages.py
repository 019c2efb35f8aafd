"""Issue 22 part 2: what the profiler says matches what happened (one summary row per phase, a
note when torch came too late, no experiment for a start that failed, API calls that fail at
the call, names accepted wherever a run is)."""

from __future__ import annotations

import sys
import time
import types

import pytest

import gpuprof_jupyter as gp
from gpuprof_jupyter.runtime.link import sampler_link
from gpuprof_jupyter.render.summary_html import render_summary_html, render_summary_text


@pytest.mark.browser
def test_phases_in_a_loop_are_one_row_per_phase(store_dir, offline_page, artifacts_dir):
    with gp.profile(name="loop", source="sim:amp", store=store_dir, interval=0.02) as run:
        for _ in range(300):
            with gp.phase("fwd"):
                time.sleep(0.0002)
            with gp.phase("bwd"):
                time.sleep(0.0002)
            gp.step(8)
    phases = run.experiment.summary["phases"]
    assert [(p["name"], p["count"]) for p in phases] == [("fwd", 300), ("bwd", 300)]
    assert all(0 < p["duration_s"] < run.experiment.meta.duration_s for p in phases)
    text = render_summary_text(run.experiment)
    assert text.count("phase: fwd") == 1 and "entered: 300x" in text
    offline_page.set_content(render_summary_html(run.experiment))  # as the static ending shows it
    rows = offline_page.locator("table.gpuprof-table tr:has-text('fwd')")
    assert rows.count() == 1 and "300x" in rows.inner_text()
    offline_page.screenshot(path=str(artifacts_dir / "summary_phases.png"), full_page=True)


@pytest.mark.process
def test_torch_imported_inside_the_run_is_a_note(store_dir, monkeypatch):
    """A profile() block says "block" and where to import torch in a script; a profiled cell
    (the magic gives its source) says "cell" and "an earlier cell"."""
    from gpuprof_jupyter.core.store.experiment import RunStatus
    from gpuprof_jupyter.runtime.session import ProfileSession

    monkeypatch.delitem(sys.modules, "torch", raising=False)
    with gp.profile(name="late", source="sim:amp", store=store_dir, interval=0.05) as run:
        monkeypatch.setitem(sys.modules, "torch", types.ModuleType("torch"))  # the block imports torch
    notes = " ".join(run.experiment.meta.notes)
    assert "torch was imported inside the profiled block" in notes and "no steps were counted" in notes
    assert "import torch before the block starts" in notes and "earlier cell" not in notes
    assert run.experiment.meta.context["torch_imported_late"] == "block"

    monkeypatch.delitem(sys.modules, "torch")
    session = ProfileSession("late-cell", source="sim:amp", store=store_dir, interval=0.05,
                             cell_source="import torch").start()
    monkeypatch.setitem(sys.modules, "torch", types.ModuleType("torch"))  # the cell imports torch
    experiment = session.stop(RunStatus.OK, None)
    notes = " ".join(experiment.meta.notes)
    assert "torch was imported inside the profiled cell" in notes and "import torch in an earlier cell" in notes
    assert experiment.meta.context["torch_imported_late"] == "cell"


@pytest.mark.process
def test_a_start_that_fails_leaves_no_experiment(store_dir):
    with pytest.raises(ValueError, match="unreachable"):
        with gp.profile(name="prom", source="prometheus=http://127.0.0.1:1", store=store_dir):
            pass
    sampler_link().close()  # as the kernel going away: a run still recording would be saved now
    assert not list(store_dir.glob("*/meta.json"))


def test_profile_rejects_a_wrong_keyword_at_the_call():
    with pytest.raises(TypeError, match="unknown keyword.*check;.*checks") as info:
        gp.profile(name="x", check=["sm_util > 60"])
    offered = str(info.value).split("it takes ", 1)[1]
    assert offered == ("name, sample, fail_on_check, interval, devices, source, match, store, params, checks, alerts, trace, "
                       "memory_history, stuck_after, observers")


def test_the_keywords_a_wrong_one_names_are_the_documented_ones():
    """The TypeError names the keywords docs/configuration.md documents for profile(), nothing
    more (not the gpuprof command's child_environ); the README's shorter list is among them."""
    import re
    from pathlib import Path

    from gpuprof_jupyter.runtime.profile import DOCUMENTED, OPTIONS

    root = Path(__file__).resolve().parent.parent
    table = (root / "docs" / "configuration.md").read_text().split("## `profile()` keywords", 1)[1].split("\n## ", 1)[0]
    assert tuple(re.findall(r"^\| `(\w+)` \|", table, re.M)) == DOCUMENTED
    row, = [line for line in (root / "README.md").read_text().splitlines()
            if line.startswith("| `gpuprof_jupyter.profile(")]
    assert set(re.findall(r"`(\w+)`", row.split("`options`:", 1)[1].split("(", 1)[0])) <= set(DOCUMENTED)
    assert set(DOCUMENTED) <= set(OPTIONS) and "child_environ" not in DOCUMENTED


@pytest.mark.process
def test_diagnose_takes_a_name_like_check(store_dir):
    with gp.profile(name="named", source="sim:input-bound", store=store_dir, interval=0.05):
        time.sleep(0.2)
    findings = gp.diagnose("named", store=store_dir)
    assert isinstance(findings, list) and all(f.next_step for f in findings)
    assert [f.id for f in findings] == [f.id for f in gp.diagnose(gp.load("named", store=store_dir))]
