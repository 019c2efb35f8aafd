"""A simulated GPU with the NVML source's interface, labelled "simulated" everywhere.

Runs in the sampler process.

Two modes:
* driven (plain ``sim``): each interval's ``sm_util`` is the share of that interval the loop
  spent inside reported steps (``step()``/``track()``) rather than waiting for data, and power
  and energy follow, so more DataLoader workers really raise it. Before the first report the
  simulated GPU is idle: no load is invented while nothing runs;
* scenario (``sim:SCENARIO``): a deterministic scenario plays, unless steps are reported.

Spec: ``sim``, ``sim:SCENARIO`` or ``sim:SCENARIO:NGPUS`` (e.g. ``sim:compute-bound:8``).
"""

from __future__ import annotations

import math
import time
from typing import Callable

from gpuprof_jupyter.core.config import DEFAULT_INTERVAL_S
from gpuprof_jupyter.core.format import GIB
from gpuprof_jupyter.core.sources.base import DeviceInfo, Reading, Tick

SCENARIOS = {
    "input-bound": "GPU waits for data: SM busy ~40 % of each second",
    "compute-bound": "GPU saturated: SM ~95 %",
    "throttled": "compute-bound, power-capped half the time (clocks drop)",
    "idle-gaps": "bursts of work separated by idle stretches of several seconds",
    "lagging": "compute-bound, but the last GPU runs at two thirds of the others' pace",
    "fp32": "compute-bound in fp32: SM ~95 %, tensor cores nearly idle",
    "amp": "compute-bound with mixed precision: SM ~95 %, tensor cores busy",
    "small-batch": "SM ~75 %, torch's allocator holds ~4 GiB of the 40 GiB",
    "shared": "compute-bound while another process also uses the GPUs",
}
# Metrics only some scenarios produce (tensor cores, torch allocator statistics).
_SCENARIO_METRICS = {
    "fp32": ["tensor_util"],
    "amp": ["tensor_util"],
    "small-batch": ["torch_mem_allocated_bytes", "torch_mem_reserved_bytes"],
}
DEFAULT_SCENARIO = "input-bound"

_POWER_LIMIT_W = 400.0
_IDLE_POWER_W = 60.0
_MEM_TOTAL = 40 * GIB
_SM_CLOCK_MAX = 1410.0


def parse_sim_spec(spec: str) -> tuple[str, int]:
    """``sim[:SCENARIO[:NGPUS]]`` -> (scenario, gpu count). ValueError names what is wrong."""
    parts = spec.split(":")
    if parts[0] != "sim" or len(parts) > 3:
        raise ValueError(f"not a simulated source spec: {spec!r} (expected sim[:SCENARIO[:NGPUS]])")
    scenario = parts[1] if len(parts) > 1 and parts[1] else DEFAULT_SCENARIO
    if scenario not in SCENARIOS:
        raise ValueError(f"unknown simulated scenario {scenario!r}; choose one of {', '.join(SCENARIOS)}")
    count = 1
    if len(parts) == 3:
        if not parts[2].isdigit() or not 1 <= int(parts[2]) <= 64:
            raise ValueError(f"simulated GPU count must be 1..64, got {parts[2]!r}")
        count = int(parts[2])
    return scenario, count


def _noise(i: int, k: int) -> float:
    """Deterministic pseudo-noise in [-1, 1] for tick i, device k."""
    x = math.sin(i * 12.9898 + k * 78.233) * 43758.5453
    return 2.0 * (x - math.floor(x)) - 1.0


