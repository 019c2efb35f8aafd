"""Serving, done when: ``%%gpuprofile`` on a cell that benchmarks a model's inference, in a real
kernel, with no timing code: p50/p90/p99 and throughput in the cell's output, two variants
(fp32, bf16) compared, a p99 gate, and the winner exported."""

from __future__ import annotations

import os

import pytest

import gpuprof_jupyter as gp
from gpuprof_jupyter.core.analysis.compare import compare_experiments
from gpuprof_jupyter.export.pipeline import export_pipeline
from tests.kernel_helpers import execute, running_kernel, text_of

pytestmark = pytest.mark.kernel

SETUP = '''\
%load_ext gpuprof_jupyter
import torch
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8)).eval()
inputs = [torch.randn(4, 64) for _ in range(80)]
'''

CELL = '''\
%%gpuprofile --source sim -n {name} --no-live --check "latency_p99 < 50 ms" --check "requests_per_s > 10"
model = model.to(torch.{dtype})
with torch.inference_mode():
    for x in inputs:
        model(x.to(torch.{dtype}))
'''


def test_an_inference_cell_is_understood_compared_gated_and_exported(tmp_path):
    store = tmp_path / "store"
    with running_kernel(tmp_path, {"GPUPROF_STORE": str(store), "OMP_NUM_THREADS": "1",
                                   "PYTHONPATH": os.environ.get("PYTHONPATH", "")}) as (km, kc):
        reply, messages = execute(kc, SETUP)
        assert reply["status"] == "ok", text_of(messages)
        outputs = {}
        for name, dtype in (("fp32", "float32"), ("bf16", "bfloat16")):
            reply, messages = execute(kc, CELL.format(name=name, dtype=dtype))
            assert reply["status"] == "ok", text_of(messages)
            outputs[name] = text_of(messages)
    for text in outputs.values():
        assert "latency p50 / p90 / p95 / p99 / max" in text and "requests/s" in text and "(host wall time)" in text
        assert "requests: 80 (80 module)" in text
    fp32, bf16 = (gp.load(name, store=store) for name in ("fp32", "bf16"))
    assert fp32.meta.params["serving.dtype"] == "float32" and bf16.meta.params["serving.dtype"] == "bfloat16"
    assert {c["rule"] for c in bf16.meta.checks} == {"latency_p99 < 50 ms", "requests_per_s > 10"}
    row = compare_experiments([fp32, bf16]).metric("latency_p50_s")
    assert row.intervals[1] is not None and row.verdicts[1] in ("better", "worse", "same")
    export_pipeline(bf16, tmp_path / "pipeline.yaml", step="serve", baseline=fp32, store=store, force=True)
    line = next(line for line in (tmp_path / "pipeline.yaml").read_text().splitlines() if "serving.dtype" in line)
    assert "serving.dtype: bfloat16 # float32 -> bfloat16; alone in bf16 against fp32" in line and "latency p50" in line
    frame = gp.experiments(store)
    assert frame["latency_p99_ms"].notna().all() and (frame["requests_per_s"] > 0).all()
