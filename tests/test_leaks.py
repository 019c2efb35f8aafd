"""1,000 profiled cells: no thread, file-descriptor or memory leak."""

from __future__ import annotations

import gc
import os
import threading

import psutil

import gpuprof_jupyter as gp


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_thousand_profiled_cells_leak_nothing(store_dir):
    def cell(i):
        with gp.profile(f"cell-{i % 3}", source="sim", store=store_dir, interval=0.01):
            for _ in gp.track(range(3)):
                gp.step(1)

    for i in range(50):  # warm-up: imports, caches, pandas internals
        cell(i)
    gc.collect()
    threads, fds = threading.active_count(), _fds()
    rss = psutil.Process().memory_info().rss
    for i in range(1000):
        cell(i)
    gc.collect()
    assert threading.active_count() == threads
    assert _fds() <= fds
    growth = psutil.Process().memory_info().rss - rss
    assert growth < 40 * 1024**2, f"RSS grew {growth / 1024**2:.1f} MiB over 1,000 cells"
    assert len(gp.experiments(store_dir)) == 1050
