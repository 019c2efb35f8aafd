"""A script that forks while it trains (tests/test_child_forks.py): 50 steps; forks that step
and exit (``os.fork``, a ``multiprocessing`` fork Process); a DataLoader whose fork workers
must stay silent; 50 more steps. ``--profile STORE``: all of it inside ``gp.profile`` (what a
profiled cell does), else as a plain script (under ``gpuprof run``)."""

import argparse
import multiprocessing
import os
import sys

import torch
from torch.utils.data import DataLoader, TensorDataset

import gpuprof_jupyter as gp


def steps(n: int) -> None:
    for _ in range(n):
        gp.step()


def train(forks: int) -> None:
    steps(50)
    for _ in range(forks):
        pid = os.fork()
        if pid == 0:
            steps(7)
            sys.exit(0)  # through the interpreter's exit (and the profiled block's), as a script would
        os.waitpid(pid, 0)
    process = multiprocessing.get_context("fork").Process(target=steps, args=(5,))
    process.start()
    process.join()
    loader = DataLoader(TensorDataset(torch.zeros(16, 2)), batch_size=4, num_workers=2,
                        multiprocessing_context="fork")
    for _ in loader:
        pass
    steps(50)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--forks", type=int, default=1)
    parser.add_argument("--profile", metavar="STORE")
    args = parser.parse_args()
    if args.profile:
        with gp.profile("forks-in-a-cell", source="sim", store=args.profile, interval=0.05):
            train(args.forks)
    else:
        train(args.forks)
