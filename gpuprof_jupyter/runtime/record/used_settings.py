"""The settings a run used, as the training hooks saw them: no ``--param`` needed (docs/events.md).

Runs in any process that holds a run: the kernel, or a script under ``gpuprof run``.

From ``TrainingHooks``: autocast (enabled, dtype: observed when the forward pass entered it,
since it is already off when ``optimizer.step()`` runs), ``torch.compile`` calls, the
gradient scaler's state, the parameters the optimizers train (count and dtype); and torch's
global flags when the run trained with torch: ``cudnn.benchmark``, the TF32 flags and the
float32 matmul precision. Reading them never initialises CUDA. Keys are dotted
(``amp.dtype``) and sit beside ``--param`` keys, which win.
"""

from __future__ import annotations

import sys


def used_settings(hooks) -> dict:
    """Settings observed by ``hooks`` (a ``TrainingHooks``); {} when torch played no part."""
    settings: dict = {}
    if hooks.autocast:
        enabled = [(device, dtype) for (device, dtype, on) in hooks.autocast if on]
        settings["amp.autocast"] = bool(enabled)
        if enabled:
            settings["amp.dtype"] = ",".join(sorted({dtype for _, dtype in enabled}))
            settings["amp.device"] = ",".join(sorted({device for device, _ in enabled}))
    elif hooks.optimizers:
        settings["amp.autocast"] = False  # trained, never under autocast
    if hooks.compiled:
        settings["torch.compile"] = True
        settings["torch.compile.mode"] = ",".join(sorted({c["mode"] for c in hooks.compiled}))
    if hooks.scalers:
        scaler = next(iter(hooks.scalers.values()))
        settings["grad_scaler.enabled"] = bool(scaler.is_enabled())
        if scaler.is_enabled():
            settings["grad_scaler.scale"] = float(scaler.get_scale())
    if hooks.optimizers:
        infos = list(hooks.optimizers.values())
        settings["optimizer"] = ",".join(dict.fromkeys(i["class"] for i in infos))
        counted = [i for i in infos if "parameters" in i]
        if counted:
            settings["model.parameters"] = sum(i["parameters"] for i in counted)
            settings["model.dtype"] = ",".join(sorted({d for i in counted for d in i["dtypes"]}))
        settings.update(_torch_flags())
    requests = getattr(hooks, "requests", None)
    settings.update(serving_settings(hooks.activity.requests.records, requests.models if requests else {}))
    return settings


def serving_batch_size(records) -> dict:
    """``serving.batch_size`` of folded requests (``request_log.RequestRecord``): one size, or
    the sizes used (``"1,8"``); {} when none is known."""
    sizes = sorted({int(r.batch) for r in records if r.batch == r.batch})
    if not sizes:
        return {}
    return {"serving.batch_size": sizes[0] if len(sizes) == 1 else ",".join(map(str, sizes))}


def serving_settings(records, models: dict) -> dict:
    """What a serving run chose, as the request hooks saw it: the requests' batch size (from the
    folded ``records``; a child process folds nothing, so its run adds it: ``jobs/children_merge.py``), the
    served ``models``' class, dtypes and parameters, torch's intra-op threads; {} when the run
    served no request."""
    if not records and not models:
        return {}
    settings = serving_batch_size(records)
    models = [m for m in models.values() if "dtypes" in m]
    if models:
        settings["serving.model"] = ",".join(dict.fromkeys(m["class"] for m in models))
        settings["serving.dtype"] = ",".join(sorted({d for m in models for d in m["dtypes"]}))
        settings["serving.parameters"] = sum(m["parameters"] for m in models)
    torch = sys.modules.get("torch")
    try:
        settings["serving.threads"] = int(torch.get_num_threads())
    except Exception:  # noqa: BLE001 - a torch without it: the others stay
        pass
    return settings


def _torch_flags() -> dict:
    torch = sys.modules.get("torch")
    backends = getattr(torch, "backends", None)
    flags: dict = {}
    try:
        flags["cudnn.benchmark"] = bool(backends.cudnn.benchmark)
        flags["tf32.cudnn"] = bool(backends.cudnn.allow_tf32)
        flags["tf32.matmul"] = bool(backends.cuda.matmul.allow_tf32)
        flags["float32_matmul_precision"] = str(torch.get_float32_matmul_precision())
    except Exception:  # noqa: BLE001 - an older or newer torch without one of them: the others stay
        pass
    return flags


__all__ = ["serving_batch_size", "serving_settings", "used_settings"]
