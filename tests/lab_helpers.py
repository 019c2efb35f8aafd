"""JupyterLab served on a free port and driven in headless Chromium: the browser tests' and the
live-view browser benchmark's (``benchmarks/bench_live_browser.py``) one way to do it."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from contextlib import contextmanager
from pathlib import Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _notebook(path: Path, sources: list[str]) -> None:
    """A notebook of code cells ``sources`` at ``path``, with the ipykernel kernelspec."""
    def code(src):
        return {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [], "source": src}

    nb = {
        "cells": [code(src) for src in sources],
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"},
                     "language_info": {"name": "python"}},
        "nbformat": 4, "nbformat_minor": 5,
    }
    path.write_text(json.dumps(nb))


def with_our_extensions(tmp_path: Path, built: Path) -> tuple[str, ...]:
    """The built labextension and our server extension for a ``serve_lab`` under ``tmp_path``
    (its config folder): the arguments that put the labextension on the path."""
    labext = tmp_path / "labextensions"
    labext.mkdir()
    (labext / "gpuprof-jupyter").symlink_to(built)
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "jupyter_server_config.json").write_text(
        json.dumps({"ServerApp": {"jpserver_extensions": {"gpuprof_jupyter.server": True}}}))
    return (f"--LabApp.extra_labextensions_path={labext}",)


@contextmanager
def serve_lab(root: Path, tmp_path: Path, env: dict, args: tuple = (), base_url: str = "/",
              command: tuple = (sys.executable, "-m", "jupyterlab", "--LabApp.news_url=")):
    """``jupyter lab`` (or another server ``command``) on a free port with a fresh token, its own
    config/settings/workspace folders under ``tmp_path`` and no news; yields {"base", "token",
    "root", "log", "pid"}; stopped after."""
    token = uuid.uuid4().hex
    port = _free_port()
    env = {**env, "JUPYTER_CONFIG_DIR": str(tmp_path / "cfg"),
           "JUPYTERLAB_SETTINGS_DIR": str(tmp_path / "settings"), "JUPYTERLAB_WORKSPACES_DIR": str(tmp_path / "ws")}
    settings = tmp_path / "settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    (settings / "notification.jupyterlab-settings").write_text(json.dumps({"fetchNews": "false",
                                                                           "checkForUpdates": False}))
    log = open(tmp_path / "lab.log", "w")
    proc = subprocess.Popen(
        [*command, "--allow-root", "--no-browser", f"--port={port}",
         f"--ServerApp.token={token}", "--ServerApp.ip=127.0.0.1", f"--ServerApp.root_dir={root}",
         f"--ServerApp.base_url={base_url}", "--ServerApp.open_browser=False", *args],
        cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}{base_url.rstrip('/')}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2)
                break
            except Exception:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{command} did not start: " + (tmp_path / "lab.log").read_text()[-2000:])
                time.sleep(0.5)
        yield {"base": base, "token": token, "root": root, "log": tmp_path / "lab.log", "pid": proc.pid}
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        log.close()


def _dismiss_dialogs(page) -> None:
    """The 'Select Kernel' dialog (if kernelspec metadata were ignored) and the news toast."""
    for label in ("Select", "No"):
        button = page.locator(f".jp-Dialog button:has-text('{label}')")
        if button.count():
            button.first.click()
    news = page.locator(".jp-Notification-Toast button:has-text('No')")
    if news.count():
        news.first.click()


def _wait_idle(page, timeout_s: float = 60) -> None:
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=timeout_s * 1000)


def _open_notebook(page, lab_server: dict, name: str) -> None:
    """Open notebook ``name`` in JupyterLab and wait for its kernel to be idle."""
    page.goto(f"{lab_server['base']}/lab/tree/{name}?token={lab_server['token']}")
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
    _dismiss_dialogs(page)
    page.wait_for_selector("text=Python 3 (ipykernel) | Idle", timeout=60_000)


def _run_cell(page, index: int, finished: bool = True) -> None:
    """Run code cell ``index`` (Ctrl+Enter), again if the first execute was lost while the kernel
    connected; ``finished``: until it has run (its prompt shows a number), else until it runs."""
    cell = page.locator(".jp-Notebook .jp-CodeCell").nth(index)
    done = "/\\[\\d+\\]/" if finished else "/\\[(\\d+|\\*)\\]/"
    for _attempt in range(6):
        cell.locator(".jp-InputArea-editor").click()
        page.keyboard.press("Control+Enter")
        try:
            page.wait_for_function(
                f"() => {done}.test(document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')[{index}].textContent)",
                timeout=30_000)
            return
        except Exception:
            continue
    raise AssertionError(f"cell {index} never ran")
