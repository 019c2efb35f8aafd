"""Sampler cost per sample (issue 5, item 2): Python CPU microseconds and NVML calls per
sample, per source, at 1 and 8 GPUs, on tests.fake_nvml at zero latency. The fake's own
Python cost stands in for time inside NVML's C calls: every C call a sample makes is
recorded (with its arguments) and replayed alone, and that replay time is subtracted
(rounds alternate sample / replay; medians). Also: a 10 Hz sampler on the fake with
realistic latencies must make no blocking call (PCIe throughput, ~20 ms) in its own thread.
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


def run(mode: str = "quick") -> dict:
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
                              200.0 if gated else None, gated=gated))
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
    data = {"figures": figures, "per_config": per, "fast_lane": lanes, "repeat": repeat}
    save(NAME, data, mode)
    return data


if __name__ == "__main__":
    import sys

    print(json.dumps(run(sys.argv[1] if len(sys.argv) > 1 else "quick")["figures"], indent=1))
