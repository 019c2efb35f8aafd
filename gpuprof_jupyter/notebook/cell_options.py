"""A profiled cell's arguments, checked and turned into the run's ``RunOptions``.

Runs in the kernel. Below both the magic (which parses the arguments) and the profiled cell
(which starts the session from them). The run's options, as the table names them
(``runtime/option_table.py``: ``given``), are checked by ``RunOptions``
(``runtime/run_options.py``); here only the magic's own flags are, and a ValueError
becomes the magic's UsageError.
"""

from __future__ import annotations

from IPython.core.error import UsageError

from gpuprof_jupyter.core.store.directory import Store
from gpuprof_jupyter.runtime.option_table import MAGIC, given
from gpuprof_jupyter.runtime.run_options import RunOptions
from gpuprof_jupyter.runtime.record.settings import parse_capture


def session_options(args) -> RunOptions:
    """The run's options from a cell's arguments; UsageError names a bad one (before anything
    starts). ``args.capture`` becomes the list of names to capture."""
    if args.command:
        raise UsageError(f"unexpected argument(s) for %%gpuprofile: {' '.join(args.command)}")
    if args.port is not None or args.addr is not None or args.no_auth:
        raise UsageError("--port, --addr and --no-auth belong to %gpuprofile serve, not to a profiled cell")
    if not args.tune and (args.trial_steps is not None or args.budget is not None or args.objective is not None):
        raise UsageError("--trial-steps, --budget and --objective go with --tune")
    try:
        args.capture = parse_capture(args.capture)
        return RunOptions.resolve(**{**given(args, MAGIC), "store": writable_store(args.store) if args.store else None})
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def writable_store(path: str) -> Store:
    """``--store DIR`` made (as a run would make it) and written to once; ValueError, before
    the cell runs, when it cannot be (a read-only mount, a path through a file, no permission)."""
    import tempfile
    from pathlib import Path

    from gpuprof_jupyter.core.store.permissions import make_store_root

    try:
        make_store_root(Path(path))
        tempfile.TemporaryFile(dir=path).close()
    except OSError as exc:
        raise ValueError(f"--store {path}: cannot write there ({exc}); the cell did not run") from None
    return Store(path)
