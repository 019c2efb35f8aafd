"""Serving cells: requests found with no code change, their latency measured honestly.

transformers is not installed here: generate() and pipelines are tested with stand-in classes of
the same shape (``GenerationMixin.generate`` calling the model once per token, ``Pipeline.__call__``
calling generate), put in ``sys.modules["transformers"]`` before the run starts, as a user's
import would.
"""

from __future__ import annotations

import math
import sys
import time
import types

import numpy as np
import pytest
import torch

import gpuprof_jupyter as gp
from gpuprof_jupyter.runtime.hooks.activity import ActivityLog
from gpuprof_jupyter.runtime.hooks.torch_hooks import TrainingHooks

# 299 steady latencies spread evenly over 20-80 ms, in a shuffled order (no percentile sits on a jump)
PLANTED_MS = np.random.default_rng(0).permutation(np.linspace(20.0, 80.0, 299))


class Sleeper(torch.nn.Module):
    """A real model whose forward pass takes a planted time (its submodules are nested calls)."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
        self.delay_s = 0.0

    def forward(self, x):
        time.sleep(self.delay_s)
        return self.encoder(x)


def _profiled(tmp_path, fn, name="serve"):
    with gp.profile(name, source="sim", store=tmp_path / "store", interval=0.05) as p:
        fn()
    return p.experiment


@pytest.mark.process
def test_planted_latencies_give_their_percentiles_with_warm_up_left_out(tmp_path):
    model = Sleeper().eval()
    x = torch.randn(4, 8)

    timed = []  # each steady request as the loop itself saw it (a loaded machine stretches the sleeps)

    def serve():
        with torch.inference_mode():
            model.delay_s = 0.3  # the first request warms up: 6x the median steady one
            model(x)
            for ms in PLANTED_MS:
                model.delay_s = ms / 1000
                began = time.perf_counter()
                model(x)
                timed.append(time.perf_counter() - began)

    exp = _profiled(tmp_path, serve)
    r = exp.summary["requests"]
    assert r["count"] == 300 and r["warmup_count"] == 1 and r["warmup_latency_s"][0] >= 0.3
    assert "median" in r["warmup_rule"]
    for name, q in (("p50", 50), ("p90", 90), ("p99", 99)):
        assert r[f"latency_{name}_s"] == pytest.approx(np.percentile(timed, q), rel=0.01, abs=5e-4), name
        assert r[f"latency_{name}_s"] >= np.percentile(PLANTED_MS / 1000, q), name  # never under what was planted
    assert r["latency_max_s"] >= 0.080 and r["timing"] == "host wall time"
    assert r["batch"] == 4 and r["samples_per_s"] == pytest.approx(4 * r["requests_per_s"])
    assert r["requests_per_s"] == pytest.approx(299 / r["span_s"])
    assert exp.summary["run_kind"] == "serving"
    assert len(exp.requests) == 300 and set(exp.requests["kind"]) == {"module"}
    from gpuprof_jupyter.render.summary_html import render_summary_html, render_summary_text

    text = render_summary_text(exp)
    assert "requests: 300 (300 module); warm-up 1 left out (leading requests slower than 2x the median" in text
    assert "latency p50 / p90 / p95 / p99 / max: " in text and "(host wall time)" in text and "requests/s" in text
    assert "latency p50 / p90 / p95 / p99 / max" in render_summary_html(exp)


def _hooked_log():
    activity = ActivityLog(time.monotonic())
    hooks = TrainingHooks(activity).install()
    return activity, hooks


def test_a_nested_module_call_is_one_request_and_training_forwards_are_none():
    model = Sleeper()
    activity, hooks = _hooked_log()
    try:
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):  # training: gradients enabled, never requests
            opt.zero_grad()
            model(torch.randn(2, 8)).sum().backward()
            opt.step()
        with torch.no_grad():
            for _ in range(5):
                model(torch.randn(6, 8))  # Sleeper -> Sequential -> Linear, ReLU, Linear: one request
    finally:
        hooks.remove()
    activity.drain()
    requests = activity.requests.records
    assert len(requests) == 5 and all(r.batch == 6 and r.kind == "module" for r in requests)
    assert len(activity.steps) == 3
    assert torch.nn.Module.__call__ is torch.nn.Module._wrapped_call_impl  # the hook is gone


TORCH_CALL = torch.nn.Module._wrapped_call_impl  # Module.__call__ as torch defines it


def _train_steps(model, opt, n: int, clip: bool = False) -> None:
    for _ in range(n):
        opt.zero_grad()
        model(torch.randn(2, 8)).sum().backward()
        if clip:  # torch's own no_grad entry: not the user's, it arms nothing
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()


@pytest.mark.parametrize("serve", ["no_grad", "inference_mode", "eval", "decorated"])
def test_a_training_run_sets_the_module_hook_aside_until_the_code_serves(serve):
    """A training forward pass pays nothing for the request hook once the run is known to
    train; the user's own no_grad / inference_mode / eval() brings it back, and the requests
    after it are counted."""
    model = Sleeper()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    activity, hooks = _hooked_log()
    try:
        assert vars(torch.nn.Module)["__call__"] is not TORCH_CALL  # armed from the start
        _train_steps(model, opt, 3, clip=True)
        assert vars(torch.nn.Module)["__call__"] is TORCH_CALL and not hooks.requests.armed
        if serve == "eval":
            model.eval()
            torch.set_grad_enabled(False)  # gradients off without a context: the hook must be back already
            try:
                model(torch.randn(3, 8))
            finally:
                torch.set_grad_enabled(True)
        elif serve == "decorated":  # the user's own @torch.no_grad() function, no eval()
            @torch.no_grad()
            def evaluate(x):
                return model(x)
            evaluate(torch.randn(3, 8))
        else:
            with getattr(torch, serve)():
                model(torch.randn(3, 8))
        assert hooks.requests.armed
        _train_steps(model, opt, 2)  # a request was seen: the hook stays for the run
        assert hooks.requests.armed
    finally:
        hooks.remove()
    activity.drain()
    assert [r.batch for r in activity.requests.records] == [3]
    assert vars(torch.nn.Module)["__call__"] is TORCH_CALL
    assert "__enter__" in vars(torch.no_grad) and vars(torch.no_grad)["__enter__"].__module__.startswith("torch")


def test_a_request_before_the_first_step_keeps_the_hook_and_nothing_arms_it_after_the_run():
    model = Sleeper()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    activity, hooks = _hooked_log()
    try:
        with torch.no_grad():
            model(torch.randn(4, 8))  # a serving thread's request, say, before any training step
        _train_steps(model, opt, 2)
        assert hooks.requests.armed and vars(torch.nn.Module)["__call__"] is not TORCH_CALL
    finally:
        hooks.remove()
    hooks.requests.arm()  # a late call from another thread once the run is over
    model.eval()
    assert vars(torch.nn.Module)["__call__"] is TORCH_CALL


def test_someone_elses_patch_of_module_call_is_left_alone():
    model = Sleeper()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    activity, hooks = _hooked_log()
    theirs = None
    try:
        ours = vars(torch.nn.Module)["__call__"]

        def theirs(module, *args, **kwargs):  # another tool wraps module calls after us
            return ours(module, *args, **kwargs)

        torch.nn.Module.__call__ = theirs
        _train_steps(model, opt, 2)
        assert vars(torch.nn.Module)["__call__"] is theirs  # not set aside under their feet
    finally:
        torch.nn.Module.__call__ = ours
        hooks.remove()
    assert vars(torch.nn.Module)["__call__"] is TORCH_CALL


@pytest.mark.process
def test_a_training_cell_stays_training_and_one_with_evaluation_says_both(tmp_path):
    model = Sleeper()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def train(evaluate: bool):
        for _ in range(4):
            opt.zero_grad()
            model(torch.randn(2, 8)).sum().backward()
            opt.step()
        if evaluate:
            with torch.no_grad():
                model(torch.randn(16, 8))

    training = _profiled(tmp_path, lambda: train(False), "train")
    assert training.summary["run_kind"] == "training" and training.summary["requests"] == {}
    both = _profiled(tmp_path, lambda: train(True), "train-eval")
    assert both.summary["run_kind"] == "training and serving" and both.summary["requests"]["count"] == 1


# -- transformers' shapes -------------------------------------------------------------------------
class TinyLM(torch.nn.Module):
    """A decoder-only stand-in: logits for the next token from the last one's embedding."""

    def __init__(self, vocab: int = 11) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, 8)
        self.head = torch.nn.Linear(8, vocab)
        self.config = types.SimpleNamespace(is_encoder_decoder=False)
        self.prefill_s = 0.0

    def forward(self, input_ids):
        if input_ids.shape[1] > 1:
            time.sleep(self.prefill_s)  # the prompt's pass: what the first token waits for
        return self.head(self.embed(input_ids[:, -1]))


