"""What the NVML source does when a call stops working: the fallback state machine.

Runs in the sampler process, and in the Jupyter server for its device list; never in the kernel.

A failure of kind NotSupported, NoPermission, FunctionNotFound or InvalidArgument
(:data:`.query.PERMANENT`) drops the reader's metrics for the session with one note, or
falls back where the metric contract has a fallback:

* GPM (whole sampling, or one metric) -> NVML ``utilization.gpu``/``.memory`` for ``sm_util``
  and ``mem_bw_util``, the PCIe slow lane for ``pcie_*``; ``sm_occupancy``/``tensor_util``
  are dropped;
* the FieldValues batch (instant power + energy counter) -> ``nvmlDeviceGetPowerUsage`` and
  ``nvmlDeviceGetTotalEnergyConsumption``; no energy counter at all -> the integral of
  ``power_w`` (tag ``integral.power_w``);
* ``nvmlDeviceGetTemperature`` / ``...ClocksEventReasons`` missing from an old driver
  (FunctionNotFound) -> ``nvmlDeviceGetTemperatureV`` / ``...ClocksThrottleReasons``.

Other kinds are transient: the metric is missing from that sample, with one note, and
retried. Changes take effect in the same sample: the source runs readers added here at once.
"""

from __future__ import annotations

from typing import Any, Callable

import pynvml

from gpuprof_jupyter.core.sources.nvml import query as q
from gpuprof_jupyter.core.sources.nvml.device import NvmlDevice, Reader, fed_by
from gpuprof_jupyter.core.sources.nvml.readers import FI_ENERGY, FI_POWER, READERS

_REASONS = {
    q.NOT_SUPPORTED: "not supported by this GPU",
    q.NO_PERMISSION: "not permitted for this user",
    q.INVALID: "not available on this device",
}

# reader -> the reader taking over when the driver's NVML library lacks the first one's function
_OLDER_FUNCTION = {"temp": "temp_v", "throttle": "throttle_old"}


