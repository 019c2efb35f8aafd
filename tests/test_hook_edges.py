"""The hooks at their edges: a user's odd object, another library's patch, a fork, a run's end.

The rule every hook keeps (docs/serving.md, "What is still missed"): it never raises into the
user's code, it never outlives its run, and no request completed inside the run is lost.
"""

from __future__ import annotations

import os
import sys
import threading
import time

import pytest
import torch

import gpuprof_jupyter as gp
from gpuprof_jupyter.runtime.hooks.activity import ActivityLog
from gpuprof_jupyter.runtime.hooks.torch_hooks import TrainingHooks
from gpuprof_jupyter.runtime.record.request_log import open_requests_note

TORCH_CALL = torch.nn.Module._wrapped_call_impl  # Module.__call__ as torch defines it
UNSEEN = "requests unseen after another library patched Module.__call__"
nested_tensors = pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors:UserWarning")


@pytest.fixture(autouse=True)
def torch_as_it_was():
    """What these tests patch by hand is torch's own again after each, whatever failed."""
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    owners = [(torch.nn.Module, "__call__"), (torch.nn.Module, "train"), (torch.no_grad, "__enter__"),
              (_BaseDataLoaderIter, "__next__"), (torch.utils.data.DataLoader, "__iter__"),
              (torch.amp.autocast_mode.autocast, "__enter__")]
    saved = [(owner, name, vars(owner)[name]) for owner, name in owners]
    yield
    for owner, name, value in saved:
        setattr(owner, name, value)


def _hooked_log():
    activity = ActivityLog(time.monotonic())
    hooks = TrainingHooks(activity).install()
    return activity, hooks


def _model():
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))


def _train_steps(model, opt, n: int) -> None:
    for _ in range(n):
        opt.zero_grad()
        model(torch.randn(2, 8)).sum().backward()
        opt.step()


def _nested(rows):
    return torch.nested.nested_tensor([torch.ones(n, 3) for n in rows])


class Padder(torch.nn.Module):
    """A model that takes a nested tensor (reading its shape raises: it has none)."""

    def forward(self, x):
        return torch.nested.to_padded_tensor(x, 0.0).sum()


# -- part 1: a user's object read inside a hook never raises ----------------------------------------
@nested_tensors
def test_a_nested_tensor_through_a_module_under_no_grad_is_a_request_of_unknown_batch():
    model = Padder()
    activity, hooks = _hooked_log()
    try:
        with torch.no_grad():
            results = [model(_nested([2, 4])) for _ in range(3)]
    finally:
        hooks.remove()
    activity.close()
    assert [float(r) for r in results] == [18.0] * 3  # what the call returns without the profiler
    records = activity.requests.records
    assert len(records) == 3 and all(r.batch != r.batch for r in records)  # NaN: unknown, never 0
    notes = [n for n in hooks.notes() if "batch size" in n]
    assert len(notes) == 1 and "3 time(s)" in notes[0] and "unknown" in notes[0], hooks.notes()


@nested_tensors
def test_a_nested_tensor_from_a_dataloader_collate_is_a_batch_of_unknown_size():
    loader = torch.utils.data.DataLoader(list(range(8)), batch_size=4, collate_fn=lambda xs: _nested([x + 1 for x in xs]))
    activity, hooks = _hooked_log()
    try:
        batches = list(loader)
        batches += list(loader)
    finally:
        hooks.remove()
    activity.close()
    assert len(batches) == 4 and batches[0].is_nested
    notes = [n for n in hooks.notes() if "batch size" in n]
    assert len(notes) == 1 and "4 time(s)" in notes[0], hooks.notes()


