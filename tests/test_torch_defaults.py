"""torch's defaults in one table (core/torch_defaults.py), checked against torch itself.

The settings a run records, the comparison, the pipeline.yaml export and --tune read this table;
if torch changes a default or starts refusing a knob without workers, these tests say so.
"""

from __future__ import annotations

import inspect
import json
import subprocess
import sys

import pytest

from gpuprof_jupyter.core import torch_defaults as td
from gpuprof_jupyter.core.store.experiment import ExperimentMeta

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader  # noqa: E402


def _loader(**kwargs):
    return DataLoader(list(range(8)), **kwargs)


def test_the_table_holds_the_dataloaders_own_defaults():
    signature = inspect.signature(DataLoader.__init__).parameters
    for field in td.LOADER_FIELDS:
        assert signature[field].default in td.TORCH_DEFAULTS[field], field
        assert td.is_torch_default(field, signature[field].default)
        assert td.is_torch_default(f"loader2.{field}", signature[field].default)
    assert _loader(num_workers=1).prefetch_factor == td.TORCH_PREFETCH_DEFAULT  # what torch fills in
    assert _loader().prefetch_factor is None
    assert not td.is_torch_default("num_workers", False)  # 0 is a default, False is not


@pytest.mark.process
def test_the_table_holds_torchs_global_flags_in_a_fresh_process():
    code = ("import json, torch; b = torch.backends; print(json.dumps({'cudnn.benchmark': b.cudnn.benchmark, "
            "'tf32.cudnn': b.cudnn.allow_tf32, 'tf32.matmul': b.cuda.matmul.allow_tf32, "
            "'float32_matmul_precision': torch.get_float32_matmul_precision()}))")
    flags = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                      timeout=120).stdout)
    for key, value in flags.items():
        assert td.is_torch_default(key, value), (key, value)


@pytest.mark.parametrize("knob, value", [("prefetch_factor", 2), ("persistent_workers", True), ("pin_memory", True)])
def test_needs_workers_names_exactly_the_knobs_torch_refuses_without_workers(knob, value):
    assert knob in td.LOADER_KNOBS
    if knob in td.NEEDS_WORKERS:
        with pytest.raises(ValueError):
            _loader(num_workers=0, **{knob: value})
    else:
        _loader(num_workers=0, **{knob: value})
    _loader(num_workers=1, **{knob: value})  # with workers torch takes every knob


def test_torch_filled_names_the_prefetch_torch_chose_per_loader():
    settings = {"a.num_workers": 2, "a.prefetch_factor": 2, "b.num_workers": 0, "b.prefetch_factor": None,
                "c.num_workers": 2, "c.prefetch_factor": 4}
    assert td.torch_filled(settings) == ["a.prefetch_factor"]
    assert td.torch_filled({"num_workers": 1, "prefetch_factor": 2}) == ["prefetch_factor"]


def test_one_merge_the_users_param_wins_and_is_never_called_torchs():
    meta = ExperimentMeta(id="x", name="x", params={"prefetch_factor": 2, "lr": 0.1})
    td.merge_recorded(meta, {"num_workers": 4, "prefetch_factor": 2, "batch_size": 32}, ["prefetch_factor"])
    assert meta.params == {"num_workers": 4, "prefetch_factor": 2, "batch_size": 32, "lr": 0.1}
    assert "torch_filled" not in meta.context  # the user passed --param prefetch_factor=2

    meta = ExperimentMeta(id="y", name="y", params={"lr": 0.1})
    td.merge_recorded(meta, {"num_workers": 4, "prefetch_factor": 2}, ["prefetch_factor"])
    assert meta.context["torch_filled"] == ["prefetch_factor"]
    assert meta.params["lr"] == 0.1 and meta.params["prefetch_factor"] == 2
