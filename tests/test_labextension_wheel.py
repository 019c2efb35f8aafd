"""The wheel carries the prebuilt labextension and enables the server extension: a pip user
needs no Node.

Builds the wheel from this checkout with the README's command, `make wheel` (no build isolation:
hatchling, hatch-jupyter-builder and build come with the test extra; the labextension must have
been built, as `make install` does; this venv counts as installed, so make does not reinstall it),
installs it with --no-deps into a fresh venv whose PATH holds only that venv's bin (no node),
and asks `jupyter labextension list` / `jupyter server extension list` and the console script
`jupyter-gpuprof-server --help-all` there. The fresh venv gets the dependencies by a .pth line
naming this venv's site-packages (no download, no compiling: seconds on 2 cores); their data
files (share/jupyter, etc/jupyter) are not seen, so what the listings show comes from our wheel
alone.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BUILT = ROOT / "gpuprof_jupyter" / "labextension" / "static" / "style.js"

pytestmark = pytest.mark.timeout(300)


@pytest.mark.process
def test_wheel_installs_both_extensions_without_node(tmp_path):
    assert BUILT.exists(), "labextension not built: run scripts/build_labextension.sh (make install does)"
    dist = tmp_path / "dist"
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    ours = bin_dir.parent  # this venv
    made = subprocess.run(["make", "-C", str(ROOT), "wheel", f"DIST={dist}", f"VENV={ours}",
                           f"--assume-old={ours}/.installed"], capture_output=True, text=True, env=env, timeout=240)
    assert made.returncode == 0, made.stdout + made.stderr
    [wheel] = dist.glob("gpuprof_jupyter-*.whl")
    assert wheel.name == "gpuprof_jupyter-0.1.0-py3-none-any.whl"  # the name the README installs
    assert f"pip install {wheel.name}" in (ROOT / "README.md").read_text()
    names = zipfile.ZipFile(wheel).namelist()
    data = "gpuprof_jupyter-0.1.0.data/data/"
    assert data + "share/jupyter/labextensions/gpuprof-jupyter/package.json" in names
    assert data + "share/jupyter/labextensions/gpuprof-jupyter/static/style.js" in names
    assert data + "etc/jupyter/jupyter_server_config.d/gpuprof_jupyter.json" in names
    assert not any(n.startswith("gpuprof_jupyter/labextension/") for n in names)  # once, in the data only

    venv = tmp_path / "fresh"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    (Path(site) / "_deps_from_test_venv.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    home = tmp_path / "home"
    home.mkdir()
    bare = {"PATH": str(venv / "bin"), "HOME": str(home), "JUPYTER_CONFIG_DIR": str(home / ".jupyter"),
            "JUPYTER_DATA_DIR": str(home / "data"), "LANG": "C.UTF-8"}
    assert shutil.which("node", path=bare["PATH"]) is None
    subprocess.run([str(py), "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", str(wheel)],
                   check=True, env=bare, timeout=120)
    located = subprocess.run([str(py), "-c", "import gpuprof_jupyter.server as s; print(s.__file__)"],
                             check=True, capture_output=True, text=True, env=bare, cwd=home).stdout
    assert located.startswith(site), located  # ours, not a checkout's

    # the modules behind `jupyter labextension` / `jupyter server extension` (their console
    # scripts belong to the jupyterlab/jupyter_server dists, which the .pth lends, not installs)
    lab = subprocess.run([str(py), "-m", "jupyterlab.labextensions", "list"], capture_output=True, text=True,
                         env=bare, cwd=home, timeout=120)
    out = lab.stdout + lab.stderr
    line = next((x for x in out.splitlines() if "gpuprof-jupyter" in x), "")
    assert "enabled" in line and "OK" in line and "gpuprof_jupyter" in line, out
    server = subprocess.run([str(py), "-m", "jupyter_server.extension.serverextension", "list"], capture_output=True,
                            text=True, env=bare, cwd=home, timeout=120)
    out = server.stdout + server.stderr
    lines = out.splitlines()
    i = next((k for k, x in enumerate(lines) if "gpuprof_jupyter.server" in x and "enabled" in x), None)
    assert i is not None, out
    assert any("gpuprof_jupyter.server" in x and "OK" in x for x in lines[i:i + 3]), out

    # the console script `jupyter gpuprof-server` runs (`jupyter` itself, jupyter_core's, is lent)
    helped = subprocess.run([str(venv / "bin" / "jupyter-gpuprof-server"), "--help-all"], capture_output=True,
                            text=True, env=bare, cwd=home, timeout=120)
    assert helped.returncode == 0 and "--GPUProfiler.poll_interval_s=" in helped.stdout, helped.stdout + helped.stderr
