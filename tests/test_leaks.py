"""1,000 profiled cells: no thread, file-descriptor or memory leak."""

from __future__ import annotations

import gc
import os
import threading

import psutil
import pytest
import torch

import gpuprof_jupyter as gp
from tests.fakes import wait_for


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _torch_hooks() -> tuple:
    """What the training hooks patch: torch's global optimizer hooks and the DataLoader methods."""
    from torch.optim import optimizer
    from torch.utils.data import DataLoader
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    return (len(optimizer._global_optimizer_pre_hooks), len(optimizer._global_optimizer_post_hooks),
            _BaseDataLoaderIter.__next__, DataLoader.__iter__, torch.amp.GradScaler.step,
            torch.amp.autocast_mode.autocast.__enter__, torch.compile)


@pytest.mark.process
def test_thousand_profiled_cells_leak_nothing(store_dir):
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.zeros(6, 2)), batch_size=2)
    before = _torch_hooks()

    def cell(i):
        with gp.profile(f"cell-{i % 3}", source="sim", store=store_dir, interval=0.01):
            for _ in gp.track(range(3)):
                gp.step(1)
            for _ in loader:  # the zero-code hooks too: an optimizer step per batch
                opt.step()

    for i in range(50):  # warm-up: imports, caches, pandas internals
        cell(i)
    gc.collect()
    threads, fds = threading.active_count(), _fds()
    rss = psutil.Process().memory_info().rss
    for i in range(1000):
        cell(i)
    gc.collect()
    wait_for(lambda: threading.active_count() <= threads, 10, "the last cell's threads to end")
    assert threading.active_count() == threads
    assert _fds() <= fds
    growth = psutil.Process().memory_info().rss - rss
    assert growth < 40 * 1024**2, f"RSS grew {growth / 1024**2:.1f} MiB over 1,000 cells"
    assert len(gp.experiments(store_dir)) == 1050
    assert _torch_hooks() == before  # no hook left behind
