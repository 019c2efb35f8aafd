"""``--tune``: short measured trials of a training cell, searched coordinate by
coordinate, the user's state restored after each (docs/tune.md).

Runs in the kernel (or the profiled script).
"""
