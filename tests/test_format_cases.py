"""Python and the JupyterLab extension print a value the same way: both formatters run over one
table of cases (tests/format_cases.json), and core/format.py's rule for missing values holds in
text, in coercion and in JSON."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from gpuprof_jupyter.core import format as fmt

ROOT = Path(__file__).resolve().parent.parent
CASES = json.loads((Path(__file__).with_name("format_cases.json")).read_text())
SPECIAL = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
TYPESCRIPT = ROOT / "labextension" / "node_modules" / "typescript"


def _args(case) -> list:
    return [SPECIAL.get(a, a) if isinstance(a, str) else a for a in case["args"]]


@pytest.mark.parametrize("case", CASES["cases"], ids=lambda c: f"{c['fn']}{c['args']}")
def test_python_prints_each_case(case):
    function = getattr(fmt, CASES["functions"][case["fn"]])
    assert function(*_args(case)) == case["out"]


@pytest.mark.process
def test_typescript_prints_each_case():
    """The extension's format.ts, transpiled by the labextension's own TypeScript and run by Node."""
    node = shutil.which("node")
    assert node and TYPESCRIPT.is_dir(), "needs Node and labextension/node_modules (make install builds them)"
    out = subprocess.run([node, str(ROOT / "tests" / "format_cases_ts.js"), str(TYPESCRIPT),
                          str(ROOT / "labextension" / "src" / "format.ts"), str(Path(__file__).with_name("format_cases.json"))],
                         check=True, capture_output=True, text=True, timeout=120).stdout
    got = [json.loads(line)["got"] for line in out.splitlines()]
    wrong = [(c["fn"], c["args"], c["out"], g) for c, g in zip(CASES["cases"], got) if g != c["out"]]
    assert len(got) == len(CASES["cases"]) and not wrong, wrong


def test_every_extension_formatter_has_cases():
    """A formatter added to format.ts without a Python twin and cases fails here."""
    source = (ROOT / "labextension" / "src" / "format.ts").read_text()
    exported = {line.split("function ", 1)[1].split("(", 1)[0] for line in source.splitlines()
                if line.startswith("export function ")}
    assert exported - {"fixed", "sparkline"} == set(CASES["functions"])
    assert {c["fn"] for c in CASES["cases"]} == set(CASES["functions"])


@pytest.mark.parametrize("value", [None, math.nan, math.inf, -math.inf, np.float32("nan"), np.float64("inf")])
def test_missing_is_one_rule(value):
    """None, NaN and infinities: "n/a" in text, None as a number, null in JSON."""
    assert fmt.missing(value)
    assert fmt.fmt_pct(value) == fmt.fmt_seconds(value) == fmt.fmt_bytes(value) == fmt.fmt_number(value) == "n/a"
    assert fmt.as_number(value) is None and fmt.as_float(value) is None
    assert json.dumps(fmt.json_safe({"v": value, "in": [value]}), allow_nan=False) == '{"v": null, "in": [null]}'


def test_coercion_keeps_ints_and_refuses_what_is_not_a_number():
    assert fmt.as_number(np.int64(64)) == 64 and type(fmt.as_number(np.int64(64))) is int
    assert fmt.as_number(Fraction(1, 4)) == 0.25 and fmt.as_number(True) is None and fmt.as_number("3") is None
    assert fmt.as_float("3.5") == 3.5 and fmt.as_float(True) is None and fmt.as_float("x") is None
    assert not fmt.missing(0) and not fmt.missing("text") and not fmt.missing(np.int32(3))


def test_json_safe_gives_plain_json():
    import pandas as pd

    data = {1: np.float32(0.5), "flag": np.bool_(True), "arr": np.array([1.0, np.nan]), "t": (1, pd.NA), "o": object}
    safe = fmt.json_safe(data)
    assert safe == {"1": 0.5, "flag": True, "arr": [1.0, None], "t": [1, None], "o": str(object)}
    json.dumps(safe, allow_nan=False)


def test_settings_print_one_way():
    assert [fmt.fmt_setting(v) for v in (True, False, None, 8, "fp16", fmt.NOT_RECORDED)] == \
        ["true", "false", "null", "8", "fp16", "not recorded"]


def test_signed_changes_and_points():
    assert fmt.fmt_change(0.25) == "+25 %" and fmt.fmt_change(-0.035, 1) == "-3.5 %" and fmt.fmt_change(None) == "n/a"
    assert fmt.fmt_points(12.5) == "+12.5 pts"


def test_a_number_in_a_fixed_unit():
    """``fmt_unit``: a setting as given, a clock's reading with fixed decimals, a short time with
    significant digits; never scaled, "n/a" when missing."""
    assert fmt.fmt_unit(0.5, "s") == "0.5 s" and fmt.fmt_unit(120.0, "s") == "120 s" and fmt.fmt_unit(90, "%") == "90 %"
    assert fmt.fmt_unit(12.3456, "s", 2) == "12.35 s" and fmt.fmt_unit(0.010123, "s", significant=3) == "0.0101 s"
    assert fmt.fmt_unit(3600, "s") == "3600 s" and fmt.fmt_unit(float("nan"), "s") == "n/a"
