"""The zero-code hooks' cost in the training process (issue 11, part 6; issue 20, part 5): per
DataLoader batch and per optimizer step, target <= 2 us each, in the kernel and in a child
process of ``gpuprof run``.

Measured side by side in one fresh interpreter, hooked and plain alternating, each figure
the best of several repeats (the least disturbed by other processes on shared cores):
* a DataLoader over an in-memory list with ``batch_size=None`` (no collation: a few us a
  batch, so the hook's share shows), iterated with and without the hooks;
* ``optimizer.step()`` of an optimizer whose step does nothing (torch's hook machinery runs
  as for any optimizer; a real step's own cost would hide the hook's), with and without.
While hooked, a thread drains the buffer every 0.1 s as the sampler does, so the hooked time
includes the fold (``ActivityLog.drain``) in the kernel, as today; the fold is also timed
alone, per event (it moves to the sampler process once issue 9 hands it the batches).
A child process of ``gpuprof run`` (issue 20) does not fold: its sender thread encodes the
events for the run's channel instead (``core/child_channel.py``), and the run's process folds
them. Its figures: per batch, hooked (no fold) - plain plus the encoding of the 2 events; per
optimizer step, the pre and post hooks plus that encoding.
Per batch, the hooked - plain difference is the hooks' whole cost in the kernel. Per optimizer
step torch's own step wrapper (a ``record_function`` range) varies by more than the hooks cost,
so the gated figure adds the pieces timed alone: the pre and post hooks called directly, and
the fold of their two events.

Serving (issue 30, part 7): per request, target <= 2 us: a no-op ``torch.nn.Module`` called
with gradients disabled, hooked - plain (the request hook, its two events and their fold, with
the draining thread as above). The hook wraps every Module call, so the cost it adds to a call
that is not a request (a training forward pass, with gradients enabled) is reported too.

Inside a training loop (``in_loop_costs``): the overhead benchmark's torch loop (``_train.py``,
one intra-op thread, a 2 ms step), hooked and plain in alternating blocks of steps, each
phase timed per step; the medians' differences are what the hooks add to the forward pass and
to ``optimizer.step()`` there. In the loop the step's own data has pushed the hooks' code and
data out of the caches, so each costs several times what it costs timed alone above. The
hooked blocks start after three steps: the request hook is set aside and the memory breakdown
sampled, as in a run (docs/serving.md, "What a request is").

Memory (docs/memory.md, "Cost"), in the same run and set against one step of the quickstart
workload (``gpuprof_jupyter/demo.py``: its model and optimizer at batch 32, CPU tensors, plus the
modelled GPU step it waits out): the per-step peak read and reset (``StepMemory.boundary`` with
torch.cuda's allocator statistics faked as in tests, ``tests/fake_torch_cuda.py``: the
profiler's side; a real ``max_memory_allocated`` is one C call into the allocator), and the
breakdown's one sampled step (the saved-tensor counter on, the optimizers' tensors summed)
against the same step unsampled. Each ratio is given against the whole quickstart step and,
stricter, against its CPU compute alone.
"""

from __future__ import annotations

import json

from ._common import figure, save

NAME = "hooks"
SIZES = {"tiny": (3, 2_000), "quick": (9, 20_000), "full": (25, 50_000)}  # repeats, iterations per repeat
IN_LOOP = {"tiny": (2, 20), "quick": (30, 200), "full": (60, 200)}  # rounds, steps per block
TARGET_US = 2.0


