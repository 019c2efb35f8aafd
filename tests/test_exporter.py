"""Issue 13 part 2: the Prometheus exporter, scraped over HTTP and read with prometheus_client's
own parser; its cardinality bound, ports, loopback default and the %gpuprofile serve magic."""

from __future__ import annotations

import math
import re
import socket
import time
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuprof_jupyter.core.config import ConfigError, load_config
from gpuprof_jupyter.core.metrics import METRICS
from gpuprof_jupyter.sampler_process.exporter import (
    KEEP_FINISHED, Exporter, ExporterBindError, is_loopback, wide_listen_warning)
from gpuprof_jupyter.core.sources.base import DeviceInfo
from tests.fakes import wait_for

DEVICES = [DeviceInfo("gpu0", "gpu", "Simulated A100", 0, "GPU-sim-0", simulated=True),
           DeviceInfo("host", "host", "this host")]


def scrape(exporter: Exporter) -> dict[str, list]:
    """Sample name (``gpuprof_duration_seconds_count``...) -> its samples, from a real HTTP GET
    of /metrics read by prometheus_client's parser."""
    text = scrape_text(exporter.url)
    samples: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append(sample)
    return samples


def scrape_text(url: str, token: str | None = None) -> str:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as response:
        assert response.status == 200
        return response.read().decode()


def values(families, name: str, **labels) -> list[float]:
    return [s.value for s in families.get(name, []) if all(s.labels.get(k) == v for k, v in labels.items())]


@pytest.fixture
def exporter():
    exporter = Exporter(node="node-a", keep_finished=2)
    exporter.set_devices(DEVICES, {"gpu0": {"sm_util": "simulated"}})
    exporter.start(port=0)
    yield exporter
    exporter.close()


def test_device_values_are_gauges_labelled_by_node_device_and_simulated(exporter):
    exporter.update({"gpu0": {"sm_util": 42.5, "power_w": math.nan, "gpu_mem_used_bytes": 2e9},
                     "host": {"cpu_util": 75.0, "rss_bytes": 1.5e9}})
    families = scrape(exporter)
    (sm,) = families["gpuprof_sm_util"]
    assert sm.labels == {"node": "node-a", "device": "gpu0", "simulated": "true"} and sm.value == 42.5
    assert values(families, "gpuprof_cpu_util", device="host", simulated="false") == [75.0]
    assert "gpuprof_power_w" not in families  # NaN: not measured, so absent (never a fake 0)
    info = {s.labels["device"]: s.labels for s in families["gpuprof_device_info"]}
    assert info["gpu0"]["simulated"] == "true" and info["gpu0"]["uuid"] == "GPU-sim-0"
    assert values(families, "gpuprof_metric_provenance_info", device="gpu0", metric="sm_util",
                  provenance="simulated") == [1.0]
    exporter.update({"gpu0": {"sm_util": 10.0}})  # host no longer measured: its series goes
    families = scrape(exporter)
    assert "gpuprof_cpu_util" not in families and values(families, "gpuprof_sm_util") == [10.0]


def test_help_texts_name_the_unit(exporter):
    assert "gpuprof_sm_util" not in scrape(exporter)  # nothing exported before the first update
    exporter.update({"gpu0": {name: 1.0 for name in METRICS if METRICS[name].scope == "gpu"}})
    families = {f.name: f for f in text_string_to_metric_families(scrape_text(exporter.url))}
    assert "in percent (0-100)" in families["gpuprof_sm_util"].documentation
    assert "in watts" in families["gpuprof_power_w"].documentation
    assert "in bytes" in families["gpuprof_gpu_memory_used_bytes"].documentation
    assert "in seconds" in families["gpuprof_duration_seconds"].documentation
    assert "in seconds" in families["gpuprof_cpu_seconds"].documentation


