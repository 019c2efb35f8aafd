"""A real JupyterHub (issue 39 part 6): two system users on one node with a shared (fake) GPU.

JupyterHub itself (the ``jupyterhub`` package) with ``configurable-http-proxy`` (npm), the
``dummy`` authenticator and ``LocalProcessSpawner``: each user's single-user server runs as that
system user (CI is root: ``useradd``). Through Chromium, user A runs cells and a profiled cell and
sees the session and the status bar ("GPU idle 1 min, holding 3 GiB"); user B cannot read A's
session through the API, A's experiments through the files, or A's metrics; an admin's token
reads A's idle GPU held on A's server's ``/metrics``.

What it needs beyond ``make test``'s: ``jupyterhub`` importable (the ``hub`` extra) and
``configurable-http-proxy`` on PATH (``npm install -g configurable-http-proxy``), both installed
by ``make hub-deps`` (part of ``system-deps``). The users' servers run the interpreter named by
``GPUPROF_HUB_PYTHON`` (default: this one), which the test users must be able to execute, with
this interpreter's site-packages on their PYTHONPATH.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import site
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.lab_helpers import _dismiss_dialogs, _run_cell

pytestmark = [pytest.mark.browser, pytest.mark.process, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parent.parent
BUILT = ROOT / "gpuprof_jupyter" / "labextension"
USERS = ("gpuprof-hub-a", "gpuprof-hub-b")
PASSWORD = "hub-test-" + secrets.token_hex(4)
GIB = 1 << 30

NOTEBOOK_CELLS = [
    "import os\nfrom tests.fake_nvml import sampler_process_env\n"
    "os.environ.update(sampler_process_env({'gpus': [{'kind': 'a100', 'util_gpu': 0, "
    f"'processes': [[os.getpid(), {3 * GIB}]]}}]}}))\n%load_ext gpuprof_jupyter\nimport gpuprof_jupyter",
    "x = 1",
    "%%gpuprofile --source sim -n hub-run --quiet\ny = sum(range(1000))",
    "frame = gpuprof_jupyter.session()\nprint('CELLS', [s for s in frame['source'] if s])\n"
    "print('EXPERIMENTS', [e for e in frame['experiment'] if e])",
    "%gpuprofile serve --port 0",
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _requirements() -> tuple[str, str]:
    """(the hub's proxy, the users' Python) or a failure saying what to install."""
    if os.geteuid() != 0 or not shutil.which("useradd"):
        pytest.fail("needs root and useradd to make the two hub users (CI runs as root)")
    try:
        import jupyterhub  # noqa: F401
    except ImportError:
        pytest.fail("needs the jupyterhub package: make hub-deps (pip install -e '.[hub]')")
    proxy = os.environ.get("GPUPROF_HUB_PROXY") or shutil.which("configurable-http-proxy")
    if not proxy:
        pytest.fail("needs configurable-http-proxy: make hub-deps (npm install -g configurable-http-proxy)")
    for needed in (ROOT / "gpuprof_jupyter", *map(Path, site.getsitepackages())):
        if not _reachable_by_others(needed):
            pytest.fail(f"the hub's users cannot reach {needed} (a folder above it is closed to others): "
                        "run the tests from a checkout and environment other users can read")
    return proxy, os.environ.get("GPUPROF_HUB_PYTHON") or _python_for_others()


def _reachable_by_others(path: Path) -> bool:
    """Whether a user other than root can reach ``path``: every folder above it searchable by others."""
    return all(os.stat(folder).st_mode & 0o001 for folder in [*path.parents][::-1] if folder != path)


def _python_for_others() -> str:
    """An interpreter of this Python's version that the hub's users may run: this one, or (where it
    sits in root's home, mode 0700, as pyenv's does) the system's of the same version; this
    interpreter's site-packages go on their PYTHONPATH either way."""
    own = Path(os.path.realpath(sys.executable))
    if _reachable_by_others(own):
        return sys.executable
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for folder in ("/usr/bin", "/usr/local/bin"):
        candidate = Path(folder) / version
        if candidate.is_file() and _reachable_by_others(candidate):
            return str(candidate)
    pytest.fail(f"the hub's users cannot run {own} (a folder above it is closed to them) and there is no "
                f"/usr/bin/{version}: set GPUPROF_HUB_PYTHON to an interpreter of this version they can run")


def _api(base: str, path: str, token: str, method: str = "GET", body: dict | None = None):
    """(status, body text) of a request to the hub's proxy with ``token``."""
    data = json.dumps(body).encode() if body is not None else (b"" if method == "POST" else None)
    request = urllib.request.Request(f"{base}{path}", data=data, method=method,
                                     headers={"Authorization": f"token {token}"})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")
    except (urllib.error.URLError, OSError) as exc:  # not listening yet
        return 0, str(exc)


