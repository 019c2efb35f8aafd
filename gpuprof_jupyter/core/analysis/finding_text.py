"""What every finding's evidence is written with: typed figures (core/figure.py) and the checks' marks.

Runs in any process (core).

``fig`` writes a run's figure as every view does (a simulated run's GPU figures say
"(simulated)", a missing one "n/a", never 0); ``uses`` marks a check as drawn from sampled
metrics, so ``diagnosis.diagnose`` skips it on a run too short for them.
"""

from __future__ import annotations

from gpuprof_jupyter.core.figure import measured
from gpuprof_jupyter.core.format import fmt_figure, provenance_label
from gpuprof_jupyter.core.analysis.run_figures import run_figure, step_figure
from gpuprof_jupyter.core.analysis.provenance import sm_is_kernel_active


def uses(*metrics: str):
    """Mark a check as drawn from these sampled metrics: ``diagnose`` skips it when the run is
    too short for one of them."""
    def mark(check):
        check.metrics = metrics
        return check
    return mark


def fig(experiment, key: str, value, unit: str) -> str:
    """The run's figure ``key`` in ``unit`` as every view writes it (core/figure.py): a GPU figure
    of a simulated run says "(simulated)", a missing one "n/a", never 0."""
    return fmt_figure(run_figure(experiment.meta, key, value, unit))


def together(experiment, *specs: tuple[str, object, str]) -> tuple[list[str], str]:
    """Several figures of one clause, each (key, value, unit): their texts and the label they
    share, said once after the clause ("4.0 GiB of 40.0 GiB (10 %) (simulated)"); figures of
    different provenance keep their own labels (and the shared one is "")."""
    figures = [run_figure(experiment.meta, key, value, unit) for key, value, unit in specs]
    labels = {provenance_label(f) for f in figures if f.known}
    if len(labels) == 1:
        return [fmt_figure(f, labelled=False) for f in figures], labels.pop()
    return [fmt_figure(f) for f in figures], ""


def step_fig(value, unit: str) -> str:
    """A figure of the run's steps (a batch, a time per step), measured by the step hooks."""
    return fmt_figure(step_figure(value, unit))


def traced_fig(value, unit: str) -> str:
    """A figure of the --trace window, measured by torch.profiler."""
    return fmt_figure(measured(value, unit, "the --trace window (torch.profiler)"))


def sm_name(experiment) -> str:
    """How evidence names ``sm_util``: by what it measured where that is kernel-active time."""
    return "kernel-active time (sm_util from NVML utilization.gpu)" if sm_is_kernel_active(experiment.meta) else "sm_util"


def serving_only(summary: dict) -> bool:
    """Requests and no steps: the serving checks (serving_findings.py) say what limits it."""
    return not (summary.get("steps") or {}).get("count") and bool((summary.get("requests") or {}).get("count"))
