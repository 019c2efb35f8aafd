"""Issue 11, done when: only ``%%gpuprofile`` added to a cell that calls a third-party trainer,
in a real kernel; the experiment has steps, throughput, data-wait share, the loader's settings
and the flattened config, and a comparison names what changed between two such runs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import gpuprof_jupyter as gp
from gpuprof_jupyter.core.analysis.compare import compare_experiments
from gpuprof_jupyter.render.comparison import comparison_text
from gpuprof_jupyter.export.pipeline import export_pipeline
from tests.kernel_helpers import execute, running_kernel, text_of

pytestmark = pytest.mark.kernel

THIRD_PARTY = '''\
"""A trainer library: builds its own DataLoader and optimizer, knows nothing of gpuprof."""
import time
from dataclasses import dataclass

import torch


@dataclass
class TrainConfig:
    batch_size: int = 16
    num_workers: int = 0
    lr: float = 1e-3


class Slow(torch.utils.data.Dataset):
    def __len__(self):
        return 128

    def __getitem__(self, i):
        time.sleep(0.0005)
        return torch.full((8,), float(i)), i % 2


class Trainer:
    def __init__(self, config):
        self.config = config
        self.model = torch.nn.Linear(8, 2)

    def fit(self):
        loader = torch.utils.data.DataLoader(Slow(), batch_size=self.config.batch_size,
                                             num_workers=self.config.num_workers)
        optimizer = torch.optim.AdamW(self.model.parameters(), lr=self.config.lr)
        for x, y in loader:
            loss = torch.nn.functional.cross_entropy(self.model(x), y)
            time.sleep(0.003)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        return loss.item()
'''


def test_third_party_trainer_profiled_by_the_magic_alone(tmp_path):
    (tmp_path / "trainer_lib.py").write_text(THIRD_PARTY)
    store = tmp_path / "store"
    path = os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p)  # this checkout stays first
    with running_kernel(tmp_path, {"GPUPROF_STORE": str(store), "PYTHONPATH": path}) as (km, kc):
        reply, _ = execute(kc, "%load_ext gpuprof_jupyter\nimport torch\nfrom trainer_lib import Trainer, TrainConfig")
        assert reply["status"] == "ok"
        for workers in (0, 2):
            reply, messages = execute(kc, f"%%gpuprofile --source sim -n workers{workers} --no-live --quiet "
                                          f"--capture train_config\n"
                                          f"train_config = TrainConfig(num_workers={workers})\n"
                                          "Trainer(train_config).fit()")
            assert reply["status"] == "ok", text_of(messages)
        reply, messages = execute(kc, "from torch.optim import optimizer as o\n"
                                      "print('hooks left:', len(o._global_optimizer_pre_hooks))")
        assert "hooks left: 0" in text_of(messages)
    runs = [gp.load(f"workers{w}", store=store) for w in (0, 2)]
    for exp, workers in zip(runs, (0, 2)):
        steps = exp.summary["steps"]
        assert steps["count"] == 8 and steps["batches"] == 8 and steps["samples"] == 128
        assert steps["samples_per_s"] > 0 and 0 <= steps["data_wait_frac"] < 1
        p = exp.meta.params
        assert (p["batch_size"], p["num_workers"], p["dataset"], p["dataset_len"]) == (16, workers, "Slow", 128)
        assert p["optimizer"] == "AdamW" and p["model.parameters"] == 18 and p["amp.autocast"] is False
        assert exp.meta.captured["train_config.num_workers"] == workers and exp.meta.captured["train_config.lr"] == 1e-3
        assert exp.meta.context["steps_from"] == "optimizer"
    assert runs[0].summary["steps"]["data_wait_frac"] > 0.1  # 8 samples of 0.5 ms each, loaded in the loop
    comparison = compare_experiments(runs)
    changed = comparison.changed_settings(1)
    assert changed["train_config.num_workers"] == (0, 2) and changed["num_workers"] == (0, 2)
    assert "train_config.num_workers: 0 -> 2" in comparison_text(comparison)
    assert runs[1].meta.context["torch_filled"] == ["prefetch_factor"]  # torch's 2, not the user's change:
    assert [w for w in comparison.warnings if w.kind == "several-settings"] == []  # one change, no warning
    result = export_pipeline(runs[1], tmp_path / "pipeline.yaml", baseline=runs[0], captured=["train_config"])
    text = (tmp_path / "pipeline.yaml").read_text()
    assert "train_config.num_workers: 2" in text and "num_workers: 2" in text, result.changes


def test_a_cell_that_spawns_children_gets_every_childs_steps(tmp_path):
    """Issue 20: torch.multiprocessing.spawn from a profiled cell; the children need no code."""
    store = tmp_path / "store"
    scripts = Path(__file__).resolve().parent / "data" / "scripts"
    path = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), str(scripts)) if p)
    with running_kernel(tmp_path, {"GPUPROF_STORE": str(store), "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}) as (km, kc):
        reply, _ = execute(kc, "%load_ext gpuprof_jupyter\nimport torch.multiprocessing as mp\nimport spawn_worker")
        assert reply["status"] == "ok"
        reply, messages = execute(kc, "%%gpuprofile --source sim -n spawned --no-live --quiet\n"
                                      "mp.spawn(spawn_worker.train, nprocs=2)")
        assert reply["status"] == "ok", text_of(messages)
    exp = gp.load("spawned", store=store)
    assert {rank: len(frame) for rank, frame in exp.rank_steps().items()} == {0: 3, 1: 4}
    assert {"loss_0", "loss_1"} <= set(exp.meta.user_metrics)
