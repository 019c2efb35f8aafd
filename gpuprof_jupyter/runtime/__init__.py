"""The profiling runtime: sessions, settings, the activity of the training loop.

Runs in any process that holds a run: the kernel, or a script under ``gpuprof run``.
"""
