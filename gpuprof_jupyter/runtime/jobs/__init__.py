"""The children of a run: the runtime inside each child process, the parent's listener that
folds their events, and the merge of what they said into the run.

Runs in any process that holds a run (the kernel, a script under ``gpuprof run``, their children).
"""