def _fake_transformers():
    module = types.ModuleType("transformers")

    class GenerationMixin:
        def generate(self, input_ids=None, max_new_tokens=4, **kwargs):
            out, step_input = input_ids, input_ids
            for _ in range(max_new_tokens):  # one forward per token (a KV cache's shape)
                with torch.no_grad():
                    logits = self(step_input)
                step_input = logits.argmax(-1, keepdim=True)
                out = torch.cat([out, step_input], dim=1)
            return out

    class Pipeline:
        def __init__(self, model) -> None:
            self.model = model

        def __call__(self, inputs, *args, **kwargs):
            prompts = inputs if isinstance(inputs, list) else [inputs]  # texts: "token token ..."
            return [self.model.generate(torch.tensor([[int(t) for t in p.split()]]), max_new_tokens=2) for p in prompts]

    module.GenerationMixin, module.Pipeline = GenerationMixin, Pipeline
    return module


@pytest.fixture
def transformers(monkeypatch):
    module = _fake_transformers()
    monkeypatch.setitem(sys.modules, "transformers", module)

    class Model(TinyLM, module.GenerationMixin):
        pass

    module.Model = Model
    return module


@pytest.mark.process
def test_generate_counts_tokens_and_time_to_first_token(tmp_path, transformers):
    model = transformers.Model()
    model.prefill_s = 0.01
    prompt = torch.randint(0, 11, (2, 5))

    def serve():
        for _ in range(12):
            model.generate(input_ids=prompt, max_new_tokens=8)

    exp = _profiled(tmp_path, serve, "gen")
    r = exp.summary["requests"]
    assert r["count"] == 12 and r["kinds"] == {"generate()": 12}  # its 8 forward passes are inside
    assert set(exp.requests["tokens"]) == {16.0}  # 8 new tokens x 2 sequences
    assert 0.01 <= r["ttft_p50_s"] < r["latency_p50_s"]
    assert r["tokens_per_s"] == pytest.approx(16 * r["measured"] / r["span_s"])


