"""Kernel level: a real ipykernel streams plot updates to IOPub while the cell executes."""

from __future__ import annotations

import pytest

from benchmarks.ui_traffic import run_profiled_cell

pytestmark = [pytest.mark.kernel, pytest.mark.timeout(180)]


def test_updates_reach_iopub_while_cell_runs_within_budget():
    # 10 s: the first update needs the sampler process, a hand-over and a live period (2-3 s
    # on a loaded machine); then one a second
    traffic = run_profiled_cell("import time\ntime.sleep(10)", "--source sim:compute-bound:8 --interval 0.01")
    assert not traffic.errors, traffic.errors
    assert traffic.updates_before_reply >= 5, traffic.to_dict()  # one a second (live_view.STREAM_PERIOD_S) while it runs
    assert traffic.first_update_s < traffic.duration_s - 3, traffic.to_dict()
    assert traffic.max_updates_in_window(1.0) <= 6, traffic.to_dict()
    live_s = traffic.last_update_s - traffic.first_update_s
    assert traffic.comm_bytes / max(live_s, 1.0) <= 50_000 * 1.5, traffic.to_dict()  # short run: startup burst
    assert traffic.ending_displayed and traffic.ending_has_png, traffic.to_dict()


def test_no_live_shows_summary_only():
    traffic = run_profiled_cell("x = 1", "--source sim --no-live")
    assert traffic.doc_updates == 0 and not traffic.errors
