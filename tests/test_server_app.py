"""The server extension as an ExtensionApp: `jupyter gpuprof-server --help-all` lists the
settings, and `c.GPUProfiler.<name>` / `--GPUProfiler.<name>=...` reach the handlers, whether
`jupyter lab` loads the extension or `jupyter gpuprof-server` starts a server with it.

The console script is declared in pyproject.toml and installed only by pip; instead of
reinstalling the shared environment, the tests write pip's wrapper for the declared entry
point into a folder ahead on PATH and go through the real `jupyter` command, which finds
`jupyter-gpuprof-server` there as it would an installed one.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import urllib.request
from pathlib import Path

import pytest
from tests.lab_helpers import serve_lab

from gpuprof_jupyter.server.app import GPUProfilerApp
from gpuprof_jupyter.server.config import GPUProfiler

# Every test here imports the app (jupyter_server: 1-2 s of CPU) and most start one: none in the fast loop.
pytestmark = pytest.mark.process

ROOT = Path(__file__).resolve().parent.parent
JUPYTER = str(Path(sys.executable).parent / "jupyter")
SCRIPT = "jupyter-gpuprof-server"

# What pip writes for a [project.scripts] entry (pip._internal.operations.install.wheel).
PIP_WRAPPER = """#!{python}
import re
import sys
from {module} import {attr}
if __name__ == "__main__":
    sys.argv[0] = re.sub(r"(-script\\.pyw|\\.exe)?$", "", sys.argv[0])
    sys.exit({attr}())
"""


def declared_scripts() -> dict[str, str]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]


@pytest.fixture
def jupyter_env(tmp_path) -> dict:
    """The environment of a `jupyter` command that finds the declared console script (and this
    checkout's package, ahead of any installed one)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    module, attr = declared_scripts()[SCRIPT].split(":")
    wrapper = bin_dir / SCRIPT
    wrapper.write_text(PIP_WRAPPER.format(python=sys.executable, module=module, attr=attr))
    wrapper.chmod(0o755)
    return {**os.environ, "PATH": os.pathsep.join([str(bin_dir), os.environ.get("PATH", "")]),
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


def test_the_console_script_is_the_apps_launcher():
    """`jupyter-gpuprof-server` names the app's launcher, the app is named after the subcommand
    (jupyter_server reads `jupyter_gpuprof_server_config.*` by that name), and `gpuprof`, the
    command line tool, keeps its own name."""
    scripts = declared_scripts()
    assert scripts[SCRIPT] == "gpuprof_jupyter.server.app:main"
    assert SCRIPT == f"jupyter-{GPUProfilerApp.name}"
    assert scripts["gpuprof"] == "gpuprof_jupyter.cli:main"
    from gpuprof_jupyter.server.app import main

    assert main == GPUProfilerApp.launch_instance


@pytest.mark.timeout(120)
def test_help_all_lists_every_setting_with_its_help(jupyter_env, tmp_path):
    done = subprocess.run([JUPYTER, "gpuprof-server", "--help-all"], env=jupyter_env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stdout + done.stderr
    section = done.stdout.split("GPUProfiler(Configurable) options", 1)[1]
    words = " ".join(section.split())
    traits = GPUProfiler.class_traits(config=True)
    assert len(traits) == 9  # the six of the poller and the store, the three of GPU-aware culling
    for name, trait in traits.items():
        assert f"--GPUProfiler.{name}=" in section, f"--help-all does not list GPUProfiler.{name}"
        assert " ".join(trait.help.split()) in words, f"--help-all does not show GPUProfiler.{name}'s help"


def _get(server, path) -> dict:
    url = f"{server['base']}/gpuprof/api/{path}"
    with urllib.request.urlopen(urllib.request.Request(url, headers={"Authorization": f"token {server['token']}"}),
                                timeout=10) as response:
        return json.loads(response.read())


@pytest.mark.timeout(180)
@pytest.mark.parametrize("subcommand", [("gpuprof-server",), ("lab", "--LabApp.news_url=")], ids=lambda c: c[0])
def test_settings_from_the_command_line_and_a_config_file_reach_the_handlers(jupyter_env, tmp_path, subcommand):
    """One setting on the command line, one in jupyter_server_config.py, both seen through the
    routes; under `jupyter lab` the extension is enabled by jupyter-config/server-config's file,
    copied where the wheel puts it (a config folder's jupyter_server_config.d), and loaded once,
    into lab's own server."""
    root = tmp_path / "root"
    root.mkdir()
    config_dir = tmp_path / "cfg"
    (config_dir / "jupyter_server_config.d").mkdir(parents=True)
    shutil.copy(ROOT / "jupyter-config" / "server-config" / "gpuprof_jupyter.json",
                config_dir / "jupyter_server_config.d")
    (config_dir / "jupyter_server_config.py").write_text('c.GPUProfiler.default_store = "elsewhere"\n')
    with serve_lab(root, tmp_path, jupyter_env, args=("--GPUProfiler.devices_enabled=False",),
                   command=(JUPYTER, *subcommand)) as server:
        devices = _get(server, "devices")
        assert (devices["state"], devices["reason"]) == ("no_gpu", "disabled"), devices
        assert _get(server, "experiments")["store"] == "elsewhere"
        log = server["log"].read_text()
    assert log.count("gpuprof_jupyter server extension:") == 1, log
    assert len(re.findall(r"Jupyter Server [\d.]+ is running at", log)) == 1, log
