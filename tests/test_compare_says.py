"""Comparisons say what they mean: equal is "same", a value one run did not record is "not
recorded" (never a change), booleans and missing values print one way in the report, the
comparison and the text, ``compare()`` without names takes the last two runs and says so, and
the text fits 100 columns."""

from __future__ import annotations

import re

import pytest

import gpuprof_jupyter as gp
from gpuprof_jupyter.core.analysis.compare import compare_experiments
from gpuprof_jupyter.core.store.directory import Store
from gpuprof_jupyter.render.comparison import TEXT_WIDTH, comparison_html, comparison_text
from gpuprof_jupyter.render.report import render_report
from tests.simexp import sim_experiment, steps_frame


def _row_html(html: str, label: str) -> str:
    """The metrics or settings table row whose header cell is ``label``."""
    rows = [r for r in html.split("<tr>") if re.search(rf"<th[^>]*>{re.escape(label)}</th>", r)]
    assert len(rows) == 1, (label, rows)
    return rows[0].split("</tr>")[0]


def _text_row(text: str, label: str) -> str:
    [line] = [line for line in text.splitlines() if line.startswith(label + " ")]
    return line


def test_equal_values_are_same_and_have_no_colour():
    a = sim_experiment("amp", name="a", user_metrics={"accuracy": 1})
    b = sim_experiment("amp", name="b", user_metrics={"accuracy": 1})
    c = compare_experiments([a, b])
    assert c.metric("accuracy").verdicts[1] == "same"
    line = _text_row(comparison_text(c), "accuracy")
    assert "same" in line and "worse" not in line and "+0" not in line, line
    row = _row_html(comparison_html(c, plots=False), "accuracy")
    assert "same" in row and "worse" not in row and "color" not in row, row
    duration = _text_row(comparison_text(c), "duration")  # within the noise (1 %): same too, no verdict word
    assert "same" in duration and "better" not in duration and "worse" not in duration, duration


def test_a_value_one_run_did_not_record_is_not_a_change():
    base = sim_experiment("amp", name="base", params={"cfg.lr": 0.1, "amp": True, "batch_size": 32},
                          user_metrics={"accuracy": 0.9, "loss": 0.3})
    other = sim_experiment("amp", name="other", params={"batch_size": 64}, user_metrics={"accuracy": 0.92})
    c = compare_experiments([base, other])
    assert c.setting("cfg.lr").changed == [False, False] and c.setting("amp").changed == [False, False]
    assert c.changed_settings(1) == {"batch_size": (32, 64)}
    assert [w.kind for w in c.warnings if w.kind == "several-settings"] == []  # one change, not three
    text = comparison_text(c)
    assert "other changed: batch_size: 32 -> 64\n" in text + "\n", text
    assert re.search(r"^cfg\.lr +\| 0\.1 +\| not recorded$", text, re.M), text
    assert " -> -" not in text and "| -" not in text
    loss = _text_row(text, "loss")
    assert "not recorded" in loss and "better" not in loss and "worse" not in loss, loss
    assert c.metric("loss").verdicts[1] is None
    html = comparison_html(c, plots=False)
    row = _row_html(html, "cfg.lr")
    assert "not recorded" in row and "changed" not in row, row
    assert "not recorded" in _row_html(html, "loss")


def test_booleans_and_missing_values_print_one_way_in_report_comparison_and_text():
    a = sim_experiment("amp", name="a", params={"amp": False, "prefetch_factor": None, "pin_memory": True})
    b = sim_experiment("amp", name="b", params={"amp": True, "prefetch_factor": 2})
    c = compare_experiments([a, b])
    text = comparison_text(c)
    assert re.search(r"^amp +\| false +\| true \*$", text, re.M), text
    assert re.search(r"^prefetch_factor +\| null +\| 2 \*$", text, re.M), text
    assert re.search(r"^pin_memory +\| true +\| not recorded$", text, re.M), text
    report = render_report([a, b])
    for html in (comparison_html(c, plots=False), report):
        for word in ("False", "True", "None", ">-<"):
            assert word not in re.sub(r"<script.*?</script>", "", html, flags=re.S).replace("SIMULATED", ""), word
    section = report.split("data-id='" + a.meta.id, 1)[1]
    settings = section.split("<h3>settings</h3>", 1)[1].split("</table>", 1)[0]
    assert ">false</td>" in settings and ">null</td>" in settings and ">true</td>" in settings, settings


def _store_runs(store_dir, count: int, name=lambda i: f"r{i}", **kwargs) -> list[str]:
    store = Store(store_dir)
    names = []
    for i in range(count):
        e = sim_experiment("amp", name=name(i), params={"batch_size": 32 + i}, user_metrics={"accuracy": 0.9 + i / 1000},
                           **kwargs)
        store.create(e.meta)
        names.append(e.meta.name)
    return names


def test_compare_without_names_takes_the_last_two_runs_and_says_so(store_dir):
    names = _store_runs(store_dir, 5)
    view = gp.compare(store=store_dir)
    assert view.comparison.names == ["r3", "r4"]
    text, html = repr(view), view.static_bundle()["text/html"]
    for shown in (text, html):
        assert "the last 2 of the 5 runs in the store" in shown and "compare(all=True)" in shown, shown[:600]
    assert gp.compare(store=store_dir, all=True).comparison.names == names
    named = gp.compare("r0", "r2", "r4", store=store_dir)
    assert named.comparison.names == ["r0", "r2", "r4"] and "last 2" not in repr(named)
    with pytest.raises(ValueError, match="all=True.*names"):
        gp.compare("r0", "r1", store=store_dir, all=True)