def _as_user(user: str, code: str) -> subprocess.CompletedProcess:
    return subprocess.run(["/usr/bin/python3", "-c", code], user=user, capture_output=True, text=True, timeout=30,
                          cwd="/")


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    proxy, python = _requirements()
    assert (BUILT / "package.json").exists(), "labextension not built: run scripts/build_labextension.sh"
    tmp = tmp_path_factory.mktemp("hub")
    os.chmod(tmp, 0o755)
    for user in USERS:
        subprocess.run(["userdel", "-r", user], capture_output=True)  # left by an interrupted run
        subprocess.run(["useradd", "-m", "-s", "/bin/bash", user], check=True)
        os.chmod(f"/home/{user}", 0o700)  # a home of one's own, as useradd's HOME_MODE 0700 makes it
    shared = Path(tempfile.mkdtemp(prefix="gpuprof-hub-"))  # what every user's server reads (pytest's tmp is 0700)
    os.chmod(shared, 0o755)
    (shared / "cfg").mkdir(parents=True)
    (shared / "cfg" / "jupyter_server_config.json").write_text(json.dumps({
        "ServerApp": {"jpserver_extensions": {"gpuprof_jupyter.server": True}},
        "LabApp": {"news_url": ""}}))
    (shared / "data" / "labextensions").mkdir(parents=True)  # first on JUPYTER_PATH: this checkout's build wins
    (shared / "data" / "labextensions" / "gpuprof-jupyter").symlink_to(BUILT)
    os.system(f"chmod -R a+rX {shared}")
    # this environment's Jupyter config and data, found whatever interpreter the users' servers run
    pythonpath = os.pathsep.join([str(ROOT), *os.environ.get("PYTHONPATH", "").split(os.pathsep),
                                  *site.getsitepackages()])
    token = secrets.token_hex(16)
    port, hub_port, api_port = _free_port(), _free_port(), _free_port()
    config = tmp / "jupyterhub_config.py"
    config.write_text(f"""
c.JupyterHub.ip = "127.0.0.1"
c.JupyterHub.port = {port}
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = {hub_port}
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{api_port}"
c.ConfigurableHTTPProxy.command = [{proxy!r}]
c.JupyterHub.db_url = "sqlite:///{tmp}/hub.sqlite"
c.JupyterHub.cookie_secret_file = "{tmp}/cookie_secret"
c.JupyterHub.authenticator_class = "dummy"
c.DummyAuthenticator.password = {PASSWORD!r}
c.Authenticator.allowed_users = {set(USERS)!r}
c.JupyterHub.services = [{{"name": "gpuprof-test-admin", "api_token": {token!r}}}]
c.JupyterHub.load_roles = [{{"name": "gpuprof-test-admin", "services": ["gpuprof-test-admin"],
                            "scopes": ["admin:users", "admin:servers", "tokens", "access:servers"]}}]
c.Spawner.cmd = [{python!r}, "-m", "jupyterhub.singleuser"]
c.Spawner.default_url = "/lab"
c.Spawner.start_timeout = 180
c.Spawner.http_timeout = 180
c.Spawner.environment = {{"PYTHONPATH": {pythonpath!r},
                          "JUPYTER_CONFIG_PATH": "{shared}/cfg:{sys.prefix}/etc/jupyter",
                          "JUPYTER_PATH": "{shared}/data:{sys.prefix}/share/jupyter",
                          "JUPYTERLAB_DIR": "{sys.prefix}/share/jupyter/lab", "GPUPROF_SESSION_NOTICE_AFTER": "0"}}
""")
    log = open(tmp / "hub.log", "w")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "PATH": os.pathsep.join([str(Path(proxy).parent), os.environ["PATH"]])}
    proc = subprocess.Popen([sys.executable, "-m", "jupyterhub", "-f", str(config)], cwd=tmp, env=env,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while _api(base, "/hub/api/", token)[0] != 200:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("jupyterhub did not start: " + (tmp / "hub.log").read_text()[-3000:])
            time.sleep(0.5)
        for user in USERS:
            assert _api(base, "/hub/api/users", token, "POST", {"usernames": [user]})[0] in (201, 409)
        yield {"base": base, "token": token, "tmp": tmp, "log": tmp / "hub.log"}
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)  # the hub stops the users' servers on its way out
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        log.close()
        for user in USERS:
            subprocess.run(["pkill", "-u", user], capture_output=True)
            subprocess.run(["userdel", "-r", user], capture_output=True)
        shutil.rmtree(shared, ignore_errors=True)


