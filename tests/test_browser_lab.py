"""Real browser: JupyterLab + headless Chromium run a %%gpuprofile cell and watch the plots move.

The cell trains a small torch model on the CPU for ~20 s through gpuprof_jupyter.track/step,
so the simulated GPU is driven. While the kernel is busy the plotted data must grow at least
three times; after the cell, the static plot and its PNG must be there, and still there after
the notebook is saved and the page reloaded. Screenshots go to artifacts/.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from conftest import block_remote_requests
from tests.lab_helpers import _dismiss_dialogs, _notebook, _open_notebook, _run_cell, _wait_idle, serve_lab

pytestmark = [pytest.mark.browser, pytest.mark.timeout(240)]

TRAIN_CELL = """%%gpuprofile --source sim -n lab-train
import time, torch
import gpuprof_jupyter as gp
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
data = [(torch.randn(64, 64), torch.randint(0, 10, (64,))) for _ in range(32)]
def loader():
    for x, y in data:
        time.sleep(0.004)  # a slow-ish data pipeline
        yield x, y
end = time.monotonic() + 20
with gp.phase("train"):
    while time.monotonic() < end:
        for x, y in gp.track(loader()):
            opt.zero_grad(); loss = torch.nn.functional.cross_entropy(model(x), y); loss.backward(); opt.step()
            gp.step(64)
            time.sleep(0.01)
