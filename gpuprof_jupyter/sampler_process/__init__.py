"""The sampler process: the only NVML reader on the kernel's behalf (docs/architecture.md).

Runs in the sampler process.
"""