def _start_server(hub, user: str) -> None:
    status, body = _api(hub["base"], f"/hub/api/users/{user}/server", hub["token"], "POST")
    assert status in (201, 202, 400), body  # 400: already running
    deadline = time.monotonic() + 180
    while True:
        status, body = _api(hub["base"], f"/hub/api/users/{user}", hub["token"])
        if status == 200 and json.loads(body).get("servers", {}).get("", {}).get("ready"):
            return
        assert time.monotonic() < deadline, "the server of " + user + " did not start: " + hub["log"].read_text()[-3000:]
        time.sleep(1)


def _token_of(hub, user: str) -> str:
    status, body = _api(hub["base"], f"/hub/api/users/{user}/tokens", hub["token"], "POST", {"note": "test"})
    assert status in (200, 201), body
    return json.loads(body)["token"]


def test_each_user_sees_their_own_session_and_admins_see_the_idle_gpu_held(hub, browser, artifacts_dir):
    a, b = USERS
    notebook = {"cells": [{"cell_type": "code", "execution_count": None, "id": f"c{i}", "metadata": {}, "outputs": [],
                           "source": source} for i, source in enumerate(NOTEBOOK_CELLS)],
                "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3 (ipykernel)",
                                            "language": "python"}},
                "nbformat": 4, "nbformat_minor": 5}
    path = Path(f"/home/{a}/session.ipynb")
    path.write_text(json.dumps(notebook))
    shutil.chown(path, a, a)
    for user in USERS:
        _start_server(hub, user)

    page = browser.new_context(viewport={"width": 1400, "height": 900}).new_page()
    page.goto(f"{hub['base']}/hub/login")
    page.fill("input[name=username]", a)
    page.fill("input[name=password]", PASSWORD)
    page.click("input[type=submit], button[type=submit]")
    page.goto(f"{hub['base']}/user/{a}/lab/tree/session.ipynb")
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=120_000)
    _dismiss_dialogs(page)
    page.wait_for_selector("text=Python 3 (ipykernel) | Idle", timeout=120_000)
    for index in range(len(NOTEBOOK_CELLS)):
        _run_cell(page, index)
    page.wait_for_function("() => /EXPERIMENTS \\[.+\\]/.test(document.body.innerText)", timeout=60_000)
    page.wait_for_function("() => /Prometheus metrics on http/.test(document.body.innerText)", timeout=60_000)
    said = page.locator(".jp-OutputArea-output").all_text_contents()
    assert any("%%gpuprofile --source sim -n hub-run --quiet" in t and "x = 1" in t for t in said), said
    # a minute of idle GPU while the kernel holds 3 GiB: the status bar says so
    page.wait_for_function("() => { const e = document.querySelector('.jp-gpuprof-idle-held');"
                           " return e && /^GPU idle \\d+ min, holding 3 GiB/.test(e.textContent); }", timeout=180_000)
    page.locator(".jp-gpuprof-idle-held").screenshot(path=str(artifacts_dir / "hub_idle_held.png"))

    token_a, token_b = _token_of(hub, a), _token_of(hub, b)
    status, body = _api(hub["base"], f"/user/{a}/gpuprof/api/sessions", token_a)
    assert status == 200 and [s["user"] for s in json.loads(body)["sessions"]] == [a]
    for path_ in (f"/user/{a}/gpuprof/api/sessions", f"/user/{a}/gpuprof/api/experiments", f"/user/{a}/metrics"):
        assert _api(hub["base"], path_, token_b)[0] == 403, path_  # B's token: not A's server
    status, body = _api(hub["base"], f"/user/{b}/gpuprof/api/sessions", token_b)
    assert status == 200 and json.loads(body)["sessions"] == []  # B's own server knows nothing of A's kernel
    store = Path(f"/home/{a}/.gpuprof")
    meta = next(store.glob("*/meta.json"))
    done = _as_user(b, f"open({str(meta)!r}).read()")
    assert done.returncode != 0 and "PermissionError" in done.stderr  # nor through the files
    served = " ".join(page.locator(".jp-OutputArea-output").all_text_contents())
    url = re.search(r"Prometheus metrics on (http://\S+?)[ (]", served).group(1)
    token_file = re.search(r"bearer token kept in (\S+) \(mode", served).group(1)
    done = _as_user(b, f"import urllib.request; urllib.request.urlopen({url!r}, timeout=10)")
    assert "HTTP Error 401" in done.stderr, done.stderr  # nor A's exporter without A's token
    done = _as_user(b, f"open({token_file!r}).read()")
    assert done.returncode != 0 and "PermissionError" in done.stderr  # which B cannot read
    status, metrics = _api(hub["base"], f"/user/{a}/metrics", hub["token"])  # an admin's token
    assert status == 200
    assert 'gpuprof_session_gpu_idle_held_seconds{kernel="' in metrics and f'user="{a}"' in metrics
    assert 'gpuprof_session_gpu_memory_held_bytes' in metrics
