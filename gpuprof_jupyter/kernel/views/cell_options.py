"""A profiled cell's arguments, checked and turned into ``ProfileSession`` options.

Runs in the kernel. Below both the magic (which parses the arguments) and the profiled cell
(which starts the session from them).
"""

from __future__ import annotations

from IPython.core.error import UsageError

from gpuprof_jupyter.core.store.directory import Store
from gpuprof_jupyter.kernel.runtime.settings import parse_capture, parse_params


def _parse_devices(text: str | None) -> list[int] | None:
    if not text:
        return None
    try:
        devices = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise UsageError(f"--devices takes visible GPU indices like 0,1; got {text!r}") from None
    if not devices or any(d < 0 for d in devices) or len(set(devices)) != len(devices):
        raise UsageError(f"--devices takes distinct indices >= 0 like 0,1; got {text!r}")
    return devices


def session_options(args) -> dict:
    """ProfileSession options from a cell's arguments; UsageError names a bad one."""
    if args.command:
        raise UsageError(f"unexpected argument(s) for %%gpuprofile: {' '.join(args.command)}")
    if args.port is not None or args.addr is not None or args.no_auth:
        raise UsageError("--port, --addr and --no-auth belong to %gpuprofile serve, not to a profiled cell")
    if not args.tune and (args.trial_steps is not None or args.budget is not None or args.objective is not None):
        raise UsageError("--trial-steps, --budget and --objective go with --tune")
    try:
        params = parse_params(args.param)
        args.capture = parse_capture(args.capture)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if args.interval is not None and not 0.001 <= args.interval <= 3600:
        raise UsageError(f"--interval must be between 0.001 and 3600 s, got {args.interval}")
    if args.name is not None and not args.name.strip():
        raise UsageError("--name must not be empty")
    from gpuprof_jupyter.core.analysis.live_alerts import parse_alerts

    try:  # a malformed rule stops the cell here, before anything starts
        parse_alerts(args.alert)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return {
        "name": args.name,
        "interval": args.interval,
        "devices": _parse_devices(args.devices),
        "source": _source_spec(args.source, args.match),
        "store": writable_store(args.store) if args.store else None,
        "params": params,
        "checks": args.check,
        "trace": args.trace,
        "alerts": args.alert,
    }


def writable_store(path: str) -> Store:
    """``--store DIR`` made (as a run would make it) and written to once; UsageError, before
    the cell runs, when it cannot be (a read-only mount, a path through a file, no permission)."""
    import tempfile
    from pathlib import Path

    from gpuprof_jupyter.core.store.permissions import make_store_root

    try:
        make_store_root(Path(path))
        tempfile.TemporaryFile(dir=path).close()
    except OSError as exc:
        raise UsageError(f"--store {path}: cannot write there ({exc}); the cell did not run") from None
    return Store(path)


def _source_spec(source: str | None, match: str | None) -> str | None:
    """``--match`` folds into a Prometheus spec (``prometheus=URL match=SELECTOR``, the form
    core/sources/prometheus.py parses), so one string carries the choice to the sampler."""
    if match is None:
        return source
    if not (source or "").startswith("prometheus="):
        raise UsageError("--match needs --source prometheus=http://HOST:9090")
    return f"{source} match={match}"
