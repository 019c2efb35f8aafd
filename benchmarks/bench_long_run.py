"""Long runs (issue 5, item 5): a fast-forwarded 12 h x 8 GPUs x 10 Hz run. Synthetic ticks
go straight into the Recorder and the store (Arrow IPC stream, then Parquet) with a fake
clock; then the end of a session: summary, static output, standalone report. Measured in a
fresh process: RSS growth (peak over the baseline after imports), store size on disk, time
to load the experiment back, output sizes against BokehJS's size + 1 MB, points per series.
"""

from __future__ import annotations

import json

from ._common import figure, run_json_subprocess, save

NAME = "long_run"
HOURS = {"tiny": 0.05, "quick": 2.0, "full": 12.0}

GPU_METRICS = ["sm_util", "gpu_busy", "mem_bw_util", "sm_occupancy", "tensor_util", "power_w", "energy_j",
               "gpu_mem_used_bytes", "gpu_mem_total_bytes", "gpu_temp_c", "sm_clock_mhz", "mem_clock_mhz",
               "throttle_reasons", "pcie_tx_bytes_s", "pcie_rx_bytes_s"]
HOST_METRICS = ["cpu_util", "host_cpu_util", "rss_bytes", "disk_read_bytes_s", "disk_write_bytes_s"]


def _rss() -> int:
    import psutil

    return psutil.Process().memory_info().rss


