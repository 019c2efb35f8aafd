"""GPUs of a multi-node job, read from an existing Prometheus server (a batched source).

Runs in the sampler process.

Spec: ``prometheus=http://HOST:9090``, with ``--match 'job="train"'`` restricting the series
(``prometheus=URL match=SELECTOR`` once folded into one spec string: a URL holds no blank).
Each poll asks ``query_range`` for the time since the last poll, at the scrape interval
step, for dcgm-exporter's series and this project's exporter's (``prometheus_names``), and
maps them onto the metric contract's names and units with their provenance. Devices are
keyed ``NODE/gpuN`` (the GPU UUID is kept in ``DeviceInfo.uuid``); a node's host metrics from
our exporter are ``NODE/host``.

Clocks: Prometheus stamps samples with wall-clock time; they are put on the monotonic clock
the other sources use with one offset (``monotonic() - time()``) taken at ``open``, so a wall
clock step during a run (NTP) shifts these readings against the others by that step instead
of reordering them.

A step's value is the latest sample Prometheus holds at that instant (its lookback), so the
newest reading may lag by one scrape interval. An unreachable server, one that does not
answer within the query's deadline, or a rejected query during a run is a note, and the poll
is retried from the same start one scrape interval later: Prometheus keeps what it scraped
meanwhile, so the stretch is filled in when it answers again. An answer that cannot be used
(over the size cap, wrong types) is a note too, but that stretch is skipped, so one bad point
never blocks later data. Non-finite values (NaN, +-Inf, or beyond float range once converted
to the contract's unit) are dropped, with one note. Gaps are recorded per device (a node down)
or for the source (no device at all) where readings are more than two scrape intervals apart.

User and password in the URL (``http://user:password@host:9090``) are sent as basic auth and
kept out of everything stored or shown: the spec's ``url`` never holds them (docs/prometheus.md).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Callable
from urllib.parse import urlsplit, urlunsplit

from gpuprof_jupyter.core.protocol import is_gap
from gpuprof_jupyter.core.sources.base import DeviceInfo, Gap, NoteBook, Reading, SourceUnavailable, Tick
from gpuprof_jupyter.core.sources.prometheus_api import (
    MAX_ANSWER_BYTES,
    PrometheusAnswerError,
    PrometheusAPI,
    PrometheusError,
    parse_duration,
    shown_url,
)
from gpuprof_jupyter.core.sources.prometheus_names import (
    OWN_DEVICE_INFO,
    OWN_PREFIX,
    OWN_PROVENANCE_INFO,
    RULES,
    SERIES_NAMES,
    DeviceIdentity,
    SeriesRule,
    identify,
)
from gpuprof_jupyter.core.format import fmt_unit

SPEC_PREFIX = "prometheus="
MAX_POINTS = 10_000  # per series and query (Prometheus refuses more than 11,000)
BYTES_PER_POINT = 40  # '[1700000000.123,"123456.789"],' with room: sizes a query under the answer cap
DEFAULT_INTERVAL_S = 60.0  # Prometheus's own default scrape interval


@dataclass(frozen=True)
class PrometheusSpec:
    url: str  # without user and password: safe to store and show
    match: str | None = None
    userinfo: str | None = field(default=None, repr=False)  # "user:password" of the URL, if given

    def __str__(self) -> str:
        """The whole spec, credentials included: what travels to the sampler process, never stored."""
        return SPEC_PREFIX + self.connect_url + (f" match={self.match}" if self.match else "")

    @property
    def connect_url(self) -> str:
        if self.userinfo is None:
            return self.url
        parts = urlsplit(self.url)
        return urlunsplit((parts.scheme, f"{self.userinfo}@{parts.netloc}", parts.path, parts.query, parts.fragment))

    @property
    def selector(self) -> str:
        """The PromQL selector for every series we read, restricted by ``match``."""
        return self._select(SERIES_NAMES)

    @property
    def info_selector(self) -> str:
        """Our exporter's device and provenance info series, restricted by ``match``."""
        return self._select([OWN_DEVICE_INFO, OWN_PROVENANCE_INFO])

    def _select(self, names: list[str]) -> str:
        return '{__name__=~"' + "|".join(names) + '"' + (f",{self.match}" if self.match else "") + "}"


