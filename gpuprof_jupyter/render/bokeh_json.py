"""Bokeh JSON text without Bokeh: model ids made unique per output, and float arrays encoded as Bokeh does.

Runs in the kernel, the Jupyter server and the ``gpuprof`` command.

The live view and the static plots both copy one serialised template per plot structure.
"""

from __future__ import annotations

import base64
import gzip
import json
import os
import re
import sys
import uuid

_DECLARED_ID = re.compile(r'"id": ?"(p\d+)"')
_QUOTED_ID = re.compile(r'"(p\d+)(?=\\?")')


def fresh_ids(text: str, prefix: str | None = None) -> str:
    """``text`` (serialised Bokeh JSON) with every model id (``p1234``) made unique to this
    output (``<prefix>1234``), so several outputs built from one template can share a page."""
    declared = set(_DECLARED_ID.findall(text))
    prefix = prefix or new_id_prefix()
    return _QUOTED_ID.sub(lambda m: f'"{prefix}{m.group(1)[1:]}' if m.group(1) in declared else m.group(0), text)


def new_id_prefix() -> str:
    return "g" + uuid.uuid4().hex[:8]


def ndarray_json(array) -> str:
    """Bokeh's JSON for a float ndarray (gzip level 2 + base64, as ``bokeh.core.serialization`` writes
    it), without importing Bokeh; other arrays go through Bokeh's serializer."""
    import numpy as np

    array = np.asarray(array)
    if array.dtype.name not in ("float32", "float64") or array.ndim != 1:
        from bokeh.core.serialization import Serializer

        return json.dumps(Serializer(deferred=False).encode(array))
    level = int(os.environ.get("BOKEH_COMPRESSION_LEVEL", "2"))
    data = base64.b64encode(gzip.compress(np.ascontiguousarray(array).tobytes(), mtime=1, compresslevel=level))
    return json.dumps({"type": "ndarray", "array": {"type": "bytes", "data": data.decode("ascii")},
                       "shape": [len(array)], "dtype": array.dtype.name, "order": sys.byteorder})


__all__ = ["fresh_ids", "new_id_prefix", "ndarray_json"]
