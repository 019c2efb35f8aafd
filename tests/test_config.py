"""Config file and GPUPROF_* variables: precedence and clear errors."""

from __future__ import annotations

import pytest

import gpuprof_jupyter as gp
from gpuprof_jupyter.core.analysis.cost import resolve_prices
from gpuprof_jupyter.core.config import ConfigError, load_config


@pytest.mark.process
def test_file_then_environment_then_flag(tmp_path, monkeypatch):
    (tmp_path / "gpuprof.toml").write_text(
        'source = "sim:compute-bound"\ninterval = 0.05\nchecks = ["sm_util > 60 for >=80%"]\n'
        '[prices]\nkwh = 0.3\n'
    )
    config = load_config(tmp_path, environ={})
    assert (config.source, config.interval, config.checks, config.prices) == (
        "sim:compute-bound", 0.05, ["sm_util > 60 for >=80%"], {"kwh": 0.3})
    env = {"GPUPROF_SOURCE": "host", "GPUPROF_CHECKS": "sm_util < 50 for <=30%; accuracy >= 0.9",
           "GPUPROF_PRICE_KWH": "0.5"}
    config = load_config(tmp_path, environ=env)
    assert config.source == "host" and config.checks == ["sm_util < 50 for <=30%", "accuracy >= 0.9"]
    assert config.prices["kwh"] == "0.5"
    monkeypatch.chdir(tmp_path)
    for var in ("GPUPROF_SOURCE", "GPUPROF_INTERVAL", "GPUPROF_CHECKS", "GPUPROF_PRICE_KWH"):
        monkeypatch.delenv(var, raising=False)
    assert resolve_prices().kwh == 0.3
    assert resolve_prices({"kwh": 1.0}).kwh == 1.0  # the argument wins
    with gp.profile("cfg", store=tmp_path / "store") as run:  # no source given: the file's
        pass
    meta = run.experiment.meta
    assert meta.source == "sim:compute-bound" and meta.interval_s == 0.05
    assert [c["rule"] for c in meta.checks] == ["sm_util > 60 for >=80%"]
    with gp.profile("flag", source="host", interval=0.2, store=tmp_path / "store") as run:
        pass
    assert run.experiment.meta.source == "host" and run.experiment.meta.interval_s == 0.2


def test_pyproject_tool_table(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n[tool.gpuprof]\nstore = "runs"\n')
    assert load_config(tmp_path, environ={}).store == "runs"


@pytest.mark.parametrize("text, message", [
    ("interval = 'fast'", "interval must be a number"),
    ("colour = 'red'", r"unknown key\(s\) colour"),
    ("checks = 3", "checks must be a list"),
    ("[prices]\neuros = 1", "prices takes"),
    ("source = ", "not valid TOML"),
])
def test_malformed_config_is_a_clear_error(tmp_path, text, message):
    (tmp_path / "gpuprof.toml").write_text(text)
    with pytest.raises(ConfigError, match=message) as info:
        load_config(tmp_path, environ={})
    assert "gpuprof.toml" in str(info.value)


def test_bad_environment_value(tmp_path):
    with pytest.raises(ConfigError, match="GPUPROF_INTERVAL"):
        load_config(tmp_path, environ={"GPUPROF_INTERVAL": "soon"})
