"""The experiment store on disk: one directory per experiment.

Runs in any process (core).
"""
