"""What torch's DataLoader does by itself, and which recorded params only describe a run.

Runs in every process (plain data: the kernel records settings, renderers export them).
"""

from __future__ import annotations

LOADER_FIELDS = ("batch_size", "num_workers", "pin_memory", "prefetch_factor", "persistent_workers")
TORCH_PREFETCH_DEFAULT = 2  # torch.utils.data.DataLoader: prefetch_factor None -> 2 when num_workers > 0

# Recorded params that describe the run rather than choose it: shown and compared, never
# written to pipeline.yaml as settings to keep (``loader1.dataset`` counts as ``dataset``).
DESCRIPTIVE_KEYS = frozenset({"dataset", "dataset_len", "optimizer", "model.parameters", "model.dtype",
                              "amp.device", "grad_scaler.scale", "serving.model", "serving.parameters"})


def is_descriptive(key: str) -> bool:
    """True for a param that describes the run (``DESCRIPTIVE_KEYS``), also under a loader prefix."""
    return key in DESCRIPTIVE_KEYS or key.split(".", 1)[-1] in DESCRIPTIVE_KEYS


__all__ = ["LOADER_FIELDS", "TORCH_PREFETCH_DEFAULT", "DESCRIPTIVE_KEYS", "is_descriptive"]
