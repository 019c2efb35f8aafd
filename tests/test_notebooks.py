"""notebooks/shared_gpus.ipynb and notebooks/multi_node.ipynb run as committed (issue 22 part 3):
without outputs in git, executed here on fake GPUs and simulated nodes, and they show what the
docs say they show."""

from __future__ import annotations

import json
import os
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

pytestmark = [pytest.mark.kernel, pytest.mark.timeout(300)]

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


def execute(name: str, store: Path) -> str:
    """Run the notebook in notebooks/ (its cwd, as in JupyterLab) with the store in ``store``;
    the text of every output."""
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    previous = os.environ.get("GPUPROF_STORE")
    os.environ["GPUPROF_STORE"] = str(store)  # the kernel inherits it: nothing written in notebooks/
    try:
        NotebookClient(nb, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    finally:
        if previous is None:
            os.environ.pop("GPUPROF_STORE", None)
        else:
            os.environ["GPUPROF_STORE"] = previous
    return json.dumps([cell.get("outputs", []) for cell in nb.cells])


@pytest.mark.parametrize("name", ["shared_gpus.ipynb", "multi_node.ipynb"])
def test_committed_without_outputs(name):
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    assert all(not c.get("outputs") and c.get("execution_count") is None for c in nb.cells if c.cell_type == "code")
    assert "FAKE" in nb.cells[0].source or "SIMULATED" in nb.cells[0].source  # said before anything runs


def test_shared_gpus_notebook(tmp_path):
    out = execute("shared_gpus.ipynb", tmp_path / "store")
    assert "FAKE A100 #0" in out  # %gpuprofile status: the fake GPUs, named so
    assert "gpu0 (FAKE): SM yours 60 % / others 25 %, memory yours 3.0 GiB / others 5.0 GiB" in out
    assert "the other process id in the stored experiment: False" in out
    assert "999999" not in (tmp_path / "store").joinpath(next(p.name for p in (tmp_path / "store").iterdir()
                                                            if p.is_dir()), "meta.json").read_text()


def test_multi_node_notebook(tmp_path):
    out = execute("multi_node.ipynb", tmp_path / "store")
    assert "node1/gpu0 (SIMULATED): SM mean 50 %" in out and "node2/gpu0 (SIMULATED): SM mean 70 %" in out
