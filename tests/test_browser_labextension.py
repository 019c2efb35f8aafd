"""Real browser: the GPU Profiler labextension in JupyterLab (headless Chromium, Playwright).

The server runs with our server extension and the built labextension configured explicitly
(not through an install), and with the test's fake NVML serving 2 GPUs to the *server*
process: a sitecustomize.py that this test writes to a temporary folder on PYTHONPATH
installs tests/fake_nvml.py when GPUPROF_TEST_FAKE_NVML is set (test-only; no production code
reads that variable). Experiments come from a real `%%gpuprofile --source sim` run (a kernel
through nbclient, in the server's root). Screenshots go to artifacts/.
"""

from __future__ import annotations

import json
import math
import os
import threading
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.lab_helpers import _dismiss_dialogs, serve_lab, with_our_extensions

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parent.parent
BUILT = ROOT / "gpuprof_jupyter" / "labextension"
SITECUSTOMIZE = """
import os, sys
if os.environ.get("GPUPROF_TEST_FAKE_NVML"):
    sys.path.insert(0, {tests!r})
    from tests.fake_nvml import FakeNvml, h100
    FakeNvml([h100(i) for i in range(int(os.environ["GPUPROF_TEST_FAKE_NVML"]))]).install()
"""


def _record_with_a_kernel(root: Path) -> None:
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell("%load_ext gpuprof_jupyter"),
                nbformat.v4.new_code_cell("%%gpuprofile --source sim:input-bound -n slow-input --param num_workers=0 "
                                          "--no-live\nimport time\ntime.sleep(2)"),
                nbformat.v4.new_code_cell("%%gpuprofile --source sim:compute-bound -n fed --param num_workers=4 "
                                          "--no-live\nimport time\ntime.sleep(2)")]
    NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(root)}}).execute()
    nbformat.write(nb, root / "train.ipynb")


@contextmanager
def _growing_run(root: Path):
    """A run "recording" into root/.gpuprof: its stream gets 5 rows of gpu0 every 0.5 s, as a
    kernel's flushes do (its pid is this process, alive, so it reads as running)."""
    from gpuprof_jupyter.core.store.directory import Store
    from gpuprof_jupyter.core.store.experiment import ExperimentMeta
    from gpuprof_jupyter.core.store.samples_file import SampleStreamWriter, samples_schema

    store = Store(root / ".gpuprof")
    meta = ExperimentMeta(id="", name="long-training", interval_s=0.1,
                          devices=[{"key": "gpu0", "kind": "gpu", "name": "sim"}])
    writer = SampleStreamWriter(store.create(meta), samples_schema(["sm_util", "power_w"]))
    stop = threading.Event()

    def flush():
        i = 0
        while not stop.wait(0.5):
            t = [0.1 * k for k in range(i, i + 5)]
            writer.write({"t": t, "wall_time": [1.9e9 + x for x in t], "device": ["gpu0"] * 5,
                          "sm_util": [50.0 + 40 * math.sin(x) for x in t], "power_w": [250.0] * 5})
            i += 5

    thread = threading.Thread(target=flush, name="test-stream-writer", daemon=True)
    thread.start()
    try:
        yield meta
    finally:
        stop.set()
        thread.join(5)
        writer.close()


def _live_t(page, timeout_ms: int = 30_000) -> float:
    """The last time (s since start) the sidebar's live section shows for gpu0."""
    row = page.locator("#gpuprof-sidebar .jp-gpuprof-live-device[data-device=gpu0]")
    row.wait_for(state="attached", timeout=timeout_ms)
    page.wait_for_function("() => { const r = document.querySelector("
                           "'#gpuprof-sidebar .jp-gpuprof-live-device[data-device=gpu0]'); "
                           "return r && r.dataset.lastT !== ''; }", timeout=timeout_ms)
    return float(row.get_attribute("data-last-t"))


