"""Side by side (issue 5, item 7): nvitop's ResourceMetricCollector.take_snapshots() and our
NvmlSource.read() on the same fake NVML (zero latency), same device counts, same process,
same subtraction of the fake's own cost. nvitop is a benchmark-only dependency (``bench``
extra); this fails clearly without it.
"""

from __future__ import annotations

import json

from ._common import figure, run_json_subprocess, save

NAME = "side_by_side"
REPEAT = {"tiny": 20, "quick": 100, "full": 300}


def require_nvitop() -> str:
    try:
        import nvitop
    except ImportError:
        raise SystemExit("benchmarks need nvitop (benchmark-only dependency): pip install -e '.[bench]'") from None
    return nvitop.__version__


def run(mode: str = "quick") -> dict:
    version = require_nvitop()
    rows = {}
    for n in ((1, 8) if mode == "tiny" else (1, 2, 8)):
        code = ("import json; from benchmarks._measure import worker; "
                f"print(json.dumps(worker('both', {n}, 'h100', {REPEAT[mode]})))")
        rows[n] = run_json_subprocess(code, timeout=600)
    figures = []
    for n, r in rows.items():
        ours, theirs = r["ours"]["nvml"]["cpu_us_python"], r["nvitop"]["cpu_us_python"]
        figures.append(figure(f"ours_us_{n}gpu", f"ours: NvmlSource.read Python CPU per sample, {n} GPU(s)", round(ours, 1), "us"))
        figures.append(figure(f"nvitop_us_{n}gpu", f"nvitop {version}: ResourceMetricCollector.take_snapshots Python CPU per sample, {n} GPU(s)",
                              round(theirs, 1), "us", note=f"{r['nvitop']['nvml_calls_per_sample']} NVML calls/sample vs our "
                                                           f"{r['ours']['nvml']['nvml_calls_per_sample']}"))
        figures.append(figure(f"ratio_{n}gpu", f"nvitop / ours, {n} GPU(s)", round(theirs / ours, 1) if ours > 0 else None, "x"))
    data = {"figures": figures, "nvitop_version": version, "per_gpu_count": {str(k): v for k, v in rows.items()}}
    save(NAME, data, mode)
    return data


if __name__ == "__main__":
    import sys

    print(json.dumps(run(sys.argv[1] if len(sys.argv) > 1 else "quick")["figures"], indent=1))
