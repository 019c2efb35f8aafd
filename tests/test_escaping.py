"""A name like <script>alert(1)</script> appears as text in every view.

Every renderer writes HTML through one module (render/html.py), so its escaping is tested once
here, with a check that no other module builds HTML its own way; then the report, the
comparison and the static plots are tested end to end with a hostile name, param, logged value,
note, phase, rule and cell source.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpuprof_jupyter.core.analysis.compare import compare_experiments
from gpuprof_jupyter.core.analysis.rules import evaluate_rules
from gpuprof_jupyter.notebook.compare_widget import ComparisonView
from gpuprof_jupyter.render import html as h
from gpuprof_jupyter.render.comparison import comparison_html
from gpuprof_jupyter.render.report import render_report
from gpuprof_jupyter.render.static_plots import static_plots_html
from tests.simexp import sim_experiment, steps_frame

EVIL = "<script>alert(1)</script>"
ESCAPED = "&lt;script&gt;alert(1)&lt;/script&gt;"
PACKAGE = Path(h.__file__).resolve().parent.parent


def assert_escaped(html: str):
    assert EVIL not in html
    assert ESCAPED in html


# -- the module, once ---------------------------------------------------------------------------

def test_values_are_escaped_and_markup_is_kept():
    assert h.html("<b>{}</b>", EVIL) == f"<b>{ESCAPED}</b>"
    assert h.html("<b>{}</b>", h.html("<i>{}</i>", EVIL)) == f"<b><i>{ESCAPED}</i></b>"  # escaped once, not twice
    assert h.html("<td title='{}'>{:.1f}</td>", "a' onmouseover='x", 2.25) == \
        "<td title='a&#x27; onmouseover=&#x27;x'>2.2</td>"  # an attribute cannot be closed; format specs work
    assert h.join([EVIL, h.Markup("<br>")], "<hr>") == f"{ESCAPED}<hr><br>"
    assert h.coloured(EVIL, "bad", cls=EVIL) == \
        f"<span class='{ESCAPED}' style='color:{h.PALETTE['bad']}'>{ESCAPED}</span>"


def test_one_table_builder_escapes_heads_and_cells():
    rows = [{EVIL: EVIL, "n": 1}, {EVIL: h.Markup("<code>ok</code>"), "n": h.Cell(EVIL, cls="changed", style="x")}]
    table = h.table(rows)
    assert table.count(ESCAPED) == 3 and EVIL not in table and "<code>ok</code>" in table
    assert f"<td class='changed' style='x'>{ESCAPED}</td>" in table
    assert h.table([[EVIL, 2]], ["k", "v"], row_heads=True).count(f"<th style='text-align:left'>{ESCAPED}</th>") == 1
    assert h.table([]) == ""


def test_banner_lists_and_script_json():
    assert "SIMULATED GPU: these figures are not measurements" in h.simulated_banner()
    assert_escaped(h.simulated_banner(EVIL))
    box = h.problem_box(EVIL, [("hardware", EVIL), EVIL])
    assert box.count(ESCAPED) == 3 and "data-warning='hardware'" in box and EVIL not in box
    assert h.bullet_list([]) == "" and h.bullet_list([EVIL], title=EVIL).count(ESCAPED) == 2
    assert h.script_json('{"name": "</script><script>alert(1)</script>"}') == \
        '{"name": "<\\/script><script>alert(1)<\\/script>"}'


def test_no_module_writes_html_its_own_way():
    """Escaping, tables, the banner and colours live in render/html.py only: another module that
    escapes by hand, opens a table or paints the banner's colour is not going through it."""
    own = {"render/html.py"}
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(PACKAGE).as_posix()
        if name in own:
            continue
        text = path.read_text()
        for pattern in (r"^\s*from html import|^\s*import html\b|html\.escape\(", r"markupsafe", r"<table[ >]",
                        r"#fff3cd|#c62828|#2e7d32"):
            if re.search(pattern, text, re.M):
                offenders.append(f"{name}: {pattern}")
    assert not offenders, offenders


# -- end to end ---------------------------------------------------------------------------------

@pytest.fixture
def evil_runs():
    base = sim_experiment("input-bound", seconds=4, name="base", params={"batch_size": 32},
                          steps=steps_frame(20, 4, 0.5), cpu_util=95)
    evil = sim_experiment("fp32", seconds=4, name=EVIL, params={EVIL: EVIL, "batch_size": 64},
                          user_metrics={EVIL: 1.0, "note": EVIL}, phases=[{"name": EVIL, "start_s": 0, "end_s": 2}])
    evil.meta.context["cell_source"] = f"print('{EVIL}')"
    evil.meta.notes.append(EVIL)
    evil.meta.checks = [r.to_dict() for r in evaluate_rules(evil, [f"sm_util > 60 for 80% in phase '{EVIL}'"])]
    return base, evil


def test_comparison_static_and_widget(evil_runs):
    c = compare_experiments(evil_runs)
    assert_escaped(comparison_html(c))
    view = ComparisonView(c)
    assert_escaped(view.static_bundle()["text/html"])
    descriptions = [b.description for b in view.widget().children[1].children[1].children]
    assert f"export {EVIL}" in descriptions  # a button label is text, never HTML


def test_report(evil_runs):
    html = render_report(evil_runs)
    body = html.split("<body>", 1)[1]
    assert_escaped(body)
    assert EVIL not in html.replace(ESCAPED, "")
    section = body.split("class='gpuprof-experiment'")[2]  # the hostile run's own section
    for shown in ("notes (1)", f"<th style='text-align:left'>{ESCAPED}</th><td>{ESCAPED}</td>",
                  f"print(&#x27;{ESCAPED}&#x27;)"):
        assert shown in section, shown


def test_a_phase_name_cannot_end_the_static_plots_script():
    """The plots' JSON (phase bands carry their names) sits inside a <script>: a name holding
    ``</script>`` would end it and run what follows."""
    closing = "</script><script>alert(1)</script>"
    html = static_plots_html(sim_experiment("amp", seconds=2, name=closing,
                                            phases=[{"name": closing, "start_s": 0, "end_s": 1}]))
    assert closing not in html and html.count("</script>") == 1
    assert "<\\/script><script>alert(1)<\\/script>" in html  # still the phase's name once the JSON is read