def test_the_magic_and_the_command_compare_the_last_two_too(store_dir, capsys):
    from IPython.core.interactiveshell import InteractiveShell

    from gpuprof_jupyter.cli import main
    from gpuprof_jupyter.notebook.magic import GpuProfileMagics

    names = _store_runs(store_dir, 3)
    shell = InteractiveShell.instance()
    shell.register_magics(GpuProfileMagics)
    assert shell.run_line_magic("gpuprofile", f"compare --store {store_dir}").comparison.names == names[1:]
    assert shell.run_line_magic("gpuprofile", f"compare --all --store {store_dir}").comparison.names == names
    assert main(["compare", "--store", str(store_dir)]) == 0
    out = capsys.readouterr().out
    assert "the last 2 of the 3 runs in the store" in out and "--all" in out and "'r0'" not in out
    assert main(["compare", "--all", "--store", str(store_dir)]) == 0
    assert "baseline 'r0'" in capsys.readouterr().out


def test_text_fits_100_columns_and_keeps_every_value(store_dir):
    """24 runs with long names, a long setting and findings: nothing wider than 100 columns, nothing lost."""
    long = lambda i: f"resnet50-bs{64 + i}-amp-workers8-prefetch4-pinned-{i:02d}"  # noqa: E731
    _store_runs(store_dir, 24, name=long, steps=steps_frame(20, 5, 0.5))
    text = repr(gp.compare(store=store_dir, all=True))
    wide = [line for line in text.splitlines() if len(line) > TEXT_WIDTH]
    assert not wide, wide
    for i in range(24):
        assert long(i) in text and f"{0.9 + i / 1000:.4g}" in text
    two = repr(gp.compare(store=store_dir))
    assert max(len(line) for line in two.splitlines()) <= TEXT_WIDTH
    assert "[info] Run too short" in two  # the findings are kept, wrapped


def test_the_export_does_not_count_a_value_one_run_did_not_record_as_a_change(tmp_path):
    """pipeline.yaml's evidence reads the runs as the comparison does: workers changed num_workers
    alone against baseline, even though baseline also recorded a --param workers did not."""
    from gpuprof_jupyter.export.pipeline import export_pipeline

    base = sim_experiment("input-bound", seconds=12, name="baseline",
                          params={"batch_size": 32, "num_workers": 0, "cfg.lr": 0.1}, steps=steps_frame(60, 12, 0.5))
    workers = sim_experiment("input-bound", seconds=10, name="workers", params={"batch_size": 32, "num_workers": 4},
                             steps=steps_frame(55, 10, 0.3))
    path = tmp_path / "pipeline.yaml"
    export_pipeline(workers, path, "train", baseline=base, candidates=[base, workers])
    [line] = [x for x in path.read_text().splitlines() if x.strip().startswith("num_workers:")]
    assert "# 0 -> 4; alone in workers against baseline: " in line, line


def test_a_logged_bool_reads_the_same_in_the_summary():
    from gpuprof_jupyter.render.summary_html import render_summary_html, render_summary_text

    run = sim_experiment("amp", name="flags", user_metrics={"converged": False, "note": None})
    assert "logged: converged = false, note = null" in render_summary_text(run)
    assert "converged = false, note = null" in render_summary_html(run)


def test_gpuprof_list_prints_a_missing_figure_as_everywhere_else(store_dir, capsys):
    from gpuprof_jupyter.cli import main

    _store_runs(store_dir, 1)  # saved without samples: no energy, no sm_util
    assert main(["list", "--store", str(store_dir)]) == 0
    [store_line, head, row] = capsys.readouterr().out.splitlines()  # the first line names the store
    assert row.split()[-2:] == ["n/a", "n/a"], row


def test_text_fits_100_columns_even_when_two_columns_do_not():
    """A 130-character setting and a long name: one run a line, every value kept."""
    key = "model.encoder.layers." + "very_long_name_" * 7
    a = sim_experiment("amp", name="a" * 90, params={key: 1}, user_metrics={key: 0.5})
    b = sim_experiment("amp", name="b", params={key: 2}, user_metrics={key: 0.7})
    text = comparison_text(compare_experiments([a, b]))
    assert max(len(line) for line in text.splitlines()) <= TEXT_WIDTH
    assert "settings, one run a line:" in text and "  #2: 2 *" in text and "  #2: 0.7 (+0.2 better)" in text


def test_an_equal_logged_value_is_same_in_the_effect_and_a_new_key_in_the_file_is_new(tmp_path):
    """The export's comments: accuracy equal in both runs reads "same", not "1->1"; a key the
    pipeline file did not have is "new" there ("not recorded" is said of runs)."""
    from gpuprof_jupyter.core.analysis.compare import effect_text
    from gpuprof_jupyter.export.pipeline import export_pipeline

    base = sim_experiment("input-bound", name="base", params={"batch_size": 32}, user_metrics={"accuracy": 1.0})
    fast = sim_experiment("amp", name="fast", params={"batch_size": 32}, user_metrics={"accuracy": 1.0})
    assert "accuracy same (1)" in effect_text(compare_experiments([base, fast]), 1)
    result = export_pipeline(fast, tmp_path / "pipeline.yaml", candidates=[base, fast])
    gpu, = [comment for key, _, _, comment in result.changes if key == "resources.gpu"]
    assert gpu == "new; fast"
