"""A kernel shared by two people (issue 39 part 7): real-time collaboration, two Chromium contexts.

JupyterLab with ``jupyter-collaboration`` (the ``collab`` extra) and our labextension: two
browser contexts (two people) open the same notebook; the second trusts it (JupyterLab shows the
rich outputs another page made, widgets and scripts, only in a trusted notebook: its trust is kept
per page, docs/session.md); the first runs ``%load_ext`` and a profiled cell. Both see the live
view move while it runs and the same static ending after it (PNG, then plots and summary, in the
same order: the labextension's ``collaboration.ts`` mends JupyterLab's mirroring of in-place
updates), and the session record is the kernel's: ``session()`` asked from the second page lists
the cell the first ran. Screenshots: artifacts/collab_*.png.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from tests.lab_helpers import _dismiss_dialogs, _notebook, _run_cell, serve_lab, with_our_extensions
from test_browser_lab import PLOT_STATE_JS, _static_state
from conftest import block_remote_requests

pytestmark = [pytest.mark.browser, pytest.mark.timeout(400)]

ROOT = Path(__file__).resolve().parent.parent
BUILT = ROOT / "gpuprof_jupyter" / "labextension"
CELLS = [
    "%load_ext gpuprof_jupyter\nimport gpuprof_jupyter",
    "%%gpuprofile --source sim -n shared-run --interval 0.05\nimport time\nfor _ in range(60):\n"
    "    time.sleep(0.2)\n    gpuprof_jupyter.step(8)",
    "frame = gpuprof_jupyter.session()\nprint('SESSION', [s for s in frame['source'] if s])",
]


def _collaboration_env() -> dict:
    """The server's paths to jupyter-collaboration. ``make collab-deps`` installs it (the collab
    extra) into the venv's ``collab/`` folder, which only this test's server is given: in the
    environment it would turn collaboration on in every other test's JupyterLab. A copy importable
    here (another --target folder on PYTHONPATH, or the environment itself) is used as it is."""
    target = Path(sys.prefix) / "collab"
    if not (target / "jupyter_collaboration").is_dir():
        try:
            import jupyter_collaboration
        except ImportError:
            pytest.fail("needs jupyter-collaboration: make collab-deps (the collab extra, into .venv/collab)")
        target = Path(jupyter_collaboration.__file__).resolve().parents[1]
        if not (target / "etc" / "jupyter").is_dir():
            return {}  # installed in the environment: its prefix's config enables it
    return {"PYTHONPATH": os.pathsep.join(p for p in (str(target), os.environ.get("PYTHONPATH")) if p),
            "JUPYTER_CONFIG_PATH": str(target / "etc" / "jupyter"), "JUPYTER_PATH": str(target / "share" / "jupyter")}


@pytest.fixture
def lab(tmp_path):
    root = tmp_path / "lab"
    root.mkdir()
    _notebook(root / "shared.ipynb", CELLS)
    assert (BUILT / "package.json").exists(), "labextension not built: run scripts/build_labextension.sh"
    env = {**os.environ, "GPUPROF_STORE": str(tmp_path / "store"), **_collaboration_env()}
    with serve_lab(root, tmp_path, env, with_our_extensions(tmp_path, BUILT)) as server:
        yield server


def _open(browser, lab):
    context = browser.new_context(viewport={"width": 1300, "height": 1000})
    block_remote_requests(context)
    page = context.new_page()
    page.goto(f"{lab['base']}/lab/tree/shared.ipynb?token={lab['token']}")
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
    _dismiss_dialogs(page)
    page.wait_for_selector("text=Python 3 (ipykernel) | Idle", timeout=60_000)
    return context, page


def _trust(page) -> None:
    """Trust the notebook in this page (command palette, "Trust Notebook"), as the second person
    must: JupyterLab takes a cell's trust from the shared notebook only when the page builds the
    cell, so outputs another page makes later stay untrusted here (shown as text) until then."""
    page.locator(".jp-Notebook .jp-InputPrompt").first.click()  # the notebook has the keyboard
    page.keyboard.press("Control+Shift+C")
    page.locator(".lm-CommandPalette-input:visible").fill("Trust Notebook")
    page.keyboard.press("Enter")
    page.locator(".jp-Dialog .jp-mod-accept").click()
    page.wait_for_selector("[title^='Notebook trusted']", timeout=30_000)


def _last_t(page):
    state = page.evaluate(PLOT_STATE_JS)
    return state[0][1] if state and state[0][1] is not None else None


# What the profiled cell's outputs are, in order, as the page shows them.
OUTPUTS_JS = """() => [...document.querySelectorAll('.jp-CodeCell')[1].querySelectorAll('.jp-OutputArea-output')]
  .map(o => o.querySelector('.gpuprof-static') ? 'plots+summary' : o.querySelector('img') ? 'png'
             : o.querySelector('.bk-Canvas, .bk-root, .jupyter-widgets') ? 'widget' : 'text:' + o.textContent.trim().slice(0, 40))"""


def test_two_people_see_the_same_live_view_and_ending(browser, lab, artifacts_dir):
    (ctx_a, alice), (ctx_b, bob) = _open(browser, lab), _open(browser, lab)
    try:
        _trust(bob)
        _run_cell(alice, 0)
        # BokehJS reached the second page too: %load_ext's output runs in every trusted page showing it
        bob.wait_for_function("() => window.Bokeh !== undefined", timeout=60_000)
        _run_cell(alice, 1, finished=False)
        seen = {"alice": [], "bob": []}
        deadline = time.monotonic() + 60
        running = "() => /\\[\\*\\]/.test(document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')[1].textContent)"
        while time.monotonic() < deadline and alice.evaluate(running):
            for name, page in (("alice", alice), ("bob", bob)):
                t = _last_t(page)
                if t is not None and (not seen[name] or t > seen[name][-1]):
                    seen[name].append(t)
            if len(seen["bob"]) == 3:
                for name, page in (("alice", alice), ("bob", bob)):
                    page.screenshot(path=str(artifacts_dir / f"collab_{name}_live.png"), full_page=True)
            alice.wait_for_timeout(1000)
        assert len(seen["alice"]) >= 3, seen
        assert len(seen["bob"]) >= 3, f"the second person's live view did not move: {seen}"
        for page in (alice, bob):
            page.wait_for_selector(".gpuprof-static", timeout=60_000)
        alice.wait_for_function(f"() => JSON.stringify(({OUTPUTS_JS})()) === JSON.stringify(['png', 'plots+summary'])",
                                timeout=30_000)
        bob.wait_for_timeout(2000)  # the ending's last changes reach the second page
        for name, page in (("alice", alice), ("bob", bob)):
            page.screenshot(path=str(artifacts_dir / f"collab_{name}_end.png"), full_page=True)
        assert bob.evaluate(OUTPUTS_JS) == alice.evaluate(OUTPUTS_JS) == ["png", "plots+summary"]
        for page in (alice, bob):
            state = _static_state(page)
            assert state["img"] and state["plotHeight"] > 100 and state["summary"], state
        _run_cell(bob, 2)  # the other person asks: the record is the kernel's
        for page in (alice, bob):
            page.wait_for_function("() => /SESSION \\[.*shared-run.*\\]/.test(document.body.innerText)", timeout=60_000)
    finally:
        ctx_a.close()
        ctx_b.close()
