"""For tests only: the ways a test reaches into the profiler's production code, in one place.

Runs in any process (core).

Nothing here is set outside the tests and benchmarks, so a user's run never meets it:

* ``GPUPROF_TEST_<NAME>_S`` shortens one timeout of the kernel's exchange with its sampler
  process (``test_seconds``, through ``core/protocol.timeout_s``: BEGIN, END, CANCEL,
  OPEN_DEADLINE, PROBE_DEADLINE).
* ``GPUPROF_TEST_SWITCH_S``: the sampler process's GIL switch interval (``switch_interval_s``).
* ``GPUPROF_FAKE_NVML`` = JSON ``{"module": path, "spec": {...}}``: the sampler process installs
  that fake below nvidia-ml-py's public functions before anything reads NVML
  (``install_fake_nvml_if_asked``; tests/fake_nvml.py). It is the process's own, never handed
  on as a kernel setting (``core/protocol.is_kernel_setting``).
* ``GPUPROF_FAULT_STEP`` (``FAULT_STEP_ENV``): one named step of the sampler process fails
  once. The kernel's session sends it in ``Begin.fail_step`` (``fault_step_asked``); each run
  of the sampler process routes its steps through ``core/guarded.replace_call``, naming them
  and failing that one (``trace_steps``); its ``Ping`` answer says which steps the latest run
  went through and which one failed (``traced_steps``).
"""

from __future__ import annotations

import os
import sys

from gpuprof_jupyter.core import guarded

FAKE_NVML_ENV = "GPUPROF_FAKE_NVML"
FAULT_STEP_ENV = "GPUPROF_FAULT_STEP"
_SECONDS_ENV = "GPUPROF_TEST_{}_S"


def test_seconds(name: str, default: float) -> float:
    """``default`` unless a test set ``GPUPROF_TEST_<NAME>_S`` to a number of seconds."""
    raw = os.environ.get(_SECONDS_ENV.format(name))
    try:
        return float(raw) if raw else default
    except ValueError:
        return default


def switch_interval_s(default: float) -> float:
    """The sampler process's GIL switch interval: ``default`` unless ``GPUPROF_TEST_SWITCH_S``."""
    return test_seconds("SWITCH", default)


def install_fake_nvml_if_asked() -> None:
    """In the sampler process, before anything reads NVML: install the fake ``GPUPROF_FAKE_NVML``
    names, if a test or benchmark set it."""
    raw = os.environ.get(FAKE_NVML_ENV)
    if not raw:
        return
    import importlib.util
    import json

    config = json.loads(raw)
    spec = importlib.util.spec_from_file_location("gpuprof_fake_nvml", config["module"])
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpuprof_fake_nvml"] = module
    spec.loader.exec_module(module)
    module.install_from_spec(config.get("spec", {}))


def fault_step_asked() -> str | None:
    """In the kernel: the step of the sampler process a test asked to fail (``GPUPROF_FAULT_STEP``)."""
    return os.environ.get(FAULT_STEP_ENV)


_traced = {"last_steps_run": [], "last_faults_raised": []}  # the latest run's, for ``traced_steps``


def trace_steps(fail_step: str | None) -> None:
    """In the sampler process, as a run begins: every named step of it is noted, and the one
    called ``fail_step`` raises once (a retry, saving the metadata again, may then work), the
    way the kernel's fault-injection test replaces ``guarded.call``."""
    visited: list[str] = []
    raised: list[str] = []
    _traced.update(last_steps_run=visited, last_faults_raised=raised)

    def call(step_name, fn):
        visited.append(step_name)
        if step_name == fail_step and not raised:
            raised.append(step_name)
            raise RuntimeError(f"injected into {step_name}")
        return fn()

    guarded.replace_call(call)


def traced_steps() -> dict:
    """For the sampler process's ``Ping``: the named steps the latest run went through (each
    once, in order) and the one a test made fail."""
    return {"last_steps_run": list(dict.fromkeys(_traced["last_steps_run"])),
            "last_faults_raised": list(_traced["last_faults_raised"])}


__all__ = ["FAKE_NVML_ENV", "FAULT_STEP_ENV", "fault_step_asked", "install_fake_nvml_if_asked", "switch_interval_s",
           "test_seconds", "trace_steps", "traced_steps"]