def test_values_stop_being_exported_when_the_sampler_stops_refreshing_them():
    now = [100.0]
    exporter = Exporter(node="n", stale_after_s=15, clock=lambda: now[0])
    exporter.set_devices(DEVICES)
    exporter.update({"gpu0": {"sm_util": 50.0}})
    exporter.start(port=0)
    try:
        assert values(scrape(exporter), "gpuprof_sm_util") == [50.0]
        now[0] += 16
        assert "gpuprof_sm_util" not in scrape(exporter)
    finally:
        exporter.close()


def test_an_undeclared_device_is_a_clear_error_and_changes_nothing(exporter):
    exporter.update({"gpu0": {"sm_util": 5.0}})
    with pytest.raises(ValueError, match="gpu7 not declared with set_devices"):
        exporter.update({"gpu7": {"sm_util": 1.0}}, "run")
    assert values(scrape(exporter), "gpuprof_sm_util") == [5.0] and exporter.listed_experiments() == []


def test_experiment_series_while_running_and_when_finished(exporter):
    exporter.update({"gpu0": {"gpu_mem_used_bytes": 3e9}}, "baseline")
    exporter.update({"gpu0": {"gpu_mem_used_bytes": 5e9}}, "baseline")
    exporter.update({"gpu0": {"gpu_mem_used_bytes": 4e9}}, "baseline")
    exporter.observe_steps("baseline", [0.02, 0.2, 0.2])
    exporter.add_cpu_seconds("baseline", 1.5)
    families = scrape(exporter)
    assert values(families, "gpuprof_experiment_running", experiment="baseline") == [1.0]
    assert values(families, "gpuprof_gpu_memory_used_bytes", experiment="baseline", device="gpu0",
                  simulated="true") == [5e9]  # the peak so far
    assert values(families, "gpuprof_duration_seconds_count", experiment="baseline") == [3.0]
    assert values(families, "gpuprof_duration_seconds_bucket", experiment="baseline", le="0.025") == [1.0]
    assert values(families, "gpuprof_cpu_seconds_total", experiment="baseline") == [1.5]

    exporter.experiment_finished("baseline", duration_s=12.0, step_durations=[0.2] * 4, cpu_seconds=9.0)
    families = scrape(exporter)
    assert values(families, "gpuprof_experiment_running", experiment="baseline") == [0.0]
    assert values(families, "gpuprof_experiment_elapsed_seconds", experiment="baseline") == [12.0]
    # the final record replaces what was fed live (no double counting)
    assert values(families, "gpuprof_duration_seconds_count", experiment="baseline") == [4.0]
    assert values(families, "gpuprof_duration_seconds_sum", experiment="baseline") == [pytest.approx(0.8)]
    assert values(families, "gpuprof_cpu_seconds_total", experiment="baseline") == [9.0]
    assert values(families, "gpuprof_gpu_memory_used_bytes", experiment="baseline") == [5e9]


def test_cardinality_is_the_running_experiment_and_the_last_n_finished(exporter):
    for name in ["e1", "e2", "e3", "e4"]:
        exporter.update({"gpu0": {"gpu_mem_used_bytes": 1e9}}, name)
        exporter.observe_steps(name, [0.1])
        exporter.experiment_finished(name, duration_s=1.0, cpu_seconds=1.0)
    exporter.update({"gpu0": {"gpu_mem_used_bytes": 1e9}}, "e5")
    assert exporter.listed_experiments() == ["e3", "e4", "e5"]  # keep_finished=2, plus the running one
    families = scrape(exporter)
    for name in ("gpuprof_duration_seconds_count", "gpuprof_cpu_seconds_total", "gpuprof_gpu_memory_used_bytes",
                 "gpuprof_experiment_running", "gpuprof_experiment_elapsed_seconds"):
        assert {s.labels["experiment"] for s in families[name]} == {"e3", "e4", "e5"}, name
    assert len(families["gpuprof_duration_seconds_bucket"]) == 3 * 16  # 16 buckets, +Inf included
    assert KEEP_FINISHED == 5  # the documented default (docs/prometheus.md)


