"""Findings of a loop held back by its input, or of a GPU idle for a reason nothing recorded: ``input-bound``, ``gpu-underused``.

Runs in any process (core).

Their next steps are shared with the live alerts (``low_activity_advice``) and the rules
(``no_steps_advice``). Thresholds are module constants so tests and users can see them.
"""

from __future__ import annotations

from gpuprof_jupyter.core.analysis.finding import Finding
from gpuprof_jupyter.core.format import as_float
from gpuprof_jupyter.core.analysis.provenance import gpu_measured
from gpuprof_jupyter.core.analysis.summary import summary_of
from gpuprof_jupyter.core.analysis.finding_text import fig, serving_only, sm_name, uses


INPUT_SM_LOW_FRAC = 0.30  # sm_util < 50 % for at least this share of the time...
INPUT_DATA_WAIT_FRAC = 0.20  # ...while the loop waited for data at least this share
INPUT_CPU_BUSY = 80.0  # or (no steps reported) the process tree used this much of its CPUs
HOST_INPUT_WAIT_FRAC = 0.30  # no GPU read: the loop waited for data at least this share of its steps
# Next steps for a GPU often idle; one wording, shared by the findings and the live alerts.
UNDERUSED_IN_STEP_ADVICE = ("profile one step with torch.profiler to find host-side work between kernels (Python "
                            "overhead, .item()/.cpu() syncs, small kernels); CUDA graphs or torch.compile can cut "
                            "launch overhead")
NO_STEPS_ADVICE = ("no training steps were found: steps come from torch's optimizer hooks and data waits from its "
                   "DataLoaders; a loop without a torch optimizer can call gpuprof_jupyter.step(n_samples) itself, "
                   "and gpuprof_jupyter.track(loader) times another loader's batches")
# Where the run's context says torch came too late for its hooks (``context["torch_imported_late"]``:
# "cell" for a profiled notebook cell, "block" for a ``profile()`` block), the advice says so first.
_LATE_TORCH = {"cell": "torch was imported inside the profiled cell, so its hooks were not installed: import it in "
                       "an earlier cell",
               "block": "torch was imported inside the profiled block, so its hooks were not installed: import it "
                        "before the block starts"}


def no_steps_advice(context: dict | None) -> str:
    """What to do when no steps were found: import torch earlier only where that applies (torch
    came after the run started), else report steps."""
    late = _LATE_TORCH.get((context or {}).get("torch_imported_late"))
    return f"{late}; or {NO_STEPS_ADVICE}" if late else NO_STEPS_ADVICE


def waits_for_input(wait: float | None, cpu: float | None) -> bool:
    """The loop waited for data (or, with no steps reported, the CPUs were busy): the input
    pipeline is what a low GPU activity points at."""
    return (wait is not None and wait >= INPUT_DATA_WAIT_FRAC) or (wait is None and cpu is not None and cpu >= INPUT_CPU_BUSY)


def input_advice(num_workers=None, cpu: float | None = None, gpu: bool = True) -> str:
    """What to try when the loop waits for data (``num_workers`` as recorded, ``cpu`` the process
    tree's mean CPU %); ``pin_memory`` only where a GPU was measured (it speeds host-to-GPU copies)."""
    step = ("give the DataLoader more workers"
            + (f" (num_workers={num_workers} now)" if num_workers is not None else "")
            + ", set prefetch_factor (e.g. 4)" + (" and pin_memory=True" if gpu else ""))
    if cpu is not None and cpu >= INPUT_CPU_BUSY:
        step += ("; the CPUs are already saturated, so also make preprocessing cheaper (batched transforms, "
                 + ("decode on GPU, " if gpu else "") + "cache preprocessed data)")
    return step


def low_activity_advice(wait: float | None, cpu: float | None, num_workers=None) -> tuple[str, str]:
    """(finding id, next step) for a GPU often below 50 %: input-bound when the loop waits for
    data, else host-side work inside the step, else (no steps) the advice to report them."""
    if waits_for_input(wait, cpu):
        return "input-bound", input_advice(num_workers, cpu)
    return "gpu-underused", UNDERUSED_IN_STEP_ADVICE if wait is not None else NO_STEPS_ADVICE


