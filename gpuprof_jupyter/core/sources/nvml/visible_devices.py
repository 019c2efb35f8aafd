"""Which GPUs this process sees: ``CUDA_VISIBLE_DEVICES`` matched to NVML devices by UUID.

Runs in the sampler process and the Jupyter server; never in the kernel.

CUDA's rules, followed here:

* unset: every GPU; set to ``""`` (or anything whose first entry is invalid, like ``-1``):
  none;
* a comma list of entries, each an index (``0``), a GPU UUID ``GPU-<uuid>`` (any unique
  prefix of it, as CUDA accepts), or a MIG device UUID ``MIG-<uuid>`` (or the legacy
  ``MIG-GPU-<uuid>/<gpu instance>/<compute instance>``);
* parsing stops at the first invalid entry: the devices before it stay visible.

NVML enumerates GPUs in PCI bus order; CUDA's indices follow that order only with
``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (default ``FASTEST_FIRST``), which is why matching is by
UUID and a note warns when indices may differ.

:func:`parse_cuda_visible_devices` and :func:`select_visible` are pure (testable without
NVML); :func:`enumerate_nvml_devices` reads NVML through :mod:`.query`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import pynvml

from gpuprof_jupyter.core.sources.nvml import query as q

_LEGACY_MIG = re.compile(r"^MIG-(GPU-[0-9A-Fa-f-]+)/(\d+)/(\d+)$")


@dataclass(frozen=True)
class NvmlMig:
    """A MIG device (slice) of a GPU in MIG mode."""

    uuid: str
    handle: Any
    parent_index: int  # NVML index of the parent GPU
    mig_index: int  # index for nvmlDeviceGetMigDeviceHandleByIndex
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    name: str = ""


@dataclass(frozen=True)
class NvmlGpu:
    """A physical GPU as NVML enumerates it (PCI bus order)."""

    index: int
    uuid: str | None
    handle: Any
    name: str = ""
    mig_enabled: bool = False
    migs: tuple[NvmlMig, ...] = ()


@dataclass(frozen=True)
class VisibleDevice:
    """A device this process sees, in CUDA_VISIBLE_DEVICES order."""

    visible_index: int
    gpu: NvmlGpu  # the physical GPU (the parent, for a MIG slice)
    mig: NvmlMig | None = None

    @property
    def uuid(self) -> str | None:
        return self.mig.uuid if self.mig else self.gpu.uuid

    @property
    def handle(self) -> Any:
        return self.mig.handle if self.mig else self.gpu.handle


@dataclass
class Selection:
    devices: list[VisibleDevice]
    notes: list[str] = field(default_factory=list)


def parse_cuda_visible_devices(value: str | None) -> list[str] | None:
    """Entries of ``CUDA_VISIBLE_DEVICES`` up to the first invalid one; None when unset.

    Entries come back stripped: ``"3"``, ``"GPU-8e2f"``, ``"MIG-..."``. ``""`` and ``"-1"``
    give ``[]`` (no device). Whether an index or UUID exists is checked later, by
    :func:`select_visible`.
    """
    if value is None:
        return None
    entries: list[str] = []
    for raw in value.split(","):
        entry = raw.strip()
        if entry.isdigit() and entry.isascii():
            entries.append(str(int(entry)))
        elif entry.startswith("GPU-") and len(entry) > 4:
            entries.append(entry)
        elif entry.startswith("MIG-") and len(entry) > 4:
            entries.append(entry)
        else:
            break  # CUDA stops at the first invalid entry ("-1", "", "foo")
    return entries


def _by_prefix(prefix: str, candidates: list[tuple[str, Any]]) -> tuple[Any, str | None]:
    """The one candidate whose UUID starts with ``prefix`` (case-insensitive), else a reason."""
    p = prefix.lower()
    hits = [obj for uuid, obj in candidates if uuid.lower().startswith(p)]
    if len(hits) == 1:
        return hits[0], None
    return None, ("matches no device" if not hits else f"matches {len(hits)} devices (ambiguous)")


def select_visible(
    value: str | None,
    gpus: list[NvmlGpu],
    device_order: str | None = None,
) -> Selection:
    """Devices visible under ``CUDA_VISIBLE_DEVICES=value``, matched to NVML ``gpus``.

    Stops at the first entry that names no device (out-of-range index, unknown or ambiguous
    UUID prefix, a device named twice), like CUDA; notes say why.
    """
    notes: list[str] = []
    entries = parse_cuda_visible_devices(value)
    if entries is None:
        chosen: list[tuple[NvmlGpu, NvmlMig | None]] = [(g, None) for g in gpus if g.handle is not None]
        used_index = True
    else:
        parts = value.split(",")
        if len(entries) < len(parts) and value.strip():
            bad = parts[len(entries)].strip()
            notes.append(
                f"CUDA_VISIBLE_DEVICES={value!r}: entry {bad!r} is not a device index or "
                f"GPU-/MIG- UUID; CUDA ignores it and everything after it"
            )
        gpu_uuids = [(g.uuid, g) for g in gpus if g.uuid and g.handle is not None]
        mig_uuids = [(m.uuid, (g, m)) for g in gpus for m in g.migs if m.uuid]
        chosen = []
        seen: set[str] = set()
        used_index = False
        for entry in entries:
            target: tuple[NvmlGpu, NvmlMig | None] | None = None
            why = "matches no device"
            if entry.isdigit():
                used_index = True
                idx = int(entry)
                match = next((g for g in gpus if g.index == idx and g.handle is not None), None)
                target = (match, None) if match else None
                if match is None:
                    why = f"index out of range ({len(gpus)} GPUs)"
            elif entry.startswith("GPU-"):
                match, why = _by_prefix(entry, gpu_uuids)
                target = (match, None) if match else None
            else:
                legacy = _LEGACY_MIG.match(entry)
                if legacy:
                    parent, why = _by_prefix(legacy.group(1), gpu_uuids)
                    gi, ci = int(legacy.group(2)), int(legacy.group(3))
                    mig = None
                    if parent is not None:
                        mig = next(
                            (m for m in parent.migs
                             if m.gpu_instance_id == gi and m.compute_instance_id in (ci, None)),
                            None,
                        )
                        why = "names no MIG device of that GPU"
                    target = (parent, mig) if mig else None
                else:
                    target, why = _by_prefix(entry, mig_uuids)
            if target is None:
                notes.append(
                    f"CUDA_VISIBLE_DEVICES entry {entry!r} {why}; CUDA ignores it and everything after it"
                )
                break
            uuid = target[1].uuid if target[1] else target[0].uuid
            if uuid in seen:
                notes.append(
                    f"CUDA_VISIBLE_DEVICES names {uuid} twice; entries from the repeat on are ignored"
                )
                break
            seen.add(uuid)
            chosen.append(target)
    devices = [VisibleDevice(i, g, m) for i, (g, m) in enumerate(chosen)]
    for dev in devices:
        if dev.mig is None and dev.gpu.mig_enabled:
            notes.append(
                f"gpu{dev.visible_index} ({dev.gpu.uuid}) is in MIG mode: whole-GPU utilization is "
                f"not reported; name its MIG- UUIDs in CUDA_VISIBLE_DEVICES to profile the slices"
            )
    names = {g.name for g in gpus}
    if used_index and len(names) > 1 and (device_order or "FASTEST_FIRST") != "PCI_BUS_ID":
        notes.append(
            "GPUs of different models and CUDA_DEVICE_ORDER is not PCI_BUS_ID: CUDA's device "
            "indices may differ from NVML's (and from these gpuN keys); set "
            "CUDA_DEVICE_ORDER=PCI_BUS_ID or use GPU- UUIDs in CUDA_VISIBLE_DEVICES"
        )
    return Selection(devices, notes)


def enumerate_nvml_devices(with_migs: bool = True) -> list[NvmlGpu]:
    """Every GPU NVML sees (PCI bus order), with its MIG devices when in MIG mode.

    A GPU NVML cannot open (``nvmlDeviceGetHandleByIndex`` fails, e.g. NoPermission for a
    GPU outside this container) is kept with ``handle=None`` so indices stay NVML's.
    Raises :class:`~.query.NvmlFailure` only when the count itself fails.
    """
    count = q.query(pynvml.nvmlDeviceGetCount)
    gpus: list[NvmlGpu] = []
    for i in range(count):
        try:
            handle = q.query(pynvml.nvmlDeviceGetHandleByIndex, i)
        except q.NvmlFailure:
            gpus.append(NvmlGpu(i, None, None))
            continue
        uuid = q.query_or(None, pynvml.nvmlDeviceGetUUID, handle)
        name = q.query_or("", pynvml.nvmlDeviceGetName, handle)
        mode = q.query_or(None, pynvml.nvmlDeviceGetMigMode, handle)
        mig_enabled = bool(mode) and mode[0] == pynvml.NVML_DEVICE_MIG_ENABLE
        migs: list[NvmlMig] = []
        if mig_enabled and with_migs:
            for j in range(q.query_or(0, pynvml.nvmlDeviceGetMaxMigDeviceCount, handle)):
                mh = q.query_or(None, pynvml.nvmlDeviceGetMigDeviceHandleByIndex, handle, j)
                if mh is None:
                    continue  # slot not populated (NVML_ERROR_NOT_FOUND)
                migs.append(
                    NvmlMig(
                        uuid=q.query_or("", pynvml.nvmlDeviceGetUUID, mh),
                        handle=mh,
                        parent_index=i,
                        mig_index=j,
                        gpu_instance_id=q.query_or(None, pynvml.nvmlDeviceGetGpuInstanceId, mh),
                        compute_instance_id=q.query_or(None, pynvml.nvmlDeviceGetComputeInstanceId, mh),
                        name=q.query_or("", pynvml.nvmlDeviceGetName, mh),
                    )
                )
        gpus.append(NvmlGpu(i, uuid, handle, name, mig_enabled, tuple(migs)))
    return gpus