def normalise_match(match: str | None) -> str | None:
    """``job="train"`` from what a user typed: one pair of outer quotes (IPython keeps them,
    docs/facts.md, "IPython magics") and outer braces dropped. ValueError for an empty or malformed one."""
    if match is None:
        return None
    text = match.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"" and text.count(text[0]) == 2:
        text = text[1:-1].strip()
    if text.startswith("{") and text.endswith("}"):
        text = text[1:-1].strip()
    if not text:
        raise ValueError("--match is empty: give label matchers such as job=\"train\"")
    if any(c in text for c in "{}\n"):
        raise ValueError(f"--match {match!r}: give label matchers only, e.g. job=\"train\",instance=~\"node.*\"")
    return text


def parse_prometheus_spec(spec: str, match: str | None = None) -> PrometheusSpec:
    """``prometheus=URL[ match=SELECTOR]`` (plus ``match``) -> PrometheusSpec; ValueError says why."""
    text = spec.strip()
    if not text.startswith(SPEC_PREFIX):
        raise ValueError(f"not a Prometheus source spec: {spec!r} (expected prometheus=http://HOST:9090)")
    url, _, rest = text[len(SPEC_PREFIX):].partition(" ")
    rest = rest.strip()
    if rest:
        if not rest.startswith("match="):
            raise ValueError(f"unexpected {rest!r} after the Prometheus URL (expected match=SELECTOR)")
        if match is not None:
            raise ValueError("the Prometheus match selector is given twice")
        match = rest[len("match="):]
    parts = urlsplit(url)
    shown = shown_url(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"Prometheus URL {shown!r} must be http(s)://HOST[:PORT], e.g. prometheus=http://localhost:9090")
    try:
        parts.port  # noqa: B018 (raises on a bad port)
    except ValueError as exc:
        raise ValueError(f"Prometheus URL {shown!r}: {str(exc).replace(url, shown)}") from None
    userinfo = parts.netloc.rpartition("@")[0] or None
    return PrometheusSpec(shown.rstrip("/"), normalise_match(match), userinfo)


def validate_prometheus_spec(spec: str, match: str | None = None) -> str:
    """The normalised spec string (what ``open_sources`` and the sampler process receive)."""
    return str(parse_prometheus_spec(spec, match))


@dataclass
class _Counter:
    """A counter turned into "since the first reading", across a reset (driver reload)."""

    base: float | None = None
    last: float = 0.0
    carried: float = 0.0

    def since_start(self, value: float) -> float:
        if math.isnan(value):
            return value
        if self.base is None:
            self.base = self.last = value
        elif value < self.last:  # the counter restarted from zero
            self.carried += self.last - self.base
            self.base = 0.0
        self.last = value
        return self.carried + value - self.base


@dataclass
class _Device:
    info: DeviceInfo
    rules: dict[str, list[SeriesRule]] = field(default_factory=dict)  # series name -> rules used