float(loss)
"""

# Switches the SM panel's first legend entry off and back on in BokehJS (as a click does):
# [lines the entry stands for, those hidden when off, those hidden when on again, the key's rows
# (its swatch is drawn from its first)].
LEGEND_SWITCH_JS = """async () => {
  const B = window.Bokeh; if (!B || !B.index) return null;
  let views = [];
  try { views = [...B.index]; } catch (e) { try { views = Object.values(B.index.roots || B.index); } catch (e2) {} }
  for (const v of views) {
    const doc = v && v.model && v.model.document; if (!doc) continue;
    const fig = doc.get_model_by_name('gpuprof-sm'); if (!fig || !doc.get_model_by_name(SOURCE)) continue;
    const legend = fig.right.find(r => r.items !== undefined); if (!legend) return null;
    const key = legend.items[0].renderers[0];
    const code = Object.values(key.js_property_callbacks).flat().map(cb => cb.code).join();
    const lines = fig.renderers.filter(r => r !== key && code.includes(r.id));
    const hidden = () => lines.filter(r => r.visible === false).length;
    const settle = () => new Promise(done => setTimeout(done, 300));  // BokehJS runs a CustomJS asynchronously
    key.visible = false; await settle(); const off = hidden();
    key.visible = true; await settle(); return [lines.length, off, hidden(), key.data_source.get_length()];
  }
  return null;
}"""


def _legend_switch(page, source: str) -> list:
    return page.evaluate(LEGEND_SWITCH_JS.replace("SOURCE", repr(source)))


# Reads the live plot's data from BokehJS: [rows in the recent source, last t] per plot.
PLOT_STATE_JS = """() => {
  const B = window.Bokeh; if (!B || !B.index) return [];
  let views = [];
  try { views = [...B.index]; } catch (e) { try { views = Object.values(B.index.roots || B.index); } catch (e2) {} }
  const out = [];
  for (const v of views) {
    const doc = v && v.model && v.model.document; if (!doc) continue;
    const m = doc.get_model_by_name('gpuprof-recent'); if (!m) continue;
    const t = m.data.t; out.push([t.length, t.length ? Number(t[t.length - 1]) : null]);
  }
  return out;
}"""


COMPARE_CELLS = [
    "%load_ext gpuprof_jupyter",
    "%%gpuprofile --source sim:input-bound -n slow-input --param num_workers=0 --no-live\nimport time\ntime.sleep(2)",
    "%%gpuprofile --source sim:compute-bound -n fed --param num_workers=4 --no-live\nimport time\ntime.sleep(2)",
    "%gpuprofile compare",
]


@pytest.fixture
def lab_server(tmp_path):
    root = tmp_path / "lab"
    root.mkdir()
    _notebook(root / "live.ipynb", ["%load_ext gpuprof_jupyter", TRAIN_CELL])
    _notebook(root / "compare.ipynb", COMPARE_CELLS)
    env = {**os.environ, "GPUPROF_STORE": str(tmp_path / "store")}
    with serve_lab(root, tmp_path, env) as lab:
        yield lab


def _static_state(page) -> dict:
    """The static ending: the PNG output, and the interactive plots in the output after it."""
    return page.evaluate("""() => {
      const box = document.querySelector('.gpuprof-static'); if (!box) return {static: false};
      const out = box.closest('.jp-OutputArea-child'); const prev = out && out.previousElementSibling;
      const img = prev && prev.querySelector('img');
      const plot = box.querySelector('.gpuprof-static-plot');
      const plotHeight = plot ? plot.getBoundingClientRect().height : 0;
      const imgShown = !!img && img.getBoundingClientRect().height > 100;  // hidden once BokehJS drew the plots
      const summary = !!document.querySelector('.gpuprof-summary');
      return {static: true, img: !!img, imgWidth: img ? img.naturalWidth : 0, plotHeight, imgShown, summary};
    }""")


def _output_shot(page, cell: int, path: Path) -> None:
    """A screenshot of one cell's outputs (the README's pictures, copied to docs/images/)."""
    area = page.locator(".jp-Notebook .jp-CodeCell").nth(cell).locator(".jp-OutputArea")
    area.scroll_into_view_if_needed()
    area.screenshot(path=str(path))


def test_live_plots_move_then_static_after_reload(browser, lab_server, artifacts_dir):
    context = browser.new_context(viewport={"width": 1400, "height": 1100})
    block_remote_requests(context)
    page = context.new_page()
    sent_back = []  # the page's own changes sent to the kernel (BokehJS "jsevent" comm messages)
    page.on("websocket", lambda ws: ws.on("framesent", lambda payload: sent_back.append(time.monotonic())
                                          if "jsevent" in (payload if isinstance(payload, str) else
                                                           payload.decode("latin-1")) else None))
    url = f"{lab_server['base']}/lab/tree/live.ipynb?token={lab_server['token']}"
    try:
        page.goto(url)
        page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
        _dismiss_dialogs(page)
        _wait_idle(page, 60)
        _dismiss_dialogs(page)
        cells = page.locator(".jp-Notebook .jp-CodeCell")
        page.wait_for_selector("text=Python 3 (ipykernel) | Idle", timeout=60_000)
        for _attempt in range(6):  # the first execute may be lost while the kernel connects
            cells.nth(0).locator(".jp-InputArea-editor").click()
            page.keyboard.press("Shift+Enter")  # %load_ext: BokehJS INLINE
            try:
                page.wait_for_function(
                    "() => /\\[\\d+\\]/.test(document.querySelector('.jp-CodeCell .jp-InputPrompt').textContent)",
                    timeout=8_000)
                break
            except Exception:
                continue
        _wait_idle(page, 60)
        cells.nth(1).locator(".jp-InputArea-editor").click()
        page.keyboard.press("Shift+Enter")  # the profiled training cell
        page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='busy']", timeout=20_000)
        busy_from = time.monotonic()
        seen: list = []
        deadline = time.monotonic() + 60
        shot = False
        while time.monotonic() < deadline:
            busy = page.locator(".jp-Notebook-ExecutionIndicator[data-status='busy']").count() > 0
            if not busy:
                break
            state = page.evaluate(PLOT_STATE_JS)
            if state and state[0][1] is not None:
                if not seen or state[0][1] > seen[-1][1]:
                    seen.append(tuple(state[0]))
                if len(seen) >= 4 and not shot:
                    page.screenshot(path=str(artifacts_dir / "lab_live_running.png"), full_page=True)
                    shot = True
                    # a legend entry hides its series' live and history lines, in the page
                    assert _legend_switch(page, "gpuprof-history") == [2, 2, 0, 1]
                if len(seen) == 14:  # well into the training loop
                    _output_shot(page, 1, artifacts_dir / "readme_live_dashboard.png")
            page.wait_for_timeout(1000)
        growth = len(seen) - 1
        assert growth >= 3, f"the plotted data grew {growth} times while the kernel was busy: {seen}"
        # BokehJS changes the time axis after each stream; held until the kernel is idle
        # (combine_events), the page sends one or two in the whole cell (128 before), not six a second
        during = [t for t in sent_back if busy_from <= t <= time.monotonic()]
        assert len(during) <= 6, f"the page sent {len(during)} changes to the busy kernel"
        _wait_idle(page, 60)
        page.wait_for_selector(".gpuprof-static", timeout=30_000)
        page.wait_for_timeout(2000)
        after = _static_state(page)
        page.screenshot(path=str(artifacts_dir / "lab_static_ending.png"), full_page=True)
        _output_shot(page, 1, artifacts_dir / "readme_static_ending.png")
        assert after["img"] and after["imgWidth"] > 0, after
        assert after["plotHeight"] > 200 and not after["imgShown"], f"static Bokeh plot not rendered: {after}"
        assert after["summary"], after
        assert _legend_switch(page, "gpuprof-recent") == [1, 1, 0, 1]  # the static plots: no history line
        # save, reload, and the static ending is still there
        page.keyboard.press("Control+s")
        deadline = time.monotonic() + 20
        path = lab_server["root"] / "live.ipynb"
        while time.monotonic() < deadline and "gpuprof-static" not in path.read_text():
            page.wait_for_timeout(500)  # not time.sleep: the offline route handler runs inside Playwright calls
        assert "gpuprof-static" in path.read_text(), "notebook was not saved with the static ending"
        page.reload()
        page.wait_for_selector(".gpuprof-static", state="attached", timeout=60_000)
        _dismiss_dialogs(page)
        page.wait_for_timeout(4000)
        reloaded = _static_state(page)
        page.screenshot(path=str(artifacts_dir / "lab_after_reload.png"), full_page=True)
        # BokehJS is not saved with the notebook: after a reload the PNG shows, never an empty box
        assert reloaded["img"] and reloaded["imgWidth"] > 0 and reloaded["imgShown"], reloaded
        assert reloaded["summary"], reloaded
        saved = json.loads(path.read_text())
        load_ext_bytes = len(json.dumps(saved["cells"][0]["outputs"]))
        assert load_ext_bytes < 100_000, f"%load_ext's output stored {load_ext_bytes} bytes"
    finally:
        page.screenshot(path=str(artifacts_dir / "lab_final.png"), full_page=True)
        context.close()


def test_comparison_widget_exports_the_picked_run_in_one_click(browser, lab_server, artifacts_dir):
    """The comparison shows in JupyterLab; one click on "export fed" writes pipeline.yaml."""
    context = browser.new_context(viewport={"width": 1400, "height": 1100})
    page = context.new_page()
    try:
        _open_notebook(page, lab_server, "compare.ipynb")
        for i in range(len(COMPARE_CELLS)):
            _run_cell(page, i)
            _wait_idle(page, 60)
        page.wait_for_selector("text=gpuprof comparison", timeout=30_000)
        button = page.locator(".jp-OutputArea button:has-text('export fed')")
        button.wait_for(timeout=30_000)
        page.screenshot(path=str(artifacts_dir / "lab_compare.png"), full_page=True)
        _output_shot(page, len(COMPARE_CELLS) - 1, artifacts_dir / "readme_comparison.png")
        button.click()
        yaml_path = lab_server["root"] / "pipeline.yaml"
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not yaml_path.exists():
            time.sleep(0.5)
        text = yaml_path.read_text()
        assert "num_workers: 4" in text and "fed" in text, text
        page.wait_for_selector(".jp-OutputArea :text('exported')", timeout=20_000)
        page.screenshot(path=str(artifacts_dir / "lab_compare_exported.png"), full_page=True)
    finally:
        context.close()


def test_untrusted_notebook_shows_the_png(browser, lab_server, artifacts_dir, tmp_path, monkeypatch):
    """A notebook executed elsewhere (nbclient: never signed here) opens untrusted: no scripts
    run, and each profiled cell still shows its picture and summary."""
    import nbformat
    from nbclient import NotebookClient

    monkeypatch.setenv("GPUPROF_STORE", str(tmp_path / "store-untrusted"))
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell("%load_ext gpuprof_jupyter"),
                nbformat.v4.new_code_cell("%%gpuprofile --source sim:compute-bound -n shared\nimport time\ntime.sleep(2)")]
    NotebookClient(nb, timeout=120, kernel_name="python3").execute()
    nbformat.write(nb, lab_server["root"] / "untrusted.ipynb")
    context = browser.new_context(viewport={"width": 1400, "height": 1100})
    block_remote_requests(context)
    page = context.new_page()
    try:
        page.goto(f"{lab_server['base']}/lab/tree/untrusted.ipynb?token={lab_server['token']}")
        page.wait_for_selector(".gpuprof-static", state="attached", timeout=60_000)
        _dismiss_dialogs(page)
        page.wait_for_timeout(2000)
        state = _static_state(page)
        page.screenshot(path=str(artifacts_dir / "lab_untrusted.png"), full_page=True)
        assert state["img"] and state["imgShown"] and state["imgWidth"] > 300, state
        assert state["summary"], state
        assert page.locator(".gpuprof-static script").count() == 0, "an untrusted notebook ran no script of ours"
    finally:
        context.close()


RANK_CELLS = [
    "%load_ext gpuprof_jupyter\nimport sys\nsys.path.insert(0, {scripts!r})\n"
    "import torch.multiprocessing as mp\nimport rank_worker",
    "%%gpuprofile --source sim -n ranks-live\nmp.spawn(rank_worker.train, args=(14.0,), nprocs=2)",
]


def test_the_live_header_shows_each_ranks_step_time(browser, lab_server, artifacts_dir):
    """A cell that spawns two ranks (no gpuprof code in them): while it runs, the live header
    has a line with each rank's step time (rank 1 is the slower)."""
    import re

    scripts = str(Path(__file__).resolve().parent / "data" / "scripts")
    _notebook(lab_server["root"] / "ranks.ipynb", [cell.format(scripts=scripts) for cell in RANK_CELLS])
    context = browser.new_context(viewport={"width": 1400, "height": 1100})
    block_remote_requests(context)
    page = context.new_page()
    try:
        _open_notebook(page, lab_server, "ranks.ipynb")
        _run_cell(page, 0)
        _wait_idle(page, 60)
        _run_cell(page, 1, finished=False)
        page.wait_for_function("() => { const h = document.querySelector('.gpuprof-live-header');"
                               " return h && /step time per rank/.test(h.textContent); }", timeout=90_000)
        page.wait_for_timeout(2000)  # a few more seconds of steps in the window
        text = page.locator(".gpuprof-live-header").inner_text()
        # the cell's output area, not the header itself: the header is rewritten once a second,
        # and a screenshot of an element replaced meanwhile fails ("not attached to the DOM")
        _output_shot(page, 1, artifacts_dir / "lab_live_ranks.png")
        times = re.search(r"step time per rank \(last 10 s\): 0 ([\d.]+) ms · 1 ([\d.]+) ms", text)
        assert times, text
        assert float(times.group(2)) > float(times.group(1)), text  # rank 1 sleeps 60 ms more a step
        _wait_idle(page, 120)
        page.wait_for_selector(".gpuprof-static", state="attached", timeout=30_000)
    finally:
        page.screenshot(path=str(artifacts_dir / "lab_ranks_final.png"), full_page=True)
        context.close()
