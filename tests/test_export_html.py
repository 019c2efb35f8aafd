"""Export: an executed notebook converted with `nbconvert --to html` shows the plots offline.

BokehJS is not saved by ``%load_ext`` (tests/test_quickstart.py checks the PNG-only export);
here the notebook also ran ``output_notebook(INLINE)`` itself, so BokehJS is on the exported
page and the interactive plots must replace the PNG.
"""

from __future__ import annotations

import subprocess
import sys

import nbformat
import pytest
from nbclient import NotebookClient

pytestmark = [pytest.mark.browser, pytest.mark.kernel, pytest.mark.timeout(240)]


def test_exported_html_shows_plots_and_summary_offline(tmp_path, offline_page, artifacts_dir, monkeypatch):
    monkeypatch.setenv("GPUPROF_STORE", str(tmp_path / "store"))
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [
        nbformat.v4.new_code_cell("%load_ext gpuprof_jupyter\n"
                                  "from bokeh.io import output_notebook\nfrom bokeh.resources import INLINE\n"
                                  "output_notebook(INLINE, hide_banner=True)  # the user's choice: BokehJS saved"),
        nbformat.v4.new_code_cell("%%gpuprofile --source sim:compute-bound:2 -n export\n"
                                  "import time, gpuprof_jupyter as gp\n"
                                  "with gp.phase('work'):\n    time.sleep(3)"),
        nbformat.v4.new_code_cell("%%gpuprofile --source sim:input-bound:2 -n other --no-live\nimport time\ntime.sleep(1)"),
        nbformat.v4.new_code_cell("%gpuprofile compare"),
    ]
    NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    path = tmp_path / "export.ipynb"
    nbformat.write(nb, path)
    subprocess.run([sys.executable, "-m", "jupyter", "nbconvert", "--to", "html", str(path)], check=True,
                   capture_output=True, timeout=120)
    html = tmp_path / "export.html"
    assert html.exists()
    offline_page.goto(html.as_uri())
    offline_page.wait_for_selector(".gpuprof-static", timeout=20_000)
    offline_page.wait_for_function(
        "() => document.querySelectorAll('.gpuprof-png-replaced').length >= 1",
        timeout=20_000)  # the PNG output is hidden once BokehJS (INLINE, no network) rendered the plots
    state = offline_page.evaluate("""() => {
      const plot = document.querySelector('.gpuprof-static-plot');
      // find Bokeh canvases in shadow roots and check they hold non-white pixels
      let painted = 0;
      const walk = (root) => { for (const el of root.querySelectorAll('*')) {
          if (el.tagName === 'CANVAS' && el.width > 0 && el.height > 0) {
            const ctx = el.getContext('2d'); const d = ctx.getImageData(0, 0, el.width, el.height).data;
            for (let i = 0; i < d.length; i += 4 * 97) { if (d[i + 3] > 0 && (d[i] < 200 || d[i + 1] < 200)) { painted++; break; } }
          }
          if (el.shadowRoot) walk(el.shadowRoot);
      } };
      walk(plot);
      let overlayCanvases = 0;
      const count = (root) => { for (const el of root.querySelectorAll('*')) {
          if (el.tagName === 'CANVAS') overlayCanvases++;
          if (el.shadowRoot) count(el.shadowRoot);
      } };
      const overlay = document.querySelector('.gpuprof-overlay');
      if (overlay) count(overlay);
      return {overlayCanvases,height: plot.getBoundingClientRect().height, painted,
              summary: document.body.innerText.includes('gpuprof experiment'),
              comparison: document.body.innerText.includes('gpuprof comparison')
                          && overlayCanvases >= 2,  // the overlaid curves: static Bokeh output
              simulated: document.body.innerText.includes('SIMULATED')};
    }""")
    offline_page.screenshot(path=str(artifacts_dir / "export_offline.png"), full_page=False)
    assert state["height"] > 200, state
    assert state["painted"] > 0, f"plot canvas is empty: {state}"
    assert state["summary"] and state["simulated"], state
    assert state["comparison"], f"the comparison (tables + curves) must show offline: {state}"
