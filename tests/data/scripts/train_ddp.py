"""A plain DDP script on gloo (CPU) with no gpuprof code (tests/test_scripts.py), run by
``torchrun --nproc_per_node 2``. ``--slow-rank R``: rank R's data loading is slow (planted
straggler), from its step ``--slow-from`` on (default 0); ``--slurm``: started by srun (tests/test_jobs.py);
``--crash-rank R``: rank R raises at its third step; ``--hang-rank R --hang-step S``: rank R blocks for ever
(a sleep) before its step S (0-based), the others in their next collective. Each rank writes its weights'
bytes to ``OUT.rankN``."""

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=6)
parser.add_argument("--slow-rank", type=int, default=-1)
parser.add_argument("--slow-from", type=int, default=0)
parser.add_argument("--crash-rank", type=int, default=-1)
parser.add_argument("--hang-rank", type=int, default=-1)
parser.add_argument("--hang-step", type=int, default=19)
parser.add_argument("--out")
parser.add_argument("--step-sleep", type=float, default=0.02, help="stands for the GPU's work in each step")
parser.add_argument("--slurm", action="store_true", help="ranks from srun's SLURM_PROCID/SLURM_NTASKS")
args = parser.parse_args()


class Shard(Dataset):
    def __init__(self, rank: int, n: int, delay: float, slow_from: int = 0) -> None:
        g = torch.Generator().manual_seed(rank)
        self.x, self.y, self.delay = torch.randn(n, 8, generator=g), torch.randn(n, 1, generator=g), delay
        self.slow_from = slow_from * 4  # the first slow sample (batches of 4)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i):
        if self.delay and i >= self.slow_from:
            time.sleep(self.delay)
        return self.x[i], self.y[i]


if args.slurm:  # as a script run by srun does: its rank passed on, no RANK in its environment
    dist.init_process_group("gloo", rank=int(os.environ["SLURM_PROCID"]), world_size=int(os.environ["SLURM_NTASKS"]))
else:
    dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DistributedDataParallel(torch.nn.Linear(8, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(Shard(rank, args.steps * 4, 0.05 if rank == args.slow_rank else 0.0, args.slow_from), batch_size=4)
for step, (x, y) in enumerate(loader):
    if rank == args.crash_rank and step == 2:
        raise RuntimeError(f"planted crash on rank {rank}")
    if rank == args.hang_rank and step == args.hang_step:
        time.sleep(3600)  # planted hang
    loss = torch.nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    time.sleep(args.step_sleep)  # stands for the GPU's work
    optimizer.step()
if args.out:
    with open(f"{args.out}.rank{rank}", "wb") as f:
        f.write(model.module.weight.detach().numpy().tobytes())
dist.destroy_process_group()
