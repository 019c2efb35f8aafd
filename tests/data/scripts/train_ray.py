"""A Ray Train job with no gpuprof code (tests/test_jobs.py): a TorchTrainer with two CPU
workers on a local Ray cluster this script starts, gloo, a tiny model, a few steps. Its run's
name is ``--name``."""

import argparse
import tempfile

import ray
import torch
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer, prepare_data_loader, prepare_model
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--name", default="ray-ft")
parser.add_argument("--steps", type=int, default=6)
args = parser.parse_args()


def train_loop(config: dict) -> None:
    import time

    torch.manual_seed(0)
    model = prepare_model(torch.nn.Linear(8, 1))
    g = torch.Generator().manual_seed(ray.train.get_context().get_world_rank())
    data = TensorDataset(torch.randn(config["steps"] * 4, 8, generator=g), torch.randn(config["steps"] * 4, 1, generator=g))
    loader = prepare_data_loader(DataLoader(data, batch_size=4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        time.sleep(0.02)  # stands for the GPU's work
        optimizer.step()


ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
trainer = TorchTrainer(train_loop, train_loop_config={"steps": args.steps},
                       scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
                       run_config=RunConfig(name=args.name, storage_path=tempfile.mkdtemp(prefix="ray-results-")))
trainer.fit()
ray.shutdown()
