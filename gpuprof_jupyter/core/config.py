"""Settings that apply to every run unless a flag says otherwise.

Runs in any process (core).

Order, strongest first: the flag or argument; an environment variable; the config file;
the built-in default. The config file is ``$GPUPROF_CONFIG``, else ``gpuprof.toml`` in the
working directory, else the ``[tool.gpuprof]`` table of ``pyproject.toml`` there::

    source = "sim"                      # nvml | host | sim[:SCENARIO[:NGPUS]]   GPUPROF_SOURCE
    interval = 0.1                      # seconds                                  GPUPROF_INTERVAL
    store = ".gpuprof"                  # store directory                          GPUPROF_STORE
    checks = ["sm_util > 60 for >=80%"] # rules evaluated on every run              GPUPROF_CHECKS (";"-separated)
    alerts = ["sm_util < 50 for >30% within step"]  # rules watched while it runs  GPUPROF_ALERTS (";"-separated)
    [prices]                            # or [tool.gpuprof.prices]
    kwh = 0.25                          # per kWh of GPU energy                    GPUPROF_PRICE_KWH
    gpu_hour = 2.5                      # per GPU-hour                             GPUPROF_PRICE_GPU_HOUR
    currency = "EUR"                    #                                          GPUPROF_CURRENCY
    [exporter]                          # %gpuprofile serve (docs/prometheus.md)
    port = 9464                         # 0 picks a free port                      GPUPROF_EXPORTER_PORT
    addr = "127.0.0.1"                  # beyond loopback: a warning               GPUPROF_EXPORTER_ADDR

A malformed file or value is a ConfigError naming the file and the key.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

_KEYS = {"source", "interval", "store", "checks", "alerts", "prices", "exporter"}
_RULE_LISTS = ("checks", "alerts")
_PRICE_KEYS = {"kwh", "gpu_hour", "currency"}
_EXPORTER_KEYS = {"port", "addr"}
DEFAULT_INTERVAL_S = 0.1  # sampling interval when no flag, environment variable or config file sets one
DEFAULT_EXPORTER_PORT = 9464  # the port range Prometheus's wiki lists as free for new exporters
DEFAULT_EXPORTER_ADDR = "127.0.0.1"  # loopback: nobody else on the network reads the metrics


class ConfigError(ValueError):
    """The config file or a GPUPROF_* variable is malformed."""


@dataclass(frozen=True)
class Config:
    source: str | None = None
    interval: float | None = None
    store: str | None = None
    checks: list[str] = field(default_factory=list)
    alerts: list[str] = field(default_factory=list)  # --alert rules (analysis.live_alerts)
    prices: dict = field(default_factory=dict)
    exporter: dict = field(default_factory=dict)  # "port" (int), "addr" (str), as given
    path: Path | None = None  # the file it came from, if any


def _find_file(cwd: Path, environ) -> tuple[Path | None, dict]:
    explicit = environ.get("GPUPROF_CONFIG")
    if explicit:
        path = Path(explicit)
        if not path.is_file():
            raise ConfigError(f"GPUPROF_CONFIG={explicit}: no such file")
        return path, _read_toml(path)
    own = cwd / "gpuprof.toml"
    if own.is_file():
        return own, _read_toml(own)
    pyproject = cwd / "pyproject.toml"
    if pyproject.is_file():
        try:
            table = _read_toml(pyproject).get("tool", {}).get("gpuprof")
        except ConfigError:
            return None, {}  # someone else's broken pyproject is not our config
        if table is not None:
            return pyproject, table
    return None, {}


def _read_toml(path: Path) -> dict:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: not valid TOML ({exc})") from None


def _validated(table: dict, where: str) -> dict:
    unknown = set(table) - _KEYS
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}; known: {', '.join(sorted(_KEYS))}")
    out = dict(table)
    if "interval" in out:
        value = out["interval"]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.001 <= value <= 3600:
            raise ConfigError(f"{where}: interval must be a number of seconds in 0.001..3600, got {value!r}")
        out["interval"] = float(value)
    for key in ("source", "store"):
        if key in out and not isinstance(out[key], str):
            raise ConfigError(f"{where}: {key} must be a string, got {out[key]!r}")
    for key in _RULE_LISTS:
        if key not in out:
            continue
        rules = [out[key]] if isinstance(out[key], str) else out[key]
        if not isinstance(rules, list) or not all(isinstance(c, str) for c in rules):
            raise ConfigError(f"{where}: {key} must be a list of rule strings, got {out[key]!r}")
        out[key] = rules
    if "prices" in out:
        if not isinstance(out["prices"], dict) or set(out["prices"]) - _PRICE_KEYS:
            raise ConfigError(f"{where}: prices takes {', '.join(sorted(_PRICE_KEYS))}, got {out['prices']!r}")
    if "exporter" in out:
        out["exporter"] = _validated_exporter(out["exporter"], where)
    return out


def _validated_exporter(table, where: str) -> dict:
    if not isinstance(table, dict) or set(table) - _EXPORTER_KEYS:
        raise ConfigError(f"{where}: exporter takes {', '.join(sorted(_EXPORTER_KEYS))}, got {table!r}")
    port = table.get("port", DEFAULT_EXPORTER_PORT)
    if isinstance(port, str):
        try:
            port = int(port)
        except ValueError:
            pass
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ConfigError(f"{where}: exporter port must be an integer in 0..65535 (0: a free one), got {port!r}")
    addr = table.get("addr", DEFAULT_EXPORTER_ADDR)
    if not isinstance(addr, str) or not addr.strip():
        raise ConfigError(f"{where}: exporter addr must be a host address such as 127.0.0.1, got {addr!r}")
    return {key: value for key, value in (("port", port), ("addr", addr)) if key in table}


def load_config(cwd: str | os.PathLike | None = None, environ=None) -> Config:
    environ = os.environ if environ is None else environ
    path, table = _find_file(Path(cwd or os.getcwd()), environ)
    settings = _validated(table, str(path)) if table else {}
    env_settings: dict = {}
    for key in ("source", "store"):
        if environ.get(f"GPUPROF_{key.upper()}"):
            env_settings[key] = environ[f"GPUPROF_{key.upper()}"]
    if environ.get("GPUPROF_INTERVAL"):
        try:
            env_settings["interval"] = float(environ["GPUPROF_INTERVAL"])
        except ValueError:
            raise ConfigError(f"GPUPROF_INTERVAL must be a number of seconds, got {environ['GPUPROF_INTERVAL']!r}") from None
    for key in _RULE_LISTS:
        if environ.get(f"GPUPROF_{key.upper()}"):
            env_settings[key] = [c.strip() for c in environ[f"GPUPROF_{key.upper()}"].split(";") if c.strip()]
    exporter_env = {key: environ[f"GPUPROF_EXPORTER_{key.upper()}"] for key in sorted(_EXPORTER_KEYS)
                    if environ.get(f"GPUPROF_EXPORTER_{key.upper()}")}
    if exporter_env:
        exporter = dict(settings.get("exporter", {}))
        exporter.update(_validated_exporter(exporter_env, "GPUPROF_EXPORTER_* environment"))
        env_settings["exporter"] = exporter
    settings.update(_validated(env_settings, "GPUPROF_* environment") if env_settings else {})
    prices = dict(settings.get("prices", {}))
    for key, var in (("kwh", "GPUPROF_PRICE_KWH"), ("gpu_hour", "GPUPROF_PRICE_GPU_HOUR"), ("currency", "GPUPROF_CURRENCY")):
        if environ.get(var):
            prices[key] = environ[var]
    return Config(
        source=settings.get("source"),
        interval=settings.get("interval"),
        store=settings.get("store"),
        checks=list(settings.get("checks", [])),
        alerts=list(settings.get("alerts", [])),
        prices=prices,
        exporter=dict(settings.get("exporter", {})),
        path=path,
    )
