"""A small, bounded client for Prometheus's HTTP API (``/api/v1/...``).

Runs in the sampler process.

Bounded so that a misbehaving server cannot hold or swell the process that records a run:

* one **total deadline per query** (connect, headers and body together), enforced on every
  socket read, so a server dripping a byte every half second fails the query at the deadline
  instead of holding it for the run;
* a **size cap** on the answer (``max_bytes``), checked while it streams in;
* answers of the wrong shape (not JSON, a list as the body, ``None`` where a list belongs) are
  one ``PrometheusAnswerError``, never a ``TypeError`` escaping the caller's error handling.

Every failure is a ``PrometheusError`` whose message says what happened (unreachable, timed
out, the query rejected with the server's own reason) and names the server by its URL without
user and password (``shown_url``): credentials in the URL are sent as HTTP basic auth and never
appear in a message. It connects directly (no HTTP proxy). See
https://prometheus.io/docs/prometheus/latest/querying/api/.
"""

from __future__ import annotations

import base64
import http.client
import json
import math
import re
import socket
import ssl
import time
from urllib.parse import unquote, urlencode, urlsplit, urlunsplit
from gpuprof_jupyter.core.format import fmt_bytes, fmt_unit

_DURATION = re.compile(r"(\d+)(ms|s|m|h|d|w|y)")
_UNIT_S = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0, "y": 31536000.0}
MAX_ANSWER_BYTES = 8 * 1024 * 1024  # JSON parsed from it takes about five times as much memory
_READ_BYTES = 64 * 1024


class PrometheusError(RuntimeError):
    """No usable answer: the server could not be reached in time or refused the query."""


class PrometheusAnswerError(PrometheusError):
    """The server answered, but with something that cannot be used (too big, not Prometheus
    JSON, wrong types). Asking again for the same stretch would get the same answer."""


def parse_duration(text: str) -> float:
    """A Prometheus duration ("1s", "15s", "1m30s", "500ms") in seconds; ValueError if malformed."""
    parts = _DURATION.findall(text or "")
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"not a Prometheus duration: {text!r}")
    return sum(int(n) * _UNIT_S[u] for n, u in parts)