def test_a_run_left_without_a_final_record_is_listed_as_finished(exporter):
    exporter.update({"gpu0": {"sm_util": 1.0}}, "crashed")
    exporter.update({"gpu0": {"sm_util": 1.0}}, None)
    assert values(scrape(exporter), "gpuprof_experiment_running", experiment="crashed") == [0.0]


def test_a_reused_name_starts_afresh(exporter):
    exporter.update({"gpu0": {}}, "again")
    exporter.observe_steps("again", [0.1, 0.1])
    exporter.experiment_finished("again", duration_s=1.0)
    exporter.update({"gpu0": {}}, "again")
    families = scrape(exporter)
    assert values(families, "gpuprof_duration_seconds_count", experiment="again") == [0.0]
    assert values(families, "gpuprof_experiment_running", experiment="again") == [1.0]


def test_bad_experiment_input_is_a_clear_error_and_loses_nothing(exporter):
    exporter.update({"gpu0": {}}, "run")
    exporter.observe_steps("run", [0.5])
    with pytest.raises(ValueError, match="finite seconds >= 0"):
        exporter.observe_steps("run", [0.1, -1.0])
    with pytest.raises(ValueError, match="not the running one"):
        exporter.observe_steps("other", [0.1])
    with pytest.raises(ValueError, match="finite seconds >= 0"):
        exporter.experiment_finished("run", duration_s=1.0, step_durations=[math.nan])
    with pytest.raises(ValueError, match="non-empty string"):
        exporter.update({"gpu0": {}}, "  ")
    families = scrape(exporter)
    assert values(families, "gpuprof_duration_seconds_count", experiment="run") == [1.0]
    assert values(families, "gpuprof_experiment_running", experiment="run") == [1.0]


def test_each_exporter_has_its_own_registry():
    from prometheus_client import REGISTRY

    one, two = Exporter(node="a"), Exporter(node="b")
    for exporter in (one, two):
        exporter.set_devices(DEVICES)
    one.update({"gpu0": {"sm_util": 1.0}})
    assert one.registry is not two.registry
    assert two.registry.get_sample_value("gpuprof_sm_util", {"node": "a", "device": "gpu0", "simulated": "true"}) is None
    assert one.registry.get_sample_value("gpuprof_sm_util", {"node": "a", "device": "gpu0", "simulated": "true"}) == 1.0
    assert REGISTRY.get_sample_value("gpuprof_sm_util", {"node": "a", "device": "gpu0", "simulated": "true"}) is None


# -- listening --------------------------------------------------------------------------------
def test_port_0_picks_a_free_port_on_loopback_and_close_frees_it():
    exporter = Exporter(node="n")
    port = exporter.start(port=0)
    assert port > 0 and exporter.port == port and exporter.url == f"http://127.0.0.1:{port}/metrics"
    assert "# TYPE gpuprof_device_info gauge" in scrape_text(exporter.url)
    exporter.close()
    assert exporter.url is None
    with socket.socket() as probe:  # nothing listens there any more (as a server binds: REUSEADDR)
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(("127.0.0.1", port))
        probe.listen()
    again = Exporter(node="n")
    assert again.start(port=port) == port
    again.close()


def test_a_busy_port_is_an_error_naming_the_port():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        busy = holder.getsockname()[1]
        exporter = Exporter(node="n")
        with pytest.raises(ExporterBindError, match=f"port {busy} on 127.0.0.1 is already in use"):
            exporter.start(port=busy)
        assert exporter.url is None
    with pytest.raises(ValueError, match="0..65535"):
        Exporter().start(port=70000)


def test_loopback_is_the_default_and_wider_addresses_warn():
    assert Exporter.start.__defaults__ == ("127.0.0.1", 9464, None)  # loopback, no token unless given
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert wide_listen_warning("127.0.0.1", 9464) is None
    for wide in ("0.0.0.0", "::", "10.1.2.3", "node-a.example"):
        assert "beyond this machine's loopback" in wide_listen_warning(wide, 9464)