class Fallbacks:
    """Applies failures to a device's record.

    Args:
        note: adds one note (the source's notebook; called from the slow lane thread too).
        need_slow_lane: called when a device moved PCIe throughput to the slow lane.
    """

    def __init__(self, note: Callable[[str], None], need_slow_lane: Callable[[], None]) -> None:
        self._note = note
        self._need_slow_lane = need_slow_lane

    # -------------------------------------------------------------- entry points
    def failed(self, dev: NvmlDevice, reader: Reader, failure: q.NvmlFailure) -> None:
        """A reader's call failed (not GPU-lost: the source handles that)."""
        kind, fn, err = failure.kind, failure.function, failure.error
        if kind not in q.PERMANENT:
            what = ", ".join(fed_by(dev, reader)) or reader.name
            self._note(f"{dev.key}: {what} missing at times ({failure}); retried each sample")
            return
        name = reader.name
        if kind == q.FUNCTION_NOT_FOUND and name in _OLDER_FUNCTION:
            older = READERS[_OLDER_FUNCTION[name]]
            if name == "throttle":
                dev.tags["throttle_reasons"] = "nvml.clocks_throttle_reasons"
            dev.replace_reader(name, older)
            return
        if name == "gpm":
            self.gpm_failed(dev, f"{fn}: {err}")
            return
        metrics = fed_by(dev, reader)
        dev.remove_reader(name)
        if name == "util":
            dev.util_ok = dev.util_sm = dev.util_mem = False
        elif name == "fields":  # the whole FieldValues call: both fall back to functions
            ids = dev.field_ids
            dev.set_fields([])
            if FI_POWER in ids:
                self._power_fallback(dev, f"{fn}: {err}")
            if FI_ENERGY in ids:
                self._energy_fallback(dev)
            return
        elif name == "power_usage" and dev.energy.mode == "integral":
            dev.energy.mode = None
            metrics.append("energy_j")
        elif name == "energy":
            self._energy_to_integral(dev, fn, kind, err)
            return
        self.drop(dev, metrics, fn, kind, err)

    def partly_failed(self, dev: NvmlDevice, reader: Reader, failures: list, out: dict) -> None:
        """A batched call answered, but some of its items failed: ``[(item, NVML code)]``."""
        for item, code in failures:
            if reader.name == "fields":
                self._field_failed(dev, item, code)
            else:
                for moved in self._gpm_metric_failed(dev, item, code):
                    out.pop(moved, None)  # PCIe RX leaves GPM with TX: not half from each API

    def drop(self, dev: NvmlDevice, metrics: list[str], function: str, kind: str, error: Any) -> None:
        """Drop metrics of a device for the session, with one note."""
        for metric in metrics:
            if dev.ticks == 0:  # never produced a value: no provenance to keep
                dev.tags.pop(metric, None)
        names = ", ".join(metrics)
        if kind == q.FUNCTION_NOT_FOUND:
            # the same for every GPU: one note, without a device key
            self._note(
                f"{names}: {function} is missing from this driver's NVML library (Function Not "
                f"Found); dropped on every GPU (a newer driver has it)"
            )
        else:
            self._note(f"{dev.key}: {names} {_REASONS.get(kind, 'unavailable')} ({function}: {error}); dropped")

    # ------------------------------------------------------------ power, energy
    def _field_failed(self, dev: NvmlDevice, field_id: int, ret: int) -> None:
        error = pynvml.NVMLError(ret)
        kind = q.classify(error)
        if kind == q.LOST:
            raise q.NvmlFailure(kind, "nvmlDeviceGetFieldValues", error)
        if kind not in q.PERMANENT:
            return  # missing this time
        dev.set_fields([f for f in dev.field_ids if f != field_id])
        if not dev.field_ids:
            dev.remove_reader("fields")
        if field_id == FI_POWER:
            self._power_fallback(dev, f"field NVML_FI_DEV_POWER_INSTANT: {error}")
        else:
            self._energy_fallback(dev)

    def _power_fallback(self, dev: NvmlDevice, why: str) -> None:
        dev.tags["power_w"] = "nvml.power_usage" + dev.whole
        dev.add_reader(READERS["power_usage"])
        self._note(
            f"{dev.key}: instant power not available ({why}); power_w is nvmlDeviceGetPowerUsage, "
            f"a 1 s average on Ampere and newer"
        )

    def _energy_fallback(self, dev: NvmlDevice) -> None:
        # The field and the function read the same counter; try the function before integrating.
        dev.tags["energy_j"] = "nvml.total_energy" + dev.whole
        dev.add_reader(READERS["energy"])

    def _energy_to_integral(self, dev: NvmlDevice, function: str, kind: str, error: Any) -> None:
        if FI_POWER not in dev.field_ids and not dev.has_reader("power_usage"):
            dev.energy.mode = None
            self.drop(dev, ["energy_j"], function, kind, error)
            return
        dev.energy.mode = "integral"
        dev.tags["energy_j"] = "integral.power_w" + dev.whole
        self._note(
            f"{dev.key}: no energy counter ({function}: {error}); energy_j is the integral of "
            f"power_w over time (gaps not integrated)"
        )

    # ---------------------------------------------------------------------- GPM
    def gpm_failed(self, dev: NvmlDevice, why: str) -> None:
        """GPM sampling itself failed for good: fall back to NVML utilization where we can."""
        dev.remove_reader("gpm")
        metrics = list(dev.gpm.names)
        dev.gpm.free()
        dev.gpm.metrics = dev.gpm.names = ()
        for metric in metrics:
            self._gpm_metric_fallback(dev, metric)
        dropped = [m for m in metrics if dev.tags.get(m, "gpm").startswith("gpm")]
        moved = [f"{m} -> {dev.tags[m]}" for m in metrics if m not in dropped]
        if dev.ticks == 0:
            for m in dropped:
                dev.tags.pop(m, None)
        parts = [f"{dev.key}: GPM unavailable ({why})"]
        if dropped:
            parts.append(f"{', '.join(dropped)} dropped")
        if moved:
            parts.append(f"falling back: {', '.join(moved)}")
        self._note("; ".join(parts))
        self._need_slow_lane()

    def _gpm_metric_fallback(self, dev: NvmlDevice, metric: str) -> None:
        if metric == "sm_util" and dev.util_ok:
            dev.util_sm = True
            dev.tags["sm_util"] = "nvml.utilization.gpu"
        elif metric == "mem_bw_util" and dev.util_ok:
            dev.util_mem = True
            dev.tags["mem_bw_util"] = "nvml.utilization.memory"
        elif metric.startswith("pcie_") and not dev.is_mig:
            dev.pcie_slow = True
            dev.tags["pcie_tx_bytes_s"] = dev.tags["pcie_rx_bytes_s"] = "nvml.pcie_throughput"

    def _gpm_metric_failed(self, dev: NvmlDevice, metric: str, code: int) -> set[str]:
        """Drop (or fall back) a GPM metric that failed; the metrics taken off GPM with it."""
        error = pynvml.NVMLError(code)
        kind = q.classify(error)
        if kind not in q.PERMANENT or metric not in dev.gpm.names:
            return set()
        gone = {metric}
        if metric.startswith("pcie_"):  # TX and RX come from one API, never half from each
            gone |= {"pcie_tx_bytes_s", "pcie_rx_bytes_s"}
        keep = [(m, mid, s) for (m, s), mid in zip(dev.gpm.metrics, dev.gpm.ids) if m not in gone]
        before = dev.tags.get(metric)
        self._gpm_metric_fallback(dev, metric)
        if dev.tags.get(metric) != before:
            self._note(f"{dev.key}: GPM {metric} {_REASONS.get(kind, 'unavailable')} ({error}); falling back to {dev.tags[metric]}")
            self._need_slow_lane()
        else:
            self.drop(dev, [metric], "nvmlGpmMetricsGet", kind, error)
        if keep:
            dev.gpm.set_metrics(keep)
        else:
            dev.remove_reader("gpm")
            dev.gpm.free()
            dev.gpm.metrics = dev.gpm.names = ()
        return gone - {metric}
