"""An out-of-memory error that explains itself (docs/memory.md, "Out of memory"): a run that dies
of torch.OutOfMemoryError is saved with summary["memory"]["oom"] (the step, the bytes torch
asked for, the breakdown at the last step, the other processes on the GPU, the largest batch
that fits, the next steps) and prints that explanation before the traceback: in profile(), in
a profiled cell through IPython, and under gpuprof run. The allocator (tests/fake_torch_cuda.py)
raises torch's real error from a fake limit inside a real training loop."""

from __future__ import annotations

import contextlib
import os
import pickle
import sys
import textwrap

import pytest
import torch

import gpuprof_jupyter as gp
from gpuprof_jupyter.core.analysis.oom import parse_oom_message
from gpuprof_jupyter.core.store.directory import Store
from tests.fake_nvml import sampler_process_env
from tests.fake_torch_cuda import GIB, MIB, FakeCuda

WIDTH = 1000  # floats held per sample during a step
SCALE = 100_000  # -> 400 MB per sample on the fake 40 GiB GPU
PER_SAMPLE = 4 * WIDTH * SCALE
OTHER_PID, OTHER_BYTES = 999_999, 5 * GIB  # a teammate's kernel on the same GPU


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))


def train(fake, model, opt, batch, steps, leak=False):
    """A real loop; ``leak`` keeps half of each step's activations (a loss kept with its graph)."""
    kept = []
    for _ in range(steps):
        x, y = torch.randn(batch, 16), torch.randint(0, 4, (batch,))
        acts = fake.hold(torch.empty(batch * WIDTH))
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        del acts
        if leak:
            kept.append(fake.hold(torch.empty(batch * WIDTH // 2)))
        opt.step()
        opt.zero_grad()
        gp.step(batch)
    return kept


@contextlib.contextmanager
def profiled_shell(fake):
    """An IPython shell with the extension loaded and the fake GPU's training loop in its
    namespace; the extension is unloaded after."""
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "gpuprof_jupyter")
    shell.user_ns.update(fake=fake, train=train, _model=_model, torch=torch)
    try:
        yield shell
    finally:
        shell.run_line_magic("unload_ext", "gpuprof_jupyter")


@pytest.fixture
def fake(monkeypatch):
    return FakeCuda(total=40 * GIB, scale=SCALE).install(monkeypatch)


@pytest.fixture
def shared_gpu(fresh_sampler):
    fresh_sampler(sampler_process_env({"gpus": [{"kind": "a100", "processes": [[os.getpid(), 2 * GIB],
                                                                              [OTHER_PID, OTHER_BYTES]]}]}))


def _earlier_runs(store, fake, name):
    for batch in (8, 16):
        model = _model()
        with gp.profile(name, source="nvml", store=store, interval=0.05):
            train(fake, model, torch.optim.SGD(model.parameters(), lr=0.1), batch, 3)


def test_torchs_message_is_parsed():
    fake = FakeCuda(total=40 * GIB, scale=MIB)
    fake.allocated, fake.reserved = 38 * GIB, 39 * GIB
    with pytest.raises(torch.OutOfMemoryError) as caught:
        fake.hold(torch.empty(768))  # 3 KiB counted as 3 GiB
    figures = parse_oom_message(str(caught.value))
    assert figures["requested_bytes"] == 3 * GIB
    assert figures["device_total_bytes"] == 40 * GIB
    assert figures["device"] == 0
    assert figures["reserved_unallocated_bytes"] == 1 * GIB
    assert figures["free_bytes"] == pytest.approx(40 * GIB - 300 * MIB - 38 * GIB, abs=0.01 * MIB)
    assert parse_oom_message("RuntimeError: something else") == {}


@pytest.mark.process
def test_profile_block_that_runs_out_of_memory_explains_why_before_the_traceback(store_dir, fake, shared_gpu, capsys):
    _earlier_runs(store_dir, fake, "leaky")
    capsys.readouterr()
    model = _model()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    with pytest.raises(torch.OutOfMemoryError):
        with gp.profile("leaky", source="nvml", store=store_dir, interval=0.05):
            train(fake, model, opt, 32, 10, leak=True)
    exp = Store(store_dir).load("leaky")
    assert exp.status == "error" and "OutOfMemoryError" in exp.meta.error
    oom = exp.summary["memory"]["oom"]
    # steps peak at 12.8, 19.2, 25.6, 32, 38.4 GB (6.4 GB kept by each); the sixth asks for 12.8 GB
    assert oom["step"] == 6
    assert oom["requested_bytes"] == pytest.approx(32 * PER_SAMPLE, rel=1e-6)
    assert oom["last_step_peak_bytes"] == 3 * 32 * PER_SAMPLE  # 4 x 6.4 GB kept + the step's 12.8 GB
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    state = sum(v.numel() * v.element_size() for s in opt.state.values() for v in s.values() if torch.is_tensor(v))
    assert oom["breakdown"]["parameters"] == params
    assert oom["breakdown"]["optimizer_state"] == state
    assert oom["other_processes"]["gpu0"]["used_memory_bytes"] == OTHER_BYTES
    assert oom["largest_batch"]["batch"] == int((40 * GIB * 0.9) // PER_SAMPLE)  # from the batch 8 and 16 runs
    assert oom["batch"] == 32
    first, grew, fits = oom["next_steps"][:3]
    assert "Other processes hold 5.0 GiB on gpu0" in first
    assert "Memory grew step after step" in grew
    assert "batch 32 should fit" in fits
    err = capsys.readouterr().err
    assert "gpuprof: out of GPU memory at step 6 (batch 32)" in err
    assert "other processes on gpu0: 1, holding 5.0 GiB" in err
    assert "1. Other processes hold" in err and "--memory-history" in err


@pytest.mark.process
def test_a_run_that_did_not_fit_gets_the_batch_that_does_and_the_accumulation(store_dir, fake, fresh_sampler):
    fresh_sampler(sampler_process_env({"gpus": ["a100"]}))
    _earlier_runs(store_dir, fake, "big")
    model = _model()
    with pytest.raises(torch.OutOfMemoryError):
        with gp.profile("big", source="nvml", store=store_dir, interval=0.05, params={"batch_size": 128}):
            train(fake, model, torch.optim.SGD(model.parameters(), lr=0.1), 128, 3)
    oom = Store(store_dir).load("big").summary["memory"]["oom"]
    largest = int((40 * GIB * 0.9) // PER_SAMPLE)
    assert oom["step"] == 1 and "other_processes" not in oom
    assert "breakdown" not in oom  # no optimizer had stepped: nothing counted, rather than zeros
    assert oom["batch"] == 128  # no step finished: the batch_size param says it
    fit = next(s for s in oom["next_steps"] if s.startswith("Run at batch"))
    assert fit.startswith(f"Run at batch {largest} or less")
    from gpuprof_jupyter.render.summary_html import render_summary_text, summary_bundle

    line = f"out of memory at step 1 (requested 47.7 GiB); first: Run at batch {largest} or less"
    assert line in render_summary_text(Store(store_dir).load("big"))  # the summary, the CLI's and the cell's
    assert line in summary_bundle(Store(store_dir).load("big"))["text/html"]
    assert fit.endswith("to keep the effective batch of 128, accumulate gradients over 2 steps of 64")


@pytest.mark.process
def test_memory_history_saves_a_snapshot_for_pytorchs_viewer(store_dir, fake, capsys):
    model = _model()
    with pytest.raises(torch.OutOfMemoryError):
        with gp.profile("history", source="sim", store=store_dir, interval=0.05, memory_history=True):
            train(fake, model, torch.optim.SGD(model.parameters(), lr=0.1), 64, 10, leak=True)
    exp = Store(store_dir).load("history")
    history = exp.summary["memory"]["oom"]["memory_history"]
    with open(history["snapshot"], "rb") as f:
        snapshot = pickle.load(f)
    assert snapshot["device_traces"][0][0] == {"action": "alloc", "size": 64 * PER_SAMPLE}
    assert os.path.dirname(history["snapshot"]) == str(store_dir / exp.id)
    assert fake.history_calls[0][0] == "all" and fake.history_calls[-1][0] is None  # stopped with the run
    err = capsys.readouterr().err
    assert "https://pytorch.org/memory_viz" in err and history["snapshot"] in err
    assert "[SIMULATED GPU" in err
    assert "--memory-history" not in err.split("next steps:")[1]  # it was on: not advised again


@pytest.mark.process
def test_memory_history_never_creates_a_cuda_context(store_dir, monkeypatch):
    fake = FakeCuda().install(monkeypatch)
    fake.initialised = False
    with gp.profile("cpu", source="sim", store=store_dir, interval=0.05, memory_history=True):
        model = _model()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            torch.nn.functional.cross_entropy(model(torch.randn(4, 16)), torch.randint(0, 4, (4,))).backward()
            opt.step()
    assert fake.history_calls == []
    with pytest.raises(ValueError, match="memory_history is True or False"):
        gp.profile("x", source="sim", store=store_dir, memory_history="yes").__enter__()


@pytest.mark.process
def test_a_profiled_cell_shows_the_explanation_before_the_traceback(store_dir, fake, fresh_sampler):
    from IPython.utils.capture import capture_output

    fresh_sampler(sampler_process_env({"gpus": ["a100"]}))
    with profiled_shell(fake) as shell:
        for batch in (8, 16):
            shell.run_cell(f"%%gpuprofile -n cell --store {store_dir} --source nvml --quiet\n"
                           f"model = _model()\ntrain(fake, model, torch.optim.SGD(model.parameters(), lr=0.1), {batch}, 3)")
        with capture_output() as out, contextlib.redirect_stderr(sys.stdout):  # one stream: the order shows
            result = shell.run_cell(f"%%gpuprofile -n cell --store {store_dir} --source nvml --no-live --memory-history "
                                    "--param batch_size=128\n"
                                    "model = _model()\ntrain(fake, model, torch.optim.SGD(model.parameters(), lr=0.1), 128, 3)")
    assert isinstance(result.error_in_exec, torch.OutOfMemoryError)
    text = out.stdout
    explanation, traceback = text.index("gpuprof: out of GPU memory at step 1"), text.index("OutOfMemoryError")
    assert explanation < traceback, text
    assert "allocator history saved" in text and "memory_viz" in text
    assert "accumulate gradients over 2 steps of 64" in text  # the earlier runs at batch 8 and 16 fit a line
    exp = Store(store_dir).load("cell")
    assert exp.status == "error" and exp.summary["memory"]["oom"]["step"] == 1
    assert shell.custom_exceptions == ()  # nothing of ours left in the shell


@pytest.mark.process
def test_gpuprof_run_explains_on_stderr(store_dir, tmp_path, capfd, monkeypatch):
    from gpuprof_jupyter.cli import main

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {os.getcwd()!r})
        import torch
        from tests.fake_torch_cuda import FakeCuda, GIB
        from tests.test_oom import _model, train

        class Patch:  # monkeypatch's setattr, for a script
            setattr = staticmethod(setattr)

        fake = FakeCuda(total=40 * GIB, scale={SCALE}).install(Patch)
        model = _model()
        train(fake, model, torch.optim.SGD(model.parameters(), lr=0.1), 32, 10, leak=True)
    """))
    rc = main(["run", "--store", str(store_dir), "--source", "sim", "--interval", "0.05", "-n", "script",
               "--memory-history", "--", sys.executable, str(script)])
    assert rc == 1
    err = capfd.readouterr().err
    assert err.index("gpuprof: out of GPU memory after 5 optimizer step(s)") < err.index("Traceback")  # the script's own
    assert "gpuprof: out of GPU memory at step 6" in err[err.index("Traceback"):]  # the run's, after its summary
    exp = Store(store_dir).load("script")
    oom = exp.summary["memory"]["oom"]
    assert exp.status == "error" and oom["step"] == 6 and oom["breakdown"]["parameters"] > 0
    assert os.path.exists(oom["memory_history"]["snapshot"])
    assert os.path.dirname(oom["memory_history"]["snapshot"]) == str(store_dir / exp.id)


def test_a_childs_oom_record_is_checked_on_the_channel():
    from gpuprof_jupyter.core.child_channel import FINAL, Malformed, encode, parse

    good = parse(encode(FINAL, oom={"error": "CUDA out of memory.", "counted": {"parameters": 8},
                                    "memory_history": {"snapshot": None, "why": "no CUDA"}}))
    assert good.oom["counted"] == {"parameters": 8}
    for bad in ({"error": 3}, {"error": "x", "counted": {"parameters": "8 B"}}, {"error": "x", "counted": [8]},
                {"error": "x", "memory_history": {"snapshot": 1}}, {"error": "x", "optimizer_steps": "5"}, "out of memory"):
        with pytest.raises(Malformed):
            parse(encode(FINAL, oom=bad))


@pytest.mark.process
def test_a_snapshot_that_fills_the_disk_is_said_and_the_run_is_kept(tmp_path, fake, monkeypatch, capsys):
    import subprocess

    mount = tmp_path / "small"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root; CI runs as root)")
    try:
        monkeypatch.setattr(torch.cuda.memory, "_snapshot", lambda: {"segments": [], "blob": os.urandom(4 * MIB)})  # > disk
        model = _model()
        with pytest.raises(torch.OutOfMemoryError):
            with gp.profile("full", source="sim", store=mount / "store", interval=0.05, memory_history=True):
                train(fake, model, torch.optim.SGD(model.parameters(), lr=0.1), 64, 10, leak=True)
        exp = Store(mount / "store").load("full")
        history = exp.summary["memory"]["oom"]["memory_history"]
        assert history["snapshot"] is None and "No space left on device" in history["why"]
        assert not list((mount / "store" / exp.id).glob("memory_snapshot*"))  # no torn file left
        assert exp.status == "error" and exp.summary["memory"]["oom"]["step"] == 3
        assert "allocator history not saved: saving the snapshot failed (OSError" in capsys.readouterr().err
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


@pytest.mark.process
def test_a_users_own_exception_handler_is_left_alone(store_dir, fake):
    from IPython.utils.capture import capture_output

    seen = []

    def mine(self, etype, value, tb, tb_offset=None):
        seen.append(etype)
        return ["handled by the user's own handler"]

    with profiled_shell(fake) as shell:
        shell.set_custom_exc((torch.OutOfMemoryError,), mine)
        try:
            with capture_output() as out, contextlib.redirect_stderr(sys.stdout):
                result = shell.run_cell(f"%%gpuprofile -n mine --store {store_dir} --source sim --no-live\n"
                                        "model = _model()\ntrain(fake, model, torch.optim.SGD(model.parameters(), lr=0.1), 128, 3)")
            assert seen == [torch.OutOfMemoryError]  # theirs ran, not ours
            assert shell.custom_exceptions == (torch.OutOfMemoryError,)
            assert any(cell.cell_contents is mine for cell in shell.CustomTB.__func__.__closure__)
        finally:
            shell.set_custom_exc((), None)
    assert isinstance(result.error_in_exec, torch.OutOfMemoryError)
    assert "gpuprof: out of GPU memory at step 1" in out.stdout  # still explained, after their handler
    assert Store(store_dir).load("mine").status == "error"


@pytest.mark.process
def test_quiet_shows_nothing_but_keeps_the_explanation_in_the_run(store_dir, fake):
    from IPython.utils.capture import capture_output

    with profiled_shell(fake) as shell, capture_output() as out:
        shell.run_cell(f"%%gpuprofile -n quiet --store {store_dir} --source sim --quiet\n"
                       "model = _model()\ntrain(fake, model, torch.optim.SGD(model.parameters(), lr=0.1), 128, 3)")
    assert "OutOfMemoryError" in out.stdout + out.stderr and "gpuprof:" not in out.stdout + out.stderr
    assert Store(store_dir).load("quiet").summary["memory"]["oom"]["step"] == 1


def test_only_the_other_processes_on_the_gpu_that_ran_out_are_named():
    from gpuprof_jupyter.core.analysis.oom import oom_summary

    context = {"gpu_sharing": {"devices": {"gpu1": {"other_processes_max": 2, "other_gpu_mem_peak_bytes": 9 * GIB}}}}
    message = ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.10 GiB of which "
               "1.50 GiB is free.")
    oom = oom_summary({"error": message}, {}, context, 4, [], None)
    assert "other_processes" not in oom and not any("Other processes" in s for s in oom["next_steps"])
    oom = oom_summary({"error": message.replace("GPU 0", "GPU 1")}, {}, context, 4, [], None)
    assert oom["other_processes"] == {"gpu1": {"processes": 2, "used_memory_bytes": 9 * GIB, "sm_util_mean": None}}
    assert oom["next_steps"][0].startswith("Other processes hold 9.0 GiB on gpu1")
    assert oom["requested_bytes"] == 2 * GIB and oom["device_total_bytes"] == pytest.approx(79.10 * GIB)


@pytest.mark.process
def test_an_out_of_memory_in_a_cell_run_inside_the_profiled_cell_leaves_the_run_going(store_dir, fake):
    from IPython.utils.capture import capture_output

    with profiled_shell(fake) as shell, capture_output():
        result = shell.run_cell(
            f"%%gpuprofile -n outer --store {store_dir} --source sim --no-live\n"
            "model = _model()\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            "get_ipython().run_cell('train(fake, model, opt, 128, 1)')\n"  # a notebook-runner cell: it fails
            "train(fake, model, opt, 8, 3)\n")
    assert result.error_in_exec is None
    exp = Store(store_dir).load("outer")
    assert exp.status == "ok" and exp.summary["steps"]["count"] == 3 and "oom" not in exp.summary.get("memory", {})