@nested_tensors
def test_a_nested_tensor_given_to_generate_or_a_pipeline_never_raises():
    """generate()'s inputs and output and a pipeline's inputs are read too (their shapes)."""
    import types

    calls = []

    class GenerationMixin:
        def generate(self, input_ids=None, **kwargs):
            calls.append("generate")
            return input_ids  # its output is read for the tokens generated

    class Pipeline:
        def __call__(self, inputs, *args, **kwargs):
            calls.append("pipeline")
            return inputs

    fake = types.ModuleType("transformers")
    fake.GenerationMixin, fake.Pipeline = GenerationMixin, Pipeline
    sys.modules["transformers"] = fake
    try:
        activity, hooks = _hooked_log()
        try:
            GenerationMixin().generate(input_ids=_nested([1, 2]))
            Pipeline()(_nested([1, 2]))
        finally:
            hooks.remove()
    finally:
        del sys.modules["transformers"]
    activity.close()
    assert calls == ["generate", "pipeline"]
    assert [r.kind for r in activity.requests.records] == ["generate()", "pipeline"]


# -- part 1: no hook outlives its run ----------------------------------------------------------------
class OtherLibrary:
    """Another tool that wraps ``Module.__call__`` (a tracer, a framework) and later restores what
    it found there."""

    def __init__(self) -> None:
        self.found = None
        self.calls = 0

    def patch(self) -> None:
        found = self.found = vars(torch.nn.Module)["__call__"]

        def theirs(module, *args, **kwargs):
            self.calls += 1
            return found(module, *args, **kwargs)

        torch.nn.Module.__call__ = theirs

    def restore(self) -> None:
        torch.nn.Module.__call__ = self.found


def _after_the_run_nothing_is_appended(activity) -> None:
    tiny, x = torch.nn.Identity(), torch.randn(1)
    with torch.no_grad():
        for _ in range(100_000):
            tiny(x)
    assert len(activity.events) == 0  # the ended run's buffer: nothing, not 200,000 events
    assert vars(torch.nn.Module)["__call__"] is TORCH_CALL  # and no wrapper of ours is left


