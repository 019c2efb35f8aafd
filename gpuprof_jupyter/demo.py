"""The quickstart's training workload: a real small model, a modelled GPU, a real input pipeline.

Runs in the process that trains (the kernel, or the quickstart script) and its DataLoader workers.

Why modelled: without a GPU, the simulated GPU's load follows the loop's measured timing (the
share of time spent inside steps rather than waiting for data, ``runtime.activity``). If the
demo's "GPU step" were CPU work, it would compete with the DataLoader workers for the same
cores, and the story (input-bound baseline, workers fix it) would hold on 32 cores and fail on 2.
So here, as with a real GPU:

* a **GPU step** is a modelled duration the training thread waits out without using a CPU, as a
  synchronising CUDA step does (the small model still trains for real, in a few milliseconds);
* **loading** a batch is a storage read (a wait, as on network storage) plus real CPU decoding,
  in the training process or in DataLoader workers. The decoding's CPU cost is calibrated when
  the demo starts (:func:`calibrate`), so a batch costs the same share of a step on 2 slow cores
  as on 32 fast ones.

The figures below define the *simulated* GPU and storage; nothing here is tuned to one machine,
and ``sm_util`` is never set: it comes from the measured timing of steps and data waits.
"""

from __future__ import annotations

import statistics
import time
from contextlib import contextmanager

import torch
from gpuprof_jupyter.core.format import fmt_time, fmt_unit

GPU_LAUNCH_S = 0.006  # per training step: kernel launches, optimizer
GPU_PER_SAMPLE_S = 0.0012  # forward + backward of one sample in fp32
AMP_TIME_FACTOR = 0.9  # mixed precision shortens the GPU step
READ_LATENCY_S = 0.022  # one storage request per batch
READ_PER_SAMPLE_S = 0.0001
DECODE_PER_SAMPLE_S = 0.00025  # CPU decoding + augmentation of one sample, calibrated to this
IMAGE = (3, 16, 16)
CLASSES = 10


def gpu_step_s(batch_size: int, amp: bool) -> float:
    """Modelled GPU time of one training step."""
    return GPU_LAUNCH_S + batch_size * GPU_PER_SAMPLE_S * (AMP_TIME_FACTOR if amp else 1.0)


def _augment(x: torch.Tensor, passes: int) -> torch.Tensor:
    """The decoding and augmentation work: real CPU, ``passes`` times a small smoothing."""
    for _ in range(passes):
        x = x + 0.01 * torch.nn.functional.avg_pool2d(x, 3, 1, 1)
    return x


def calibrate(target_s: float = DECODE_PER_SAMPLE_S, trials: int = 7) -> int:
    """Augmentation passes that make decoding one sample take ``target_s`` on this machine now.

    Measured in wall time, in this process, under whatever load the machine has, so the demo's
    ratios of loading time to GPU time hold on any machine (notebooks/quickstart.ipynb).
    """
    def cost(passes: int) -> float:
        images = SlowImages(trials, passes)
        images._decode(0)  # warm up
        times = []
        for i in range(trials):
            t0 = time.perf_counter()
            images._decode(i)
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    probe = 50
    base = cost(0)  # generating the image, the work that is not augmentation
    per_pass = max((cost(probe) - base) / probe, 1e-7)
    return max(1, round((target_s - base) / per_pass))


_PATTERNS = torch.nn.functional.interpolate(
    torch.rand(CLASSES, *IMAGE[:1], 4, 4, generator=torch.Generator().manual_seed(1)), size=IMAGE[1:])


class SlowImages(torch.utils.data.Dataset):
    """Images of ten learnable classes behind slow storage and CPU-heavy decoding.

    ``__getitems__`` serves a whole batch per storage request, as a sharded dataset does; the
    DataLoader calls it in the training process (``num_workers=0``) or in its workers.
    """

    def __init__(self, size: int, passes: int) -> None:
        self.size = size
        self.passes = passes

    def __len__(self) -> int:
        return self.size

    def _decode(self, i: int) -> tuple[torch.Tensor, int]:
        g = torch.Generator().manual_seed(i)
        x = _PATTERNS[i % CLASSES] + 0.5 * torch.rand(IMAGE, generator=g)
        return _augment(x, self.passes), i % CLASSES

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return self.__getitems__([i])[0]  # one sample: a storage request of its own

    def __getitems__(self, indices: list[int]) -> list[tuple[torch.Tensor, int]]:
        time.sleep(READ_LATENCY_S + READ_PER_SAMPLE_S * len(indices))  # waits, uses no CPU
        return [self._decode(i) for i in indices]


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(IMAGE[0], 16, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(4),
        torch.nn.Flatten(), torch.nn.Linear(256, CLASSES))


@contextmanager
def gpu_step(batch_size: int, amp: bool = False):
    """``with gpu_step(len(y), amp):`` the body runs, then the step's modelled GPU time is waited
    out without using a CPU, as a synchronising CUDA step would be."""
    started = time.perf_counter()
    yield
    remaining = started + gpu_step_s(batch_size, amp) - time.perf_counter()
    if remaining > 0:
        time.sleep(remaining)


def describe(passes: int) -> str:
    """One line for the notebook: what was calibrated and what is modelled."""
    return (f"calibrated: decoding one sample = {passes} augmentation passes (~{fmt_time(DECODE_PER_SAMPLE_S)} "
            f"of CPU here); modelled: storage read {fmt_unit(READ_LATENCY_S * 1e3, 'ms', 0)} a batch, GPU step "
            f"{fmt_unit(gpu_step_s(32, False) * 1e3, 'ms', 1)} at batch 32 in fp32, {fmt_unit(gpu_step_s(64, True) * 1e3, 'ms', 1)} at batch 64 "
            "with AMP")
