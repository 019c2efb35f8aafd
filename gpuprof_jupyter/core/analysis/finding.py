"""A finding: what held a run back, the evidence in numbers and a next step.

Runs in any process (core).

Made by the checks of ``diagnosis.py`` (training) and ``serving_findings.py`` (serving).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class Finding:
    id: str  # "input-bound", "compute-bound-fp32" ("gpu-busy-fp32" on kernel-active time), "memory-underused",
    #           "throttled", "idle-gaps", "lagging-gpu", "too-short" (no finding from that metric), ...
    title: str
    severity: str  # "high", "medium", "info"
    evidence: str  # what was measured, in numbers
    next_step: str  # what to try
    numbers: dict = field(default_factory=dict)
    # drawn from a simulated run: its GPU figures are the simulator's, and every view says so
    # ("(simulated)" after the title: ``headline``); diagnose() sets it
    simulated: bool = False

    @property
    def headline(self) -> str:
        """The title as every view prints it: with "(simulated)" when drawn from a simulated run."""
        return self.title + (" (simulated)" if self.simulated else "")

    def to_dict(self) -> dict:
        return asdict(self)


__all__ = ["Finding"]