def _serve_in_a_run(trained: bool, meanwhile):
    """A run: a training step or not, then ``meanwhile()``, then 20 requests under no_grad."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    activity, hooks = _hooked_log()
    try:
        if trained:
            _train_steps(model, opt, 2)  # the hook is set aside
        meanwhile()
        with torch.no_grad():
            for _ in range(20):
                model(torch.randn(3, 8))
    finally:
        hooks.remove()
        activity.close()
    return activity, [n for n in hooks.notes() if UNSEEN in n]


@pytest.mark.parametrize("trained", [False, True], ids=["serving", "after-a-training-step"])
def test_a_library_patching_module_call_after_us_leaves_no_live_hook_and_notes_what_went_unseen(trained):
    other = OtherLibrary()
    activity, unseen = _serve_in_a_run(trained, other.patch)
    if trained:  # torch's own __call__ was back; our hook cannot come back under their patch: said so
        assert activity.requests.records == [] and len(unseen) == 1
    else:  # our wrapper sits under theirs: the requests are seen
        assert len(activity.requests.records) == 20 and unseen == []
    assert other.calls >= 20
    other.restore()  # puts back what it found: our wrapper, when it patched over it
    _after_the_run_nothing_is_appended(activity)


@pytest.mark.parametrize("trained", [False, True], ids=["serving", "after-a-training-step"])
def test_a_library_patching_module_call_before_us_keeps_its_patch_and_our_requests(trained):
    """A guard beside the test above (this order already worked): our hook wraps theirs, sets
    itself aside to theirs (not torch's), and gives theirs back at the run's end."""
    other = OtherLibrary()
    other.patch()
    theirs = vars(torch.nn.Module)["__call__"]
    aside = []
    activity, unseen = _serve_in_a_run(trained, lambda: aside.append(vars(torch.nn.Module)["__call__"]))
    assert vars(torch.nn.Module)["__call__"] is theirs and aside[0] is not TORCH_CALL
    assert (aside[0] is theirs) == trained
    assert len(activity.requests.records) == 20 and unseen == []
    other.restore()
    _after_the_run_nothing_is_appended(activity)


def test_every_wrapper_left_under_another_librarys_patch_is_inert_after_the_run():
    """DataLoader, autocast, no_grad and eval() (GradScaler and torch.compile alike): wrapped by
    someone else after us, our wrapper stays in their chain; after the run it records nothing."""
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    owners = [(_BaseDataLoaderIter, "__next__"), (torch.utils.data.DataLoader, "__iter__"),
              (torch.nn.Module, "train"), (torch.no_grad, "__enter__"), (torch.amp.autocast_mode.autocast, "__enter__")]
    activity, hooks = _hooked_log()
    try:
        for owner, name in owners:  # torch's own come back after the test (torch_as_it_was)
            ours = vars(owner)[name]
            setattr(owner, name, lambda *a, _ours=ours, **k: _ours(*a, **k))
    finally:
        hooks.remove()
        activity.close()
    model = _model()
    for _ in torch.utils.data.DataLoader(list(range(6)), batch_size=2):
        pass
    model.eval()
    with torch.no_grad(), torch.autocast("cpu"):
        model(torch.randn(2, 8))
    assert len(activity.events) == 0 and hooks.loaders == [] and hooks.autocast == {}


# -- part 2: requests: the completed ones always kept ------------------------------------------------
class Blocker(torch.nn.Module):
    """A slow request: its forward pass waits until released."""

    def __init__(self) -> None:
        super().__init__()
        self.entered, self.release = threading.Event(), threading.Event()

    def forward(self, x):
        self.entered.set()
        self.release.wait(60)
        return x


def _serve_around_an_open_request(fast, slow, before: int, after: int, handover=None) -> threading.Thread:
    """``before`` fast requests, then a slow one opens on another thread, then ``after`` more."""
    with torch.no_grad():
        for _ in range(before):
            fast(torch.randn(2, 8))
    thread = threading.Thread(target=lambda: torch.no_grad()(slow)(torch.randn(1, 8)))
    thread.start()
    assert slow.entered.wait(60)
    with torch.no_grad():
        for i in range(after):
            fast(torch.randn(2, 8))
            if handover is not None and i == after // 2:
                handover()
    return thread


def test_completed_requests_are_handed_over_past_an_open_one():
    fast, slow = _model(), Blocker()
    activity, hooks = _hooked_log()
    handed = []
    try:
        thread = _serve_around_an_open_request(fast, slow, 5, 40, lambda: handed.extend(activity.take_requests()))
    finally:
        hooks.remove()
    activity.close()
    handed += activity.take_requests()  # the end of the run's hand-over
    note = open_requests_note(activity.requests)
    slow.release.set()
    thread.join()
    starts = [r[0] for r in handed]
    assert len(handed) == 45 and all(r[3] == 2.0 for r in handed)  # every fast one; not the open one
    assert starts == sorted(set(starts))  # each once, in start order
    assert "1 request(s) still open" in note


@pytest.mark.process
def test_a_request_open_at_the_runs_end_is_noted_and_holds_back_none(tmp_path):
    fast, slow = _model(), Blocker()
    threads = []
    with gp.profile("open", source="sim", store=tmp_path / "store", interval=0.05) as p:
        threads.append(_serve_around_an_open_request(fast, slow, 5, 200))
    slow.release.set()
    threads[0].join()
    exp = p.experiment
    assert len(exp.requests) == 205 and set(exp.requests["batch"]) == {2.0}
    open_notes = [n for n in exp.meta.notes if "still open" in n]
    assert len(open_notes) == 1 and "1 request" in open_notes[0], exp.meta.notes


@pytest.mark.parametrize("form", ["call", "with", "decorated"])
def test_set_grad_enabled_false_brings_the_request_hook_back_after_training(form):
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    @torch.set_grad_enabled(False)  # defined before the run, called after its training steps
    def evaluate(x):
        return model(x)

    activity, hooks = _hooked_log()
    try:
        _train_steps(model, opt, 3)
        assert not hooks.requests.armed
        if form == "call":
            torch.set_grad_enabled(False)
            try:
                for _ in range(20):
                    model(torch.randn(3, 8))
            finally:
                torch.set_grad_enabled(True)
        elif form == "with":
            with torch.set_grad_enabled(False):
                for _ in range(20):
                    model(torch.randn(3, 8))
        else:
            for _ in range(20):
                evaluate(torch.randn(3, 8))
        _train_steps(model, opt, 1)
    finally:
        hooks.remove()
    activity.close()
    assert len(activity.requests.records) == 20 and len(activity.steps) == 4
    assert vars(torch.nn.Module)["__call__"] is TORCH_CALL


# -- part 4: a fork made while a hook's lock is held --------------------------------------------------
def _in_fork(child) -> int:
    """Run ``child()`` in a fork; its exit code (0: it returned True)."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = 0 if child() else 2
        finally:
            os._exit(code)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    pytest.fail("the forked child hung on a hook's lock")


def test_a_fork_made_while_the_swap_lock_is_held_gives_the_child_fresh_locks():
    """In the child every swap happens (a held lock would leave ``armed`` as it was, after a
    0.5 s wait each time): eval() and no_grad arm the hook, an optimizer step sets it aside."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    activity, hooks = _hooked_log()
    requests = hooks.requests
    try:
        _train_steps(model, opt, 2)
        locks = [requests._arming, activity._lock, hooks.memory._lock]
        for lock in locks:
            lock.acquire()  # other threads inside them, at the worst moment
        try:
            def child() -> bool:
                flips = []
                for _ in range(5):
                    model.eval()
                    flips.append(requests.armed)
                    model.train()
                    _train_steps(model, opt, 1)  # nothing was served since the fork: set aside again
                    flips.append(requests.armed)
                    with torch.no_grad():
                        model(torch.randn(3, 8))
                    flips.append(requests.armed)
                    requests.timer.begun = False  # as if no request had been seen: the next step sets it aside
                    _train_steps(model, opt, 1)
                    flips.append(requests.armed)
                free = [lock.acquire(blocking=False) for lock in (requests._arming, activity._lock, hooks.memory._lock)]
                return flips == [True, False, True, False] * 5 and all(free)

            code = _in_fork(child)
        finally:
            for lock in locks:
                lock.release()
        assert code == 0
    finally:
        hooks.remove()


SERVING_SCRIPT = """
import threading, torch
model = torch.nn.Linear(8, 2)
entered = threading.Event()

def slow():
    class Stuck(torch.nn.Module):
        def forward(self, x):
            entered.set()
            threading.Event().wait()  # never returns: open when the script ends
    with torch.no_grad():
        Stuck()(torch.randn(1, 8))

threading.Thread(target=slow, daemon=True).start()
entered.wait()
with torch.no_grad():
    for _ in range(30):
        model(torch.randn(2, 8))
"""


@pytest.mark.process
def test_a_childs_request_open_at_its_end_is_noted_with_its_name(store_dir, tmp_path, monkeypatch):
    from gpuprof_jupyter.cli import main
    from gpuprof_jupyter.core.store.directory import Store

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    script = tmp_path / "serve.py"
    script.write_text(SERVING_SCRIPT)
    main(["run", "--store", str(store_dir), "--source", "sim", "--interval", "0.05", "-n", "served", "--",
          sys.executable, str(script)])
    exp = Store(store_dir).load("served")
    assert len(exp.requests) == 30 and set(exp.requests["batch"]) == {2.0}
    open_notes = [n for n in exp.meta.notes if "still open" in n]
    assert len(open_notes) == 1 and "1 request(s)" in open_notes[0] and "rank" in open_notes[0], exp.meta.notes
