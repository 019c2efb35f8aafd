"""gpuprof_jupyter: a Jupyter-native GPU profiler.

Runs in the kernel (or the profiled script).

    %load_ext gpuprof_jupyter
    %%gpuprofile -n baseline
    train()

The public API is ``PUBLIC_API`` below, read top to bottom: each name, the module it lives in,
and what it does in one line. Every name is ``gpuprof_jupyter.NAME``, imported when first used,
so ``import gpuprof_jupyter`` stays fast (the magic loads with ``%load_ext``).
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

# name -> (the module that defines it, what it does in one line)
PUBLIC_API: dict[str, tuple[str, str]] = {
    # -- profile a run (in a notebook, or a script under ``gpuprof run``) --
    "profile": ("gpuprof_jupyter.runtime.profile",
                "Profile a block or a function as one experiment: ``with profile('name'):``."),
    "step": ("gpuprof_jupyter.runtime.reporting", "Mark the end of one training step (``n_samples``: its batch size)."),
    "track": ("gpuprof_jupyter.runtime.reporting",
              "``for batch in track(loader):`` records how long each batch was waited for."),
    "request": ("gpuprof_jupyter.runtime.reporting", "``with request(batch_size=8):`` marks one serving request."),
    "phase": ("gpuprof_jupyter.runtime.reporting", "``with phase('data-loading'):`` marks a labelled span."),
    "log": ("gpuprof_jupyter.runtime.reporting", "Attach results (``accuracy=0.923``) to the running experiment."),
    "gpu_available": ("gpuprof_jupyter.runtime.link", "True when NVML sees at least one visible GPU."),
    "tune": ("gpuprof_jupyter.notebook.tune_view", "Measured trials of a training function: ``tune(train, loader)``."),
    "last_tune": ("gpuprof_jupyter.notebook.tune_view", "The report of the last ``--tune`` run in this process."),
    # -- read runs back --
    "experiments": ("gpuprof_jupyter.api", "A DataFrame, one row per experiment in the store, oldest first."),
    "load": ("gpuprof_jupyter.api", "The latest experiment with this name (or the one with this id)."),
    "last": ("gpuprof_jupyter.api", "The store's most recent experiment."),
    "session": ("gpuprof_jupyter.notebook.session_view",
                "This kernel's session: one row per cell and idle stretch (GPU busy, energy, memory held)."),
    "Store": ("gpuprof_jupyter.core.store.directory", "The experiment store on disk (default ``.gpuprof/``)."),
    # -- judge and compare them --
    "diagnose": ("gpuprof_jupyter.api", "Findings for a saved experiment, most severe first."),
    "check": ("gpuprof_jupyter.api", "Evaluate rules (``'sm_util > 60 for >=80%'``) on a saved experiment."),
    "largest_batch": ("gpuprof_jupyter.api", "The largest batch that fits the device's memory, from measured runs."),
    "compare": ("gpuprof_jupyter.notebook.compare_widget", "Compare experiments side by side (the last two by default)."),
    "watch": ("gpuprof_jupyter.notebook.watch", "Every rank's steps of a running multi-node job, live, until it ends."),
    # -- write files --
    "report": ("gpuprof_jupyter.export.report", "Write a standalone HTML report of experiments; return its path."),
    "export_pipeline": ("gpuprof_jupyter.export.pipeline", "Write a run's settings into a step of ``pipeline.yaml``."),
}

__all__ = [*PUBLIC_API, "load_ipython_extension", "unload_ipython_extension"]


def __getattr__(name: str):
    if name in PUBLIC_API:
        value = getattr(importlib.import_module(PUBLIC_API[name][0]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'gpuprof_jupyter' has no attribute {name!r}")


def load_ipython_extension(ipython) -> None:
    """``%load_ext gpuprof_jupyter``: the ``%%gpuprofile`` and ``%gpuprofile`` magics."""
    from gpuprof_jupyter.notebook.magic import load_ipython_extension as _load

    _load(ipython)


def unload_ipython_extension(ipython) -> None:
    """``%unload_ext gpuprof_jupyter``: the profiled cells' hook removed."""
    from gpuprof_jupyter.notebook.magic import unload_ipython_extension as _unload

    _unload(ipython)