def worker(repeats: int, n: int, loop: tuple = IN_LOOP["tiny"]) -> dict:
    import threading
    import time
    import timeit

    import torch
    from torch.optim import optimizer as torch_optimizer

    from gpuprof_jupyter.runtime.hooks.activity import ActivityLog
    from gpuprof_jupyter.runtime.record.events import (OPT_POST, OPT_PRE, REQ_END, REQ_MODULE, WAIT_END, WAIT_START,
                                                       pack_request)
    from gpuprof_jupyter.runtime.hooks.torch_hooks import TrainingHooks

    loader = torch.utils.data.DataLoader(list(range(n)), batch_size=None)
    class Noop(torch.optim.Optimizer):
        def step(self, closure=None):
            return None

    opt = Noop([torch.nn.Parameter(torch.zeros(()))], {})

    class Served(torch.nn.Module):
        def forward(self, x):
            return x

    served, x = Served(), torch.zeros(2, 1)

    def requests() -> None:
        with torch.no_grad():
            for _ in range(n):
                served(x)

    def forwards() -> None:  # gradients enabled: no request, only the hook's check
        for _ in range(n):
            served(x)

    def batches() -> None:
        for _ in loader:
            pass

    def steps() -> None:
        for _ in range(n):
            opt.step()

    def per_item(fn) -> float:
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) / n

    def fold(kinds) -> float:
        activity = ActivityLog(0.0)
        for i in range(n):
            for kind, value in kinds:
                activity.emit((kind, i * 1e-3, value))
        t = time.perf_counter()
        activity.drain()
        return (time.perf_counter() - t) / (n * len(kinds))

    def encode_each(kinds) -> float:
        """A child of ``gpuprof run``'s share instead of the fold: its events encoded for the channel."""
        from gpuprof_jupyter.core.child_channel import EVENTS, encode, pack_sendable

        events = [(kind, i * 1e-3, value) for i in range(n) for kind, value in kinds]
        t = time.perf_counter()
        for start in range(0, len(events), 2000):  # batches as the sender thread takes them
            encode(EVENTS, **pack_sendable(events[start:start + 2000])[0], as_of=0.0)
        return (time.perf_counter() - t) / len(events)

    best = {k: float("inf") for k in ("batch_plain", "batch_hooked", "batch_child", "step_plain", "step_hooked",
                                      "opt_hooks", "fold_batch", "fold_step", "encode_batch", "encode_step",
                                      "request_plain", "request_hooked", "forward_plain", "forward_hooked",
                                      "fold_request")}
    batches(), steps(), requests(), forwards()  # warm up
    for _ in range(repeats):
        for kind, fn in (("batch", batches), ("step", steps), ("request", requests), ("forward", forwards)):
            best[f"{kind}_plain"] = min(best[f"{kind}_plain"], per_item(fn))
            activity = ActivityLog(time.monotonic())
            hooks = TrainingHooks(activity).install()
            stop = threading.Event()
            ticker = threading.Thread(target=lambda: [activity.drain() for _ in iter(lambda: stop.wait(0.1), True)],
                                      daemon=True)
            ticker.start()
            try:
                best[f"{kind}_hooked"] = min(best[f"{kind}_hooked"], per_item(fn))
                if kind == "batch":  # a child's training thread: the same hooks, the fold elsewhere
                    folding = activity.drain
                    activity.drain = activity.events.drain
                    best["batch_child"] = min(best["batch_child"], per_item(fn))
                    activity.drain = folding
                if kind == "step":
                    pre = list(torch_optimizer._global_optimizer_pre_hooks.values())[-1]
                    post = list(torch_optimizer._global_optimizer_post_hooks.values())[-1]

                    def both():
                        pre(opt, (), {})
                        post(opt, (), {})
                    best["opt_hooks"] = min(best["opt_hooks"], min(timeit.repeat(both, number=n, repeat=1)) / n)
            finally:
                stop.set()
                ticker.join()
                hooks.remove()
        best["fold_batch"] = min(best["fold_batch"], fold([(WAIT_START, None), (WAIT_END, 8)]))
        best["fold_step"] = min(best["fold_step"], fold([(OPT_PRE, 1), (OPT_POST, 1)]))
        best["encode_batch"] = min(best["encode_batch"], encode_each([(WAIT_START, None), (WAIT_END, 8)]))
        best["encode_step"] = min(best["encode_step"], encode_each([(OPT_PRE, 1), (OPT_POST, 1)]))
        best["fold_request"] = min(best["fold_request"], fold([(REQ_MODULE, pack_request(0, 2)), (REQ_END, pack_request(0))]))
    speed = min(timeit.repeat("sum(range(1000))", number=2000, repeat=5)) / 2000
    return {"best_s": best, "memory_s": memory_costs(repeats), "in_loop_s": in_loop_costs(*loop),
            "python_sum_range_1000_s": speed, "torch": torch.__version__}


