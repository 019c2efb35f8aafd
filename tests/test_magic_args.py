"""Issue 10 part 3: one pair of matching quotes leaves every value the magic takes, in one place."""

from __future__ import annotations

import pytest
from IPython.core.error import UsageError

from gpuprof_jupyter.notebook.cell_options import session_options
from gpuprof_jupyter.notebook.magic import parse_line


def test_quotes_are_stripped_from_every_value(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # --store 'my store' is made here
    args = parse_line("""-n "amp run" --store 'my store' --check "sm_util > 60 for >=80%" """
                      """--check 'sm_util < 50 for <=30% in phase "data loading"' --param note="a b" """
                      """--param batch_size='64' --capture x --source 'sim' --devices "0" """)
    options = session_options(args)
    assert options.name == "amp run" and str(options.store.root) == "my store"
    assert [r.text for r in options.checks] == ["sm_util > 60 for >=80%", 'sm_util < 50 for <=30% in phase "data loading"']
    assert options.params == {"note": "a b", "batch_size": 64}
    assert options.source == "sim" and options.devices == [0] and args.capture == ["x"]


def test_backslashes_stay_and_an_open_quote_is_a_usage_error():
    assert parse_line(r"--store C:\runs\gpu -n x").store == r"C:\runs\gpu"
    with pytest.raises(UsageError, match="No closing quotation"):
        parse_line('-n "amp run')


def test_an_unwritable_store_is_a_usage_error_before_the_cell_runs(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(UsageError, match=r"--store .*a-file/runs: cannot write there .*the cell did not run"):
        session_options(parse_line(f"--store {blocker}/runs"))
    ok = session_options(parse_line(f"--store {tmp_path}/runs")).store
    assert ok.root.is_dir() and list(ok.root.iterdir()) == []  # made as a run makes it, nothing left in it
