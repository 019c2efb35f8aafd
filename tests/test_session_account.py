"""The session record's accounting (core/analysis/session_account.py), with readings and marks made by hand."""

from __future__ import annotations

import json
import math

import pytest

from gpuprof_jupyter.core.analysis.session_account import MAX_ROWS, SessionAccount
from gpuprof_jupyter.render.session_timeline import idle_held, timeline_bundle

GIB = 1 << 30


def reading(busy=(0.0, 0.0), energy=(0.0, 0.0), own=(GIB, 0.0), power=(60.0, 60.0)):
    return {f"gpu{i}": {"gpu_busy": busy[i], "energy_j": energy[i], "own_gpu_mem_bytes": own[i], "power_w": power[i]}
            for i in range(len(busy))}


def feed(account, t, **kw):
    account.tick(t, 1000.0 + t, reading(**kw), "own_gpu_mem_bytes")


def test_cells_and_idle_stretches_are_accounted_by_overlap():
    account = SessionAccount(1.0, 0.0, 1000.0)
    feed(account, 0.0)
    feed(account, 1.0, energy=(50.0, 50.0))  # idle, 100 J
    account.cell_started(1.5, 1001.5, 3, "train(model)")
    feed(account, 2.0, busy=(100.0, 50.0), energy=(150.0, 100.0))  # half idle, half cell; 150 J
    feed(account, 3.0, busy=(100.0, 100.0), energy=(300.0, 250.0), own=(2 * GIB, 0.0))
    account.cell_ended(3.0, 1003.0, "ok", None)
    feed(account, 4.0, energy=(310.0, 260.0), own=(2 * GIB, 0.0))
    rows = account.rows()
    idle0, cell, idle1 = rows
    assert (idle0["kind"], cell["kind"], idle1["kind"]) == ("idle", "cell", "idle")
    assert cell["cell"] == 3 and cell["source"] == "train(model)" and cell["status"] == "ok"
    assert cell["duration_s"] == pytest.approx(1.5)
    # 0.5 s at 1.5 busy devices, then 1 s at 2 busy devices
    assert cell["gpu_busy_s"] == pytest.approx(0.5 * 1.5 + 2.0)
    assert cell["energy_j"] == pytest.approx(75.0 + 300.0)
    assert idle0["energy_j"] == pytest.approx(100.0 + 75.0)
    assert idle0["idle_s"] == pytest.approx(1.5) and idle0["gpu_busy_s"] == pytest.approx(0.5 * 1.5)
    assert cell["memory_held_bytes"] == 2 * GIB  # the reading at its end
    assert idle1["idle_s"] == pytest.approx(1.0)  # open: as far as the readings go
    assert idle_held(rows)[-1] is idle1


def test_a_gap_is_reported_never_counted_as_busy_and_energy_is_kept():
    account = SessionAccount(1.0, 0.0, 1000.0)
    account.cell_started(0.0, 1000.0, 1, "x")
    feed(account, 0.0)
    feed(account, 10.0, busy=(100.0, 100.0), energy=(500.0, 500.0))  # 10 s apart: a gap at 1 Hz
    account.cell_ended(10.0, 1010.0, "ok", "20261207-abc")
    feed(account, 11.0)
    cell = [r for r in account.rows() if r["kind"] == "cell"][0]
    assert cell["gap_s"] == pytest.approx(10.0)
    assert cell["gpu_busy_s"] is None  # nothing seen: unknown, not 0
    assert cell["energy_j"] == pytest.approx(1000.0)  # the counter measured it
    assert cell["experiment"] == "20261207-abc"
    assert account.gaps


def test_idle_while_held_counts_from_the_last_busy_reading():
    account = SessionAccount(1.0, 0.0, 1000.0)
    account.cell_started(0.0, 1000.0, 1, "load()")
    feed(account, 1.0, busy=(90.0, 0.0))
    account.cell_ended(1.0, 1001.0, "ok", None)
    feed(account, 2.0, busy=(80.0, 0.0))  # an async kernel still running after the cell
    feed(account, 3.0)
    state = account.idle_held(603.0)
    assert state["idle_s"] == pytest.approx(601.0) and state["memory_held_bytes"] == GIB
    account.cell_started(603.0, 1603.0, 2, "y")
    assert account.idle_held(604.0)["idle_s"] == 0.0  # a cell runs


def test_the_record_stays_bounded_for_a_week():
    account = SessionAccount(1.0, 0.0, 0.0)
    step = 30.0  # a reading each 30 s stands for the week's 1 Hz readings (the buckets are what is bounded)
    t = 0.0
    cells = 0
    while t < 7 * 24 * 3600:
        if int(t) % 600 == 0:
            account.cell_started(t, t, cells, "c")
            cells += 1
        account.tick(t, t, reading(busy=(50.0, 0.0)), "own_gpu_mem_bytes")
        if int(t) % 600 == 300:
            account.cell_ended(t, t, "ok", None)
        t += step
    account.interval_s = step
    body = account.to_dict(t)
    assert len(body["timeline"]["t"]) <= 3000
    assert len(body["rows"]) <= MAX_ROWS + 2
    assert len(json.dumps(body)) < 2_000_000


def test_without_gpu_readings_stretches_carry_times_only():
    account = SessionAccount(1.0, 0.0, 1000.0, no_readings=True)
    account.cell_started(1.0, 1001.0, 1, "print(1)")
    account.cell_ended(2.0, 1002.0, "ok", None)
    cell = [r for r in account.rows() if r["kind"] == "cell"][0]
    assert cell["duration_s"] == pytest.approx(1.0)
    assert cell["gpu_busy_s"] is None and cell["energy_j"] is None and cell["memory_held_bytes"] is None


def test_the_timeline_shows_cells_idle_held_and_profiled_links():
    account = SessionAccount(1.0, 0.0, 1000.0)
    feed(account, 0.0)
    account.cell_started(0.5, 1000.5, 7, "train()  # <b>")
    feed(account, 1.0, busy=(100.0, 0.0))
    account.cell_ended(1.2, 1001.2, "ok", "20261207T0000-aaaaaa")
    feed(account, 2.0)
    feed(account, 3.0)
    body = {**account.to_dict(3.0), "on": True, "interval_s": 1.0}
    bundle = timeline_bundle(body)
    assert "%gpuprofile show 20261207T0000-aaaaaa" in bundle["text/plain"]
    assert "[7] train()" in bundle["text/plain"]
    assert "train()  # &lt;b&gt;" in bundle["text/html"]  # the user's text is escaped
    assert "GPU idle, memory held" in bundle["text/html"]  # the Bokeh item names the marked stretches
    assert not math.isnan(body["rows"][1]["gpu_busy_s"])