def shown_url(url: str) -> str:
    """``url`` without user and password (``http://u:p@h:9090`` -> ``http://h:9090``): the
    form stored in an experiment and used in messages."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))


class _Deadline:
    """A socket whose every read and write may take only the time left before ``deadline``
    (monotonic seconds): the timeout is re-armed from the deadline before each call."""

    deadline = math.inf  # set right after the socket is made

    def _arm(self) -> None:
        if self.deadline == math.inf:
            return
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("deadline passed")
        self.settimeout(left)

    def recv_into(self, *args, **kwargs):
        self._arm()
        return super().recv_into(*args, **kwargs)

    def recv(self, *args, **kwargs):
        self._arm()
        return super().recv(*args, **kwargs)

    def sendall(self, *args, **kwargs):
        self._arm()
        return super().sendall(*args, **kwargs)


class _DeadlineSocket(_Deadline, socket.socket):
    pass


class _DeadlineTLSSocket(_Deadline, ssl.SSLSocket):
    def read(self, *args, **kwargs):
        self._arm()
        return super().read(*args, **kwargs)


def _connect(host: str, port: int, deadline: float) -> _DeadlineSocket:
    error: OSError = OSError(f"{host} has no address")
    for family, kind, proto, _, address in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM):
        sock = _DeadlineSocket(family, kind, proto)
        sock.deadline = deadline
        try:
            sock._arm()
            sock.connect(address)
            return sock
        except OSError as exc:
            sock.close()
            error = exc
    raise error


class PrometheusAPI:
    def __init__(self, url: str, timeout_s: float = 2.0, max_bytes: int = MAX_ANSWER_BYTES) -> None:
        parts = urlsplit(url.rstrip("/"))
        self.url = shown_url(url.rstrip("/"))  # never holds a password: safe in any message
        self.timeout_s, self.max_bytes = timeout_s, max_bytes
        self._tls = parts.scheme == "https"
        self._host, self._port = parts.hostname, parts.port or (443 if self._tls else 80)
        self._base = parts.path.rstrip("/")
        self._headers = {"Accept": "application/json", "User-Agent": "gpuprof-jupyter"}
        if parts.username is not None or parts.password is not None:
            pair = f"{unquote(parts.username or '')}:{unquote(parts.password or '')}"
            self._headers["Authorization"] = "Basic " + base64.b64encode(pair.encode()).decode()
        self._tls_context = None

    def close(self) -> None:
        """Nothing is held between queries (one connection each)."""

    def _get(self, path: str, params: dict | None = None):
        target = self._base + path + ("?" + urlencode(params) if params else "")
        try:
            status, raw = self._fetch(target, time.monotonic() + self.timeout_s)
        except TimeoutError:
            raise PrometheusError(f"Prometheus at {self.url} did not answer in full within {fmt_unit(self.timeout_s, 's')}") from None
        except (OSError, http.client.HTTPException) as exc:
            raise PrometheusError(f"Prometheus at {self.url} is unreachable ({type(exc).__name__})") from None
        try:
            body = json.loads(raw)
        except ValueError:
            raise PrometheusAnswerError(f"Prometheus at {self.url}{path} answered HTTP {status}, not Prometheus JSON") from None
        if not isinstance(body, dict):
            raise PrometheusAnswerError(f"Prometheus at {self.url}{path} answered a JSON {type(body).__name__}, not an object")
        if body.get("status") != "success":
            reason = body.get("error") or f"HTTP {status}"
            raise PrometheusError(f"Prometheus at {self.url} rejected the query: {reason}")
        return body.get("data")

    def _fetch(self, target: str, deadline: float) -> tuple[int, bytes]:
        """(HTTP status, body) of one GET, all of it before ``deadline``; at most max_bytes."""
        connection = http.client.HTTPConnection(self._host, self._port)
        sock = _connect(self._host, self._port, deadline)
        if self._tls:
            sock = self._context().wrap_socket(sock, server_hostname=self._host)
            sock.deadline = deadline
        connection.sock = sock
        try:
            connection.request("GET", target, headers=self._headers)
            response = connection.getresponse()
            declared = response.getheader("Content-Length")
            if declared and declared.isdigit() and int(declared) > self.max_bytes:
                self._too_big()
            chunks, size = [], 0
            while chunk := response.read1(_READ_BYTES):
                size += len(chunk)
                if size > self.max_bytes:
                    self._too_big()
                chunks.append(chunk)
            return response.status, b"".join(chunks)
        finally:
            connection.close()

    def _too_big(self):
        raise PrometheusAnswerError(f"Prometheus at {self.url} answered more than {fmt_bytes(self.max_bytes, 0)}: "
                                    "not read (ask for fewer series with --match)")

    def _context(self) -> ssl.SSLContext:
        if self._tls_context is None:
            self._tls_context = ssl.create_default_context()
            self._tls_context.sslsocket_class = _DeadlineTLSSocket
        return self._tls_context

    def _field(self, data, key: str, path: str) -> list:
        value = data.get(key) if isinstance(data, dict) else None
        if not isinstance(value, list):
            raise PrometheusAnswerError(f"Prometheus at {self.url}{path} answered without a list {key!r}")
        return value

    def query(self, expr: str, at: float | None = None) -> list[dict]:
        """Instant query: a list of ``{"metric": labels, "value": [ts, "v"]}``."""
        params = {"query": expr} if at is None else {"query": expr, "time": f"{at:.3f}"}
        return self._field(self._get("/api/v1/query", params), "result", "/api/v1/query")

    def query_range(self, expr: str, start: float, end: float, step_s: float) -> list[dict]:
        """Range query: a list of ``{"metric": labels, "values": [[ts, "v"], ...]}`` (wall-clock ts)."""
        params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step_s:.3f}"}
        return self._field(self._get("/api/v1/query_range", params), "result", "/api/v1/query_range")

    def active_targets(self) -> list[dict]:
        return self._field(self._get("/api/v1/targets", {"state": "active"}), "activeTargets", "/api/v1/targets")

    def global_scrape_interval_s(self) -> float:
        """The server configuration's ``global.scrape_interval`` (Prometheus's default: 1 m)."""
        from ruamel.yaml import YAML

        data = self._get("/api/v1/status/config")
        try:
            config = YAML(typ="safe").load(data["yaml"]) or {}
            interval = str((config.get("global") or {}).get("scrape_interval", "1m"))
        except Exception:  # noqa: BLE001 - any malformed answer is the same answer error
            raise PrometheusAnswerError(f"Prometheus at {self.url}/api/v1/status/config answered no readable configuration") from None
        return parse_duration(interval)
