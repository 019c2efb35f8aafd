"""gpuprof_jupyter: a Jupyter-native GPU profiler.

Runs in the kernel (or the profiled script).

    %load_ext gpuprof_jupyter
    %%gpuprofile -n baseline
    train()

Public API (imported lazily so ``import gpuprof_jupyter`` stays fast): ``profile``, ``step``, ``request``,
``track``, ``phase``, ``log``, ``experiments``, ``load``, ``last``, ``largest_batch``, ``session``.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "profile": "gpuprof_jupyter.runtime.profile",
    "step": "gpuprof_jupyter.runtime.reporting",
    "request": "gpuprof_jupyter.runtime.reporting",
    "track": "gpuprof_jupyter.runtime.reporting",
    "phase": "gpuprof_jupyter.runtime.reporting",
    "log": "gpuprof_jupyter.runtime.reporting",
    "experiments": "gpuprof_jupyter.api",
    "load": "gpuprof_jupyter.api",
    "last": "gpuprof_jupyter.api",
    "Store": "gpuprof_jupyter.core.store.directory",
    "gpu_available": "gpuprof_jupyter.runtime.link",
    "compare": "gpuprof_jupyter.notebook.compare_widget",
    "report": "gpuprof_jupyter.render.report",
    "export_pipeline": "gpuprof_jupyter.render.pipeline_yaml",
    "diagnose": "gpuprof_jupyter.api",
    "check": "gpuprof_jupyter.api",
    "largest_batch": "gpuprof_jupyter.api",
    "tune": "gpuprof_jupyter.notebook.tune_view",
    "last_tune": "gpuprof_jupyter.notebook.tune_view",
    "session": "gpuprof_jupyter.notebook.session_view",
}

__all__ = [*_EXPORTS, "load_ipython_extension", "unload_ipython_extension"]


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'gpuprof_jupyter' has no attribute {name!r}")


def load_ipython_extension(ipython) -> None:
    from gpuprof_jupyter.notebook.magic import load_ipython_extension as _load

    _load(ipython)


def unload_ipython_extension(ipython) -> None:
    from gpuprof_jupyter.notebook.magic import unload_ipython_extension as _unload

    _unload(ipython)