def test_a_pipeline_call_is_one_request_with_its_inputs_as_batch(transformers):
    pipe = transformers.Pipeline(transformers.Model())
    activity, hooks = _hooked_log()
    try:
        pipe(["1 2 3", "4 5 6", "7 8 9"])
        pipe("1 2")
    finally:
        hooks.remove()
    activity.drain()
    requests = activity.requests.records
    assert [(r.kind, r.batch) for r in requests] == [("pipeline", 3.0), ("pipeline", 1.0)]
    assert vars(transformers.GenerationMixin)["generate"].__module__ == __name__  # unhooked again


def test_a_pipeline_fed_a_generator_counts_each_forward_pass(transformers):
    """A pipeline over a dataset or generator returns at once and runs each item later: the
    call is no request, its items' generate() calls are."""
    class Streaming(transformers.Pipeline):
        def __call__(self, inputs, *args, **kwargs):
            if isinstance(inputs, (list, str)):
                return super().__call__(inputs)
            return (self.model.generate(torch.tensor([[int(t) for t in p.split()]]), max_new_tokens=2) for p in inputs)

    pipe = Streaming(transformers.Model())
    activity, hooks = _hooked_log()
    try:
        results = pipe(p for p in ["1 2", "3 4", "5 6"])
        list(results)
    finally:
        hooks.remove()
    activity.drain()
    assert [r.kind for r in activity.requests.records] == ["generate()"] * 3


