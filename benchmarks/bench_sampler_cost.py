"""Sampler cost per sample (benchmarks/README.md, "What is measured"): Python CPU microseconds and NVML calls per
sample, per source, at 1 and 8 GPUs, on tests.fake_nvml at zero latency. The fake's own
Python cost stands in for time inside NVML's C calls: every C call a sample makes is
recorded (with its arguments) and replayed alone, and that replay time is subtracted
(rounds alternate sample / replay; medians). Also: a 10 Hz sampler on the fake with
realistic latencies must make no blocking call (PCIe throughput, ~20 ms) in its own thread.

Like for like (benchmarks/README.md, "Per-sample cost"): at 8 A100-like fake GPUs (no GPM, so
every side can read the same metrics: ``_measure.SAME_METRICS``), the CPU per sample of our
``NvmlSource.read()`` (nvidia-ml-py's public functions only), of nvitop's ``Device`` API
(inside ``oneshot()``) and of raw public pynvml calls. Same fake, same process, same
subtraction. nvitop is a benchmark-only dependency (``bench`` extra); this fails clearly
without it.
"""

from __future__ import annotations

import json

from ._common import figure, run_json_subprocess, save

NAME = "sampler_cost"
REPEAT = {"tiny": 20, "quick": 100, "full": 300}
LANE_S = {"tiny": 0.5, "quick": 2.0, "full": 5.0}


def _worker(what: str, n: int, kind: str, repeat: int, seconds: float = 2.0) -> dict:
    code = ("import json; from benchmarks._measure import worker; "
            f"print(json.dumps(worker({what!r}, {n}, {kind!r}, {repeat}, {seconds})))")
    return run_json_subprocess(code, timeout=600)


def require_nvitop() -> str:
    try:
        import nvitop
    except ImportError:
        raise SystemExit("benchmarks need nvitop (benchmark-only dependency): pip install -e '.[bench]'") from None
    return nvitop.__version__


def like_for_like_figures(r: dict, nvitop_version: str) -> list[dict]:
    n = r["n_gpus"]
    sides = [
        ("ours", "ours: NvmlSource.read()"),
        ("nvitop_device", f"nvitop {nvitop_version}: Device API in oneshot()"),
        ("raw_pynvml", "raw public pynvml calls"),
    ]
    figures = [figure(f"same_metrics_{side}_us", f"{label}, same metrics, {n} x A100 (fake NVML's Python subtracted)",
                      round(r[side]["cpu_us_python"], 1), "us",
                      note=f"{r[side]['nvml_calls_per_sample']} NVML calls; {r[side]['cpu_us_total']:.0f} us with the fake's Python")
               for side, label in sides]
    ours = r["ours"]["cpu_us_python"]
    figures.append(figure("same_metrics_nvitop_over_ours", f"nvitop Device API / ours, same metrics, {n} GPUs",
                          round(r["nvitop_device"]["cpu_us_python"] / ours, 2) if ours > 0 else None, "x"))
    return figures


def run(mode: str = "quick") -> dict:
    version = require_nvitop()
    repeat = REPEAT[mode]
    per: dict = {}
    for kind in ("h100", "a100") if mode != "tiny" else ("h100",):
        for n in (1, 8):
            per[f"{kind}x{n}"] = _worker("ours", n, kind, repeat)
    lanes = {f"{kind}x8": _worker("fast_lane", 8, kind, repeat, LANE_S[mode]) for kind in ("a100", "h100")}
    figures = []
    for key, r in per.items():
        gated = key.endswith("x8")
        figures.append(figure(f"nvml_python_us_{key}", f"NVML source, Python CPU per sample, {key} (fake NVML time subtracted)",
                              round(r["nvml"]["cpu_us_python"], 1), "us", "<= 200 us at 8 GPUs" if gated else None,
                              200.0 if gated else None, gated=gated,
                              note=f"this worker's sum(range(1000)): {r['python_speed_us']:.1f} us (8-10 us on an idle modern core)"))
        figures.append(figure(f"nvml_calls_{key}", f"NVML calls per sample, {key}", r["nvml"]["nvml_calls_per_sample"], "calls"))
        figures.append(figure(f"sampler_tick_python_us_{key}", f"whole tick outside NVML (NVML source + host source + recorder), {key}",
                              round(r["sample_cpu_us_python"], 1), "us",
                              note="host source (psutil over the kernel's process tree) and recorder included"))
    first = next(iter(per.values()))
    figures.append(figure("host_source_us", "host source (psutil) CPU per sample at 10 Hz (slow metrics once a second included)", round(first["host"]["cpu_us_total"], 1), "us",
                          note="reads /proc; independent of the GPU count"))
    figures.append(figure("recorder_us_8gpu", "recorder.on_tick CPU per tick, 8 GPUs + host",
                          round(per["h100x8"]["recorder"]["cpu_us_total"], 1), "us"))
    for key, lane in lanes.items():
        figures.append(figure(f"fast_lane_blocking_{key}", f"blocking NVML calls made by the sampler thread, {key} (realistic latencies)",
                              lane["blocking_calls_in_fast_lane"], "calls", "0", 0, gated=True,
                              note=f"{lane['blocking_calls_elsewhere']} PCIe calls made by the slow lane; read() p50 "
                                   f"{lane['read_ms_p50']:.1f} ms, max {lane['read_ms_max']:.1f} ms"))
    same = _worker("like_for_like", 8, "a100", repeat)
    figures += like_for_like_figures(same, version)
    data = {"figures": figures, "per_config": per, "fast_lane": lanes, "like_for_like": same,
            "nvitop_version": version, "repeat": repeat}
    save(NAME, data, mode)
    return data


if __name__ == "__main__":
    import sys

    print(json.dumps(run(sys.argv[1] if len(sys.argv) > 1 else "quick")["figures"], indent=1))
