"""The one door to NVML: every call the profiler makes goes through :func:`query`.

Runs in the sampler process, and in the Jupyter server for its device list; never in the kernel.

Like nvitop's ``libnvml.nvmlQuery``:

* ``nvmlInit`` runs lazily, once, under a lock; :func:`acquire`/:func:`release` count the
  sources that use it, and ``nvmlShutdown`` runs when the last one that we initialised
  for is closed (or at interpreter exit);
* an ``NVMLError`` becomes an :class:`NvmlFailure` with a *kind* (``not_supported``,
  ``no_permission``, ``function_not_found``, ``lost``, ``unknown``, ``invalid``,
  ``transient``) so callers decide per metric: drop it, fall back, or end the device;
  :func:`query_or` turns any failure into a default ("missing") for optional facts;
* ``NVMLError_FunctionNotFound`` (an NVML library older than the binding) is logged once
  per function and remembered in :func:`missing_functions`;
* ``bytes`` results are decoded to ``str``.

Nothing here imports CUDA: NVML works without a CUDA context.
"""

from __future__ import annotations

import atexit
import logging
import threading
from typing import Any, Callable

import pynvml

log = logging.getLogger(__name__)

NOT_SUPPORTED = "not_supported"
NO_PERMISSION = "no_permission"
FUNCTION_NOT_FOUND = "function_not_found"
LOST = "lost"  # GPU is lost / requires reset: the device is gone
UNKNOWN = "unknown"  # NVML_ERROR_UNKNOWN: lost when every call of a device fails so
INVALID = "invalid"  # invalid argument / not found / version mismatch: never works
TRANSIENT = "transient"  # timeout, memory, IRQ, ...: missing this time, may work later
UNAVAILABLE = "unavailable"  # no library / driver not loaded (nvmlInit)

#: Kinds after which a metric is dropped for the rest of the session.
PERMANENT = frozenset({NOT_SUPPORTED, NO_PERMISSION, FUNCTION_NOT_FOUND, INVALID})

_KINDS: dict[int, str] = {
    pynvml.NVML_ERROR_NOT_SUPPORTED: NOT_SUPPORTED,
    pynvml.NVML_ERROR_NO_PERMISSION: NO_PERMISSION,
    pynvml.NVML_ERROR_FUNCTION_NOT_FOUND: FUNCTION_NOT_FOUND,
    pynvml.NVML_ERROR_GPU_IS_LOST: LOST,
    pynvml.NVML_ERROR_RESET_REQUIRED: LOST,
    pynvml.NVML_ERROR_UNKNOWN: UNKNOWN,
    pynvml.NVML_ERROR_INVALID_ARGUMENT: INVALID,
    pynvml.NVML_ERROR_NOT_FOUND: INVALID,
    pynvml.NVML_ERROR_LIBRARY_NOT_FOUND: UNAVAILABLE,
    pynvml.NVML_ERROR_DRIVER_NOT_LOADED: UNAVAILABLE,
    pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH: UNAVAILABLE,
}
_ARG_VERSION_MISMATCH = getattr(pynvml, "NVML_ERROR_ARGUMENT_VERSION_MISMATCH", None)
if _ARG_VERSION_MISMATCH is not None:
    _KINDS[_ARG_VERSION_MISMATCH] = INVALID

_lock = threading.Lock()
_initialised = False  # we called nvmlInit and not yet nvmlShutdown
_refcount = 0
_atexit_registered = False
_missing_functions: set[str] = set()


class NvmlFailure(Exception):
    """An NVML call failed. ``kind`` says what to do about it; ``error`` is pynvml's error."""

    def __init__(self, kind: str, function: str, error: BaseException) -> None:
        super().__init__(f"{function}: {error}")
        self.kind = kind
        self.function = function
        self.error = error


def classify(error: BaseException) -> str:
    """The kind of an NVML error (see module docstring); ``transient`` when not listed."""
    return _KINDS.get(getattr(error, "value", None), TRANSIENT)


def _name(fn: Callable) -> str:
    return getattr(fn, "__name__", repr(fn))


def _failure(fn: Callable | str, error: BaseException) -> NvmlFailure:
    kind = classify(error)
    name = fn if isinstance(fn, str) else _name(fn)
    if kind == FUNCTION_NOT_FOUND and name not in _missing_functions:
        _missing_functions.add(name)
        log.info("NVML function %s is not in this driver's NVML library", name)
    return NvmlFailure(kind, name, error)


def ensure_initialised() -> bool:
    """Call ``nvmlInit`` once. True if this call did it. Raises :class:`NvmlFailure`."""
    global _initialised, _atexit_registered
    with _lock:
        if _initialised:
            return False
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as err:
            raise _failure(pynvml.nvmlInit, err) from err
        _initialised = True
        if not _atexit_registered:
            _atexit_registered = True
            atexit.register(_shutdown_at_exit)
        return True


def acquire() -> None:
    """Take a reference on the NVML library (initialising it if needed)."""
    global _refcount
    ensure_initialised()
    with _lock:
        _refcount += 1


def release() -> None:
    """Drop a reference; the last one shuts NVML down if we initialised it."""
    global _refcount, _initialised
    with _lock:
        if _refcount > 0:
            _refcount -= 1
        if _refcount or not _initialised:
            return
        _initialised = False
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError as err:  # nothing to do about it at this point
            log.debug("nvmlShutdown failed: %s", err)


def _shutdown_at_exit() -> None:
    global _initialised
    with _lock:
        if not _initialised:
            return
        _initialised = False
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001 - interpreter is exiting
            pass


def query(fn: Callable, *args: Any) -> Any:
    """``fn(*args)`` with NVML initialised; bytes decoded. Raises :class:`NvmlFailure`.

    ``fn`` is a pynvml function (``pynvml.nvmlDeviceGetPowerUsage``), never a name, so the
    hot path does no lookup.
    """
    try:
        value = fn(*args)
    except pynvml.NVMLError as err:
        if err.value != pynvml.NVML_ERROR_UNINITIALIZED or _initialised:
            raise _failure(fn, err) from None
        # Lazy init: the hot path pays no check; the first call finds NVML uninitialised.
        ensure_initialised()
        try:
            value = fn(*args)
        except pynvml.NVMLError as err2:
            raise _failure(fn, err2) from None
    if value.__class__ is bytes:
        return value.decode("utf-8", "replace")
    return value


def query_or(default: Any, fn: Callable, *args: Any) -> Any:
    """Like :func:`query`, but any NVML failure gives ``default`` (a "missing" value)."""
    try:
        return query(fn, *args)
    except NvmlFailure:
        return default


def missing_functions() -> set[str]:
    """Functions this driver's NVML library lacks (seen so far)."""
    return set(_missing_functions)


def _reset_for_tests() -> None:
    """Forget init state and missing functions (tests swap the NVML library underneath)."""
    global _initialised, _refcount
    with _lock:
        _initialised = False
        _refcount = 0
        _missing_functions.clear()