@uses("sm_util")
def input_bound(experiment) -> Finding | None:
    s = summary_of(experiment)
    overall, steps, host = s.get("overall", {}), s.get("steps", {}), s.get("host", {})
    if not gpu_measured(experiment.meta):
        return _input_bound_host(experiment, s)
    low = as_float(overall.get("sm_low_frac"))
    if low is None or low < INPUT_SM_LOW_FRAC or serving_only(s):
        return None
    wait = as_float(steps.get("data_wait_frac")) if steps.get("count") else None
    cpu = as_float(host.get("cpu_util_mean"))
    if not waits_for_input(wait, cpu):
        return None
    evidence = f"{sm_name(experiment)} < 50 % for {fig(experiment, 'sm_low_frac', low, 'share')} of the time"
    if wait is not None:
        evidence += f" while the loop waited for data {fig(experiment, 'data_wait_frac', wait, 'share')} of the time"
    if cpu is not None:
        evidence += f" and the process tree used {fig(experiment, 'cpu_util_mean', cpu, '%')} of its CPUs"
    step = input_advice(experiment.meta.params.get("num_workers"), cpu)
    return Finding("input-bound", "Input-bound: the GPU waits for data", "high", evidence, step,
                   {"sm_low_frac": low, "data_wait_frac": wait, "cpu_util_mean": cpu})


def _input_bound_host(experiment, s: dict) -> Finding | None:
    """A run that read no GPU: the loop's own data wait is the evidence, said of the host only."""
    steps = s.get("steps", {})
    wait = as_float(steps.get("data_wait_frac")) if steps.get("count") else None
    if wait is None or wait < HOST_INPUT_WAIT_FRAC or serving_only(s):
        return None
    cpu = as_float(s.get("host", {}).get("cpu_util_mean"))
    evidence = (f"the loop waited for data {fig(experiment, 'data_wait_frac', wait, 'share')} of its step time over "
                f"{steps['count']} steps"
                + (f" while the process tree used {fig(experiment, 'cpu_util_mean', cpu, '%')} of its CPUs"
                   if cpu is not None else "")
                + f"; no GPU was read in this run (source {experiment.meta.source or 'host'})")
    return Finding("input-bound", "Input-bound: the loop waits for data", "high" if wait >= 0.5 else "medium",
                   evidence, input_advice(experiment.meta.params.get("num_workers"), cpu, gpu=False),
                   {"data_wait_frac": wait, "cpu_util_mean": cpu, "gpu_measured": False})


@uses("sm_util")
def gpu_underused(experiment) -> Finding | None:
    """SM often below 50 % but nothing recorded says why (no steps, CPUs not busy)."""
    s = summary_of(experiment)
    low = as_float(s.get("overall", {}).get("sm_low_frac"))
    if low is None or low < INPUT_SM_LOW_FRAC or input_bound(experiment) is not None or serving_only(s):
        return None
    steps = s.get("steps", {})
    if steps.get("count"):
        wait = as_float(steps.get("data_wait_frac")) or 0.0
        evidence = (f"{sm_name(experiment)} < 50 % for {fig(experiment, 'sm_low_frac', low, 'share')} of the time, "
                    f"but the loop waited for data only {fig(experiment, 'data_wait_frac', wait, 'share')} of the time: "
                    "the GPU waits for something else in the step")
        step = UNDERUSED_IN_STEP_ADVICE
    else:
        cpu = as_float(s.get("host", {}).get("cpu_util_mean"))
        evidence = (f"{sm_name(experiment)} < 50 % for {fig(experiment, 'sm_low_frac', low, 'share')} of the time; "
                    "no steps were reported"
                    + (f" and the process tree used {fig(experiment, 'cpu_util_mean', cpu, '%')} of its CPUs"
                       if cpu is not None else ""))
        step = no_steps_advice(experiment.meta.context)
    return Finding("gpu-underused", "GPU underused", "medium", evidence, step, {"sm_low_frac": low})
