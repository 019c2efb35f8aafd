"""The layer order (sources -> sampler -> recording/store -> analysis -> views) is a lint rule.

import-linter's contracts live in pyproject.toml; CI runs only the test suite, so the lint
runs here: once on the package, and on temporary copies with a wrong import planted, which
must fail.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LINT = "import sys; from importlinter.cli import lint_imports; sys.exit(lint_imports(no_cache=True))"


def _lint(root: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(root), "COLUMNS": "500"}  # the copy under test; one line a contract
    return subprocess.run([sys.executable, "-c", LINT], cwd=root, env=env, capture_output=True, text=True,
                          timeout=120)


def test_the_package_keeps_its_layers():
    result = _lint(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.parametrize("module, planted, contract", [
    ("store/experiment.py", "from ..views import summary_html", "Layers"),
    ("analysis/rules.py", "from ..runtime import session", "Layers"),
    ("views/magic.py", "from ..sources.select import probe_gpus", "A view never talks to NVML"),
    ("sampler/sampler.py", "import IPython", "The core imports no IPython"),
    ("views/report.py", "from ..server import api", "Layers"),
    ("runtime/status.py", "import jupyter_server.base.handlers", "Only the server extension imports jupyter_server"),
])
def test_a_wrong_import_fails_the_lint(tmp_path, module, planted, contract):
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    shutil.copytree(ROOT / "gpuprof_jupyter", tmp_path / "gpuprof_jupyter",
                    ignore=shutil.ignore_patterns("__pycache__"))
    path = tmp_path / "gpuprof_jupyter" / module
    path.write_text(path.read_text() + f"\n{planted}  # planted by the test\n")
    result = _lint(tmp_path)
    assert result.returncode != 0, result.stdout
    broken = [line for line in result.stdout.splitlines() if line.endswith("BROKEN")]
    assert any(contract in line for line in broken), result.stdout
