"""Issue 10 part 4: integers stay integers and bools stay bools, also where a run lacks them."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import gpuprof_jupyter as gp
from gpuprof_jupyter.core.analysis.compare import compare_experiments
from gpuprof_jupyter.core.format import NOT_RECORDED
from tests.simexp import sim_experiment


def _runs(store_dir):
    with gp.profile(name="base", source="sim", store=store_dir, interval=0.02, params={"lr": 0.1}):
        gp.log(epochs=3)
    with gp.profile(name="b64", source="sim", store=store_dir, interval=0.02,
                    params={"batch_size": np.int64(64), "amp": True, "lr": 0.1}):
        pass
    return gp.load("base", store=store_dir), gp.load("b64", store=store_dir)


@pytest.mark.process
def test_experiments_frame_keeps_ints_and_bools_where_a_run_lacks_them(store_dir):
    _runs(store_dir)
    frame = gp.experiments(store_dir)
    assert str(frame["batch_size"].dtype) == "Int64" and frame["batch_size"].tolist()[1] == 64
    assert pd.isna(frame["batch_size"].iloc[0])
    assert str(frame["amp"].dtype) == "boolean" and frame["amp"].iloc[1] is np.True_
    assert str(frame["epochs"].dtype) == "Int64" and frame["epochs"].iloc[0] == 3
    assert frame["lr"].tolist() == [0.1, 0.1]
    assert "64.0" not in frame.to_string()


@pytest.mark.process
def test_comparison_and_pipeline_keep_ints(store_dir, tmp_path):
    base, b64 = _runs(store_dir)
    comparison = compare_experiments([base, b64])
    assert comparison.setting("batch_size").values == [NOT_RECORDED, 64]
    assert type(comparison.setting("batch_size").values[1]) is int
    assert comparison.setting("amp").values == [NOT_RECORDED, True]  # base never recorded amp
    epochs = comparison.metric("epochs")
    assert epochs.values == [3, None] and type(epochs.values[0]) is int
    path = tmp_path / "pipeline.yaml"
    gp.export_pipeline(b64, path, "train", candidates=[base, b64])
    text = path.read_text()
    assert "batch_size: 64" in text and "64.0" not in text and "amp: true" in text


def test_comparison_of_in_memory_runs_keeps_ints():
    a = sim_experiment("input-bound", name="a", params={"num_workers": 0}, user_metrics={"epochs": 2})
    b = sim_experiment("compute-bound", name="b", params={"num_workers": 4, "pin_memory": True})
    comparison = compare_experiments([a, b])
    assert comparison.setting("num_workers").values == [0, 4]
    assert comparison.setting("pin_memory").values == [NOT_RECORDED, True]
    assert comparison.metric("epochs").values == [2, None]
