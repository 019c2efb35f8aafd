"""Serving runs compared and exported: batch 1 against batch 8, latency and throughput with intervals."""

from __future__ import annotations

import json
import time

import pytest
import torch

import gpuprof_jupyter as gp
from gpuprof_jupyter.core.analysis.compare import compare_experiments
from gpuprof_jupyter.render.comparison import comparison_text


class Batched(torch.nn.Module):
    """A model whose forward takes 3 ms plus 1 ms per sample: bigger batches, more samples/s."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 2)

    def forward(self, x):
        time.sleep(0.003 + 0.001 * x.shape[0])
        return self.linear(x)


def _serve(store, name: str, batch: int, n: int = 60):
    model = Batched().eval()
    x = torch.randn(batch, 8)
    with gp.profile(name, source="sim", store=store, interval=0.05) as p:  # no timing code, no params
        with torch.no_grad():
            for _ in range(n):
                model(x)
    return p.experiment


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    store = tmp_path_factory.mktemp("serving") / "store"
    return store, _serve(store, "batch1", 1), _serve(store, "batch8", 8)


@pytest.mark.process
def test_batch_1_against_8_shows_latency_and_throughput_changes_with_intervals(runs):
    _, one, eight = runs
    c = compare_experiments([one, eight])
    p50, rate, samples = c.metric("latency_p50_s"), c.metric("requests_per_s"), c.metric("request_samples_per_s")
    assert p50.verdicts[1] == "worse" and p50.deltas[1] == pytest.approx(0.007, rel=0.3)
    low, high = p50.intervals[1]
    assert 0 < low <= p50.deltas[1] <= high
    assert rate.verdicts[1] == "worse" and rate.intervals[1][1] < 0
    assert samples.verdicts[1] == "better"
    text = comparison_text(c)
    assert "latency p50" in text and "95 % interval +" in text and "requests/s" in text


def test_a_change_whose_interval_holds_zero_is_the_same():
    from gpuprof_jupyter.core.analysis.latency import change_interval
    import numpy as np

    rng = np.random.default_rng(1)

    def requests(latencies):
        start = np.cumsum(latencies + 0.001)
        return {"t_start_s": start, "latency_s": latencies, "host_s": latencies, "batch": np.ones(len(latencies)),
                "tokens": np.full(len(latencies), np.nan), "ttft_s": np.full(len(latencies), np.nan)}

    a, b = requests(rng.uniform(0.01, 0.02, 200)), requests(rng.uniform(0.01, 0.02, 200))
    low, high = change_interval(a, b, "latency_p50_s")
    assert low < 0 < high
    assert change_interval(requests(np.full(3, 0.01)), b, "latency_p50_s") is None  # too few to say


@pytest.mark.process
def test_experiments_and_the_server_listing_have_the_serving_columns(runs):
    store, one, eight = runs
    frame = gp.experiments(store).set_index("name")
    for run in (one, eight):
        r = run.summary["requests"]
        row = frame.loc[run.name]
        assert row["latency_p50_ms"] == pytest.approx(r["latency_p50_s"] * 1000)
        assert row["latency_p90_ms"] == pytest.approx(r["latency_p90_s"] * 1000)
        assert row["latency_p99_ms"] == pytest.approx(r["latency_p99_s"] * 1000)
        assert row["requests_per_s"] == pytest.approx(r["requests_per_s"])
    from gpuprof_jupyter.core.store.directory import Store
    from gpuprof_jupyter.server.experiments import list_experiments

    payload = json.loads(list_experiments(Store(store))[1])
    assert {"latency_p50_ms", "latency_p90_ms", "latency_p99_ms", "requests_per_s"} <= set(payload["columns"])
    assert all(row["latency_p99_ms"] > 0 for row in payload["rows"])


@pytest.mark.process
def test_the_faster_batch_is_exported_with_its_serving_settings_and_evidence(runs, tmp_path):
    from gpuprof_jupyter.export.pipeline import export_pipeline

    store, one, eight = runs
    assert one.meta.params["serving.batch_size"] == 1 and eight.meta.params["serving.batch_size"] == 8
    assert eight.meta.params["serving.dtype"] == "float32" and eight.meta.params["serving.threads"] >= 1
    path = tmp_path / "pipeline.yaml"
    result = export_pipeline(eight, path, step="serve", baseline=one, store=store)
    text = path.read_text()
    line = next(line for line in text.splitlines() if "serving.batch_size: 8" in line)
    assert "1 -> 8; alone in batch8 against batch1" in line and "latency p50" in line and "requests/s" in line
    assert "95 % interval +" in line and "samples/s" in line
    assert "serving.model" not in text and "serving.parameters" not in text  # they describe, not choose
    assert any(key == "params.serving.batch_size" for key, *_ in result.changes)
