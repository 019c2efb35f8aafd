"""A plain training script with no gpuprof code (tests/test_scripts.py): SGD, a DataLoader
(``--workers`` worker processes),
``--steps`` steps that each stand for ~0.15 s of GPU work, the weights' bytes to ``--out``."""

import argparse
import time

import torch
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=6)
parser.add_argument("--work", type=float, default=0.15)
parser.add_argument("--workers", type=int, default=0)
parser.add_argument("--out")
args = parser.parse_args()

torch.manual_seed(0)
data = TensorDataset(torch.randn(args.steps * 4, 8), torch.randn(args.steps * 4, 1))
model = torch.nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
done = 0
for x, y in DataLoader(data, batch_size=4, num_workers=args.workers):
    loss = torch.nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    time.sleep(args.work)  # stands for the GPU's work
    optimizer.step()
    done += 1
print(f"trained {done} steps")
if args.out:
    with open(args.out, "wb") as f:
        f.write(model.weight.detach().numpy().tobytes())
