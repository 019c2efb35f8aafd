"""Python lists to Arrow arrays and Arrow arrays to numpy without pandas: the sampler process never imports it.

Runs in any process (core); it matters in the sampler process.

``pa.array``, ``pa.scalar`` and ``Array.to_numpy`` import pandas on their first call,
whatever they are given (pyarrow checks for pandas objects and options), and nothing else the
sampler process does needs pandas: its first run paid 0.15-0.4 s of CPU for that import, on a
2-core machine, right when the kernel waits for the first profiled cell's ``begin`` and ``end``
(benchmarks/README.md, "Weight and cost"). So the arrays are built from, and read through,
their buffers with numpy (which pyarrow loads anyway), for the types the store writes and the
summary reads: float64, int64, bool and (written only) string. ``None`` is a null, as with
``pa.array``; NaN stays a value.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa


def array(values: list, type: pa.DataType) -> pa.Array:
    """``values`` as an Arrow array of ``type`` (float64, int64, bool or string)."""
    n = len(values)
    valid = None
    if any(v is None for v in values):
        mask = np.fromiter((v is not None for v in values), dtype=bool, count=n)
        valid = pa.py_buffer(np.packbits(mask, bitorder="little"))
        values = [v if ok else _FILL[type.id] for v, ok in zip(values, mask)]
    if type == pa.string():
        data = [v.encode("utf-8") for v in values]
        offsets = np.zeros(n + 1, dtype=np.int32)
        np.cumsum([len(b) for b in data], out=offsets[1:])
        buffers = [valid, pa.py_buffer(offsets), pa.py_buffer(b"".join(data))]
    elif type == pa.bool_():
        buffers = [valid, pa.py_buffer(np.packbits(np.array(values, dtype=bool), bitorder="little"))]
    elif type.id in _NUMBERS:
        buffers = [valid, pa.py_buffer(np.array(values, dtype=_NUMBERS[type.id]))]
    else:
        raise TypeError(f"arrow_arrays.array: no {type} (float64, int64, bool or string)")
    return pa.Array.from_buffers(type, n, buffers)


def to_numpy(values) -> np.ndarray:
    """A float64, int64, bool or string Arrow array (or chunked array) as a writable numpy array,
    as ``to_pandas`` gives a column without nulls; nulls are NaN (int64 with nulls becomes
    float64, as there), False in a bool column and None in a string (object) column."""
    if isinstance(values, pa.ChunkedArray):
        parts = [to_numpy(chunk) for chunk in values.chunks]
        if not parts:
            return np.zeros(0, dtype=bool if values.type == pa.bool_() else _NUMBERS.get(values.type.id, object))
        return np.concatenate(parts) if len(parts) > 1 else parts[0]
    n, offset, buffers = len(values), values.offset, values.buffers()
    if values.type == pa.string():  # a few labels (a request's kind): None where null
        return np.array(values.to_pylist(), dtype=object)
    if values.type == pa.bool_():
        data = _bits(buffers[1], offset, n)
    elif values.type.id in _NUMBERS:
        dtype = np.dtype(_NUMBERS[values.type.id])
        data = (np.frombuffer(buffers[1], dtype=dtype, count=n, offset=offset * dtype.itemsize).copy() if n
                else np.zeros(0, dtype))
    else:
        raise TypeError(f"arrow_arrays.to_numpy: no {values.type} (float64, int64 or bool)")
    if values.null_count:
        nulls = ~_bits(buffers[0], offset, n)
        if data.dtype == bool:
            data[nulls] = False
        else:
            data = data.astype(np.float64, copy=False)
            data[nulls] = np.nan
    return data


def _bits(buffer, offset: int, n: int) -> np.ndarray:
    """A bitmap (validity, or a bool array's values) as n bools from bit ``offset``."""
    if not n:
        return np.zeros(0, dtype=bool)
    return np.unpackbits(np.frombuffer(buffer, dtype=np.uint8), bitorder="little")[offset:offset + n].astype(bool)


_NUMBERS = {pa.float64().id: np.float64, pa.int64().id: np.int64}
_FILL = {pa.float64().id: 0.0, pa.int64().id: 0, pa.bool_().id: False, pa.string().id: ""}
