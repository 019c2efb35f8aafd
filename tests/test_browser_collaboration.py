"""A kernel shared by two people (issue 39 part 7, not done): real-time collaboration, two Chromium contexts.

JupyterLab with ``jupyter-collaboration`` (the ``collab`` extra): two browser contexts (two people)
open the same notebook; one runs a profiled cell. Both see the live view move while it runs and
the same static ending after it, and the session record is the kernel's: ``session()`` asked from
either page lists the same cells.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from test_browser_lab import PLOT_STATE_JS, _dismiss_dialogs, _notebook, _run_cell, _static_state, serve_lab
from conftest import block_remote_requests

pytestmark = [pytest.mark.browser, pytest.mark.timeout(400)]

# Seen with jupyter-collaboration 5.0.4 and JupyterLab 4.6 (issue 39 part 7, not done): the second
# person's page shows the live view as its text (``VBox(children=(HTML(...``): the widget models
# were opened for the first person's page only, and BokehJS, sent by %load_ext as an executed
# output, is in the first page only (``window.Bokeh`` is undefined in the second). Strict: this
# fails the suite once both pages do see it, so the mark goes with the fix.
KNOWN_LIMITATION = pytest.mark.xfail(strict=True, reason=(
    "RTC: the second page gets neither the live widget's models nor BokehJS (docs/session.md)"))

ROOT = Path(__file__).resolve().parent.parent
CELLS = [
    "%load_ext gpuprof_jupyter\nimport gpuprof_jupyter",
    "%%gpuprofile --source sim -n shared-run --interval 0.05\nimport time\nfor _ in range(60):\n"
    "    time.sleep(0.2)\n    gpuprof_jupyter.step(8)",
    "frame = gpuprof_jupyter.session()\nprint('SESSION', [s for s in frame['source'] if s])",
]


def _collaboration_paths() -> dict:
    """Where jupyter-collaboration's config and front end are, when it is installed outside this
    environment's prefix (a --target folder on PYTHONPATH); {} when the prefix has them."""
    try:
        import jupyter_collaboration
    except ImportError:
        pytest.fail("needs jupyter-collaboration (pip install 'jupyter-collaboration>=5'), not installed by make test yet")
    prefix = Path(jupyter_collaboration.__file__).resolve().parents[1]
    if not (prefix / "etc" / "jupyter").is_dir():
        return {}
    return {"JUPYTER_CONFIG_PATH": str(prefix / "etc" / "jupyter"), "JUPYTER_PATH": str(prefix / "share" / "jupyter")}


@pytest.fixture
def lab(tmp_path):
    root = tmp_path / "lab"
    root.mkdir()
    _notebook(root / "shared.ipynb", CELLS)
    env = {**os.environ, "GPUPROF_STORE": str(tmp_path / "store"), **_collaboration_paths()}
    with serve_lab(root, tmp_path, env, ("--LabApp.collaborative=True",)) as server:
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


def _last_t(page):
    state = page.evaluate(PLOT_STATE_JS)
    return state[0][1] if state and state[0][1] is not None else None


@KNOWN_LIMITATION
def test_two_people_see_the_same_live_view_and_ending(browser, lab, artifacts_dir):
    (ctx_a, alice), (ctx_b, bob) = _open(browser, lab), _open(browser, lab)
    try:
        _run_cell(alice, 0)
        _run_cell(alice, 1, finished=False)
        seen = {"alice": [], "bob": []}
        deadline = time.monotonic() + 60
        running = "() => /\\[\\*\\]/.test(document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')[1].textContent)"
        while time.monotonic() < deadline and alice.evaluate(running):
            for name, page in (("alice", alice), ("bob", bob)):
                t = _last_t(page)
                if t is not None and (not seen[name] or t > seen[name][-1]):
                    seen[name].append(t)
            alice.wait_for_timeout(1000)
        bob.screenshot(path=str(artifacts_dir / "collab_bob_live.png"), full_page=True)
        assert len(seen["alice"]) >= 3, seen
        assert len(seen["bob"]) >= 3, f"the second person's live view did not move: {seen}"
        for page in (alice, bob):
            page.wait_for_selector(".gpuprof-static", timeout=60_000)
        assert _static_state(alice)["img"] and _static_state(bob)["img"]
        _run_cell(bob, 2)  # the other person asks: the record is the kernel's
        for page in (alice, bob):
            page.wait_for_function("() => /SESSION \\[.*shared-run.*\\]/.test(document.body.innerText)", timeout=60_000)
    finally:
        ctx_a.close()
        ctx_b.close()
