"""Profiler overhead (issue 9, part 6), in a real ipykernel whose sampler process reads a
fake NVML with realistic per-call latencies (``GPUPROF_FAKE_NVML``), 10 Hz, live view on.

* Kernel CPU: a torch CPU training loop runs under ``%%gpuprofile --source nvml``; inside the
  cell, the CPU time of every ``gpuprof-*`` thread of the *kernel* (the link, the UI thread)
  is read from /proc/self/task/<native_id>/schedstat before and after: share of one core.
  The GIL they can hold is bounded by that time.
* The sampler process: its CPU (/proc/PID/stat) per sample, and the cadence measured inside
  it (|actual - scheduled| tick starts, asked of it before the cell ends).
* Wall clock: the same loop plain (A) and profiled (B) in A-B-B-A order at 1 and 8 GPUs;
  per-pair ratio B/A, median and a 95 % t interval. Gate: the interval's upper bound.
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


def _setup() -> str:
    return f"""
import sys; sys.path.insert(0, {str(ROOT)!r})
{TRAIN_SETUP}
{THREADS}
"""


PROFILED_BODY = """
from gpuprof_jupyter.kernel.link import sampler_link as _sl
from gpuprof_jupyter.core.protocol import Ping
def _proc_cpu(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
import os
_pid = _sl().pid
_p0 = _proc_cpu(_pid); _c0 = _gp_cpu(); _w0 = _time.perf_counter()
train_steps(_steps)
_w1 = _time.perf_counter(); _c1 = _gp_cpu(); _p1 = _proc_cpu(_pid)
_ping = _sl().request(Ping(lateness=True))
_res = {"wall": _w1 - _w0, "cpu": {k: _c1[k] - _c0.get(k, 0) for k in _c1}, "lat": _ping["lateness"],
        "sampler_cpu_s": _p1 - _p0, "gaps": _ping["gaps"]}
"""


def _run_kernel(n_gpus: int, cfg: dict, abba: bool) -> dict:
    from tests.kernel_helpers import execute, running_kernel, text_of
    import tempfile

    from ._common import fake_nvml_env

    env = {"GPUPROF_STORE": "", **fake_nvml_env(n_gpus, "h100", realistic=True)}
    with tempfile.TemporaryDirectory() as tmp, running_kernel(tmp, {**env, "GPUPROF_STORE": os.path.join(tmp, "store")}) as (km, kc):
        def run(code: str, timeout: float = 600) -> str:
            reply, msgs = execute(kc, code, timeout=timeout)
            if reply["status"] != "ok":
                raise RuntimeError(f"kernel cell failed: {text_of(msgs)[-2000:]}")
            return text_of(msgs)

        def value(expr: str):
            text = run(f"import json as _j; print('@@' + _j.dumps({expr}))")
            return json.loads(text.split("@@", 1)[1].splitlines()[0])

        run("%load_ext gpuprof_jupyter\nimport gpuprof_jupyter")
        run(_setup())
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
    for n in (1, 8):
        r = _run_kernel(n, cfg, abba=True)
        share = r["share"]
        wall = share["wall"]
        total_ns = sum(share["cpu"].values())
        by_thread: dict[str, int] = {}
        for k, v in share["cpu"].items():
            by_thread[k.split(":")[0]] = by_thread.get(k.split(":")[0], 0) + v
        pct_core = 100.0 * total_ns / 1e9 / wall
        lat = share["lat"]
        per_sample_us = share["sampler_cpu_s"] / max(len(lat), 1) * 1e6
        results[f"{n}gpu"] = {"wall_s": wall, "thread_cpu_ns": by_thread, "cpu_pct_of_core": pct_core,
                              "sampler_cpu_s": share["sampler_cpu_s"], "late_ms_p50": pct(lat, 50) * 1e3,
                              "late_ms_p99": pct(lat, 99) * 1e3, "ticks": len(lat), "gaps": share["gaps"],
                              "pairs": r["pairs"]}
        figures.append(figure(f"kernel_cpu_{n}gpu", f"kernel's profiler threads (link + UI), % of one core, 10 Hz, {n} GPU(s), live view, torch loop",
                              round(pct_core, 3), "%", "<= 0.5 %", 0.5, gated=True,
                              note=", ".join(f"{k} {v / 1e6 / wall:.2f} ms/s" for k, v in sorted(by_thread.items()))
                                   + f"; {wall:.0f} s measured; the GIL they can hold is bounded by this time"))
        figures.append(figure(f"sampler_process_cpu_{n}gpu", f"sampler process CPU per sample (NVML fake + host + writes), {n} GPU(s)",
                              round(per_sample_us, 1), "µs", note=f"{share['sampler_cpu_s']:.2f} s CPU for {len(lat)} ticks "
                                                                   f"({100 * share['sampler_cpu_s'] / wall:.1f} % of a core, its own process)"))
        figures.append(figure(f"process_p99_late_ms_{n}gpu", f"cadence inside the sampler process: p99 |actual - scheduled|, {n} GPU(s), 10 Hz",
                              round(pct(lat, 99) * 1e3, 2), "ms", "<= 2 ms", 2.0, gated=True,
                              note=f"p50 {pct(lat, 50) * 1e3:.2f} ms, {len(lat)} ticks, {len(share['gaps'])} recorded gaps"))
        if r["pairs"]:
            ratios = [b / a for a, b in r["pairs"]]
            m, lo, hi = mean_ci(ratios)
            med = statistics.median(ratios)
            figures.append(figure(f"wall_ratio_{n}gpu", f"wall time profiled / plain, {len(ratios)} A-B-B-A pairs, {n} GPU(s): 95 % CI upper bound",
                                  round(hi, 4), "x", "<= 1.05 (aim: median <= 1.01)", 1.05, gated=True,
                                  note=f"median {med:.4f}, mean {m:.4f}, 95 % CI [{lo:.4f}, {hi:.4f}]; "
                                       f"loop {statistics.median(a for a, _ in r['pairs']):.2f} s plain"))
    data = {"figures": figures, "runs": results, "config": cfg}
    save(NAME, data, mode)
    return data


if __name__ == "__main__":
    import sys

    print(json.dumps(run(sys.argv[1] if len(sys.argv) > 1 else "quick")["figures"], indent=1))
