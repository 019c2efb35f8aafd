"""Python's startup hook for the processes of a profiled job (docs/scripts.md).

Runs in any process that holds a run as a child: every Python process started by the kernel's
profiled cell or by ``gpuprof run``, at startup.

This directory holds only this file; the run puts it first on the child's ``PYTHONPATH``, so
Python imports it at startup (``site``'s documented ``sitecustomize`` hook), and every Python
process the child starts inherits it. It then:

* runs the ``sitecustomize`` it shadows (the user's, or the distribution's), as Python would;
* when the run's channel is named in the environment, starts the zero-code hooks
  (``gpuprof_jupyter.runtime.jobs.child``); they connect only once the process trains (a
  step, a batch, an optimizer step), so DataLoader workers, ``torchrun``'s agent and helper
  processes never do. Without the channel it does nothing more than a look-up in os.environ.

Standard library only until the hooks are asked for.
"""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def _chain() -> None:
    """Import the next ``sitecustomize`` on the path (ours leaves sys.path and sys.modules).
    ``__import__``, not importlib: the importlib package is not loaded yet at startup."""
    sys.path[:] = [p for p in sys.path if p != _HERE and os.path.abspath(p or ".") != _HERE]
    ours = sys.modules.pop("sitecustomize", None)
    try:
        __import__("sitecustomize")
    except ImportError as exc:
        if exc.name != "sitecustomize":
            raise
    finally:
        if ours is not None:  # the import of this module ends by looking itself up there
            sys.modules.setdefault("sitecustomize", ours)


def _start() -> None:
    package = os.environ.get("GPUPROF_CHILD_PACKAGE")
    try:
        try:
            from gpuprof_jupyter.runtime.jobs.child import start
        except ImportError:
            if not package:
                raise
            sys.path.append(package)  # a checkout, not installed for this interpreter
            from gpuprof_jupyter.runtime.jobs.child import start
        start()
    except Exception as exc:  # noqa: BLE001 - this process runs unprofiled, with one note in the run
        notes = os.environ.get("GPUPROF_CHILD_NOTES")
        if notes:
            import json

            try:
                with open(notes, "a", encoding="utf-8") as f:
                    f.write(json.dumps({"pid": os.getpid(), "why": f"{type(exc).__name__}: {exc}"}) + "\n")
            except OSError:
                pass


try:
    _chain()
finally:
    if os.environ.get("GPUPROF_CHILD_CHANNEL"):
        _start()
