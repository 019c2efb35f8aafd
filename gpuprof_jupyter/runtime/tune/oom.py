"""A trial that ran out of GPU memory: recognised, its memory released, the search goes on below.

Runs in any process that holds a run: the kernel, or a script under ``gpuprof run``.

``torch.OutOfMemoryError`` in a trial is not the cell's bug but an answer: that setting does
not fit. The trial's experiment is saved with the verdict ``DOES_NOT_FIT``
(``context["tune"]["verdict"]``), the user's state is restored as after any trial
(``state.Snapshot``), and what the failed trial still holds is dropped: the traceback's frames
(the cell's batches and activations), then a garbage collection and, where the user's code
initialised CUDA, ``torch.cuda.empty_cache()`` so the next trial starts with the memory free
(docs/tune.md, "Out of memory").
"""

from __future__ import annotations

import gc
import traceback

from gpuprof_jupyter.runtime.hooks.memory_hooks import initialised_cuda
from gpuprof_jupyter.runtime.hooks.oom_record import is_out_of_memory

DOES_NOT_FIT = "does not fit (out of memory)"


def release_memory(exc: BaseException) -> None:
    """Drop the references the failed trial still holds, then free torch's cached blocks."""
    seen = set()
    while exc is not None and id(exc) not in seen:  # the error, and those it was raised from
        seen.add(id(exc))
        if exc.__traceback__ is not None:
            traceback.clear_frames(exc.__traceback__)
            exc.__traceback__ = None
        exc = exc.__cause__ or exc.__context__
    gc.collect()
    cuda = initialised_cuda()
    if cuda is not None:
        cuda.empty_cache()


__all__ = ["DOES_NOT_FIT", "is_out_of_memory", "release_memory"]