def in_loop_costs(rounds: int, steps: int) -> dict:
    """Median per-step times (s) of the forward pass, ``optimizer.step()`` and the whole step,
    plain and hooked, in blocks of ``steps`` alternating for ``rounds`` rounds."""
    import statistics
    import time

    import torch

    from gpuprof_jupyter.runtime.hooks.activity import ActivityLog
    from gpuprof_jupyter.runtime.hooks.torch_hooks import TrainingHooks

    from ._train import namespace

    torch.set_num_threads(1)
    ns = namespace()
    model, opt, x, y, train = ns["_model"], ns["_opt"], ns["_x"], ns["_y"], ns["train_steps"]
    clock = time.perf_counter_ns
    times = {kind: {"forward": [], "step": [], "whole": []} for kind in ("plain", "hooked")}

    def block(out: dict) -> None:
        for _ in range(steps):
            t0 = clock()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            t1 = clock()
            opt.zero_grad()
            loss.backward()
            t2 = clock()
            opt.step()
            t3 = clock()
            out["forward"].append(t1 - t0)
            out["step"].append(t3 - t2)
            out["whole"].append(t3 - t0)

    train(20)
    for r in range(rounds):
        for kind in (("plain", "hooked") if r % 2 else ("hooked", "plain")):
            hooks = TrainingHooks(ActivityLog(time.monotonic())).install() if kind == "hooked" else None
            try:
                if hooks is not None:
                    train(3)  # as in a run: the request hook set aside, the breakdown sampled
                block(times[kind])
            finally:
                if hooks is not None:
                    hooks.remove()
                    hooks.activity.drain()
    return {kind: {phase: statistics.median(v) / 1e9 for phase, v in phases.items()} for kind, phases in times.items()}


def memory_costs(repeats: int, batch: int = 32) -> dict:
    """Seconds: one quickstart training step (CPU compute), the same step sampled for the
    breakdown, one boundary's peak read and reset, and the modelled GPU step."""
    import sys
    import time

    import torch

    from gpuprof_jupyter import demo
    from gpuprof_jupyter.runtime.hooks.activity import ActivityLog
    from gpuprof_jupyter.runtime.hooks.memory_hooks import StepMemory

    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent.parent))
    from tests.fake_torch_cuda import FakeCuda

    model = demo.make_model()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = torch.randn(batch, *demo.IMAGE), torch.randint(0, demo.CLASSES, (batch,))

    def step() -> None:
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()

    def sampled() -> float:
        """One step with the breakdown's window open, then closed: what the sampled step costs."""
        probe = StepMemory(ActivityLog(0.0))
        probe.boundary(opt)  # the first boundary opens the window
        t = time.perf_counter()
        step()
        probe.boundary(opt)  # closes it: the optimizers' tensors summed, the record made
        elapsed = time.perf_counter() - t
        assert probe.record is not None
        return elapsed

    fake = FakeCuda()
    saved = {name: getattr(torch.cuda, name) for name in FakeCuda.NAMES}
    best = {"step": float("inf"), "sampled_step": float("inf"), "boundary": float("inf")}
    for _ in range(3):
        step()  # warm up, the optimizer's state made
    n = 200
    for _ in range(repeats):
        t = time.perf_counter()
        step()
        best["step"] = min(best["step"], time.perf_counter() - t)
        best["sampled_step"] = min(best["sampled_step"], sampled())
        for name in FakeCuda.NAMES:  # CUDA "initialised": the boundary reads and resets the peak
            setattr(torch.cuda, name, getattr(fake, name))
        try:
            probe = StepMemory(ActivityLog(0.0))
            probe.record = {}  # the breakdown done: each later step's cost
            probe.boundary(opt)
            t = time.perf_counter()
            for _ in range(n):
                probe.boundary(opt)
            best["boundary"] = min(best["boundary"], (time.perf_counter() - t) / n)
        finally:
            for name, value in saved.items():
                setattr(torch.cuda, name, value)
    best["gpu_step"] = demo.gpu_step_s(batch, False)
    return best


