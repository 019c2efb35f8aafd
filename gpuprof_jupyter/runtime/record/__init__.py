"""The run's records: events, settings, values, requests folded (no hooks, no torch import).

Runs in any process that holds a run (the kernel, a script under ``gpuprof run``, their children).
"""
