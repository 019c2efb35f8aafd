"""The per-process layout (notebook/, runtime/, sampler_process/, server/ over core/) is a lint rule.

import-linter's contracts live in pyproject.toml. ``make lint`` checks the package against them
(``lint-imports``, beside ruff), so ``make test-fast`` and ``make test`` (CI) do, without a
process started from pytest; here the lint runs on temporary copies with a wrong import
planted, which must fail (those start the linter: ``process``). One plant a contract at least:
a process importing what only another loads (the sampler process: IPython, Bokeh, ipywidgets,
torch; the kernel: pynvml, the NVML source, the sampler process's modules), a layer imported
upwards, and an import cycle inside a folder.
"""

from __future__ import annotations

import ast
import itertools
import os
import re
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


def _recipe(makefile: str, target: str) -> list[str]:
    """The commands of a Makefile target (its tab-indented lines)."""
    lines = makefile.split(f"\n{target}:", 1)[1].split("\n")[1:]
    return [line.strip() for line in itertools.takewhile(lambda line: line.startswith("\t"), lines)]


def test_the_fast_loop_lints_the_layers():
    """``make lint`` runs the import contracts on this checkout beside ruff, and ``make
    test-fast`` (like ``make test``) runs ``lint`` first: the layers are checked on every edit."""
    makefile = (ROOT / "Makefile").read_text()
    lint = _recipe(makefile, "lint")
    assert any("ruff check" in c for c in lint)
    assert any(c.startswith("PYTHONPATH=$(CURDIR) ") and "lint-imports --no-cache" in c for c in lint), lint
    for target in ("test-fast", "test"):
        assert "lint" in re.search(rf"^{target}:(.*)$", makefile, re.M).group(1).split(), target


@pytest.mark.process
@pytest.mark.parametrize("module, planted, contract", [
    ("core/store/experiment.py", "from gpuprof_jupyter.core.analysis import summary", "Core:"),
    ("core/analysis/rules.py", "from gpuprof_jupyter.runtime import session", "Processes:"),
    ("runtime/session.py", "from gpuprof_jupyter.notebook import magic", "Processes:"),
    ("runtime/hooks/requests.py", "from gpuprof_jupyter.runtime import session", "Runtime:"),
    ("runtime/record/events.py", "from gpuprof_jupyter.runtime.hooks import activity", "Runtime:"),
    ("notebook/magic.py", "from gpuprof_jupyter.core.sources.select import validate_source_spec", "A view never talks to NVML"),
    ("notebook/status.py", "import pynvml", "The kernel side never loads NVML"),
    ("notebook/live/dashboard.py", "from gpuprof_jupyter.core.sources import nvml", "The kernel side never loads NVML"),
    ("runtime/link.py", "from gpuprof_jupyter.core.sources.nvml import query", "The kernel side never loads NVML"),
    ("sampler_process/sampler.py", "import IPython", "The sampler process and the core import no IPython"),
    ("sampler_process/exporter/endpoint.py", "import bokeh.plotting", "The sampler process and the core import no IPython"),
    ("sampler_process/recorder.py", "import ipywidgets", "The sampler process and the core import no IPython"),
    ("sampler_process/run.py", "import torch", "The sampler process and the core import no IPython"),
    ("core/analysis/windows.py", "from gpuprof_jupyter.core.analysis import summary", "No import cycles"),
    ("render/html.py", "from gpuprof_jupyter.render import summary_html", "No import cycles"),
    ("render/report.py", "from gpuprof_jupyter.server import handlers", "Processes:"),
    ("render/pipeline_yaml.py", "from gpuprof_jupyter.export import pipeline", "Processes:"),
    ("export/report.py", "from gpuprof_jupyter.notebook import compare_widget", "Processes:"),
    ("runtime/profile.py", "from gpuprof_jupyter.sampler_process import run", "Processes:"),
    ("runtime/link.py", "from gpuprof_jupyter.sampler_process import main", "Processes:"),
    ("notebook/status.py", "import jupyter_server.base.handlers", "Only the server extension imports jupyter_server"),
    ("render/summary_html.py", "from gpuprof_jupyter.runtime import session", "Processes:"),
    ("render/comparison.py", "from gpuprof_jupyter.core.sources import select", "A view never talks to NVML"),
    ("sampler_process/run.py", "from gpuprof_jupyter.render import html", "The sampler process renders nothing"),
])
def test_a_wrong_import_fails_the_lint(tmp_path, module, planted, contract):
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    shutil.copytree(ROOT / "gpuprof_jupyter", tmp_path / "gpuprof_jupyter",
                    ignore=shutil.ignore_patterns("__pycache__"))
    path = tmp_path / "gpuprof_jupyter" / module
    path.write_text(path.read_text() + f"\n{planted}  # planted by the test\n")
    result = _lint(tmp_path)
    assert result.returncode != 0, result.stdout
    broken = [line for line in result.stdout.splitlines() if " BROKEN" in line]
    assert any(contract in line for line in broken), result.stdout


# The process a folder's modules run in, as their docstrings must name it (docs/architecture.md).
_PROCESS_OF_FOLDER = {"notebook": "the kernel", "runtime": "any process that holds a run", "sampler_process": "the sampler process", "server": "the Jupyter server",
                      "render": "the kernel, the Jupyter server and the ``gpuprof`` command",
                      "export": "the kernel, the Jupyter server and the ``gpuprof`` command"}


def test_every_module_says_which_process_runs_it():
    missing = []
    for path in sorted((ROOT / "gpuprof_jupyter").rglob("*.py")):
        relative = path.relative_to(ROOT / "gpuprof_jupyter")
        if relative.parts[0] == "labextension":
            continue
        lines = [line.strip() for line in (ast.get_docstring(ast.parse(path.read_text())) or "").splitlines()]
        said = next((line for line in lines if line.startswith("Runs in ")), None)
        wanted = _PROCESS_OF_FOLDER.get(relative.parts[0], "")
        if said is None or wanted not in said:
            missing.append(f"{relative}: {said or 'no line starting Runs in'}")
    assert not missing, "\n".join(missing)


def test_the_tests_reach_into_production_code_through_one_module():
    """The variables only tests set (``GPUPROF_TEST_*``, ``GPUPROF_FAKE_NVML``,
    ``GPUPROF_FAULT_STEP``) are read, and the profiler's steps rerouted to fail one
    (``guarded.replace_call``), in core/fault_injection.py alone, so a reader of the rest sees
    no test hooks."""
    readers = sorted(str(path.relative_to(ROOT)) for path in (ROOT / "gpuprof_jupyter").rglob("*.py")
                     if path.name != "fault_injection.py"
                     and re.search(r"GPUPROF_TEST_|GPUPROF_FAKE_NVML|GPUPROF_FAULT_STEP|(?<!def )replace_call\(",
                                   path.read_text(encoding="utf-8")))
    assert readers == []


def test_renderers_return_text_and_export_writes_the_files():
    """Writing a file a person asked for (pipeline.yaml, a report, a trace) is export/'s job;
    render/ returns text. Its one write is bokeh_templates' cache of BokehJS's templates, a
    cache of its own, not a person's file."""
    writers = sorted(path.name for path in (ROOT / "gpuprof_jupyter" / "render").glob("*.py")
                     if "write_text_atomic" in path.read_text(encoding="utf-8"))
    assert writers == ["bokeh_templates.py"]