class PrometheusSource:
    """Batched source over a Prometheus server; see the module docstring."""

    name = "prometheus"

    def __init__(
        self,
        spec: str | PrometheusSpec,
        match: str | None = None,
        interval_s: float | None = None,
        timeout_s: float = 2.0,
        wall: Callable[[], float] = time.time,
        mono: Callable[[], float] = time.monotonic,
    ) -> None:
        self.spec = spec if isinstance(spec, PrometheusSpec) else parse_prometheus_spec(spec, match)
        self.interval_s = interval_s
        self._interval_given = interval_s is not None
        self._api = PrometheusAPI(self.spec.connect_url, timeout_s)
        self._wall, self._mono = wall, mono
        self._notes = NoteBook()
        self._devices: dict[tuple, _Device] = {}  # _identity(who) -> device
        self._own_devices: dict[tuple[str, str], dict] = {}  # (node, device) -> gpuprof_device_info labels
        self._own_provenance: dict[tuple[str, str, str], str] = {}  # (node, device, metric) -> tag
        self._counters: dict[tuple[str, str], _Counter] = {}
        self._gaps: list[Gap] = []
        self._offset = 0.0
        self._next_ms = 0  # the first step of the next poll, wall-clock milliseconds
        self._retry_ms = 0  # after a failed poll: no query before this wall-clock time (ms)
        self._opened_mono = 0.0
        self._last_mono: dict[str, float] = {}  # device key -> its latest reading (monotonic s)
        self._points_per_query = MAX_POINTS
        self._non_finite = 0  # values dropped as NaN or infinite, and the first one's series
        self._first_non_finite = ""
        self.simulated = False

    # -- opening ------------------------------------------------------------------------------
    def open(self) -> list[DeviceInfo]:
        try:
            found = self._api.query(self.spec.selector)
            own_info = self._api.query(self.spec.info_selector)
            if not self._interval_given:
                self.interval_s = self._scrape_interval(found)
            self._learn_own_info(own_info)
            by_identity: dict[tuple, tuple[DeviceIdentity, set[str]]] = {}
            for series in found:
                who = self._complete(identify(series["metric"]))
                if who is not None:
                    by_identity.setdefault(self._identity(who), (who, set()))[1].add(series["metric"]["__name__"])
        except PrometheusError as exc:
            raise SourceUnavailable(str(exc)) from None
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise SourceUnavailable(f"Prometheus at {self.spec.url} answered series of the wrong shape "
                                    f"({type(exc).__name__}: {exc})") from None
        if not by_identity:
            restricted = f" matching {self.spec.match}" if self.spec.match else ""
            raise SourceUnavailable(
                f"Prometheus at {self.spec.url} has no dcgm-exporter (DCGM_FI_*) or gpuprof_* GPU series{restricted}")
        for identity, (who, names) in sorted(by_identity.items(), key=lambda item: item[1][0].key):
            self._devices[identity] = _Device(self._device_info(who), self._choose_rules(names))
        self.simulated = any(d.info.simulated for d in self._devices.values())
        self._points_per_query = max(1, min(MAX_POINTS, MAX_ANSWER_BYTES // (BYTES_PER_POINT * len(found))))
        if self.simulated:
            self._notes.add("some Prometheus series are labelled simulated: those devices are not measurements")
        now_wall, now_mono = self._wall(), self._mono()
        self._offset = now_mono - now_wall
        step_ms = self._step_ms
        self._next_ms = math.ceil(now_wall * 1000 / step_ms) * step_ms
        self._opened_mono = now_mono
        return [d.info for d in self._devices.values()]

    def _learn_own_info(self, series: list[dict]) -> None:
        """Our exporter's device details (UUID, name) and per-metric provenance on its node."""
        for s in series:
            labels = s["metric"]
            where = (labels.get("node", ""), labels.get("device", ""))
            if labels["__name__"] == OWN_DEVICE_INFO:
                self._own_devices[where] = labels
            elif labels.get("metric") and labels.get("provenance"):
                self._own_provenance[(*where, labels["metric"])] = labels["provenance"]

    def _complete(self, who: DeviceIdentity | None) -> DeviceIdentity | None:
        """``who`` with the UUID and name our exporter's ``gpuprof_device_info`` gives it."""
        info = self._own_devices.get((who.node, who.device)) if who is not None else None
        if info is None:
            return who
        return replace(who, uuid=who.uuid or info.get("uuid") or None, model=who.model or info.get("name") or None)

    @staticmethod
    def _identity(who: DeviceIdentity) -> tuple:
        """One device per node and GPU UUID (so dcgm-exporter's and our exporter's series of one
        GPU meet even if their indices differ); by node and index where no UUID is known."""
        return (who.node, who.uuid or who.device)

    def _scrape_interval(self, found: list[dict]) -> float:
        """The scrape interval of the targets these series come from (the coarsest if several);
        else the server's global setting."""
        sources = {(s["metric"].get("job"), s["metric"].get("instance")) for s in found}
        intervals = {
            parse_duration(t["scrapeInterval"])
            for t in self._api.active_targets()
            if (t["labels"].get("job"), t["labels"].get("instance")) in sources and t.get("scrapeInterval")
        }
        if len(intervals) > 1:
            self._notes.add("these targets are scraped at different intervals "
                            f"({', '.join(fmt_unit(i, 's') for i in sorted(intervals))}); read at the coarsest")
        if intervals:
            return max(intervals)
        try:
            return self._api.global_scrape_interval_s()
        except (PrometheusError, ValueError):
            self._notes.add(f"scrape interval unknown; read every {fmt_unit(DEFAULT_INTERVAL_S, 's')} (Prometheus's default)")
            return DEFAULT_INTERVAL_S

    def _device_info(self, who: DeviceIdentity) -> DeviceInfo:
        taken = {d.info.key for d in self._devices.values()}
        key, n = who.key, 2
        while key in taken:  # same node and index, another UUID (e.g. two exporters disagree)
            key, n = f"{who.key}#{n}", n + 1
        name = f"host {who.node}" if who.kind == "host" else f"{who.model or 'GPU'} on {who.node}"
        if who.simulated and "simulated" not in name:
            name += " (simulated)"
        index = int(who.device[3:]) if who.device[3:].isdigit() else None
        return DeviceInfo(key=key, kind=who.kind, name=name, index=index, uuid=who.uuid,
                          simulated=who.simulated, extra={"node": who.node, "device": who.device, "via": "prometheus"})

    def _choose_rules(self, names: set[str]) -> dict[str, list[SeriesRule]]:
        """For each metric, the first rule whose series this device has (RULES are best first)."""
        chosen: dict[str, SeriesRule] = {}
        for rule in RULES:
            if rule.series in names and rule.metric not in chosen:
                chosen[rule.metric] = rule
        by_series: dict[str, list[SeriesRule]] = {}
        for rule in chosen.values():
            by_series.setdefault(rule.series, []).append(rule)
        return by_series

    @property
    def _step_ms(self) -> int:
        return max(1, round(self.interval_s * 1000))

    # -- reading ------------------------------------------------------------------------------
    def read(self) -> Reading:
        """Batched: readings come from ``read_batch``."""
        return {}

    def read_batch(self, final: bool = False) -> list[Tick]:
        """Every step since the last poll that Prometheus can answer for now, oldest first;
        ``final`` (the run ends): also the partial interval up to now, as one reading stamped
        now (what Prometheus holds then).

        Asks the server at most once a scrape interval (the sampler may call more often), and
        after a failure waits one interval before asking again (not when ``final``). Blocks up
        to ``timeout_s`` a query (the API's total deadline): call it off any fast sampling lane.
        A query covers at most as many steps as fit the answer's size cap."""
        step_ms = self._step_ms
        now_ms = round(self._wall() * 1000)
        end_ms = now_ms // step_ms * step_ms
        if end_ms < self._retry_ms and not final:
            return []
        by_time: dict[int, Reading] = {}
        try:
            while self._next_ms <= end_ms:
                chunk_end = min(end_ms, self._next_ms + step_ms * (self._points_per_query - 1))
                self._query_window(self._next_ms, chunk_end, chunk_end + step_ms, by_time)
            if final and now_ms > self._next_ms - step_ms:
                self._query_window(now_ms, now_ms, now_ms + step_ms, by_time)
        except PrometheusAnswerError as exc:
            self._retry_ms = end_ms + step_ms
            self._notes.add(f"{exc}; that stretch was skipped (a gap) and the "
                            "next one asked for a scrape interval later")
        except PrometheusError as exc:
            self._retry_ms = end_ms + step_ms
            self._notes.add(f"{exc}; asked again every scrape interval "
                            "(what it scraped meanwhile is read then)")
        timed = [Tick(ms / 1000 + self._offset, ms / 1000, by_time[ms]) for ms in sorted(by_time)]
        self._record_gaps(timed)
        return timed

    def _query_window(self, start_ms: int, end_ms: int, next_ms: int, by_time: dict[int, Reading]) -> None:
        """Read ``start_ms..end_ms`` into ``by_time`` and move the window to ``next_ms``; a
        usable answer or an unusable one moves it, no answer leaves it for the next poll."""
        try:
            result = self._api.query_range(self.spec.selector, start_ms / 1000, end_ms / 1000, self._step_ms / 1000)
            self._fold(_checked_series(result, self.spec.url), by_time)
        except PrometheusAnswerError:
            self._next_ms = next_ms
            raise
        self._next_ms = next_ms

    def _fold(self, result: list[tuple[dict, list[tuple[int, float]]]], by_time: dict[int, Reading]) -> None:
        for labels, points in result:
            who = self._complete(identify(labels))
            if who is None:
                continue
            device = self._devices.get(self._identity(who))
            if device is None:
                self._notes.add(f"{who.key} appeared on Prometheus after the run started: not recorded")
                continue
            for rule in device.rules.get(labels.get("__name__"), []):
                counter = self._counters.setdefault((device.info.key, rule.metric), _Counter()) if rule.counter else None
                for ts_ms, raw in points:
                    value = raw * rule.scale
                    if counter is not None and math.isfinite(value):
                        value = counter.since_start(value)
                    if not math.isfinite(value):
                        self._drop_non_finite(f"{labels.get('__name__')} of {device.info.key}")
                        continue
                    by_time.setdefault(ts_ms, {}).setdefault(device.info.key, {})[rule.metric] = value

    def _drop_non_finite(self, where: str) -> None:
        self._non_finite += 1
        self._first_non_finite = self._first_non_finite or where

    def _record_gaps(self, timed: list[Tick]) -> None:
        """A device whose next reading came more than two scrape intervals after its previous
        one (a node down, a scrape failing) has a gap, tagged ``prometheus NODE/gpuN``; a
        stretch every device missed (the server or the whole job) is one ``prometheus`` gap."""
        missed: dict[tuple[float, float], list[str]] = {}
        for reading in timed:
            for key in reading.reading:
                last = self._last_mono.get(key, self._opened_mono)
                if is_gap(last, reading.mono, self.interval_s):
                    missed.setdefault((last, reading.mono), []).append(key)
                self._last_mono[key] = reading.mono
        every = {d.info.key for d in self._devices.values()}
        for (start, end), keys in missed.items():
            if set(keys) == every:
                self._gaps.append(Gap(start, end, self.name))
            else:
                self._gaps.extend(Gap(start, end, f"{self.name} {key}") for key in keys)

    def take_gaps(self) -> list[Gap]:
        gaps, self._gaps = self._gaps, []
        return gaps

    # -- describing ---------------------------------------------------------------------------
    def provenance(self) -> dict[str, dict[str, str]]:
        """Our exporter's series keep the tag their node recorded (``gpm.sm_util`` read through
        Prometheus is still GPM's SM share); DCGM's are tagged ``dcgm.*``."""
        out: dict[str, dict[str, str]] = {}
        for device in self._devices.values():
            tags = out.setdefault(device.info.key, {})
            where = (device.info.extra["node"], device.info.extra["device"])
            for rules in device.rules.values():
                for rule in rules:
                    tags[rule.metric] = ("simulated" if device.info.simulated else
                                         self._own_provenance.get((*where, rule.metric), rule.tag)
                                         if rule.series.startswith(OWN_PREFIX) else rule.tag)
        return out

    def notes(self) -> list[str]:
        notes = self._notes.list()
        if self._non_finite:
            notes.append(f"Prometheus at {self.spec.url}: {self._non_finite} non-finite value(s) (NaN, +-Inf, or "
                         f"beyond float range in the contract's unit) dropped, not recorded; the first: "
                         f"{self._first_non_finite}")
        return notes

    def context(self) -> dict:
        return {"prometheus_url": self.spec.url, "prometheus_match": self.spec.match,
                "prometheus_scrape_interval_s": self.interval_s,
                "prometheus_clock_offset_s": self._offset}

    def close(self) -> None:
        self._api.close()



def _checked_series(result: list, url: str) -> list[tuple[dict, list[tuple[int, float]]]]:
    """A range query's series as (labels, [(wall ms, value)]), every type checked first, so a
    malformed answer changes no state (no counter, no device). PrometheusAnswerError if any
    part is of the wrong type; a value may be NaN or infinite (the caller drops those)."""
    checked = []
    try:
        for series in result:
            labels, values = series["metric"], series["values"]
            if not isinstance(labels, dict) or not all(isinstance(v, str) for v in labels.values()):
                raise TypeError(f"labels {labels!r}")
            points = []
            for ts, text in values:
                if not isinstance(text, str) or isinstance(ts, bool) or not isinstance(ts, (int, float, str)):
                    raise TypeError(f"point {[ts, text]!r}")
                ts_s = float(ts)
                if not math.isfinite(ts_s):
                    raise ValueError(f"time {ts!r}")
                points.append((round(ts_s * 1000), float(text)))
            checked.append((labels, points))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise PrometheusAnswerError(f"Prometheus at {url} answered a series of the wrong shape ({type(exc).__name__}: {exc})") from None
    return checked
