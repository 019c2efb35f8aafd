"""Test helpers are imported one way, ``from tests.NAME import ...``: a helper loaded under two
module names (``fake_nvml`` and ``tests.fake_nvml``) is two modules with two sets of state."""

from __future__ import annotations

import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent
HELPERS = sorted(p.stem for p in TESTS.glob("*.py") if not p.stem.startswith(("test_", "conftest")))


def test_helpers_are_imported_from_the_tests_package_only():
    bare = re.compile(rf"^\s*(from|import)\s+({'|'.join(HELPERS)})\b", re.M)
    found = [f"{path.name}: {m.group(0).strip()}" for path in sorted(TESTS.glob("*.py"))
             for m in bare.finditer(path.read_text())]
    assert not found, found
