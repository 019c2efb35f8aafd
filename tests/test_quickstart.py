"""The quickstart, executed headless with a busy process on every core, tells its story: input-bound, then fed.

What a newcomer runs first (``make demo``) must work on a slow, loaded 2-core machine: the
baseline is input-bound, workers + prefetch raise ``sm_util`` and lower the data wait, the
last run passes the gate without ``force=True``, each run is long enough for the live plots to
move, and the saved notebook stays light while still showing a picture of every run offline.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

pytestmark = [pytest.mark.kernel, pytest.mark.browser, pytest.mark.timeout(600)]

QUICKSTART = Path(__file__).resolve().parent.parent / "notebooks" / "quickstart.ipynb"
RUNS = ("baseline", "b64-amp", "workers-prefetch")
LOAD_EXT_MAX_BYTES = 100_000
PROFILED_CELL_MAX_BYTES = 120_000
NOTEBOOK_BASE_MAX_BYTES = 100_000  # the whole executed file, metadata included: this + 120 KB a profiled cell
LIVE_WIDGET_MAX_BYTES = 2_000  # the live plots' last widget state, as nbclient saves it in metadata.widgets


def _execute(folder: Path) -> nbformat.NotebookNode:
    nb = nbformat.read(QUICKSTART, as_version=4)
    env_store = os.environ.pop("GPUPROF_STORE", None)  # the notebook's own .gpuprof/, as make demo has it
    try:
        NotebookClient(nb, timeout=240, kernel_name="python3", resources={"metadata": {"path": str(folder)}}).execute()
    finally:
        if env_store is not None:
            os.environ["GPUPROF_STORE"] = env_store
    nbformat.write(nb, folder / "quickstart.ipynb")
    return nb


def pipeline_reads_well(text: str) -> None:
    """What the run set or changed, no torch default nobody set, each change explained on its own."""
    for default in ("tf32.", "cudnn.benchmark", "float32_matmul_precision", "pin_memory"):
        assert default not in text, f"torch's own default {default!r} written:\n{text}"
    changes = [line.split("#", 1)[1] for line in text.splitlines() if " -> " in line.partition("#")[2]]
    assert len(changes) >= 4 and len(set(changes)) == len(changes), text
    assert sum(" against baseline: " in line for line in text.splitlines()) == 1, text  # the effect, once


def _bytes_by_model(widgets: dict) -> dict:
    """The saved widget state's size per widget kind (docs/live_view.md quotes them)."""
    out: dict = {}
    for state in widgets.values():
        out[state.get("model_name", "?")] = out.get(state.get("model_name", "?"), 0) + len(json.dumps(state))
    return out


def _output_bytes(cell) -> int:
    return len(json.dumps(cell.get("outputs", [])))


def test_quickstart_story_under_load(tmp_path, busy_cores, offline_page, artifacts_dir):
    nb = _execute(tmp_path)

    import gpuprof_jupyter as gp

    store = gp.Store(tmp_path / ".gpuprof")
    runs = {name: store.load(name) for name in RUNS}
    facts = {name: (e.meta.duration_s, e.summary["overall"].get("sm_util_mean"), e.summary["steps"].get("data_wait_frac"))
             for name, e in runs.items()}
    (artifacts_dir / "quickstart_story.json").write_text(json.dumps({"busy_cores": busy_cores, "runs": facts}, indent=1))
    base, last = runs["baseline"], runs["workers-prefetch"]

    # the story
    assert base.summary["overall"]["sm_util_mean"] < last.summary["overall"]["sm_util_mean"], facts
    assert base.summary["steps"]["data_wait_frac"] > last.summary["steps"]["data_wait_frac"], facts
    assert "input-bound" in [f.id for f in gp.diagnose(base)], f"baseline not diagnosed input-bound: {facts}"
    rules = last.meta.checks
    assert len(rules) == 2 and all(r["passed"] for r in rules), rules
    assert (tmp_path / "pipeline.yaml").exists() and (tmp_path / "report.html").exists()
    pipeline_reads_well((tmp_path / "pipeline.yaml").read_text())
    for name, e in runs.items():  # long enough for the live plots to move (several streams a run), however fast the machine
        assert len(e.samples) >= 20 and e.summary["steps"]["count"] >= 20, (name, len(e.samples), facts)
    for e in runs.values():
        assert e.meta.simulated, "the demo without a GPU is labelled simulated"

    # light: BokehJS is not saved, each profiled cell stores its PNG once
    code = [c for c in nb.cells if c.cell_type == "code"]
    echoed = [c.source[:60] for c in code[:-1] if not c.source.startswith("%gpuprofile")
              and any(o.output_type == "execute_result" for o in c.outputs)]
    assert echoed == [], f"stray Out[...] (tests/test_quickstart_source.py): {echoed}"
    load_ext = next(c for c in code if "%load_ext gpuprof_jupyter" in c.source)
    assert _output_bytes(load_ext) <= LOAD_EXT_MAX_BYTES, _output_bytes(load_ext)
    profiled = [c for c in code if c.source.startswith("%%gpuprofile")]
    assert len(profiled) == len(RUNS)
    for cell in profiled:
        assert _output_bytes(cell) <= PROFILED_CELL_MAX_BYTES, (cell.source[:40], _output_bytes(cell))
        pngs = [o for o in cell.outputs if "image/png" in o.get("data", {})]
        html = "".join(o.get("data", {}).get("text/html", "") for o in cell.outputs)
        assert len(pngs) == 1 and "data:image/png" not in html, "the PNG is stored once per profiled cell"
    size = (tmp_path / "quickstart.ipynb").stat().st_size
    widgets = nb.metadata.get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {}).get("state", {})
    live = {k: len(json.dumps(w)) for k, w in widgets.items() if w.get("model_name") == "BokehModel"}
    (artifacts_dir / "quickstart_size.json").write_text(json.dumps(
        {"file_bytes": size, "widgets_metadata_bytes": len(json.dumps(nb.metadata.get("widgets", {}))),
         "profiled_cell_output_bytes": [_output_bytes(c) for c in profiled], "live_widget_state_bytes": live,
         "widget_state_bytes_by_model": _bytes_by_model(widgets)}, indent=1))
    assert size <= NOTEBOOK_BASE_MAX_BYTES + PROFILED_CELL_MAX_BYTES * len(profiled), size
    assert all(n <= LIVE_WIDGET_MAX_BYTES for n in live.values()), f"live plots' state saved: {live}"

    # nbconvert's HTML, offline and without BokehJS: every run still shows its picture
    subprocess.run([sys.executable, "-m", "jupyter", "nbconvert", "--to", "html", str(tmp_path / "quickstart.ipynb")],
                   check=True, capture_output=True, timeout=120)
    offline_page.goto((tmp_path / "quickstart.html").as_uri())
    offline_page.wait_for_selector("img", timeout=20_000)
    offline_page.wait_for_timeout(1500)
    shown = offline_page.evaluate("""() => [...document.querySelectorAll('.jp-OutputArea-output img')]
        .filter(i => i.naturalWidth > 300 && i.getBoundingClientRect().height > 100).length""")
    offline_page.screenshot(path=str(artifacts_dir / "quickstart_export_offline.png"), full_page=False)
    assert shown >= len(RUNS), f"{shown} plot pictures visible in the offline export"