class SimulatedSource:
    """Simulated GPUs. ``busy_share(start, end)`` comes from the kernel's step events.

    In the sampler process it is a *batched* source: the kernel's events arrive about four
    times a second, so ``read_batch`` produces one reading per interval up to the time they
    cover (``covered()``), each timestamped with the time it describes. ``read`` gives one
    reading of now (tests, benchmarks).
    """

    simulated = True

    def __init__(
        self,
        spec: str = "sim",
        busy_share: Callable[[float, float], float | None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        covered: Callable[[], float] | None = None,
        interval: float = DEFAULT_INTERVAL_S,
        wall_clock: Callable[[], float] = time.time,
        start: float | None = None,
    ) -> None:
        self.scenario, self.count = parse_sim_spec(spec)
        # plain "sim" is labelled as such: its load follows reported steps when there are any
        self.driven_only = spec.split(":")[1:2] in ([], [""])
        self.name = "sim" if self.driven_only else f"sim:{self.scenario}"
        self._busy_share = busy_share
        self._clock = clock
        self._wall_clock = wall_clock
        self._covered = covered or clock
        self.follows_events = covered is not None  # its readings wait for the kernel's events (read_batch)
        self.interval_s = float(interval)
        self._start = start  # the session's start: readings are computed from then, not from open()
        self._devices: list[DeviceInfo] = []
        self._t0 = 0.0
        self._last = 0.0
        self._tick = 0
        self._energy = [0.0] * self.count
        self._driven_seen = False  # steps were reported and the load followed them
        self._opened = False

    def open(self) -> list[DeviceInfo]:
        self._t0 = self._last = self._start if self._start is not None else self._clock()
        self._devices = [
            DeviceInfo(
                key=f"gpu{k}",
                kind="gpu",
                name="Simulated A100-SXM4-40GB (simulated)",
                index=k,
                uuid=f"GPU-simulated-{k:04d}",
                simulated=True,
                power_limit_w=_POWER_LIMIT_W,
                memory_total_bytes=float(_MEM_TOTAL),
            )
            for k in range(self.count)
        ]
        self._opened = True
        return self._devices

    def keep_only(self, keys: set[str]) -> None:
        """``--devices``: read only these simulated GPUs."""
        self._devices = [d for d in self._devices if d.key in keys]

    def _scenario_busy(self, t: float, k: int) -> float:
        """Scenario load in [0, 1] at t seconds since start on device k."""
        phase = t % 1.0
        if self.scenario == "input-bound":
            return 0.95 if phase < 0.4 else 0.03
        if self.scenario == "idle-gaps":
            return 0.95 if (t % 10.0) < 5.0 else 0.0
        if self.scenario == "lagging" and k == self.count - 1 and self.count > 1:
            return 0.62
        if self.scenario == "small-batch":
            return 0.78
        return 0.96  # compute-bound, throttled, lagging (other GPUs)

    def read(self) -> Reading:
        return self._reading(self._clock())

    def read_batch(self, final: bool = False) -> list[Tick]:
        """One reading per interval from the last one up to what the kernel's events cover;
        ``final``: the run ends, the last, shorter interval too."""
        limit = min(self._covered(), self._clock())
        offset = self._wall_clock() - self._clock()
        out = []
        while self._last + self.interval_s <= limit:
            end = self._last + self.interval_s
            out.append(Tick(end, end + offset, self._reading(end)))
        if final and limit > self._last + 1e-6:
            out.append(Tick(limit, limit + offset, self._reading(limit)))
        return out

    def take_gaps(self) -> list:
        return []  # computed, not observed: nothing is ever missed

    def _reading(self, now: float) -> Reading:
        dt = max(now - self._last, 1e-9)
        t = now - self._t0
        driven = self._busy_share(self._last, now) if self._busy_share else None
        self._driven_seen = self._driven_seen or driven is not None
        self._last = now
        self._tick += 1
        reading: Reading = {}
        for dev in self._devices:
            k = dev.index
            if driven is not None:
                busy = driven
            elif self.driven_only and self._busy_share is not None:
                busy = 0.0  # nothing reported yet: the loop has not started
            else:
                busy = self._scenario_busy(t, k)
            jitter = _noise(self._tick, k)
            sm = min(100.0, max(0.0, busy * 95.0 + 2.0 * jitter))
            throttled = self.scenario == "throttled" and (t % 20.0) >= 10.0
            clock_mhz = _SM_CLOCK_MAX * (0.78 if throttled else 1.0)
            power = _IDLE_POWER_W + (_POWER_LIMIT_W - _IDLE_POWER_W) * (sm / 100.0) * 0.9
            if throttled:
                power = _POWER_LIMIT_W * (0.99 + 0.01 * jitter)
            self._energy[k] += power * dt
            reasons = (0x4 if throttled else 0) | (0x1 if sm < 5 else 0)
            reading[dev.key] = {
                "sm_util": sm,
                "gpu_busy": min(100.0, busy * 100.0 * 1.05),
                "mem_bw_util": sm * 0.55,
                "power_w": power,
                "energy_j": self._energy[k],
                "gpu_mem_used_bytes": 14.5 * GIB + 64 * 1024**2 * jitter,
                "gpu_mem_total_bytes": float(_MEM_TOTAL),
                "gpu_temp_c": 35.0 + 40.0 * sm / 100.0,
                "sm_clock_mhz": clock_mhz if sm > 5 else 210.0,
                "mem_clock_mhz": 1215.0,
                "throttle_reasons": float(reasons),
                "pcie_tx_bytes_s": 2e8 * busy,
                "pcie_rx_bytes_s": 1.2e9 * busy,
            }
            if self.scenario in ("fp32", "amp"):
                reading[dev.key]["tensor_util"] = (2.0 if self.scenario == "fp32" else 62.0) * busy + jitter
            elif self.scenario == "small-batch":
                reading[dev.key].update({
                    "gpu_mem_used_bytes": 5.0 * GIB + 32 * 1024**2 * jitter,
                    "torch_mem_allocated_bytes": 3.5 * GIB + 32 * 1024**2 * jitter,
                    "torch_mem_reserved_bytes": 4.0 * GIB,
                })
        return reading

    def provenance(self) -> dict[str, dict[str, str]]:
        metrics = self.read_metric_names() + _SCENARIO_METRICS.get(self.scenario, [])
        return {dev.key: {m: "simulated" for m in metrics} for dev in self._devices}

    @staticmethod
    def read_metric_names() -> list[str]:
        return [
            "sm_util", "gpu_busy", "mem_bw_util", "power_w", "energy_j", "gpu_mem_used_bytes",
            "gpu_mem_total_bytes", "gpu_temp_c", "sm_clock_mhz", "mem_clock_mhz",
            "throttle_reasons", "pcie_tx_bytes_s", "pcie_rx_bytes_s",
        ]

    def notes(self) -> list[str]:
        """One note, once opened: the GPU is simulated, and what its load followed so far."""
        if not self._opened:
            return []
        if self._driven_seen:
            how = ("its load followed the reported training steps; driven mode" if self.driven_only else
                   f"{self.scenario} until steps were reported, then its load followed them; driven mode")
        elif self.driven_only and self._busy_share is not None:
            how = "its load follows reported steps; none were, so it stayed idle"
        else:
            how = f"{self.scenario} unless steps are reported"
        return [f"simulated GPU ({how}): these are not measurements"]

    def context(self) -> dict:
        context = {"simulated": True, "scenario": self.scenario, "driver_version": "simulated"}
        if self.scenario == "shared":
            context["other_gpu_processes"] = [  # counts only, like the real source: no PID, no name
                {"device": dev.key, "processes": 1, "used_memory_bytes": 8.0 * GIB} for dev in self._devices
            ]
        return context

    def close(self) -> None:
        pass
