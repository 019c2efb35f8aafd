"""Profiler CPU share and wall-clock overhead (issue 5, item 1), in a real ipykernel.

A kernel (jupyter_client) loads the extension and installs tests.fake_nvml with realistic
per-call latencies in a setup cell; a torch CPU training loop then runs under
``%%gpuprofile --source nvml`` with the live dashboard. Inside the cell, the CPU time of
every ``gpuprof-*`` thread (sampler, UI, NVML slow lane) is read from
/proc/self/task/<native_id>/schedstat before and after the loop: CPU share = that time /
wall time. GIL: time those threads run Python (an upper bound of the GIL held: their CPU
time outside GIL-free C calls; the fake's sleeps release it like NVML's ctypes calls).
Wall ratio: the same loop plain (A) and profiled (B) in A-B-B-A order, per-pair ratio
B/A, mean with a 95 % t interval (reported, not gated).
"""

from __future__ import annotations

import json
import os
import statistics

from ._common import ROOT, figure, mean_ci, pct, save
from ._train import TRAIN_SETUP

NAME = "overhead"
CFG = {"tiny": {"share_s": 3.0, "pairs": 2, "pair_s": 0.5},
       "quick": {"share_s": 15.0, "pairs": 10, "pair_s": 1.0},
       "full": {"share_s": 60.0, "pairs": 20, "pair_s": 3.0}}

THREADS = """
import threading, time as _time
def _gp_cpu():
    out = {}
    for t in threading.enumerate():
        if t.name.startswith("gpuprof-"):
            try:
                with open(f"/proc/self/task/{t.native_id}/schedstat") as f:
                    out[f"{t.name}:{t.native_id}"] = int(f.read().split()[0])
            except OSError:
                pass
    return out
"""


def _setup(n_gpus: int) -> str:
    return f"""
import sys; sys.path.insert(0, {str(ROOT)!r})
from benchmarks._common import fake_nvml
try:
    _fake.uninstall()
except NameError:
    pass
_fake = fake_nvml({n_gpus}, "h100", realistic=True).install()
{TRAIN_SETUP}
{THREADS}
"""


PROFILED_BODY = """
_c0 = _gp_cpu(); _w0 = _time.perf_counter()
train_steps(_steps)
_w1 = _time.perf_counter(); _c1 = _gp_cpu()
from gpuprof_jupyter.runtime.session import current_session as _cs
_lat = list(_cs()._sampler.lateness)
_res = {"wall": _w1 - _w0, "cpu": {k: _c1[k] - _c0.get(k, 0) for k in _c1}, "lat": _lat}
"""


def _run_kernel(n_gpus: int, cfg: dict, abba: bool) -> dict:
    from tests.kernel_helpers import execute, running_kernel, text_of
    import tempfile

    with tempfile.TemporaryDirectory() as tmp, running_kernel(tmp, {"GPUPROF_STORE": os.path.join(tmp, "store")}) as (km, kc):
        def run(code: str, timeout: float = 600) -> str:
            reply, msgs = execute(kc, code, timeout=timeout)
            if reply["status"] != "ok":
                raise RuntimeError(f"kernel cell failed: {text_of(msgs)[-2000:]}")
            return text_of(msgs)

        def value(expr: str):
            text = run(f"import json as _j; print('@@' + _j.dumps({expr}))")
            return json.loads(text.split("@@", 1)[1].splitlines()[0])

        run("%load_ext gpuprof_jupyter\nimport gpuprof_jupyter")
        run(_setup(n_gpus))
        run(f"_steps = steps_for({cfg['share_s']})")
        run("%%gpuprofile --source nvml -n share\n" + PROFILED_BODY)
        share = value("_res")
        pairs = []
        if abba:
            run(f"_steps = steps_for({cfg['pair_s']})")
            plain = "_w0 = _time.perf_counter(); train_steps(_steps); _wall = _time.perf_counter() - _w0"
            prof = "%%gpuprofile --source nvml -n abba\n" + plain
            for _ in range(cfg["pairs"] // 2 + cfg["pairs"] % 2):
                a1 = (run(plain), value("_wall"))[1]
                b1 = (run(prof), value("_wall"))[1]
                b2 = (run(prof), value("_wall"))[1]
                a2 = (run(plain), value("_wall"))[1]
                pairs += [(a1, b1), (a2, b2)]
            pairs = pairs[:cfg["pairs"]]
        return {"share": share, "pairs": pairs}


def run(mode: str = "quick") -> dict:
    import sys

    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    cfg = CFG[mode]
    results = {}
    figures = []
    for n, limit in ((1, 1.0), (8, 3.0)):
        r = _run_kernel(n, cfg, abba=(n == 8))
        share = r["share"]
        wall = share["wall"]
        cpu = share["cpu"]
        total_ns = sum(cpu.values())
        by_thread = {}
        for k, v in cpu.items():
            by_thread[k.split(":")[0]] = by_thread.get(k.split(":")[0], 0) + v
        pct_core = 100.0 * total_ns / 1e9 / wall
        lat = share["lat"]
        results[f"{n}gpu"] = {"wall_s": wall, "thread_cpu_ns": by_thread, "cpu_pct_of_core": pct_core,
                              "late_ms_p50": pct(lat, 50) * 1e3, "late_ms_p99": pct(lat, 99) * 1e3, "ticks": len(lat),
                              "pairs": r["pairs"]}
        figures.append(figure(f"cpu_share_{n}gpu", f"profiler threads' CPU, % of one core, 10 Hz, {n} GPU(s), live dashboard, torch loop",
                              round(pct_core, 2), "%", f"<= {limit:g} %", limit, gated=True,
                              note=", ".join(f"{k} {v / 1e6 / wall:.1f} ms/s" for k, v in sorted(by_thread.items()))
                                   + f"; {wall:.0f} s measured"))
        figures.append(figure(f"gil_ms_per_s_{n}gpu", f"GIL held by the profiler's threads, upper bound, {n} GPU(s)",
                              round(total_ns / 1e6 / wall, 2), "ms/s",
                              note="their on-CPU time per second; NVML (fake) calls release the GIL and are not on-CPU"))
        figures.append(figure(f"kernel_p99_late_ms_{n}gpu", f"cadence inside the kernel: p99 lateness, {n} GPU(s)",
                              round(pct(lat, 99) * 1e3, 2), "ms", note=f"p50 {pct(lat, 50) * 1e3:.1f} ms, {len(lat)} ticks"))
        if r["pairs"]:
            ratios = [b / a for a, b in r["pairs"]]
            m, lo, hi = mean_ci(ratios)
            figures.append(figure("wall_ratio_8gpu", f"wall time profiled / plain, {len(ratios)} A-B-B-A pairs, 8 GPUs (95 % CI)",
                                  round(m, 4), "x", "aim <= 1.01 (reported, not gated)", 1.01, gated=False,
                                  note=f"95 % CI [{lo:.4f}, {hi:.4f}]; median {statistics.median(ratios):.4f}; "
                                       f"loop {statistics.median(a for a, _ in r['pairs']):.2f} s plain"))
    data = {"figures": figures, "runs": results, "config": cfg}
    save(NAME, data, mode)
    return data


if __name__ == "__main__":
    import sys

    print(json.dumps(run(sys.argv[1] if len(sys.argv) > 1 else "quick")["figures"], indent=1))