def test_requests_from_several_threads_pair_up():
    """Each record is one call's own start and end: it lies inside the span the calling
    thread saw around that call (a start paired with another thread's end would not)."""
    import threading

    model = Sleeper().eval()
    model.delay_s = 0.003
    activity, hooks = _hooked_log()
    calls = []  # (start, end) of each call as its thread saw it, in the log's seconds

    def serve():
        with torch.no_grad():
            for _ in range(15):
                x = torch.randn(5, 8)
                before = time.monotonic() - activity.t0
                model(x)
                calls.append((before, time.monotonic() - activity.t0))

    try:
        threads = [threading.Thread(target=serve) for _ in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        hooks.remove()
    activity.close()
    records = activity.requests.records
    assert len(records) == 45 and all(r.batch == 5 and r.host_s >= 0.003 for r in records)
    unpaired = [r for r in records
                if not any(before - 1e-6 <= r.t_start_s and r.t_start_s + r.host_s <= end + 1e-6 for before, end in calls)]
    assert unpaired == [], unpaired
    assert activity.request_timer.open == set()


# -- request(): by hand ---------------------------------------------------------------------------
@pytest.mark.process
def test_request_marks_alone_count_when_used(tmp_path):
    model = Sleeper().eval()

    def serve():
        with torch.no_grad():
            model(torch.randn(1, 8))  # seen by the hooks, but request() is used below
            for _ in range(6):
                with gp.request(batch_size=3) as r:
                    model(torch.randn(3, 8))
                    r.tokens = 7

    exp = _profiled(tmp_path, serve, "marked")
    r = exp.summary["requests"]
    assert r["count"] == 6 and r["kinds"] == {"request()": 6}
    assert exp.meta.context["requests_from"] == "request()" and exp.meta.context["hooked_requests"] == 1
    assert set(exp.requests["batch"]) == {3.0} and set(exp.requests["tokens"]) == {7.0}


def test_request_refuses_a_count_that_is_not_one():
    with pytest.raises(ValueError, match=r"batch_size.*int >= 0"):
        gp.request(batch_size=-2)
    with pytest.raises(ValueError, match=r"tokens.*int >= 0"):
        gp.request().tokens = "many"
    with gp.request(batch_size=np.int64(4)) as r:  # nothing profiled: a no-op
        r.tokens = np.int64(3)


# -- CUDA: events read later, never a synchronisation in the loop ------------------------------------
class FakeEvent:
    """torch.cuda.Event's shape: the GPU is 'done' with an event a while after it is recorded."""

    log: list = []

    def __init__(self, enable_timing=False) -> None:
        assert enable_timing
        self.t = None

    def record(self, stream=None) -> None:
        self.t = time.monotonic() + (0.03 if len(FakeEvent.log) % 2 else 0.0)  # end events: 30 ms of GPU work
        FakeEvent.log.append("record")

    def query(self) -> bool:
        return time.monotonic() >= self.t

    def synchronize(self) -> None:
        FakeEvent.log.append("synchronize")
        time.sleep(max(0.0, self.t - time.monotonic()))

    def elapsed_time(self, end) -> float:
        return (end.t - self.t) * 1000


def test_cuda_requests_are_timed_by_events_read_later_without_synchronising(monkeypatch):
    FakeEvent.log = []
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    model = Sleeper().eval()
    activity, hooks = _hooked_log()
    try:
        with torch.no_grad():
            for _ in range(4):
                model(torch.randn(2, 8))
        activity.drain()  # the link's hand-over: nothing is waited for
        assert "synchronize" not in FakeEvent.log
        assert activity.take_requests() == []  # their GPU work is not done yet: held back
        time.sleep(0.04)
        done = activity.take_requests()
        assert len(done) == 4
    finally:
        hooks.remove()
    assert "synchronize" not in FakeEvent.log
    for t_start, latency, host, batch, tokens, ttft, gc_s, wait_s, cuda, kind in done:
        assert cuda and latency == pytest.approx(host + 0.03, abs=0.002) and batch == 2  # the GPU ran 30 ms past the host
        assert math.isnan(ttft) and kind == "module"


def test_the_live_header_tells_recent_latency_and_rate():
    from gpuprof_jupyter.runtime.record.request_log import RequestRecord
    from gpuprof_jupyter.render.live_header import request_text

    assert request_text([], 5.0) == ""
    records = [RequestRecord(t_start_s=i * 0.1, kind="module", batch=1.0, host_s=0.01, latency_s=0.01 + (i == 99) * 0.09)
               for i in range(100)]
    text = request_text(records, 10.0)
    assert text.startswith("requests: 100 · latency p50 10.00 ms · p99") and "ms ·" in text and "requests/s (last 10 s)" in text
    assert request_text(records, 60.0) == "requests: 100 (none in the last 10 s)"


# -- what a child process sends: request events through the channel's float64 values ----------------
from hypothesis import given, settings  # noqa: E402 - beside the tests that use it
from hypothesis import strategies as st  # noqa: E402
from tests.property_budget import examples  # noqa: E402


@settings(max_examples=examples(200), deadline=None)
@given(requests=st.lists(st.tuples(st.integers(0, 2 ** 32 - 1), st.one_of(st.none(), st.integers(0, 2 ** 20)),
                                   st.one_of(st.none(), st.integers(0, 2 ** 20))), min_size=1, max_size=20,
                         unique_by=lambda r: r[0]))
def test_request_events_survive_the_child_channel(requests):
    """A child of gpuprof run packs its events as float64 (core/child_channel.py); the run folds
    them: every request's number, batch size and tokens come back exactly."""
    from gpuprof_jupyter.core.child_channel import pack_events, unpack_events
    from gpuprof_jupyter.runtime.record.events import REQ_END, REQ_MODULE, pack_request
    from gpuprof_jupyter.runtime.record.request_log import RequestLog

    events = []
    for i, (number, batch, tokens) in enumerate(requests):
        events += [(REQ_MODULE, 1.0 + i, pack_request(number, batch)), (REQ_END, 1.5 + i, pack_request(number, tokens))]
    log = RequestLog(0.0)
    for kind, t, value in unpack_events(**pack_events(events)):
        log.apply(kind, t, value)
    got = [(r.batch, r.tokens, r.host_s) for r in log.records]
    want = [(float("nan") if b is None else float(b), float("nan") if k is None else float(k), 0.5) for _, b, k in requests]
    assert len(got) == len(want)
    for (gb, gk, gh), (wb, wk, wh) in zip(got, want):
        assert (gb == wb or gb != gb and wb != wb) and (gk == wk or gk != gk and wk != wk) and gh == wh


def test_a_cuda_request_never_ends_before_its_host_call_returned(monkeypatch):
    """GPU work shorter than the host's (a slow Python forward, a tiny kernel): the request's
    latency is its host time, not the events' 1 ms."""
    class QuickGpu(FakeEvent):
        def record(self, stream=None) -> None:
            self.t = time.monotonic() if len(FakeEvent.log) % 2 == 0 else self.start_t + 0.001
            FakeEvent.log.append("record")

    FakeEvent.log = []
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    events = []

    def make(enable_timing=False):
        event = QuickGpu(enable_timing)
        event.start_t = events[-1].t if events and len(events) % 2 else None
        events.append(event)
        return event

    monkeypatch.setattr(torch.cuda, "Event", make)
    model = Sleeper().eval()
    model.delay_s = 0.02
    activity, hooks = _hooked_log()
    try:
        with torch.no_grad():
            model(torch.randn(2, 8))
    finally:
        hooks.remove()
    activity.close()
    (request,) = activity.requests.records
    assert request.cuda and request.host_s >= 0.02 and request.latency_s == pytest.approx(request.host_s, abs=1e-6)


@pytest.mark.process
def test_an_unreadable_requests_file_is_reported_and_loses_nothing_else(tmp_path):
    from gpuprof_jupyter.core.store.directory import REQUESTS_NAME, Store, StoreProblem

    model = Sleeper().eval()

    def serve():
        with torch.no_grad():
            for _ in range(5):
                model(torch.randn(2, 8))

    exp = _profiled(tmp_path, serve, "damaged")
    store = Store(tmp_path / "store")
    path = store.directory(exp.meta) / REQUESTS_NAME
    assert path.exists()
    path.write_bytes(b"PAR1 not parquet at all")
    with pytest.warns(StoreProblem, match=r"requests of 'damaged' .* are unreadable"):
        again = store.load("damaged")
        assert len(again.requests) == 0
    assert again.summary["requests"]["count"] == 5  # the summary saved when the run ended stays
    assert "requests" in " ".join(store.problems)


@pytest.mark.process
def test_a_fork_made_while_the_hook_was_being_swapped_does_not_hang_the_child():
    """The swap's lock, held by another thread at the fork, stays held in the child for ever:
    the child's eval(), no_grad forward and optimizer step must still run (and end)."""
    import os

    model = Sleeper()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    activity, hooks = _hooked_log()
    try:
        _train_steps(model, opt, 2)
        hooks.requests._arming.acquire()  # another thread mid-swap, at the worst moment
        try:
            pid = os.fork()
            if pid == 0:  # the child: exit code 0 once all of it ran
                code = 1
                try:
                    model.eval()
                    with torch.no_grad():
                        model(torch.randn(3, 8))
                    model.train()
                    _train_steps(model, opt, 1)
                    code = 0
                finally:
                    os._exit(code)
        finally:
            hooks.requests._arming.release()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.05)
        else:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            pytest.fail("the forked child hung on the hook's lock")
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        hooks.remove()