# -- %gpuprofile serve and its settings ---------------------------------------------------------
def test_config_exporter_table_and_environment(tmp_path):
    (tmp_path / "gpuprof.toml").write_text('[exporter]\nport = 9500\naddr = "0.0.0.0"\n')
    assert load_config(tmp_path, environ={}).exporter == {"port": 9500, "addr": "0.0.0.0"}
    assert load_config(tmp_path, environ={"GPUPROF_EXPORTER_PORT": "0"}).exporter == {"port": 0, "addr": "0.0.0.0"}
    (tmp_path / "gpuprof.toml").write_text('[exporter]\nport = 99999\n')
    with pytest.raises(ConfigError, match="exporter port must be an integer in 0..65535"):
        load_config(tmp_path, environ={})
    (tmp_path / "gpuprof.toml").write_text('[exporter]\nhost = "x"\n')
    with pytest.raises(ConfigError, match="exporter takes addr, port"):
        load_config(tmp_path, environ={})


@pytest.fixture
def served(monkeypatch, tmp_path):
    """The exporter behind %gpuprofile serve (in the sampler process), stopped afterwards."""
    from gpuprof_jupyter.runtime import exporter_control

    monkeypatch.chdir(tmp_path)
    for var in ("GPUPROF_CONFIG", "GPUPROF_EXPORTER_PORT", "GPUPROF_EXPORTER_ADDR"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("GPUPROF_EXPORTER_TOKEN_FILE", str(tmp_path / "config" / "exporter-token"))
    yield exporter_control
    exporter_control.stop()


def served_token() -> str:
    """The token the served exporter asks for (this test's token file)."""
    from gpuprof_jupyter.runtime import exporter_control

    return exporter_control.exporter_token(exporter_control.token_file())


def line_magic(line: str):
    """``%gpuprofile LINE`` through IPython itself."""
    from IPython.core.interactiveshell import InteractiveShell

    from gpuprof_jupyter.notebook.magic import GpuProfileMagics

    shell = InteractiveShell.instance()
    shell.register_magics(GpuProfileMagics)
    return shell.run_line_magic("gpuprofile", line)


@pytest.mark.process
def test_serve_magic_reports_the_port_chosen_and_stops(served, capsys):
    line_magic("serve --port 0")
    out = capsys.readouterr().out
    url = re.search(r"Prometheus metrics on (http://127\.0\.0\.1:(\d+)/metrics)", out)
    assert url, out
    port = url.group(2)
    assert f"(port 0 asked: port {port} chosen)" in out and "served by the sampler process" in out
    assert "warning" not in out
    assert "# TYPE gpuprof_device_info gauge" in scrape_text(url.group(1), served_token())
    line_magic("serve stop")
    assert "stopped serving" in capsys.readouterr().out
    with pytest.raises(OSError):
        scrape_text(url.group(1))


@pytest.mark.process
def test_the_sampler_process_serves_a_running_experiment_while_the_kernel_is_busy(served, tmp_path):
    """Scrapes are answered by the sampler process: here while this (kernel) thread sleeps
    inside a profiled run, with the run's simulated GPU labelled simulated."""
    from gpuprof_jupyter.runtime.session import ProfileSession

    url = re.search(r"(http://\S+/metrics)", served.serve(0, "127.0.0.1")).group(1)
    token = served_token()
    session = ProfileSession("scraped", source="sim", store=tmp_path / "store", interval=0.05).start()
    try:
        def run_served(t: str) -> bool:  # between runs the devices' readings are served too: wait for the run's
            return 'gpuprof_experiment_running{' in t and 'experiment="scraped"' in t and any(
                l.startswith("gpuprof_sm_util{") and 'device="gpu0"' in l for l in t.splitlines())

        text = wait_for(lambda: (lambda t: run_served(t) and t)(scrape_text(url, token)), 20,
                        "the running experiment's values on /metrics")
    finally:
        session.stop()
    assert 'gpuprof_experiment_running{' in text and 'experiment="scraped"' in text, text[-2000:]
    line = next(l for l in text.splitlines() if l.startswith("gpuprof_sm_util{") and 'device="gpu0"' in l)
    assert 'device="gpu0"' in line and 'simulated="true"' in line
    after = scrape_text(url, token)
    assert 'experiment="scraped"' in after  # the finished run is kept (the last N)


@pytest.mark.process
def test_a_serving_run_s_request_latencies_are_a_histogram_scraped_with_the_token(served, tmp_path):
    """Each request of a profiled serving loop is one observation of
    gpuprof_request_duration_seconds, while it runs and in the finished run's record."""
    import torch

    from gpuprof_jupyter.runtime.session import ProfileSession

    url = re.search(r"(http://\S+/metrics)", served.serve(0, "127.0.0.1")).group(1)
    token = served_token()
    model = torch.nn.Linear(4, 2).eval()
    session = ProfileSession("serving", source="sim", store=tmp_path / "store", interval=0.05).start()
    try:
        with torch.no_grad():
            for _ in range(30):
                model(torch.randn(2, 4))
                time.sleep(0.002)
        wait_for(lambda: _request_count(scrape_text(url, token)) is not None, 20,
                 "the running experiment's request histogram")
    finally:
        session.stop()
    after = scrape_text(url, token)
    assert _request_count(after) == 30.0
    buckets = [line for line in after.splitlines() if line.startswith("gpuprof_request_duration_seconds_bucket{")]
    assert any('le="0.001"' in line for line in buckets) and any('le="+Inf"' in line for line in buckets)
    with pytest.raises(urllib.error.HTTPError, match="401"):
        scrape_text(url)  # without the token: refused


def _request_count(text: str) -> float | None:
    for line in text.splitlines():
        if line.startswith("gpuprof_request_duration_seconds_count{") and 'experiment="serving"' in line:
            return float(line.rsplit(" ", 1)[1])
    return None


@pytest.mark.process
def test_serve_wide_warns_and_a_busy_port_is_a_usage_error_that_keeps_the_endpoint(served, tmp_path):
    from IPython.core.error import UsageError

    message = served.serve(0, "0.0.0.0")
    assert "beyond this machine's loopback" in message
    port = re.search(r"Prometheus metrics on http://0\.0\.0\.0:(\d+)/metrics", message).group(1)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        busy = holder.getsockname()[1]
        with pytest.raises(UsageError, match=f"port {busy} on 127.0.0.1 is already in use"):
            line_magic(f"serve --port {busy} --addr 127.0.0.1")
    assert "gpuprof_device_info" in scrape_text(f"http://127.0.0.1:{port}/metrics", served_token())  # still served
    with pytest.raises(UsageError, match="serve takes --port, --addr and --no-auth, or 'stop'"):
        line_magic("serve 9464")


@pytest.mark.process
def test_serve_takes_its_defaults_from_the_config_file(served, tmp_path):
    (tmp_path / "gpuprof.toml").write_text('[exporter]\nport = 0\n')
    assert served.listen_settings() == (0, "127.0.0.1")
    assert served.listen_settings(9999, "::1") == (9999, "::1")


def test_port_and_addr_are_rejected_on_a_profiled_cell():
    from IPython.core.error import UsageError

    from gpuprof_jupyter.notebook.cell_options import session_options
    from gpuprof_jupyter.notebook.magic import parse_line

    with pytest.raises(UsageError, match="belong to %gpuprofile serve"):
        session_options(parse_line("-n x --port 9464"))


@pytest.mark.process
def test_the_exporter_imports_without_the_kernel():
    """The Prometheus source's end-to-end test runs exporters as plain processes."""
    import subprocess
    import sys

    code = ("import sys, gpuprof_jupyter.sampler_process.exporter; "
            "print(sorted(m for m in ('IPython', 'bokeh', 'ipywidgets', 'tornado', 'torch') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert result.stdout.strip() == "[]"
