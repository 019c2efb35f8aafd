"""A small client for Prometheus's HTTP API (``/api/v1/...``) over ``requests``.

Runs in the sampler process.

Every failure is one ``PrometheusError`` whose message says what happened (unreachable,
timed out, the query rejected with the server's own reason), so the source can turn it into
a note. See https://prometheus.io/docs/prometheus/latest/querying/api/.
"""

from __future__ import annotations

import re

import requests

_DURATION = re.compile(r"(\d+)(ms|s|m|h|d|w|y)")
_UNIT_S = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0, "y": 31536000.0}


class PrometheusError(RuntimeError):
    """The server could not be reached or refused a query (the message says which)."""


def parse_duration(text: str) -> float:
    """A Prometheus duration ("1s", "15s", "1m30s", "500ms") in seconds; ValueError if malformed."""
    parts = _DURATION.findall(text or "")
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"not a Prometheus duration: {text!r}")
    return sum(int(n) * _UNIT_S[u] for n, u in parts)


class PrometheusAPI:
    def __init__(self, url: str, timeout_s: float = 2.0) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self._http = requests.Session()

    def close(self) -> None:
        self._http.close()

    def _get(self, path: str, params: dict | None = None):
        try:
            response = self._http.get(f"{self.url}{path}", params=params, timeout=self.timeout_s)
        except requests.Timeout:
            raise PrometheusError(f"{self.url} did not answer within {self.timeout_s:g} s") from None
        except requests.RequestException as exc:
            raise PrometheusError(f"{self.url} is unreachable ({type(exc).__name__})") from None
        try:
            body = response.json()
        except ValueError:
            raise PrometheusError(f"{self.url}{path} answered HTTP {response.status_code}, not Prometheus JSON") from None
        if body.get("status") != "success":
            reason = body.get("error") or f"HTTP {response.status_code}"
            raise PrometheusError(f"Prometheus rejected the query: {reason}")
        return body.get("data")

    def query(self, expr: str, at: float | None = None) -> list[dict]:
        """Instant query: a list of ``{"metric": labels, "value": [ts, "v"]}``."""
        params = {"query": expr} if at is None else {"query": expr, "time": f"{at:.3f}"}
        return self._get("/api/v1/query", params)["result"]

    def query_range(self, expr: str, start: float, end: float, step_s: float) -> list[dict]:
        """Range query: a list of ``{"metric": labels, "values": [[ts, "v"], ...]}`` (wall-clock ts)."""
        params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step_s:.3f}"}
        return self._get("/api/v1/query_range", params)["result"]

    def active_targets(self) -> list[dict]:
        return self._get("/api/v1/targets", {"state": "active"})["activeTargets"]

    def global_scrape_interval_s(self) -> float:
        """The server configuration's ``global.scrape_interval`` (Prometheus's default: 1 m)."""
        from ruamel.yaml import YAML

        config = YAML(typ="safe").load(self._get("/api/v1/status/config")["yaml"]) or {}
        return parse_duration(str((config.get("global") or {}).get("scrape_interval", "1m")))
