"""A script that starts two ranks with ``torch.multiprocessing.spawn`` and sets no ``RANK``
(tests/test_scripts.py): the children's ranks are spawn's process indices."""

import os
import sys

import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spawn_worker  # noqa: E402

if __name__ == "__main__":
    mp.spawn(spawn_worker.train, nprocs=2)
