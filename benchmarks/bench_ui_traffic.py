"""UI traffic of the live dashboard: what reaches the front end, and points in the browser.

For 10 Hz and 100 Hz sampling with 1 and 8 simulated GPUs, a real ipykernel runs a
``%%gpuprofile`` cell and every IOPub message is counted (document updates = Bokeh PATCH-DOC
messages; comm messages; bytes = JSON content + binary buffers), rates taken over the live
part of the cell (first to last plot update). Then a 12-hour run is fast-forwarded through
the dashboard's data model to count points per series in the browser (recent window +
decimated history) and the size of one history replacement (sent at most once a minute).

    python benchmarks/bench_ui_traffic.py --quick      # 15 s per case, a few minutes in all
    python benchmarks/bench_ui_traffic.py              # 75 s per case (includes a history refresh)

Targets: <= 6 document updates/s, <= 50 KB/s averaged over a minute, <= 5,000 points/series.
Writes benchmarks/results/ui_traffic.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from benchmarks.ui_traffic import run_profiled_cell  # noqa: E402


def traffic_case(hz: int, gpus: int, seconds: float) -> dict:
    spec = f"sim:compute-bound:{gpus}"
    traffic = run_profiled_cell(f"import time\ntime.sleep({seconds})", f"--source {spec} --interval {1 / hz}")
    live = max((traffic.last_update_s or 0) - (traffic.first_update_s or 0), 1e-9)
    return {
        "rate_hz": hz, "gpus": gpus, "cell_s": round(traffic.duration_s, 2), "live_s": round(live, 2),
        "doc_updates_per_s": round(traffic.doc_updates / live, 2),
        "max_doc_updates_in_1s": traffic.max_updates_in_window(1.0),
        "comm_messages_per_s": round(traffic.comm_messages / live, 1),
        "bytes_per_s": round(traffic.comm_bytes / live),
        "updates_before_execute_reply": traffic.updates_before_reply,
        "static_ending_with_png": traffic.ending_displayed and traffic.ending_has_png,
        "errors": traffic.errors,
    }


def long_run_points(hz: int, gpus: int, hours: float = 12.0) -> dict:
    """Fast-forward ``hours`` through the model: points per series and history refresh size."""
    from gpuprof_jupyter.core.protocol import Tick
    from gpuprof_jupyter.core.store.experiment import ExperimentMeta
    from gpuprof_jupyter.core.plots.columns import LiveColumns
    from gpuprof_jupyter.core.plots.spec import plot_spec

    metrics = ("sm_util", "mem_bw_util", "power_w", "gpu_mem_used_bytes")
    devices = [{"key": f"gpu{k}", "kind": "gpu", "name": "sim", "index": k, "power_limit_w": 400.0}
               for k in range(gpus)] + [{"key": "host", "kind": "host", "name": "host"}]
    meta = ExperimentMeta(id="b", name="bench", devices=devices, simulated=True,
                          provenance={d["key"]: {m: "simulated" for m in metrics} for d in devices},
                          units={m: "" for m in (*metrics, "cpu_util")})
    spec = plot_spec(meta)
    model = LiveColumns(spec, t0=0.0, interval=1 / hz)
    started = time.perf_counter()
    n = int(hours * 3600 * hz)
    per_drain = hz * 60  # batch size does not change the points; minute batches keep this fast
    for i in range(n):
        t = i / hz
        spike = 100.0 if i == n // 2 else 50.0 + (i % 7)
        reading = {f"gpu{k}": {"sm_util": spike, "mem_bw_util": 30.0, "power_w": 250.0, "gpu_mem_used_bytes": 2**33}
                   for k in range(gpus)}
        reading["host"] = {"cpu_util": 20.0}
        model.push(Tick(t, t, reading))
        if i % per_drain == per_drain - 1:
            model.drain()
    model.drain()
    history = model.history_data()
    refresh_bytes = len(json.dumps(history))
    spike_kept = max(v for v in history["sm_util__gpu0"] if v == v) == 100.0
    return {"rate_hz": hz, "gpus": gpus, "hours": hours, "ticks": n,
            "points_per_series": model.points_per_series(len(history["t"])),
            "history_rows": len(history["t"]), "recent_rows": model.recent_rows,
            "history_refresh_bytes": refresh_bytes, "history_bytes_per_s_avg": round(refresh_bytes / 60),
            "spike_kept": spike_kept, "fast_forward_s": round(time.perf_counter() - started, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="15 s per case; 12 h fast-forward at 10 Hz only")
    parser.add_argument("--out", default=str(HERE / "results" / "ui_traffic.json"))
    args = parser.parse_args()
    seconds = 15 if args.quick else 75
    cases = [traffic_case(hz, g, seconds) for hz in (10, 100) for g in (1, 8)]
    for c in cases:
        print(json.dumps(c))
    long = [long_run_points(10, 1), long_run_points(10, 8)]
    if not args.quick:
        long.append(long_run_points(100, 1, hours=12.0))
    for c in long:
        print(json.dumps(c))
    result = {"benchmark": "ui_traffic", "quick": args.quick, "seconds_per_case": seconds,
              "machine": {"python": platform.python_version(), "cpus": __import__("os").cpu_count()},
              "targets": {"doc_updates_per_s": 6, "bytes_per_s": 50_000, "points_per_series": 5000},
              "traffic": cases, "long_run": long}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