def run(mode: str = "quick") -> dict:
    from ._common import run_json_subprocess

    repeats, n = SIZES[mode]
    data = run_json_subprocess(f"import json; from benchmarks.bench_hooks import worker; "
                               f"print(json.dumps(worker({repeats}, {n}, {IN_LOOP[mode]})))", timeout=900)
    m, us = data["best_s"], 1e6
    batch = max(0.0, m["batch_hooked"] - m["batch_plain"]) * us
    step_direct = (m["opt_hooks"] + 2 * m["fold_step"]) * us
    batch_child = (max(0.0, m["batch_child"] - m["batch_plain"]) + 2 * m["encode_batch"]) * us
    step_child = (m["opt_hooks"] + 2 * m["encode_step"]) * us
    speed = data["python_sum_range_1000_s"] * us
    request = max(0.0, m["request_hooked"] - m["request_plain"]) * us
    forward = max(0.0, m["forward_hooked"] - m["forward_plain"]) * us
    figures = [
        figure("request_us", "hooks' cost per serving request in the kernel (a no-op Module called with gradients "
               "disabled, hooked - plain, fold included)", round(request, 2), "us", f"<= {TARGET_US:g} us", TARGET_US,
               gated=True, note=f"a call {m['request_plain'] * us:.2f} us plain vs {m['request_hooked'] * us:.2f} us hooked; "
                                f"fold of its 2 events alone {2 * m['fold_request'] * us:.2f} us"),
        figure("module_call_us", "what the request hook adds to a Module call that is no request while it is armed "
               "(gradients enabled, no optimizer step yet: a training run sets it aside at its first step; a submodule "
               "inside a request costs the same check)", round(forward, 2), "us",
               note=f"a call {m['forward_plain'] * us:.2f} us plain vs {m['forward_hooked'] * us:.2f} us hooked"),
        figure("batch_us", "hooks' cost per DataLoader batch in the kernel (hooked - plain, fold included)",
               round(batch, 2), "us", f"<= {TARGET_US:g} us", TARGET_US, gated=True,
               note=f"a batch {m['batch_plain'] * us:.2f} us plain vs {m['batch_hooked'] * us:.2f} us hooked, "
                    f"{m['batch_hooked'] / m['batch_plain']:.2f}x; fold of its 2 events alone {2 * m['fold_batch'] * us:.2f} us"),
        figure("step_us", "hooks' cost per optimizer step in the kernel (pre + post hook + fold of their 2 events, "
               "each timed alone)", round(step_direct, 2), "us", f"<= {TARGET_US:g} us", TARGET_US, gated=True,
               note=f"pre + post hook {m['opt_hooks'] * us:.2f} us, fold {2 * m['fold_step'] * us:.2f} us; end to end a no-op "
                    f"optimizer step {m['step_plain'] * us:.2f} us plain vs {m['step_hooked'] * us:.2f} us hooked "
                    f"({m['step_hooked'] / m['step_plain']:.2f}x: torch's own step wrapper varies by more than the hooks cost)"),
        figure("batch_us_child", "per DataLoader batch in a child of gpuprof run (hooked - plain, its 2 events encoded "
               "for the channel; the fold runs in the run's process)", round(batch_child, 2), "us", f"<= {TARGET_US:g} us",
               TARGET_US, gated=True, note=f"hooked without the fold {m['batch_child'] * us:.2f} us a batch; encoding "
                                           f"{2 * m['encode_batch'] * us:.2f} us"),
        figure("step_us_child", "per optimizer step in a child of gpuprof run (pre + post hook + encoding their 2 "
               "events; the fold runs in the run's process)", round(step_child, 2), "us", f"<= {TARGET_US:g} us",
               TARGET_US, gated=True, note=f"pre + post hook {m['opt_hooks'] * us:.2f} us, encoding {2 * m['encode_step'] * us:.2f} us"),
        figure("fold_us_per_event", "folding one buffered event (ActivityLog.drain; moves to the sampler process "
               "with issue 9)", round(m["fold_step"] * us, 3), "us", note=f"wait events {m['fold_batch'] * us:.3f} us"),
        *in_loop_figures(data["in_loop_s"]),
        *memory_figures(data["memory_s"]),
        figure("python_speed_us", "this machine: sum(range(1000)) (about 8-10 us on an idle modern core)",
               round(speed, 1), "us"),
    ]
    result = {"figures": figures, "best_s": m, "memory_s": data["memory_s"], "in_loop_s": data["in_loop_s"], "sizes": {"repeats": repeats, "iterations": n}, "torch": data["torch"]}
    save(NAME, result, mode)
    return result


