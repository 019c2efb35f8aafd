"""A run's settings are what it used: the DataLoaders it iterated, named after their variable,
never a loader that only sits in the notebook's namespace."""

from __future__ import annotations

import pytest
import torch  # noqa: F401 - imported before the cells, as a notebook does: the hooks install
from IPython.core.interactiveshell import InteractiveShell

from gpuprof_jupyter.core.store.directory import Store
from gpuprof_jupyter.notebook import magic
from gpuprof_jupyter.export.pipeline import export_pipeline

LOADER_KEYS = ("batch_size", "num_workers", "pin_memory", "prefetch_factor", "persistent_workers", "dataset",
               "dataset_len")

SETUP = """
import time
import torch
from torch.utils.data import DataLoader, TensorDataset
import gpuprof_jupyter as gp
model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
def train(batches):
    for x, y in batches:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
"""


@pytest.fixture
def shell():
    shell = InteractiveShell.instance()
    magic.load_ipython_extension(shell)
    shell.run_cell(SETUP)
    yield shell
    magic.unload_ipython_extension(shell)


def _run(shell, store, name: str, body: str):
    result = shell.run_cell(f"%%gpuprofile --source sim --interval 0.05 --store {store} -n {name} --no-live --quiet\n"
                            + body)
    assert result.success, result.error_in_exec
    return Store(store).load(name)


def _loader_keys(params: dict) -> dict:
    return {k: v for k, v in params.items() if k.rpartition(".")[2] in LOADER_KEYS}


@pytest.mark.process
def test_three_cells_only_the_loader_iterated_is_credited(shell, tmp_path):
    """Cell A iterates a loader; cell B only sleeps; cell C tracks a generator. Only A used a loader."""
    store = tmp_path / "store"
    a = _run(shell, store, "cell-a", "loader = DataLoader(TensorDataset(torch.randn(64, 4), "
                                     "torch.randint(0, 2, (64,))), batch_size=16)\ntrain(loader)")
    b = _run(shell, store, "cell-b", "time.sleep(0.05)")
    c = _run(shell, store, "cell-c", "def gen():\n    for _ in range(4):\n        yield torch.randn(8, 4), "
                                     "torch.randint(0, 2, (8,))\ntrain(gp.track(gen()))")
    assert _loader_keys(a.meta.params) == {"batch_size": 16, "num_workers": 0, "pin_memory": False,
                                          "prefetch_factor": None, "persistent_workers": False,
                                          "dataset": "TensorDataset", "dataset_len": 64}
    assert _loader_keys(b.meta.params) == {}
    assert _loader_keys(c.meta.params) == {}
    assert "optimizer" in c.meta.params  # what the hooks saw in C is still recorded


@pytest.mark.process
def test_loaders_named_after_their_variables_and_unused_ones_left_out(shell, tmp_path):
    store = tmp_path / "store"
    shell.run_cell("data = TensorDataset(torch.randn(32, 4), torch.randint(0, 2, (32,)))\n"
                   "unused = DataLoader(data, batch_size=99)")
    run = _run(shell, store, "two", "train_loader = DataLoader(data, batch_size=8)\n"
                                    "val_loader = DataLoader(data, batch_size=4)\n"
                                    "train(train_loader)\ntrain(val_loader)\n"
                                    "train(DataLoader(data, batch_size=2))")
    keys = _loader_keys(run.meta.params)
    assert keys["train_loader.batch_size"] == 8 and keys["val_loader.batch_size"] == 4
    assert keys["loader1.batch_size"] == 2  # iterated, held by no variable
    assert not any(k.startswith("unused.") or v == 99 for k, v in keys.items())


@pytest.mark.process
def test_settings_are_those_the_run_iterated_with(shell, tmp_path):
    """A loader changed after the run iterated it: the run keeps the settings it used."""
    store = tmp_path / "store"
    run = _run(shell, store, "changed", "loader = DataLoader(TensorDataset(torch.randn(32, 4), "
                                        "torch.randint(0, 2, (32,))), batch_size=8)\ntrain(loader)\n"
                                        "loader.num_workers = 3")
    assert run.meta.params["num_workers"] == 0


@pytest.mark.process
def test_export_never_credits_a_run_that_iterated_no_loader(shell, tmp_path):
    """nb-start ran no loader (a loader sat in the namespace): the export's comment never says
    the batch size changed in nb-start."""
    store = tmp_path / "store"
    shell.run_cell("loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,))), "
                   "batch_size=8, num_workers=0)")
    start = _run(shell, store, "nb-start", "sum(range(10**6))")
    train = _run(shell, store, "nb-train", "train(loader)")
    assert _loader_keys(start.meta.params) == {}
    result = export_pipeline(train, tmp_path / "pipeline.yaml", store=Store(store))
    comments = {key: comment for key, _, _, comment in result.changes}
    assert "params.batch_size" in comments
    assert "nb-start" not in comments["params.batch_size"], comments["params.batch_size"]
    assert "in nb-train" in comments["params.batch_size"]
