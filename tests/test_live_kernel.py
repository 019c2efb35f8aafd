"""Kernel level: a real ipykernel streams plot updates to IOPub while the cell executes."""

from __future__ import annotations

import pytest

from benchmarks.ui_traffic import run_profiled_cell

pytestmark = [pytest.mark.kernel, pytest.mark.timeout(180)]


def test_updates_reach_iopub_while_cell_runs_within_budget(tmp_path):
    """The cell runs until the fifth plot update has reached IOPub (at most 2 minutes, a bound
    for a broken live view): updates that came only at the cell's end would leave it short."""
    enough = tmp_path / "five-updates"
    cell = (f"import os, time\nfor _ in range(2400):\n    if os.path.exists({str(enough)!r}): break\n"
            "    time.sleep(0.05)")

    def on_update(count: int) -> None:
        if count >= 5:
            enough.touch()

    traffic = run_profiled_cell(cell, "--source sim:compute-bound:8 --interval 0.01", on_update=on_update)
    assert not traffic.errors, traffic.errors
    assert traffic.updates_before_reply >= 5, traffic.to_dict()  # one a second (live_view.STREAM_PERIOD_S) while it runs
    assert traffic.max_updates_in_window(1.0) <= 6, traffic.to_dict()
    live_s = traffic.last_update_s - traffic.first_update_s
    assert traffic.comm_bytes / max(live_s, 1.0) <= 50_000 * 1.5, traffic.to_dict()  # short run: startup burst
    assert traffic.ending_displayed and traffic.ending_has_png, traffic.to_dict()


def test_no_live_shows_summary_only():
    traffic = run_profiled_cell("x = 1", "--source sim --no-live")
    assert traffic.doc_updates == 0 and not traffic.errors
