"""What a run cost: energy at a price per kWh plus GPU time at a price per GPU-hour.

Runs in any process (core).

Prices come from ``prices=`` (a ``Prices`` or a dict with ``kwh``, ``gpu_hour``, ``currency``),
else from the environment (``GPUPROF_PRICE_KWH``, ``GPUPROF_PRICE_GPU_HOUR``,
``GPUPROF_CURRENCY``, default ``$``) or the config file's ``[prices]`` (config.py). A price that is not set is left out of the total; with
no price at all the cost is missing (None), never a 0 that looks real.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpuprof_jupyter.core.analysis.summary import summary_of


@dataclass(frozen=True)
class Prices:
    kwh: float | None = None  # currency per kWh of GPU energy
    gpu_hour: float | None = None  # currency per GPU-hour (duration x GPU count)
    currency: str = "$"

    @property
    def any(self) -> bool:
        return self.kwh is not None or self.gpu_hour is not None


def _price(value, what: str) -> float | None:
    if value is None or value == "":
        return None
    try:
        price = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be a number, got {value!r}") from None
    if not math.isfinite(price) or price < 0:
        raise ValueError(f"{what} must be a finite number >= 0, got {value!r}")
    return price


def resolve_prices(prices=None, environ=None) -> Prices:
    """``prices=`` argument first, then GPUPROF_PRICE_KWH / GPUPROF_PRICE_GPU_HOUR."""
    if isinstance(prices, Prices):
        return prices
    from gpuprof_jupyter.core.config import load_config

    env = load_config(environ=environ).prices  # GPUPROF_PRICE_* or the config file's [prices]
    given = dict(prices or {})
    unknown = set(given) - {"kwh", "gpu_hour", "currency"}
    if unknown:
        raise ValueError(f"prices= takes kwh, gpu_hour and currency; unknown: {', '.join(sorted(unknown))}")
    return Prices(
        kwh=_price(given.get("kwh", env.get("kwh")), "price per kWh"),
        gpu_hour=_price(given.get("gpu_hour", env.get("gpu_hour")), "price per GPU-hour"),
        currency=str(given.get("currency", env.get("currency") or "$")),
    )


def gpu_hours(experiment) -> float | None:
    meta = experiment.meta
    count = len(meta.gpu_devices)
    if not count or meta.duration_s is None:
        return None
    return meta.duration_s * count / 3600.0


def run_cost(experiment, prices=None) -> dict:
    """``{"energy": .., "gpu_time": .., "total": .., "currency": .., "gpu_hours": .., "kwh": ..}``.

    Parts are None where the price or the measurement is missing; ``total`` is None when no
    part could be priced.
    """
    p = resolve_prices(prices)
    kwh = summary_of(experiment).get("overall", {}).get("energy_kwh")
    hours = gpu_hours(experiment)
    energy = p.kwh * kwh if p.kwh is not None and kwh is not None else None
    gpu_time = p.gpu_hour * hours if p.gpu_hour is not None and hours is not None else None
    parts = [x for x in (energy, gpu_time) if x is not None]
    return {
        "energy": energy,
        "gpu_time": gpu_time,
        "total": sum(parts) if parts else None,
        "currency": p.currency,
        "gpu_hours": hours,
        "kwh": kwh,
    }
