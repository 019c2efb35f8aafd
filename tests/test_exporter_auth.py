"""Issue 19 part 4: who can scrape the exporter, moving it, and readings between runs.

A bearer token by default (401 without it), kept 0600 in a file the printed scrape config
names (checked by ``promtool check config``); ``--no-auth`` turns it off; a busy port leaves
the old endpoint serving (here and, through the magic, in tests/test_exporter.py); between runs ``/metrics`` still carries the devices' current
readings (fake NVML in the sampler process).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import stat
import subprocess
import urllib.error
import urllib.request

import pytest

from gpuprof_jupyter.sampler_process.exporter import Exporter, ExporterBindError
from tests.fakes import wait_for
from tests.test_exporter import DEVICES, line_magic, scrape_text, served, served_token  # noqa: F401 (fixture)


def status_of(url: str, token: str | None = None) -> int:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as error:
        assert error.code != 401 or error.headers["WWW-Authenticate"].startswith("Bearer")
        return error.code


def test_a_token_is_required_when_set_and_can_be_changed_in_place():
    exporter = Exporter(node="n")
    exporter.set_devices(DEVICES)
    exporter.start(port=0, token="right")
    try:
        assert status_of(exporter.url) == 401
        assert status_of(exporter.url, "wrong") == 401
        assert status_of(exporter.url, "right") == 200
        exporter.token = None
        assert status_of(exporter.url) == 200
    finally:
        exporter.close()


def test_a_busy_port_keeps_the_old_endpoint_and_a_free_one_moves_it():
    exporter = Exporter(node="n")
    first = exporter.start(port=0, token="t")
    try:
        with socket.socket() as holder:
            holder.bind(("127.0.0.1", 0))
            holder.listen()
            busy = holder.getsockname()[1]
            with pytest.raises(ExporterBindError, match=f"port {busy} on 127.0.0.1 is already in use"):
                exporter.start(port=busy, token=None)
        assert exporter.port == first and status_of(exporter.url, "t") == 200  # still there, still guarded
        old_url = exporter.url
        exporter.start(port=0, token="t")
        assert exporter.port != first and status_of(exporter.url, "t") == 200
        with pytest.raises(OSError):
            urllib.request.urlopen(old_url, timeout=5)
        moved = exporter.port  # the same port on another address: the endpoint holds it itself
        assert exporter.start(addr="0.0.0.0", port=moved, token="t") == moved and exporter.addr == "0.0.0.0"
        assert status_of(f"http://127.0.0.1:{moved}/metrics", "t") == 200
    finally:
        exporter.close()


@pytest.mark.process
def test_serve_makes_a_0600_token_prints_a_scrape_config_promtool_accepts_and_no_auth_turns_it_off(
        served, tmp_path, capsys):
    line_magic("serve --port 0")
    out = capsys.readouterr().out
    url = re.search(r"Prometheus metrics on (http://127\.0\.0\.1:\d+/metrics)", out).group(1)
    path = tmp_path / "config" / "exporter-token"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    token = path.read_text()
    assert len(token) >= 40 and token == served_token()  # made once, then read again
    assert status_of(url) == 401 and status_of(url, token) == 200
    config = out[out.index("scrape_configs:"):].strip()
    assert f'credentials_file: "{path}"' in config and f'targets: ["127.0.0.1:{url.split(":")[2][:-8]}"]' in config
    promtool = shutil.which("promtool")
    assert promtool, "promtool not found: `make system-deps` installs Debian's prometheus package"
    (tmp_path / "prometheus.yml").write_text(config + "\n")
    check = subprocess.run([promtool, "check", "config", str(tmp_path / "prometheus.yml")],
                           capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    line_magic("serve --port 0 --no-auth")  # the same endpoint, token off
    assert "No authentication (--no-auth)" in capsys.readouterr().out
    assert status_of(url) == 200


@pytest.mark.parametrize("problem", ["readable", "link", "other-user", "empty"])
def test_a_token_file_not_to_trust_is_refused(tmp_path, problem):
    from gpuprof_jupyter.runtime.exporter_control import ExporterTokenError, exporter_token

    path = tmp_path / "exporter-token"
    if problem == "link":
        (tmp_path / "elsewhere").write_text("x" * 43)
        path.symlink_to(tmp_path / "elsewhere")
    else:
        path.write_text("" if problem == "empty" else "x" * 43)
        path.chmod(0o644 if problem == "readable" else 0o600)
        if problem == "other-user":
            if os.geteuid() != 0:
                pytest.fail("run as root (CI does) to give the file to another user")
            os.chown(path, 65534, 65534)  # nobody
    with pytest.raises(ExporterTokenError, match=f"{path}.*(delete it|--no-auth)"):
        exporter_token(path)


@pytest.mark.process
def test_a_scrape_before_between_and_during_runs_has_the_devices_readings(served, fresh_sampler, tmp_path):
    """Between runs a thread of the sampler process reads the devices (here fake NVML), so a
    scrape returns their current values; ``energy_j`` (since the run started) is the run's
    only: present while one runs, absent between runs, which tells the two feeds apart."""
    from gpuprof_jupyter.runtime.session import ProfileSession
    from tests.fake_nvml import sampler_process_env

    fresh_sampler(sampler_process_env())
    url = re.search(r"(http://\S+/metrics)", served.serve(0, "127.0.0.1", auth=False)).group(1)

    def readings(energy: bool):
        text = scrape_text(url)
        gpu = re.search(r'gpuprof_sm_util\{[^}]*device="gpu0"', text) and re.search(
            r'gpuprof_host_cpu_util\{[^}]*device="host"', text)
        return gpu and ('gpuprof_energy_j{' in text) == energy and text

    wait_for(lambda: readings(energy=False), 20, "the devices' readings before any run")
    for name in ("first", "second"):
        session = ProfileSession(name, source="nvml", store=tmp_path / "store", interval=0.05).start()
        try:
            during = wait_for(lambda: readings(energy=True), 20, f"run {name}'s readings")
            assert re.search(rf'gpuprof_experiment_running\{{[^}}]*experiment="{name}"[^}}]*\}} 1.0', during), during
        finally:
            session.stop()
        between = wait_for(lambda: readings(energy=False), 20, f"the readings after run {name}")
        assert f'experiment="{name}"' in between  # the finished run is still listed beside them
