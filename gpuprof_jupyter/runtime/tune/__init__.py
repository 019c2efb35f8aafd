"""``--tune``: short measured trials of a training cell, searched coordinate by
coordinate, the user's state restored after each (docs/tune.md).

Runs in any process that holds a run: the kernel, or a script under ``gpuprof run``.
"""
