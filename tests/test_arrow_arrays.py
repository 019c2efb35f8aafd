"""``core/store/arrow_arrays.py`` and ``core/store/columns.py``: Arrow arrays built and read
without pandas (issue 22: the sampler process never imports it) hold what pyarrow's own
``pa.array`` / ``to_pandas`` would: the same values, nulls, NaN and dtypes."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest

from gpuprof_jupyter.core.store.arrow_arrays import array, to_numpy
from gpuprof_jupyter.core.store.columns import Columns

CASES = [
    ([1.5, None, math.nan, -2.0, 0.0], pa.float64()),
    ([3, None, -7, 2**40], pa.int64()),
    ([1, 2, 3], pa.int64()),
    ([True, False, None, True, True, False, True, False, True, True], pa.bool_()),
    (["gpu0", "host", None, "é"], pa.string()),
    ([], pa.float64()),
    ([], pa.bool_()),
]


@pytest.mark.parametrize("values, type", CASES)
def test_array_holds_what_pa_array_holds(values, type):
    built, expected = array(values, type), pa.array(values, type)
    built.validate(full=True)
    assert built.type == expected.type and built.null_count == expected.null_count
    assert [repr(v) for v in built.to_pylist()] == [repr(v) for v in expected.to_pylist()]  # NaN == NaN here


@pytest.mark.parametrize("values, type", [c for c in CASES if c[1] != pa.string()])
def test_to_numpy_reads_as_to_pandas_does_also_sliced_and_chunked(values, type):
    whole = pa.array(values, type)
    for arrow in (whole, whole[1:], pa.chunked_array([whole, whole[1:]], type)):
        got = to_numpy(arrow)
        frame = pa.table({"x": arrow}).to_pandas()["x"]
        if type == pa.bool_() and arrow.null_count:  # pandas: objects with None; here False
            expected = np.array([bool(v) for v in arrow.to_pylist()])
        else:
            expected = frame.to_numpy()
        assert got.dtype == expected.dtype and got.flags.writeable
        np.testing.assert_array_equal(got, expected)


def test_columns_count_rows_and_select_them():
    table = pa.table({"rank": pa.array([0, 1, 0], pa.int64()), "wait_s": pa.array([0.1, None, 0.3])})
    columns = Columns.of_table(table)
    assert len(columns) == 3 and "rank" in columns and "t" not in columns
    zero = columns.rows(columns["rank"] == 0)
    assert len(zero) == 2 and zero["wait_s"].tolist() == [0.1, 0.3]
    assert columns.frame()["wait_s"].isna().tolist() == [False, True, False]
    assert len(Columns({})) == 0


@pytest.mark.process
def test_none_of_it_imports_pandas():
    code = ("import sys, pyarrow as pa\n"
            "from gpuprof_jupyter.core.store.arrow_arrays import array, to_numpy\n"
            "from gpuprof_jupyter.core.store.columns import Columns\n"
            "a = array([1.0, None], pa.float64())\n"
            "Columns.of_table(pa.table({'x': a, 'b': array([True, None], pa.bool_())}))\n"
            "to_numpy(pa.chunked_array([a]))\n"
            "print('pandas' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "False"
