"""Issue 41 part 3: --memory-history saves the allocator's history when a step's headroom falls under
5 % (before any out-of-memory error), names it in the summary and in the out-of-memory
explanation; on the fake torch.cuda (tests/fake_torch_cuda.py), which records what a GPU would."""

from __future__ import annotations

import pickle

import pytest
import torch

import gpuprof_jupyter as gp
from gpuprof_jupyter.core.child_channel import Final, Malformed
from gpuprof_jupyter.core.store.directory import Store
from gpuprof_jupyter.render.memory_html import memory_text
from gpuprof_jupyter.render.oom_text import explain_oom
from gpuprof_jupyter.runtime.hooks.oom_record import LOW_HEADROOM_FILE, MemoryHistory
from tests.fake_torch_cuda import GIB, FakeCuda
from tests.test_oom import PER_SAMPLE, SCALE, _model, train


@pytest.fixture
def fake(monkeypatch):
    return FakeCuda(total=40 * GIB, scale=SCALE).install(monkeypatch)


def test_watch_saves_once_when_a_step_leaves_under_5_percent(tmp_path, monkeypatch):
    fake = FakeCuda(total=10 * GIB, context_bytes=0).install(monkeypatch)
    history = MemoryHistory()
    history.directory = tmp_path
    history.begin()
    fake.reserved = fake.max_reserved = 9 * GIB  # 10 % free: fine
    assert history.watch(torch.cuda, [0], step=3) is None and not (tmp_path / LOW_HEADROOM_FILE).exists()
    fake.max_reserved = int(9.7 * GIB)  # the step's peak left 3 % free, freed before its end
    record = history.watch(torch.cuda, [0], step=4)
    assert record["headroom_frac"] == pytest.approx(0.03) and (record["step"], record["device"]) == (4, 0)
    assert record["snapshot"] == str(tmp_path / LOW_HEADROOM_FILE) and record["threshold"] == 0.05
    with open(record["snapshot"], "rb") as f:
        assert "device_traces" in pickle.load(f)  # what PyTorch's memory viewer opens
    assert history.watch(torch.cuda, [0], step=5) is None  # once per run


def test_watch_needs_the_history_recording(tmp_path, monkeypatch):
    fake = FakeCuda(total=10 * GIB, context_bytes=0).install(monkeypatch)
    fake.reserved = fake.max_reserved = int(9.9 * GIB)
    history = MemoryHistory()
    history.directory = tmp_path
    assert history.watch(torch.cuda, [0], step=1) is None  # CUDA never initialised by the code: nothing recorded


def _run(store_dir, fake, name, batch, steps, leak=False):
    """A profiled training loop with --memory-history on the fake GPU; the saved experiment."""
    model = _model()
    with gp.profile(name, source="sim", store=store_dir, interval=0.05, memory_history=True):
        train(fake, model, torch.optim.SGD(model.parameters(), lr=0.1), batch, steps, leak=leak)
    return Store(store_dir).load(name)


def test_a_run_whose_headroom_ran_low_keeps_the_snapshot(store_dir, fake):
    batch = 104  # 41.6 GB held in a step of the fake 40 GiB GPU: 2.4 % left, but it fits
    exp = _run(store_dir, fake, "tight", batch, 3)
    (low,) = exp.summary["memory"]["low_headroom"]
    assert low["headroom_frac"] < 0.05 and low["step"] == 1 and low["rank"] is None
    with open(low["snapshot"], "rb") as f:
        assert pickle.load(f)["device_traces"][0][0] == {"action": "alloc", "size": batch * PER_SAMPLE}
    assert low["snapshot"].startswith(str(store_dir / exp.id))
    assert any("headroom fell to" in line and "memory_viz" in line for line in memory_text(exp))


def test_the_out_of_memory_explanation_names_the_earlier_snapshot(store_dir, fake, capsys):
    with pytest.raises(torch.OutOfMemoryError):
        _run(store_dir, fake, "ran-out", 104, 5, leak=True)  # step 1 leaves 2.4 %, step 2 runs out
    exp = Store(store_dir).load("ran-out")
    history = exp.summary["memory"]["oom"]["memory_history"]
    assert history["snapshot"] and history["low_headroom"]["snapshot"].endswith(LOW_HEADROOM_FILE)
    assert "earlier, headroom fell to" in explain_oom(exp, file=None)


def test_a_run_with_room_saves_no_early_snapshot(store_dir, fake):
    assert "low_headroom" not in (_run(store_dir, fake, "roomy", 8, 3).summary.get("memory") or {})


def test_a_childs_low_headroom_record_is_checked_on_the_channel():
    Final(memory_history={"snapshot": "/x/memory_snapshot-low-headroom-rank1.pickle", "headroom_frac": 0.02,
                          "step": 7, "device": 0}).validate()
    with pytest.raises(Malformed, match="memory_history"):
        Final(memory_history={"snapshot": 3, "headroom_frac": "low"}).validate()
    # each value the views print is checked to its kind (core/child_channel._low_headroom)
    for bad in ({"device": "0"}, {"threshold": "5 %"}, {"why": 3}):
        with pytest.raises(Malformed, match="memory_history"):
            Final(memory_history={"snapshot": None, "headroom_frac": 0.02, "step": 7, **bad}).validate()
    with pytest.raises(Malformed, match="Final.oom"):  # an out-of-memory record carries the earlier one too
        Final(oom={"error": "CUDA out of memory", "memory_history": {"snapshot": None, "low_headroom": {
            "snapshot": None, "headroom_frac": "low", "step": 7}}}).validate()


@pytest.mark.process
def test_gpuprof_run_saves_the_snapshot_of_the_rank_that_ran_low(store_dir, tmp_path, monkeypatch):
    import os
    import sys
    import textwrap

    from gpuprof_jupyter.cli import main

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(f"""
        import os, sys
        os.environ["RANK"] = "1"  # this process is rank 1 of a job
        sys.path.insert(0, {os.getcwd()!r})
        import torch
        from tests.fake_torch_cuda import FakeCuda, GIB
        from tests.test_oom import _model, train

        class Patch:  # monkeypatch's setattr, for a script
            setattr = staticmethod(setattr)

        fake = FakeCuda(total=40 * GIB, scale={SCALE}).install(Patch)
        model = _model()
        train(fake, model, torch.optim.SGD(model.parameters(), lr=0.1), 104, 3)
    """))
    rc = main(["run", "--store", str(store_dir), "--source", "sim", "--interval", "0.05", "-n", "tight-rank",
               "--memory-history", "--", sys.executable, str(script)])
    assert rc == 0
    exp = Store(store_dir).load("tight-rank")
    (low,) = exp.summary["memory"]["low_headroom"]
    assert low["rank"] == 1 and low["headroom_frac"] < 0.05
    assert low["snapshot"] == str(store_dir / exp.id / "memory_snapshot-low-headroom-rank1.pickle")
    assert os.path.exists(low["snapshot"])
