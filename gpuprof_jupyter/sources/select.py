"""Which sources a session reads, from ``--source`` (or GPUPROF_SOURCE) and ``--devices``.

* ``nvml``: real GPUs (plus torch memory statistics when CUDA is already initialised);
* ``sim[:SCENARIO[:NGPUS]]``: simulated GPUs, only when asked for;
* ``host``: host metrics only;
* nothing: NVML if a GPU is visible, else host only, with a note.
Host metrics are always recorded. When NVML cannot run, one clear note says why. The default
comes from GPUPROF_SOURCE or the config file (see config.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from .base import Source, SourceUnavailable
from .host import HostSource


@dataclass
class SourceSet:
    sources: list[Source]
    devices: list  # DeviceInfo of every opened source
    label: str  # "nvml", "sim:input-bound", "host"
    simulated: bool
    notes: list[str] = field(default_factory=list)


def validate_source_spec(spec: str | None) -> str | None:
    """Raise ValueError naming the problem; return the normalised spec."""
    if spec is None or spec == "":
        return None
    spec = spec.strip()
    if spec in ("nvml", "host", "auto"):
        return None if spec == "auto" else spec
    if spec == "sim" or spec.startswith("sim:"):
        from .simulated import parse_sim_spec

        parse_sim_spec(spec)
        return spec
    raise ValueError(f"unknown source {spec!r}: use nvml, host or sim[:SCENARIO[:NGPUS]]")


def open_sources(spec: str | None, devices: list[int] | None = None, busy_share=None) -> SourceSet:
    if spec is None:
        from ..config import load_config

        spec = load_config().source  # GPUPROF_SOURCE or the config file
    spec = validate_source_spec(spec)
    notes: list[str] = []
    gpu_sources: list[Source] = []
    label, simulated = "host", False
    if spec is not None and spec.startswith("sim"):
        from .simulated import SimulatedSource

        sim = SimulatedSource(spec, busy_share=busy_share)
        gpu_sources.append(sim)
        label, simulated = sim.name, True
    elif spec in (None, "nvml"):
        try:
            from .nvml import NvmlSource

            nvml = NvmlSource(devices=devices)
            opened = nvml.open()
        except SourceUnavailable as exc:
            notes.append(f"no GPU metrics: {exc}; host metrics only")
        else:
            gpu_sources.append(_Opened(nvml, opened))
            label = "nvml"
    host = HostSource()
    all_devices = []
    opened_sources: list[Source] = []
    for source in [*gpu_sources, host]:
        if isinstance(source, _Opened):
            all_devices.extend(source.devices)
            opened_sources.append(source.source)
        else:
            all_devices.extend(source.open())
            opened_sources.append(source)
    if spec is not None and spec.startswith("sim") and devices:
        keep = {f"gpu{i}" for i in devices}
        unknown = sorted(set(devices) - {d.index for d in all_devices if d.kind == "gpu"})
        if unknown:
            raise ValueError(f"--devices {unknown} not among the {sim.count} simulated GPUs")
        all_devices = [d for d in all_devices if d.kind != "gpu" or d.key in keep]
        sim.keep_only(keep)
    if label == "nvml":
        from .torch_memory import TorchMemorySource

        keys = {d.index: d.key for d in all_devices if d.kind == "gpu" and d.index is not None}
        opened_sources.insert(1, TorchMemorySource(keys))
    return SourceSet(opened_sources, all_devices, label, simulated, notes)


def probe_gpus() -> tuple[list, str | None]:
    """(visible GPUs, None) or ([], why not). Never raises: used by status and the demo."""
    try:
        from .nvml import NvmlSource

        probe = NvmlSource()
        try:
            return probe.open(), None
        finally:
            probe.close()
    except SourceUnavailable as exc:
        return [], str(exc)
    except Exception as exc:
        return [], f"{type(exc).__name__}: {exc}"


def gpu_available() -> bool:
    """True when NVML sees at least one visible GPU (used to pick the demo's source)."""
    return bool(probe_gpus()[0])


@dataclass
class _Opened:
    source: Source
    devices: list
