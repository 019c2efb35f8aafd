"""Issue 13 part 2: what a site deploys beside the exporter. The alert rules pass `promtool check
rules` and their unit tests (`promtool test rules`); the Grafana dashboard's queries are valid
PromQL over metric names the exporter really serves. promtool comes from Debian's prometheus
package (make system-deps): missing, these tests fail rather than skip."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from ruamel.yaml import YAML

from gpuprof_jupyter.core.metrics import METRICS
from gpuprof_jupyter.sampler_process.exporter import Exporter
from gpuprof_jupyter.core.sources.base import DeviceInfo

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
RULES = DEPLOY / "prometheus" / "gpuprof-alerts.yml"
RULE_TESTS = DEPLOY / "prometheus" / "gpuprof-alerts.test.yml"
SCRAPE_CONFIG = DEPLOY / "prometheus" / "prometheus.yml"
DASHBOARD = DEPLOY / "grafana" / "gpuprof-dashboard.json"
DOC = DEPLOY.parent / "docs" / "prometheus.md"
NAME = re.compile(r"\bgpuprof_[a-z_]+\b")


@pytest.fixture(scope="module")
def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool not found: `make system-deps` installs Debian's prometheus package, which ships it")
    return path


def run_promtool(promtool: str, *args: str | Path) -> str:
    result = subprocess.run([promtool, *map(str, args)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"promtool {' '.join(map(str, args))}:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def full_exporter() -> Exporter:
    """An exporter serving every metric it knows: all devices' values and an experiment."""
    exporter = Exporter(node="n")
    exporter.set_devices([DeviceInfo("gpu0", "gpu", "GPU"), DeviceInfo("host", "host", "host")], {"gpu0": {"sm_util": "x"}})
    exporter.update({"gpu0": {m: 1.0 for m in METRICS if METRICS[m].scope == "gpu"},
                     "host": {m: 1.0 for m in METRICS if METRICS[m].scope == "host"}}, "run")
    exporter.observe_steps("run", [0.1])
    exporter.observe_requests("run", [0.01])
    exporter.add_cpu_seconds("run", 1.0)
    return exporter


def served_names() -> set[str]:
    return {sample.name for family in full_exporter().registry.collect() for sample in family.samples}


@pytest.mark.process
def test_exposition_passes_promtool_check_metrics(promtool):
    """Prometheus's own linter. The one rule set aside, documented in docs/prometheus.md: the
    contract's ``_bytes_s`` names (one name everywhere) are not spelled ``_bytes_per_second``."""
    text = generate_latest(full_exporter().registry).decode()
    result = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    problems = [line for line in (result.stdout + result.stderr).splitlines()
                if line.strip() and not re.fullmatch(r"gpuprof_\w+_bytes_s metric names should not contain "
                                                     r"abbreviated units", line.strip())]
    assert not problems, problems


def dashboard_queries() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    queries = [t["expr"] for panel in dashboard["panels"] for t in panel.get("targets", [])]
    queries += [v["definition"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    return queries


@pytest.mark.process
def test_alert_rules_pass_promtool_check(promtool):
    assert "SUCCESS: 4 rules found" in run_promtool(promtool, "check", "rules", RULES)


@pytest.mark.process
def test_alert_rules_unit_tests_pass(promtool):
    assert "SUCCESS" in run_promtool(promtool, "test", "rules", RULE_TESTS)


@pytest.mark.process
def test_the_unit_tests_can_fail(promtool, tmp_path):
    """The SM rule at a 50 % share instead of 30 %: the test file must catch it."""
    (tmp_path / RULES.name).write_text(RULES.read_text().replace("> 0.3", "> 0.5"))
    (tmp_path / RULE_TESTS.name).write_text(RULE_TESTS.read_text())
    result = subprocess.run([promtool, "test", "rules", str(tmp_path / RULE_TESTS.name)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode != 0 and "GpuprofSmUtilLow" in result.stdout + result.stderr


@pytest.mark.process
def test_the_example_config_scrapes_with_the_token_and_passes_promtool(promtool, tmp_path):
    """deploy/prometheus/prometheus.yml, its token file path pointed at a real file (promtool
    checks that it exists) and the alert rules beside it: a complete, valid configuration."""
    config = YAML(typ="safe").load(SCRAPE_CONFIG.read_text())
    (job,) = config["scrape_configs"]
    token_file = job["authorization"]["credentials_file"]
    assert token_file.endswith("/.config/gpuprof/exporter-token")  # where %gpuprofile serve keeps it
    (tmp_path / "exporter-token").write_text("token")
    (tmp_path / SCRAPE_CONFIG.name).write_text(SCRAPE_CONFIG.read_text().replace(token_file, str(tmp_path / "exporter-token")))
    (tmp_path / RULES.name).write_text(RULES.read_text())
    assert "SUCCESS" in run_promtool(promtool, "check", "config", tmp_path / SCRAPE_CONFIG.name)


def test_rules_use_only_names_the_exporter_serves():
    rules = YAML(typ="safe").load(RULES.read_text())
    exprs = [rule["expr"] for group in rules["groups"] for rule in group["rules"]]
    used = {name for expr in exprs for name in NAME.findall(expr)}
    assert used and used <= served_names(), used - served_names()


@pytest.mark.process
def test_dashboard_queries_are_promql_over_served_names(promtool, tmp_path):
    queries = dashboard_queries()
    used = {name for query in queries for name in NAME.findall(query)}
    assert {"gpuprof_sm_util", "gpuprof_duration_seconds_bucket", "gpuprof_cpu_seconds_total",
            "gpuprof_gpu_memory_used_bytes"} <= used
    assert used <= served_names(), used - served_names()
    # Grafana's variables become a regex; label_values() is Grafana's, not PromQL: check the rest.
    promql = [re.sub(r"\$\w+", ".*", q) for q in queries if not q.startswith("label_values(")]
    rules = {"groups": [{"name": "dashboard", "rules": [{"record": f"dashboard:query{i}", "expr": q}
                                                        for i, q in enumerate(promql)]}]}
    path = tmp_path / "dashboard-queries.yml"
    with path.open("w") as out:
        YAML().dump(rules, out)
    run_promtool(promtool, "check", "rules", path)


def test_dashboard_is_valid_json_with_a_datasource_variable():
    dashboard = json.loads(DASHBOARD.read_text())
    names = {v["name"] for v in dashboard["templating"]["list"]}
    assert {"datasource", "node", "device", "experiment"} <= names
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            assert target["datasource"]["uid"] == "${datasource}"


def test_every_served_name_is_documented():
    doc = DOC.read_text()
    families = {re.sub(r"_(bucket|count|sum)$", "", name) for name in served_names() if not name.endswith("_created")}
    missing = sorted(name for name in families if f"`{name}`" not in doc)
    assert not missing, f"docs/prometheus.md does not list {missing}"
