"""Real browser: the status bar says how long the current notebook's GPUs sat idle while its kernel held their memory,
and GPU-aware culling's warning shows in the notebook ahead of the shutdown.

JupyterLab with our server extension and the built labextension (as test_browser_labextension.py
configures them); the notebook's kernel is real, and its session state file is written as its
sampler process writes it (server/sessions.py reads it), with the GPUs idle for 14 minutes.
"""

from __future__ import annotations

import json
import os
import time
import urllib.request
from pathlib import Path

import pytest

from tests.lab_helpers import _open_notebook, serve_lab, with_our_extensions

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parent.parent
BUILT = ROOT / "gpuprof_jupyter" / "labextension"
GIB = 1 << 30


@pytest.fixture
def lab(tmp_path):
    assert (BUILT / "package.json").exists(), "labextension not built: run scripts/build_labextension.sh"
    root = tmp_path / "lab"
    root.mkdir()
    nb = {"cells": [{"cell_type": "code", "execution_count": None, "id": "a1", "metadata": {}, "outputs": [],
                     "source": "x = 1"}],
          "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}},
          "nbformat": 4, "nbformat_minor": 5}
    (root / "idle.ipynb").write_text(json.dumps(nb))
    lab_args = with_our_extensions(tmp_path, BUILT)
    runtime = tmp_path / "runtime"
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(runtime), "GPUPROF_SESSION": "off",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    with serve_lab(root, tmp_path, env, lab_args) as server:
        yield {**server, "runtime": runtime}


def test_the_status_bar_says_the_idle_gpu_held(browser, lab, artifacts_dir):
    page = browser.new_context(viewport={"width": 1400, "height": 900}).new_page()
    _open_notebook(page, lab, "idle.ipynb")
    with urllib.request.urlopen(f"{lab['base']}/api/sessions?token={lab['token']}", timeout=10) as answer:
        kernel = next(s["kernel"]["id"] for s in json.load(answer) if s["path"].endswith("idle.ipynb"))
    folder = lab["runtime"] / "gpuprof-sessions"
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    item = page.locator(".jp-gpuprof-idle-held")
    assert not item.is_visible()  # nothing held idle: nothing said
    (folder / f"{kernel}.state.json").write_text(json.dumps({
        "version": 1, "kernel": {"id": kernel, "user": "alice", "pid": 1}, "on": True, "cell_running": False,
        "idle_since": time.time() - 14 * 60 - 5, "memory_held_bytes": 22 * GIB, "written": time.time()}))
    (folder / "another-servers-kernel.state.json").write_text(json.dumps({
        "version": 1, "kernel": {"id": "another-servers-kernel", "user": "bob", "pid": 1}, "cell_running": False,
        "idle_since": time.time() - 3600, "memory_held_bytes": 40 * GIB, "written": time.time()}))
    page.wait_for_function("() => { const e = document.querySelector('.jp-gpuprof-idle-held');"
                           " return e && e.textContent === 'GPU idle 14 min, holding 22 GiB'; }", timeout=60_000)
    assert item.is_visible()
    page.locator(".jp-gpuprof-idle-held").screenshot(path=str(artifacts_dir / "labext_idle_held.png"))
    # GPU-aware culling's warning (server/culling.py writes it so): the notebook is told ahead, once
    (folder / f"{kernel}.cull.json").write_text(json.dumps({"warned_at": time.time(), "cull_at": time.time() + 250}))
    page.wait_for_function("() => /shut down in 4 min/.test(document.querySelector('.jp-gpuprof-idle-held').textContent)",
                           timeout=60_000)
    toast = page.locator(".jp-toast-message:has-text('will be shut down')")
    toast.wait_for(timeout=10_000)
    assert "held 22 GiB" in toast.first.text_content() and toast.count() == 1
