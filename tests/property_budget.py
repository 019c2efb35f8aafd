"""How many examples a property test tries: the number its test names in the full suite, a
quarter of it (at least 10) in ``make test-fast``, which sets ``GPUPROF_QUICK_PROPERTIES=1`` to
stay under a minute on a loaded 2-core machine, and at least the profile's under ``pytest
--hypothesis-profile=explore`` (tests/conftest.py: a test's own ``max_examples`` would otherwise
hold it back). Hypothesis is derandomized but for ``explore``, so the other runs are the same
every time; the full suite is the thorough one."""

from __future__ import annotations

import os

from hypothesis import settings

QUICK = os.environ.get("GPUPROF_QUICK_PROPERTIES") == "1"
EXPLORE = "explore"


def examples(full: int) -> int:
    """``full`` examples, the fast loop's share of them, or the explore profile's more."""
    if QUICK:
        return max(10, full // 4)
    explore = settings.get_profile(EXPLORE).max_examples
    return max(full, explore) if settings.default.max_examples == explore else full
