"""``write_merged_trace``: one run's merged trace (Perfetto, chrome://tracing) written to a file.

Runs in the kernel, the Jupyter server and the ``gpuprof`` command.

The trace itself is ``render/chrome_trace.py``'s (``merged_trace``).
"""

from __future__ import annotations

import json
from pathlib import Path

from gpuprof_jupyter.core.store.atomic import write_text_atomic
from gpuprof_jupyter.render.chrome_trace import merged_trace


def write_merged_trace(experiment, path) -> Path:
    """Write ``merged_trace(experiment)`` as JSON to ``path`` (atomically); the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(merged_trace(experiment), separators=(",", ":")))
    return path


__all__ = ["write_merged_trace"]
