"""``--tune cfg.grad_accum=effective``: gradient accumulation that keeps the effective batch.

Runs in any process that holds a run: the kernel, or a script under ``gpuprof run``.

When the search tries another batch size, an opted-in accumulation field given the value
``effective`` follows it, so that batch x accumulation stays what the cell had (``batch_size``
32 with ``grad_accum`` 2 -> 64 with 1, 16 with 4): the optimizer sees the same effective
batch and only memory and speed change. A batch size that does not divide the effective batch
is not tried (docs/tune.md, "Out of memory").
"""

from __future__ import annotations

from gpuprof_jupyter.runtime.tune.spec import OptIn

EFFECTIVE = "effective"


def is_follower(opt: OptIn) -> bool:
    return opt.values == (EFFECTIVE,)


def _is_count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


class EffectiveBatch:
    """The accumulation field ``accum_key`` follows the batch field ``batch_key``."""

    def __init__(self, batch_key: str, accum_key: str, batch: int, accum: int) -> None:
        self.batch_key, self.accum_key = batch_key, accum_key
        self.batch, self.accum = batch, accum
        self.effective = batch * accum

    @classmethod
    def from_opt_ins(cls, opt_ins, current: dict) -> EffectiveBatch | None:
        """None without a follower; ValueError for one that cannot follow (no batch field, two
        batch fields, a current value that is not a count)."""
        followers = [o for o in opt_ins if is_follower(o)]
        if not followers:
            return None
        if len(followers) > 1:
            raise ValueError(f"--tune: only one field can be '{EFFECTIVE}'; got {', '.join(o.key for o in followers)}")
        accum = followers[0]
        batches = [o for o in opt_ins if not is_follower(o) and "batch" in o.path[-1].lower()]
        if len(batches) != 1:
            named = ", ".join(o.key for o in batches) or "none"
            raise ValueError(f"--tune {accum.key}={EFFECTIVE} keeps the effective batch of one opted-in batch-size "
                             f"field (e.g. --tune cfg.batch_size=32,64); batch-size fields opted in: {named}")
        batch = batches[0]
        for key in (batch.key, accum.key):
            if not _is_count(current.get(key)):
                raise ValueError(f"--tune {accum.key}={EFFECTIVE}: {key} must be a whole number >= 1 now; "
                                 f"it is {current.get(key)!r}")
        return cls(batch.key, accum.key, current[batch.key], current[accum.key])

    def fits(self, batch) -> bool:
        """Whether ``batch`` divides the effective batch (whole accumulation steps)."""
        return _is_count(batch) and self.effective % batch == 0

    def accumulation(self, batch: int) -> int:
        return self.effective // batch

    def follow(self, settings: dict, changed: dict) -> tuple[dict, dict]:
        """The trial's settings and changes with the accumulation that keeps the effective batch."""
        if self.batch_key not in settings:
            return settings, changed
        accum = self.accumulation(settings[self.batch_key])
        settings = {**settings, self.accum_key: accum}
        changed = {k: v for k, v in changed.items() if k != self.accum_key}
        if accum != self.accum:
            changed[self.accum_key] = (self.accum, accum)
        return settings, changed

    def largest_divisor(self, limit: int) -> int | None:
        """The largest batch <= ``limit`` that divides the effective batch (None below 1)."""
        return next((b for b in range(min(limit, self.effective), 0, -1) if self.effective % b == 0), None)


__all__ = ["EFFECTIVE", "EffectiveBatch", "is_follower"]
