"""The kernel side: the magic and API runtime, the link to the sampler process, the views (docs/architecture.md).

Runs in the kernel (or the profiled script).
"""
