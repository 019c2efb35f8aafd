"""How many examples a property test tries: the number its test names in the full suite, a
quarter of it (at least 10) in ``make test-fast``, which sets ``GPUPROF_QUICK_PROPERTIES=1`` to
stay under a minute on a loaded 2-core machine. Hypothesis is derandomized in both
(tests/conftest.py), so either run is the same every time; the full suite is the thorough one."""

from __future__ import annotations

import os

QUICK = os.environ.get("GPUPROF_QUICK_PROPERTIES") == "1"


def examples(full: int) -> int:
    """``full`` examples, or the fast loop's share of them."""
    return max(10, full // 4) if QUICK else full
