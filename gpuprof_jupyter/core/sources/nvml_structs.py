"""The NVML source's fast path: output structs allocated once, read with one ``struct.unpack``.

Runs in the sampler process, and in the Jupyter server for its device list; never in the kernel.

pynvml's wrappers allocate and fill a new ctypes struct on every call, and its structs route
every attribute access through a Python ``__getattribute__`` (~1 us each). Measured on the
fake NVML (benchmarks/README.md, "Public functions or the fast path"), per call and GPU:
FieldValues 25 us slower through the public wrapper (it sets each field id in a
try/except), utilization and memory info 4 us each; temperature, clocks and clock-event
reasons under 1.2 us. So only these three calls take the fast path; every other call goes
through nvidia-ml-py's public functions (:func:`.nvml_query.query`). GPM uses the public
functions with two prebuilt ``MetricsGet`` structs (:func:`gpm_metrics_pair`).
"""

from __future__ import annotations

import ctypes
import struct
import sys

import pynvml

from gpuprof_jupyter.core.sources import nvml_query as q


def unpacker(layout: list[tuple[int, str]]) -> struct.Struct:
    """A Struct reading ``code`` at each byte ``offset`` (sorted, non-overlapping)."""
    fmt, pos = "=", 0
    for offset, code in sorted(layout):
        if offset > pos:
            fmt += f"{offset - pos}x"
        fmt += code
        pos = offset + struct.calcsize("=" + code)
    return struct.Struct(fmt)


_UTIL = pynvml.c_nvmlUtilization_t
_MEMORY = pynvml.c_nvmlMemory_t
_UTIL_S = unpacker([(_UTIL.gpu.offset, "I"), (_UTIL.memory.offset, "I")])
_MEMORY_S = unpacker([(_MEMORY.total.offset, "Q"), (_MEMORY.used.offset, "Q")])

_FV = pynvml.c_nvmlFieldValue_t
_FV_SIZE = ctypes.sizeof(_FV)
_FV_LAYOUT = [(_FV.fieldId.offset, "I"), (_FV.valueType.offset, "I"), (_FV.nvmlReturn.offset, "I"), (_FV.value.offset, "Q")]
_GPM_REC = ctypes.sizeof(pynvml.c_nvmlGpmMetric_t)
_GPM_BASE = pynvml.c_nvmlGpmMetricsGet_t.metrics.offset
_GPM_LAYOUT = [(pynvml.c_nvmlGpmMetric_t.nvmlReturn.offset, "I"), (pynvml.c_nvmlGpmMetric_t.value.offset, "d")]

_RAW = struct.Struct("=Q")
_UINT = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
_ULL = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
_LITTLE = sys.byteorder == "little"
_VALUE_CODE = {
    pynvml.NVML_VALUE_TYPE_DOUBLE: "=d",
    _UINT: "=I",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "=Q" if ctypes.sizeof(ctypes.c_ulong) == 8 else "=I",
    _ULL: "=Q",
    pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "=q",
    pynvml.NVML_VALUE_TYPE_SIGNED_INT: "=i",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT: "=H",
}


def field_value(value_type: int, raw: int) -> float:
    """The ``c_nvmlValue_t`` union member ``value_type`` names, from its 8 raw bytes."""
    if value_type == _UINT and _LITTLE:
        return float(raw & 0xFFFFFFFF)
    if value_type == _ULL:
        return float(raw)
    code = _VALUE_CODE.get(value_type, "=I")
    return float(struct.unpack_from(code, _RAW.pack(raw))[0])


class OutBuffer:
    """``function(handle, &out)`` into one struct allocated once, read with one unpack."""

    __slots__ = ("function", "buf", "args", "_unpack")

    def __init__(self, function: str, struct_type, layout: struct.Struct, handle) -> None:
        self.function = function
        self.buf = struct_type()
        self.args = (handle, ctypes.byref(self.buf))
        self._unpack = layout

    def read(self) -> tuple:
        """The struct's fields in the layout's order. Raises NvmlFailure."""
        q.call(self.function, *self.args)
        return self._unpack.unpack_from(self.buf)


def utilization_buffer(handle) -> OutBuffer:
    """``read()`` gives (utilization.gpu %, utilization.memory %)."""
    return OutBuffer("nvmlDeviceGetUtilizationRates", _UTIL, _UTIL_S, handle)


def memory_buffer(handle) -> OutBuffer:
    """``read()`` gives (total, used) bytes (memory info version 1)."""
    return OutBuffer("nvmlDeviceGetMemoryInfo", _MEMORY, _MEMORY_S, handle)


class FieldBatch:
    """One ``nvmlDeviceGetFieldValues`` call for a fixed list of field ids (set once here)."""

    __slots__ = ("ids", "buf", "args", "_unpack")

    def __init__(self, handle, ids: list[int]) -> None:
        self.ids = list(ids)
        self.buf = (_FV * max(len(ids), 1))()
        for k, field_id in enumerate(ids):
            self.buf[k].fieldId = field_id
        self.args = (handle, ctypes.c_int32(len(ids)), ctypes.byref(self.buf))
        self._unpack = unpacker([(k * _FV_SIZE + off, code) for k in range(len(ids)) for off, code in _FV_LAYOUT])

    def read(self) -> list[tuple[int, int, float | None]]:
        """(field id, NVML return code, value) per field; the value is None where the code is
        not 0. Raises NvmlFailure when the call itself fails."""
        q.call("nvmlDeviceGetFieldValues", *self.args)
        raw = self._unpack.unpack_from(self.buf)
        return [(raw[k], raw[k + 2], None if raw[k + 2] else field_value(raw[k + 1], raw[k + 3]))
                for k in range(0, len(raw), 4)]


def gpm_metrics_pair(samples: tuple, metric_ids: list[int]) -> tuple[tuple, struct.Struct]:
    """Two ``c_nvmlGpmMetricsGet_t`` for alternating GPM samples, and their unpacker.

    Samples alternate: a read fills one, then ``MetricsGet(other, just filled)``; ``pair[n]``
    compares the other sample with sample ``n``. Prebuilding both avoids setting struct fields
    on every read. The unpacker gives ``(ret0, value0, ret1, value1, ...)``.
    """
    s0, s1 = samples
    pair = []
    for first, second in ((s1, s0), (s0, s1)):
        mg = pynvml.c_nvmlGpmMetricsGet_t()
        mg.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        mg.numMetrics = len(metric_ids)
        mg.sample1, mg.sample2 = first, second
        for k, mid in enumerate(metric_ids):
            mg.metrics[k].metricId = mid
        pair.append(mg)
    n = len(metric_ids)
    return tuple(pair), unpacker([(_GPM_BASE + k * _GPM_REC + off, code) for k in range(n) for off, code in _GPM_LAYOUT])
