"""The children of a run: the runtime inside each child process and the parent's listener that merges their events.

Runs in any process that holds a run (the kernel, a script under ``gpuprof run``, their children).
"""
