"""What a notebook cell hands to ``torch.multiprocessing.spawn`` in the live view's browser test
(tests/test_browser_lab.py): each rank trains for ``seconds`` with no gpuprof code, rank 1
slower per step than rank 0, so the live header has a step time per rank to show."""

import time

import torch


def train(index: int, seconds: float) -> None:
    torch.set_num_threads(1)
    torch.manual_seed(index)
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(16, 8), torch.randn(16, 1)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        time.sleep(0.03 + 0.06 * index)  # the step's work
        optimizer.step()
