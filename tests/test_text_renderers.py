"""The text renderers in render/ (issue 35 part 3): the one text-table builder and the texts that
moved there (``gpuprof list``'s listing, ``%gpuprofile status``, the export button's result)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from gpuprof_jupyter.render.listing_text import listing_text
from gpuprof_jupyter.render.pipeline_yaml import ExportResult
from gpuprof_jupyter.render.status_text import status_text
from gpuprof_jupyter.render.text_table import column_widths, text_table


def test_a_text_table_pads_each_column_to_its_widest_cell():
    rows = [("trial", "steps"), ("baseline", "12"), ("t1", "8")]
    assert text_table(rows) == ["trial     steps", "baseline  12", "t1        8"]
    assert text_table(rows, sep=" ", right=True) == ["   trial steps", "baseline    12", "      t1     8"]
    assert column_widths([("a", "bb"), ("ccc",)]) == [3, 2]


def test_a_wide_table_shown_in_groups_of_columns_lines_up_from_group_to_group():
    rows = [("metric", "base", "wide run name"), ("sm_util", "40 %", "90 %")]
    first, second = text_table(rows, sep=" | ", columns=[0, 1]), text_table(rows, sep=" | ", columns=[0, 2])
    assert first == ["metric  | base", "sm_util | 40 %"] and second == ["metric  | wide run name", "sm_util | 90 %"]


def test_the_listing_names_the_store_and_right_aligns_its_figures():
    rows = [{"name": "amp", "id": "a1", "status": "ok", "duration_s": 12.5, "sm_util_mean": 93.0, "energy_kwh": None,
             "source": "nvml", "simulated": False}]
    lines = listing_text(Path("/store"), rows).splitlines()
    assert lines[0] == "store /store: 1 experiment"
    assert lines[1].split() == ["name", "id", "status", "duration_s", "sm_util_mean", "energy_kwh"]
    assert lines[2].split() == ["amp", "a1", "ok", "12.5", "s", "93", "%", "n/a"] and len(lines[1]) == len(lines[2])
    assert listing_text(Path("/store"), []) == "no experiments in store /store"


def test_the_status_text_says_what_runs_and_what_is_missing():
    running = SimpleNamespace(name="amp", source="sim")
    text = status_text(Path("/store"), 3, running, 120, [], "no NVML library", None)
    assert text.splitlines() == ["store: /store (3 experiments)", "profiling: 'amp' (sim), 120 rows so far",
                                 "NVML: unavailable (no NVML library)", "sampler process: not running"]
    idle = status_text(Path("/s"), 0, None, 0, [{"key": "gpu0", "name": "A100"}], None, 4242)
    assert "profiling: nothing running" in idle and "NVML: gpu0 A100" in idle and "pid 4242" in idle


def test_the_export_result_escapes_what_it_shows():
    result = ExportResult(Path("p.yaml"), "train", "<b>x</b>", False, None,
                          changes=[("batch_size", 32, 64, "32 -> <64>")], warnings=["<script>"])
    html = result.to_html()
    assert "<b>x</b>" not in html and "&lt;script&gt;" in html and "32 -&gt; &lt;64&gt;" in html
