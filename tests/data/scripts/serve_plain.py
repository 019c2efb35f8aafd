"""An unmodified serving benchmark for ``gpuprof run``: a model called under no_grad, N times."""

import argparse
import time

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--requests", type=int, default=40)
args = parser.parse_args()

model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)).eval()
with torch.no_grad():
    for _ in range(args.requests):
        model(torch.randn(3, 8))
        time.sleep(0.002)
print(f"served {args.requests} requests")
