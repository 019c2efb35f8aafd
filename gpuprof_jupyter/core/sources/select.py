"""Which sources a session reads, from ``--source`` (or GPUPROF_SOURCE) and ``--devices``.

Runs in the sampler process, which opens the sources; the kernel and the CLI only check a spec here.

* ``nvml``: real GPUs (plus torch memory statistics when CUDA is already initialised);
* ``sim[:SCENARIO[:NGPUS]]``: simulated GPUs, only when asked for;
* ``host``: host metrics only;
* nothing: NVML if a GPU is visible, else host only, with a note.
Host metrics are always recorded. When NVML cannot run, one clear note says why. The default
comes from GPUPROF_SOURCE or the config file (see config.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuprof_jupyter.core.config import DEFAULT_INTERVAL_S
from gpuprof_jupyter.core.sources.base import Source, SourceUnavailable
from gpuprof_jupyter.core.sources.host import HostSource
from gpuprof_jupyter.core.sources.spec import validate_source_spec


@dataclass
class SourceSet:
    sources: list[Source]
    devices: list  # DeviceInfo of every opened source
    label: str  # "nvml", "sim:input-bound", "host"
    simulated: bool
    notes: list[str] = field(default_factory=list)


def open_sources(spec: str | None, devices: list[int] | None = None, busy_share=None, covered=None,
                 host_pid: int | None = None, host_exclude: set[int] | None = None,
                 interval: float = DEFAULT_INTERVAL_S, start: float | None = None) -> SourceSet:
    """Open the sources ``spec`` asks for, plus the host source; NVML that cannot run is a note.

    Run in the sampler process: ``busy_share``/``covered`` come from the kernel's step events
    (the simulated GPU's load), ``host_pid`` is the kernel (its process tree is measured,
    ``host_exclude`` left out: the sampler process itself)."""
    spec = validate_source_spec(spec)  # None: auto (the kernel resolved the config: session.py)
    sources: list[Source] = []
    found: list = []
    notes: list[str] = []
    label, simulated = "host", False
    if spec is not None and spec.startswith("sim"):
        from gpuprof_jupyter.core.sources.simulated import SimulatedSource

        sim = SimulatedSource(spec, busy_share=busy_share, covered=covered, interval=interval, start=start)
        gpus = sim.open()
        if devices:
            unknown = sorted(set(devices) - {d.index for d in gpus})
            if unknown:
                raise ValueError(f"--devices {unknown} not among the {sim.count} simulated GPUs")
            keep = {f"gpu{i}" for i in devices}
            sim.keep_only(keep)
            gpus = [d for d in gpus if d.key in keep]
        sources.append(sim)
        found.extend(gpus)
        label, simulated = sim.name, True
    elif spec is not None and spec.startswith("prometheus="):  # a job's GPUs on other nodes: asked for, so failing is an error
        from gpuprof_jupyter.core.sources.prometheus import PrometheusSource

        if devices:
            raise ValueError("--devices picks local GPUs; with a Prometheus source restrict the series with --match")
        prometheus = PrometheusSource(spec)
        try:
            found.extend(prometheus.open())
        except SourceUnavailable as exc:
            raise ValueError(str(exc)) from None
        sources.append(prometheus)
        label, simulated = prometheus.name, prometheus.simulated
    elif spec in (None, "nvml"):
        from gpuprof_jupyter.core.sources.nvml import NvmlSource

        nvml = NvmlSource(devices=devices)
        try:
            gpus = nvml.open()
        except SourceUnavailable as exc:
            notes.append(f"no GPU metrics: {exc}; host metrics only")
        else:
            sources.append(nvml)
            found.extend(gpus)
            label = "nvml"
    host = HostSource(host_pid, exclude=host_exclude)
    found.extend(host.open())
    sources.append(host)
    return SourceSet(sources, found, label, simulated, notes)


def probe_gpus() -> tuple[list, str | None]:
    """(visible GPUs, None) or ([], why not). Never raises. Runs in the sampler process (the
    kernel asks it: ``runtime.link``) and in the server extension."""
    try:
        from gpuprof_jupyter.core.sources.nvml import NvmlSource

        probe = NvmlSource()
        try:
            return probe.open(), None
        finally:
            probe.close()
    except SourceUnavailable as exc:
        return [], str(exc)
    except Exception as exc:  # noqa: BLE001 - a source that fails to open is named, the others go on
        return [], f"{type(exc).__name__}: {exc}"
