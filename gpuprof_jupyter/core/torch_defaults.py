"""torch's defaults in one table: the DataLoader's fields, what torch fills by itself, which
loader knobs need workers, and which recorded params only describe a run.

Runs in any process (core).

Read by the settings a run records (``runtime/record/settings.py``), the comparison (through
``context.torch_filled``), the ``pipeline.yaml`` export (``render/pipeline_yaml.py``) and
``--tune`` (``runtime/tune/``). Plain data: torch is never imported here; the table is checked
against torch's own signature by ``tests/test_torch_defaults.py``.
"""

from __future__ import annotations

from collections.abc import Iterable

# The DataLoader's settings a run records (``runtime/record/settings.loader_settings``).
LOADER_FIELDS = ("batch_size", "num_workers", "pin_memory", "prefetch_factor", "persistent_workers")
TORCH_PREFETCH_DEFAULT = 2  # torch.utils.data.DataLoader: prefetch_factor None -> 2 when num_workers > 0

# What torch (and its DataLoader) use when nobody sets them; a key may have several (the
# DataLoader's prefetch_factor is None without workers and TORCH_PREFETCH_DEFAULT with them).
TORCH_DEFAULTS = {
    "cudnn.benchmark": (False,), "tf32.cudnn": (True,), "tf32.matmul": (False,),
    "float32_matmul_precision": ("highest",), "amp.autocast": (False,), "torch.compile": (False,),
    "batch_size": (1,), "num_workers": (0,), "pin_memory": (False,), "persistent_workers": (False,),
    "prefetch_factor": (None, TORCH_PREFETCH_DEFAULT),
}

# The loader settings ``--tune`` tries: they change speed, never results.
LOADER_KNOBS = ("num_workers", "prefetch_factor", "persistent_workers", "pin_memory")
# torch refuses these on a loader without workers (ValueError at construction).
NEEDS_WORKERS = ("prefetch_factor", "persistent_workers")

# Recorded params that describe the run rather than choose it: shown and compared, never
# written to pipeline.yaml as settings to keep (``loader1.dataset`` counts as ``dataset``).
DESCRIPTIVE_KEYS = frozenset({"dataset", "dataset_len", "optimizer", "model.parameters", "model.dtype",
                              "amp.device", "grad_scaler.scale", "serving.model", "serving.parameters"})


def _field(key: str) -> str:
    """``loader2.num_workers`` -> ``num_workers``; a key without a loader prefix stays."""
    return key.rpartition(".")[2]


def is_descriptive(key: str) -> bool:
    """True for a param that describes the run (``DESCRIPTIVE_KEYS``), also under a loader prefix."""
    return key in DESCRIPTIVE_KEYS or key.split(".", 1)[-1] in DESCRIPTIVE_KEYS


def is_torch_default(key: str, value) -> bool:
    """True when ``value`` is what torch uses for ``key`` unset (``loader2.num_workers`` too).
    Types must match: ``0`` is not ``False``."""
    defaults = TORCH_DEFAULTS.get(key)
    if defaults is None and _field(key) in LOADER_FIELDS:
        defaults = TORCH_DEFAULTS[_field(key)]
    return any(value == d and type(value) is type(d) for d in defaults or ())


def torch_filled(settings: dict) -> list[str]:
    """Keys of recorded loader settings (``runtime/record/settings.dataloader_settings``) whose
    value torch filled in by itself rather than the user: ``prefetch_factor`` 2 when workers are
    on (the user passed None, torch's default). A comparison does not count them as the user's
    change (``core/analysis/compare.py``)."""
    filled = []
    for key, value in settings.items():
        prefix = key[:len(key) - len(_field(key))]
        if _field(key) == "prefetch_factor" and value == TORCH_PREFETCH_DEFAULT \
                and (settings.get(prefix + "num_workers") or 0) > 0:
            filled.append(key)
    return filled


def merge_recorded(meta, recorded: dict, filled: Iterable[str]) -> None:
    """Put settings a run recorded by itself (``recorded``) into ``meta.params`` under what the
    user set (``--param`` wins), and the keys torch ``filled`` that the user did not set into
    ``meta.context["torch_filled"]`` (docs/events.md). The one merge of both, for a run in the
    kernel and for a job's child processes."""
    user_set = meta.params
    kept = [key for key in filled if key not in user_set]
    if kept:
        meta.context["torch_filled"] = kept
    meta.params = {**recorded, **user_set}


__all__ = ["DESCRIPTIVE_KEYS", "LOADER_FIELDS", "LOADER_KNOBS", "NEEDS_WORKERS", "TORCH_DEFAULTS",
           "TORCH_PREFETCH_DEFAULT", "is_descriptive", "is_torch_default", "merge_recorded", "torch_filled"]