@pytest.fixture
def lab_with_extension(tmp_path, monkeypatch):
    assert (BUILT / "package.json").exists(), "labextension not built: run scripts/build_labextension.sh"
    root = tmp_path / "lab"
    root.mkdir()
    monkeypatch.setenv("GPUPROF_STORE", str(root / ".gpuprof"))  # the kernel's and the server's default
    _record_with_a_kernel(root)
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE.format(tests=str(ROOT / "tests")))
    lab_args = with_our_extensions(tmp_path, BUILT)
    env = {**os.environ, "GPUPROF_TEST_FAKE_NVML": "2",
           "PYTHONPATH": os.pathsep.join([str(site), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    with serve_lab(root, tmp_path, env, lab_args,
                   base_url="/user/someone/") as lab:
        yield lab


def _drag_sidebar_to(page, width: int) -> None:
    """Drag the split handle left of the right sidebar until the sidebar is ``width`` px wide."""
    box = page.locator("#gpuprof-sidebar").bounding_box()
    y = box["y"] + box["height"] / 2
    page.mouse.move(box["x"] - 2, y)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] - width, y, steps=8)
    page.mouse.up()
    page.wait_for_function(
        f"() => document.querySelector('#gpuprof-sidebar').getBoundingClientRect().width <= {width + 10}",
        timeout=10_000)


SIDEBAR_FIT_JS = """() => {
  const panel = document.querySelector('#gpuprof-sidebar');
  const table = panel.querySelector('.jp-gpuprof-table'), list = panel.querySelector('.jp-gpuprof-experiments');
  return {panel: panel.getBoundingClientRect().width, overflow: list.scrollWidth - list.clientWidth,
          tableRight: table.getBoundingClientRect().right - panel.getBoundingClientRect().right,
          shown: [...table.querySelectorAll('th')].filter(h => h.offsetParent !== null).map(h => h.textContent)};
}"""


def test_sidebar_status_bar_report_and_export(browser, lab_with_extension, artifacts_dir):
    lab = lab_with_extension
    context = browser.new_context(viewport={"width": 1500, "height": 950})
    page = context.new_page()
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(f"pageerror: {e}"))
    listings: list[tuple[int, str | None]] = []  # (status, If-None-Match sent) of the sidebar's listing polls
    page.on("response", lambda r: listings.append((r.status, r.request.headers.get("if-none-match")))
            if "/gpuprof/api/experiments?" in r.url else None)
    try:
        page.goto(f"{lab['base']}/lab/tree/train.ipynb?token={lab['token']}")
        page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=90_000)
        _dismiss_dialogs(page)
        # status bar: the fake's two H100s, as the server's poller reads them
        page.wait_for_function("() => document.querySelectorAll('.jp-gpuprof-status-gpu').length === 2",
                               timeout=30_000)
        page.wait_for_function("() => /%/.test(document.querySelector('.jp-gpuprof-status-gpu').textContent)",
                               timeout=30_000)
        status = page.locator(".jp-gpuprof-status-gpu").all_text_contents()
        assert status[0].startswith("GPU0 62 %") and "/80.0 GiB" in status[0] and "276 W" in status[0], status  # GPM 62.5 %: half to even, as Python rounds (tests/format_cases.json)
        assert status[1].startswith("GPU1 "), status
        page.locator(".jp-gpuprof-status").screenshot(path=str(artifacts_dir / "labext_statusbar.png"))
        # a click on it opens the sidebar, listing the notebook directory's experiments
        page.locator(".jp-gpuprof-status").click()
        page.wait_for_selector("#gpuprof-sidebar .jp-gpuprof-row", timeout=30_000)
        names = page.locator("#gpuprof-sidebar .jp-gpuprof-row .jp-gpuprof-col-name").all_text_contents()
        assert names == ["fed (sim)", "slow-input (sim)"], names
        # later polls send the listing's ETag; nothing changed: 304, no body, the rows stay
        for _ in range(60):
            if any(status == 304 for status, _ in listings):
                break
            page.wait_for_timeout(500)
        assert listings[0][0] == 200 and any(s == 304 and tag for s, tag in listings), listings
        assert page.locator("#gpuprof-sidebar .jp-gpuprof-row .jp-gpuprof-col-name").all_text_contents() == names
        page.wait_for_selector("#gpuprof-sidebar .jp-gpuprof-device polyline", state="attached", timeout=30_000)
        _dismiss_dialogs(page)
        page.screenshot(path=str(artifacts_dir / "labext_sidebar.png"))
        # select both: one report compares them, in a new browser tab
        for box in page.locator("#gpuprof-sidebar .jp-gpuprof-row input[type=checkbox]").all():
            box.check()
        with context.expect_page(timeout=60_000) as opened:
            page.locator("#gpuprof-sidebar button.jp-gpuprof-report").click()
        report = opened.value
        report.wait_for_load_state("load", timeout=60_000)
        assert "/user/someone/gpuprof/api/report?ids=" in report.url
        try:
            report.wait_for_selector("section.gpuprof-experiment", state="attached", timeout=60_000)
        except Exception:
            raise AssertionError("report page: " + report.url + " " + report.content()[:1500]) from None
        assert "<h2>comparison</h2>" in report.content()
        assert sorted(report.locator("section.gpuprof-experiment h2").all_text_contents()) == ["fed", "slow-input"]
        report.wait_for_timeout(1500)
        report.screenshot(path=str(artifacts_dir / "labext_report.png"))
        report.close()
        # export one to pipeline.yaml beside the notebook
        page.locator("#gpuprof-sidebar .jp-gpuprof-row input[type=checkbox]").nth(1).uncheck()
        page.locator("#gpuprof-sidebar button.jp-gpuprof-export").click()
        page.wait_for_selector("#gpuprof-sidebar .jp-gpuprof-message:has-text('exported')", timeout=30_000)
        text = (lab["root"] / "pipeline.yaml").read_text()
        assert "num_workers: 4" in text and "fed" in text, text
        # a multi-node job (issue 38) is one row, its parts under it: one of the three never reported
        from tests import jobparts
        from gpuprof_jupyter.core.store.directory import Store

        for node in (0, 1):
            jobparts.write_part(Store(lab["root"] / ".gpuprof"), "ft-0412", host=f"node-{'ab'[node]}", node=node,
                                ranks=[2 * node, 2 * node + 1], world=6, parts=3, name="llama-ft")
        parts = page.locator("#gpuprof-sidebar tr.jp-gpuprof-job-parts[data-job='ft-0412']")
        parts.wait_for(timeout=30_000)
        assert parts.text_content() == "job · parts 2/3 (missing: 2)", parts.text_content()
        job_row = page.locator("#gpuprof-sidebar tr.jp-gpuprof-row[data-id='ft-0412']")
        assert job_row.locator(".jp-gpuprof-col-name").text_content() == "llama-ft"
        assert page.locator("#gpuprof-sidebar .jp-gpuprof-row").count() == 3  # fed, slow-input, the job
        page.locator("#gpuprof-sidebar").screenshot(path=str(artifacts_dir / "labext_sidebar_job.png"))
        # a run still recording (its stream grows) is followed live, and again after a reload
        with _growing_run(lab["root"]):
            first = _live_t(page)
            page.wait_for_timeout(5000)
            later = _live_t(page)
            assert later > first, (first, later)
            tails = int(page.locator("#gpuprof-sidebar .jp-gpuprof-live").get_attribute("data-tail-reads"))
            assert tails >= 1
            page.screenshot(path=str(artifacts_dir / "labext_live.png"))
            page.reload()
            page.wait_for_selector(".jp-gpuprof-status-gpu", timeout=90_000)
            _dismiss_dialogs(page)
            page.locator(".jp-gpuprof-status").click()
            reloaded = _live_t(page, timeout_ms=15_000)
            page.wait_for_timeout(4000)
            assert _live_t(page) > reloaded >= later
        # the palette command adds %%gpuprofile to the active cell
        page.locator(".jp-Notebook .jp-CodeCell").nth(0).locator(".jp-InputArea-editor").click()
        page.keyboard.press("Escape")
        page.keyboard.press("Control+Shift+c")
        page.keyboard.type("Profile current cell")
        page.keyboard.press("Enter")
        page.wait_for_function(
            "() => document.querySelector('.jp-Notebook .jp-CodeCell .jp-InputArea-editor').textContent"
            ".startsWith('%%gpuprofile')", timeout=15_000)
        page.screenshot(path=str(artifacts_dir / "labext_light.png"))
        # a narrow sidebar (about JupyterLab's default width): the table fits, no sideways scrolling
        page.locator(".jp-gpuprof-status").click()
        page.wait_for_selector("#gpuprof-sidebar .jp-gpuprof-row", timeout=30_000)
        _drag_sidebar_to(page, 250)
        fit = page.evaluate(SIDEBAR_FIT_JS)
        page.locator("#gpuprof-sidebar").screenshot(path=str(artifacts_dir / "labext_sidebar_narrow.png"))
        assert fit["panel"] <= 260 and fit["overflow"] <= 0 and fit["tableRight"] <= 0, fit
        assert {"name", "status", "SM %"} <= set(fit["shown"]), fit
        # the dark theme: the sidebar follows it (theme variables only)
        page.keyboard.press("Control+Shift+c")
        page.keyboard.type("Use Theme: JupyterLab Dark")
        page.keyboard.press("Enter")
        page.wait_for_function("() => document.body.dataset.jpThemeLight === 'false'", timeout=30_000)
        page.wait_for_timeout(1500)
        background = page.evaluate(
            "() => getComputedStyle(document.querySelector('#gpuprof-sidebar')).backgroundColor")
        assert background not in ("rgb(255, 255, 255)", "rgba(0, 0, 0, 0)"), background
        page.screenshot(path=str(artifacts_dir / "labext_dark.png"))
        # refresh rates are JupyterLab settings (labextension/schema/plugin.json), applied on load
        assert page.locator("#gpuprof-sidebar").get_attribute("data-refresh-ms") == "1000,5000,2000"
        schema = json.load(urllib.request.urlopen(
            f"{lab['base']}/lab/api/settings/gpuprof-jupyter:plugin?token={lab['token']}", timeout=30))["schema"]
        assert set(schema["properties"]) == {"devicesRefreshMs", "experimentsRefreshMs", "liveRefreshMs"}, schema
        raw = json.dumps({"devicesRefreshMs": 500, "liveRefreshMs": 1000})
        urllib.request.urlopen(urllib.request.Request(
            f"{lab['base']}/lab/api/settings/gpuprof-jupyter:plugin?token={lab['token']}",
            data=json.dumps({"raw": raw}).encode(), method="PUT", headers={"Content-Type": "application/json"}), timeout=30)
        page.reload()
        page.wait_for_selector(".jp-gpuprof-status-gpu", timeout=90_000)
        _dismiss_dialogs(page)
        page.wait_for_function(  # the devices' and the running experiment's polls follow the new rates
            "() => document.querySelector('#gpuprof-sidebar').dataset.refreshMs === '500,5000,1000'", timeout=30_000)
        relevant = [e for e in errors if "favicon" not in e]
        assert not relevant, relevant
    finally:
        page.screenshot(path=str(artifacts_dir / "labext_final.png"))
        context.close()
