"""The profiling runtime: sessions, settings, the activity of the training loop.

Runs in the kernel (or the profiled script).
"""