def _peak() -> int:
    """Peak RSS of this process image: /proc/self/status VmHWM. Not ``ru_maxrss``: Linux keeps
    that across execve (``signal->maxrss``), so a worker started by a parent that imported
    torch reports the parent's RSS, which its forked pre-exec image briefly shared. That was
    the "unexplained RSS effect of a torch-importing parent" (issue 9 part 6)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def worker(hours: float, n_gpus: int = 8, interval: float = 0.1) -> dict:
    import gc
    import tempfile
    import time
    from pathlib import Path

    import numpy as np

    from gpuprof_jupyter.core.metrics import METRICS
    from gpuprof_jupyter.sampler_process.recorder import Recorder
    from gpuprof_jupyter.core.protocol import Tick
    from gpuprof_jupyter.core.store.directory import Store
    from gpuprof_jupyter.core.store.experiment import ExperimentMeta
    from gpuprof_jupyter.core.store.samples_file import SampleStreamWriter, samples_schema, stream_to_parquet
    from gpuprof_jupyter.render.report import render_report
    from gpuprof_jupyter.render.static_plots import MAX_POINTS, static_output_bundles
    import bokeh.resources

    metrics = [m for m in METRICS if m in GPU_METRICS or m in HOST_METRICS]
    keys = [f"gpu{i}" for i in range(n_gpus)]
    tmp = tempfile.mkdtemp(prefix="gpuprof-longrun-")
    store = Store(tmp)
    meta = ExperimentMeta(id="", name="long-run", interval_s=interval, source="nvml", simulated=False,
                          devices=[{"key": k, "kind": "gpu", "index": i, "name": "NVIDIA H100 80GB HBM3"} for i, k in enumerate(keys)]
                          + [{"key": "host", "kind": "host", "name": "host"}],
                          provenance={**{k: {m: "nvml" for m in GPU_METRICS} for k in keys}, "host": {m: "psutil" for m in HOST_METRICS}},
                          units={m: METRICS[m].unit for m in metrics})
    directory = store.create(meta)
    import pandas, pyarrow.parquet  # noqa: F401  (imports are not growth)
    import gpuprof_jupyter.core.analysis.summary  # noqa: F401
    gc.collect()
    base = _rss()
    peaks = {}
    writer = SampleStreamWriter(directory, samples_schema(metrics))
    recorder = Recorder(0.0, metrics, writer)
    n_ticks = int(hours * 3600 / interval)
    flush_every = int(recorder.flush_every_s / interval)  # the writer thread's period, in fast-forwarded ticks
    rng = np.random.default_rng(0)
    wave = (60 + 30 * np.sin(np.arange(4096) / 50.0) + rng.normal(0, 5, 4096)).tolist()
    reading = {k: {m: 1.0 for m in GPU_METRICS} for k in keys}
    reading["host"] = {m: 1.0 for m in HOST_METRICS}
    t_feed = time.perf_counter()
    energy = 0.0
    for i in range(n_ticks):
        w = wave[i & 4095]
        energy += 0.1 * 400.0
        for k in keys:
            values = reading[k]
            values["sm_util"] = w
            values["power_w"] = 4 * w
            values["energy_j"] = energy
        recorder.on_tick(Tick(i * interval, 1.7e9 + i * interval, reading))
        if i % flush_every == flush_every - 1:  # what the recorder's writer thread does every 2 s
            recorder.flush()
        if i % 50_000 == 0:
            peaks["during_feed"] = max(peaks.get("during_feed", 0), _rss())
    feed_s = time.perf_counter() - t_feed
    recorder.flush()
    writer.close()
    peaks["after_feed"] = _rss()
    t = time.perf_counter()
    stream_to_parquet(directory, writer.schema)
    parquet_s = time.perf_counter() - t
    meta.status, meta.duration_s = "ok", n_ticks * interval
    store.save_meta(meta)
    size = sum(f.stat().st_size for f in Path(directory).iterdir())
    t = time.perf_counter()
    experiment = store.load_meta(meta)
    meta.summary = experiment.summary
    summary_s = time.perf_counter() - t
    store.save_meta(meta)
    peaks["after_summary"] = _peak()
    t = time.perf_counter()
    bundles = static_output_bundles(experiment)
    static_s = time.perf_counter() - t
    static_bytes = sum(len(v.encode() if isinstance(v, str) else v) for bundle in bundles for v in bundle.values())
    peaks["after_static"] = _peak()
    t = time.perf_counter()
    report_html = render_report([experiment])
    report_s = time.perf_counter() - t
    peaks["after_report"] = _peak()
    bokehjs = sum(len(js) for js in bokeh.resources.INLINE.js_raw)
    del experiment, bundles
    gc.collect()
    # loading it back, as a new kernel would: metadata + stored summary, then the samples
    t = time.perf_counter()
    again = Store(tmp).load("long-run")
    _ = again.summary
    load_meta_s = time.perf_counter() - t
    t = time.perf_counter()
    rows = len(again.samples)
    load_samples_s = time.perf_counter() - t
    peaks["after_load_samples"] = _peak()
    import shutil

    shutil.rmtree(tmp, ignore_errors=True)
    return {
        "hours": hours, "n_gpus": n_gpus, "ticks": n_ticks, "rows": rows, "feed_s": feed_s, "parquet_s": parquet_s,
        "summary_s": summary_s, "static_s": static_s, "report_s": report_s, "store_bytes": size,
        "rss_base": base, "rss_growth_until_summary": max(peaks["during_feed"], peaks["after_feed"], peaks["after_summary"]) - base,
        "rss_growth_with_views": peaks["after_report"] - base, "rss_growth_with_samples_loaded": peaks["after_load_samples"] - base,
        "peaks": peaks, "static_bytes": static_bytes, "report_bytes": len(report_html.encode()), "bokehjs_bytes": bokehjs,
        "static_max_points_per_series": MAX_POINTS, "load_meta_s": load_meta_s, "load_samples_s": load_samples_s,
    }


def run(mode: str = "quick") -> dict:
    r = run_json_subprocess(f"import json; from benchmarks.bench_long_run import worker; print(json.dumps(worker({HOURS[mode]})))",
                            timeout=1200)
    MB = 1e6
    limit_out = (r["bokehjs_bytes"] + 1_048_576) / MB
    h = f"{r['hours']:g} h x {r['n_gpus']} GPUs x 10 Hz"
    figures = [
        figure("rss_growth_mb", f"kernel RSS growth: recording + stop (Parquet, summary), {h}", round(r["rss_growth_until_summary"] / MB, 1), "MB",
               "<= 100 MB", 100.0, gated=True, note=f"{r['rows']:,} rows; feed {r['feed_s']:.0f} s, Parquet {r['parquet_s']:.1f} s, summary {r['summary_s']:.1f} s"),
        figure("rss_growth_views_mb", "RSS growth including static output + report rendering", round(r["rss_growth_with_views"] / MB, 1), "MB",
               note=f"static {r['static_s']:.1f} s, report {r['report_s']:.1f} s"),
        figure("store_mb", f"store size on disk, {h}", round(r["store_bytes"] / MB, 1), "MB", note="Parquet, zstd"),
        figure("load_back_s", "loading it back: Store.load + summary (stored with the metadata)", round(r["load_meta_s"], 3), "s", "<= 2 s", 2.0, gated=True),
        figure("load_samples_s", "loading every sample into a DataFrame", round(r["load_samples_s"], 2), "s",
               note=f"RSS growth with all samples in memory: {r['rss_growth_with_samples_loaded'] / MB:.0f} MB (user asked for them)"),
        figure("static_output_mb", "static output bundle (HTML + PNG) size", round(r["static_bytes"] / MB, 2), "MB",
               f"<= BokehJS + 1 MB = {limit_out:.2f} MB", limit_out, gated=True),
        figure("report_mb", "standalone report (BokehJS inline) size", round(r["report_bytes"] / MB, 2), "MB",
               f"<= BokehJS + 1 MB = {limit_out:.2f} MB", limit_out, gated=True, note=f"BokehJS inline: {r['bokehjs_bytes'] / MB:.2f} MB"),
        figure("static_points_per_series", "points per series in the static output / report", r["static_max_points_per_series"], "points",
               "<= 5,000", 5000, gated=True, note="min/max decimation cap (render.static_plots.MAX_POINTS); live dashboard: see UI traffic"),
    ]
    data = {"figures": figures, "raw": r}
    save(NAME, data, mode)
    return data


if __name__ == "__main__":
    import sys

    print(json.dumps(run(sys.argv[1] if len(sys.argv) > 1 else "quick")["figures"], indent=1))
