"""The hooks a run installs in the user's process (torch's optimizer and loader, memory, requests) and the log they write.

Runs in any process that holds a run (the kernel, a script under ``gpuprof run``, their children).
"""
