"""``--source`` checked where it is typed: in the kernel, the CLI, and again in the sampler process.

Runs in every process; imports no source that opens a library (the kernel never loads NVML):
checking a spec only parses it.
"""

from __future__ import annotations


def validate_source_spec(spec: str | None) -> str | None:
    """Raise ValueError naming the problem; return the normalised spec."""
    if spec is None or spec == "":
        return None
    spec = spec.strip()
    if spec in ("nvml", "host", "auto"):
        return None if spec == "auto" else spec
    if spec == "sim" or spec.startswith("sim:"):
        from gpuprof_jupyter.core.sources.simulated import parse_sim_spec

        parse_sim_spec(spec)
        return spec
    if spec.startswith("prometheus="):
        from gpuprof_jupyter.core.sources.prometheus import validate_prometheus_spec

        return validate_prometheus_spec(spec)
    raise ValueError(f"unknown source {spec!r}: use nvml, host, sim[:SCENARIO[:NGPUS]] or prometheus=URL")