def in_loop_figures(loop: dict) -> list:
    """What the hooks add inside the overhead benchmark's training loop (medians per step)."""
    plain, hooked, us = loop["plain"], loop["hooked"], 1e6
    added = {phase: hooked[phase] - plain[phase] for phase in ("forward", "step", "whole")}
    return [
        figure("in_loop_forward_us", "what the hooks add to a training forward pass inside the loop (the overhead "
               "benchmark's loop, 6 module calls; the request hook set aside at the first optimizer step)",
               round(added["forward"] * us, 2), "us",
               note=f"median forward {plain['forward'] * us:.1f} us plain vs {hooked['forward'] * us:.1f} us hooked"),
        figure("in_loop_step_us", "what the hooks add to optimizer.step() inside the loop (pre + post hook, the "
               "memory probe without CUDA)", round(added["step"] * us, 2), "us",
               note=f"median step {plain['step'] * us:.1f} us plain vs {hooked['step'] * us:.1f} us hooked"),
        figure("in_loop_share", "the hooks inside the loop, forward + step, as a share of its whole step",
               round((added["forward"] + added["step"]) / plain["whole"] * 100, 3), "%",
               note=f"whole step median {plain['whole'] * 1e3:.2f} ms plain, {hooked['whole'] * 1e3:.2f} ms hooked "
                    f"(the whole-step medians also move with the backward pass's noise)"),
    ]


MEMORY_TARGET = 0.01  # of a quickstart step


def memory_figures(mem: dict) -> list:
    """The per-step peak read and the sampled step, each as a share of one quickstart step."""
    whole = mem["step"] + mem["gpu_step"]
    extra = max(0.0, mem["sampled_step"] - mem["step"])
    return [
        figure("memory_boundary_share", "per-step peak read and reset (StepMemory.boundary, CUDA in use) as a "
               "share of a quickstart step", round(mem["boundary"] / whole * 100, 4), "%", "< 1 %", 1.0, gated=True,
               note=f"{mem['boundary'] * 1e6:.2f} us a step against {whole * 1e3:.1f} ms (CPU compute "
                    f"{mem['step'] * 1e3:.2f} ms + modelled GPU {mem['gpu_step'] * 1e3:.1f} ms); against the compute "
                    f"alone {mem['boundary'] / mem['step'] * 100:.3f} %"),
        figure("memory_sampled_step_share", "the breakdown's one sampled step: its extra time as a share of a "
               "quickstart step", round(extra / whole * 100, 3), "%", "< 1 %", 1.0, gated=True,
               note=f"sampled {mem['sampled_step'] * 1e3:.3f} ms vs plain {mem['step'] * 1e3:.3f} ms of CPU compute "
                    f"({mem['sampled_step'] / mem['step']:.2f}x the compute; once per run)"),
    ]


if __name__ == "__main__":
    import sys

    print(json.dumps(run(sys.argv[1] if len(sys.argv) > 1 else "quick")["figures"], indent=1))
