"""What a notebook cell hands to ``torch.multiprocessing.spawn`` (tests/test_scripts.py): child
0 trains on a DataLoader with no gpuprof code; child 1 reports with ``track()``, ``step()``,
``phase()`` and ``log()``. Child i takes i + 3 steps."""

import torch
from torch.utils.data import DataLoader, TensorDataset


def train(index: int) -> None:
    import gpuprof_jupyter as gp

    steps = index + 3
    torch.manual_seed(index)
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = TensorDataset(torch.randn(steps * 2, 8), torch.randn(steps * 2, 1))
    batches = DataLoader(data, batch_size=2)
    with gp.phase(f"train-{index}"):
        for x, y in (gp.track(list(batches)) if index == 1 else batches):
            loss = torch.nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if index == 1:
                gp.step(len(x))
    gp.log(**{f"loss_{index}": float(loss)})
