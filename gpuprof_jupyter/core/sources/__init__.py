"""Where readings come from: NVML, the host, Prometheus, the simulated GPU.

Runs in any process (core). Which process opens each source is said in its module.
"""
