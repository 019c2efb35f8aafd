"""The Prometheus source, end to end against a real Prometheus server.

exporters (two processes running the project's exporter for two nodes with simulated GPUs,
and a loopback endpoint serving a dcgm-exporter fixture) -> Debian's prometheus (1 s scrapes) -> PrometheusSource -> the
values each node serves, in the contract's names and units. Plus the spec parser, the
conversions on a stubbed API, and failures (unreachable server, rejected query).
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import replace

import pytest

from gpuprof_jupyter.core.metrics import METRICS, PROVENANCE
from gpuprof_jupyter.core.sources.base import SourceUnavailable, is_batched
from gpuprof_jupyter.core.sources.prometheus import PrometheusSource, _Counter, parse_prometheus_spec
from gpuprof_jupyter.core.sources.prometheus_api import PrometheusError, parse_duration
from gpuprof_jupyter.core.sources.prometheus_names import MIB, RULES
from gpuprof_jupyter.core.sources.select import open_sources, validate_source_spec
from tests.prom_node import node_values
from tests.fakes import LiveRows, wait_for
from tests.prometheus_server import PROMETHEUS, dcgm_endpoint, free_port, node_exporters, prometheus_server

def _require_prometheus() -> None:
    """Fail, never skip: `make system-deps` (make test) installs Debian's prometheus."""
    if not os.access(PROMETHEUS, os.X_OK):
        pytest.fail(f"Prometheus server not installed ({PROMETHEUS}): make system-deps (apt-get install prometheus)")


needs_prometheus = pytest.mark.usefixtures("prometheus_installed")


@pytest.fixture
def prometheus_installed():
    _require_prometheus()
NODES = ["node1", "node2"]


# -- spec ---------------------------------------------------------------------------------------
def test_spec_parsing_and_match_normalisation():
    spec = parse_prometheus_spec("prometheus=http://h:9090/")
    assert spec.url == "http://h:9090" and spec.match is None
    # IPython keeps the quotes (docs/facts.md, "IPython magics"); braces are accepted too
    assert parse_prometheus_spec("prometheus=http://h:9090", "'job=\"train\"'").match == 'job="train"'
    assert parse_prometheus_spec("prometheus=http://h:9090", '{job="train"}').match == 'job="train"'
    combined = str(parse_prometheus_spec("prometheus=http://h:9090", 'job="train"'))
    assert combined == 'prometheus=http://h:9090 match=job="train"'
    assert parse_prometheus_spec(combined) == parse_prometheus_spec("prometheus=http://h:9090", 'job="train"')
    assert validate_source_spec("prometheus=https://prom.example:443") == "prometheus=https://prom.example:443"
    assert 'job="train"' in parse_prometheus_spec(combined).selector


def test_the_magic_folds_match_into_the_spec():
    from IPython.core.error import UsageError

    from gpuprof_jupyter.notebook.cell_options import session_options
    from gpuprof_jupyter.notebook.magic import parse_line

    options = session_options(parse_line("""--source prometheus=http://h:9090 --match 'job="train"'"""))
    assert parse_prometheus_spec(options.source) == parse_prometheus_spec("prometheus=http://h:9090", 'job="train"')
    with pytest.raises(UsageError, match="--match needs --source prometheus"):
        session_options(parse_line("""--source sim --match 'job="train"'"""))


@pytest.mark.parametrize("spec, match, why", [
    ("prometheus=", None, "http"),
    ("prometheus=ftp://h:9090", None, "http"),
    ("prometheus=http://h:notaport", None, "port"),
    ("prometheus=http://h:9090", "  ", "empty"),
    ("prometheus=http://h:9090", 'job="a"}{x="b"', "label matchers"),
    ("prometheus=http://h:9090 junk", None, "unexpected"),
    ('prometheus=http://h:9090 match=job="a"', 'job="b"', "twice"),
])
def test_bad_specs_say_what_is_wrong(spec, match, why):
    with pytest.raises(ValueError, match=why):
        parse_prometheus_spec(spec, match)


def test_durations():
    assert parse_duration("1s") == 1.0 and parse_duration("1m30s") == 90.0 and parse_duration("500ms") == 0.5
    with pytest.raises(ValueError):
        parse_duration("1 s")


def test_rules_name_only_contract_metrics_with_known_provenance():
    for rule in RULES:
        assert rule.metric in METRICS
        assert rule.tag in PROVENANCE


def test_a_counter_counts_from_its_first_reading_across_a_reset():
    counter = _Counter()
    assert [counter.since_start(v) for v in (100.0, 130.0, 5.0, 15.0)] == [0.0, 30.0, 35.0, 45.0]
    assert math.isnan(counter.since_start(float("nan")))


# -- a stubbed API: conversions, clocks, gaps ------------------------------------------------------
class StubAPI:
    """Answers like Prometheus for one dcgm GPU, with the samples given (wall ts -> value)."""

    def __init__(self, samples: dict[float, float]) -> None:
        self.samples = samples
        self.fail, self.range_queries = False, 0
        self.second_gpu: set[float] = set()  # times a second GPU has samples too
        self.labels = {"gpu": "0", "UUID": "GPU-x", "Hostname": "n1", "job": "dcgm", "instance": "h:9400"}

    def _series(self, name, values):
        return {"metric": {"__name__": name, **self.labels}, "values": values}

    def query(self, expr, at=None):
        if "DCGM" not in expr:
            return []
        gpus = [self.labels] + ([{**self.labels, "gpu": "1", "UUID": "GPU-y"}] if self.second_gpu else [])
        return [{"metric": {"__name__": n, **labels}, "value": [0, "1"]}
                for n in ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION") for labels in gpus]

    def active_targets(self):
        return [{"labels": {"job": "dcgm", "instance": "h:9400"}, "scrapeInterval": "1s"}]

    def query_range(self, expr, start, end, step):
        self.range_queries += 1
        if self.fail:
            raise PrometheusError("http://stub:9090 is unreachable (ConnectionError)")
        inside = [(t, v) for t, v in sorted(self.samples.items()) if start <= t <= end]
        series = [self._series("DCGM_FI_DEV_FB_USED", [[t, str(v)] for t, v in inside]),
                  self._series("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", [[t, str(1000 * v)] for t, v in inside])]
        if self.second_gpu:
            series.append({"metric": {"__name__": "DCGM_FI_DEV_FB_USED", **self.labels, "gpu": "1", "UUID": "GPU-y"},
                           "values": [[t, str(v)] for t, v in inside if t in self.second_gpu]})
        return series

    def close(self):
        pass


def test_units_clock_offset_and_gaps_on_a_stub():
    clock = {"wall": 1000.2, "mono": 50.2}
    source = PrometheusSource("prometheus=http://stub:9090", wall=lambda: clock["wall"], mono=lambda: clock["mono"])
    source._api = StubAPI({1001.0: 1.0, 1002.0: 2.0, 1006.0: 6.0})
    devices = source.open()
    assert [d.key for d in devices] == ["n1/gpu0"] and devices[0].uuid == "GPU-x"
    assert source.interval_s == 1.0 and is_batched(source)
    assert source.read_batch() == []  # no step has passed since open
    clock.update(wall=1006.5, mono=56.5)
    batch = source.read_batch()
    assert [t.wall for t in batch] == [1001.0, 1002.0, 1006.0]
    assert [round(t.mono, 6) for t in batch] == [51.0, 52.0, 56.0]  # one offset, taken at open
    assert [t.reading["n1/gpu0"]["gpu_mem_used_bytes"] for t in batch] == [MIB, 2 * MIB, 6 * MIB]
    assert [t.reading["n1/gpu0"]["energy_j"] for t in batch] == [0.0, 1.0, 5.0]  # mJ counter -> J since start
    assert [(g.source, g.start, g.end) for g in source.take_gaps()] == [("prometheus", 52.0, 56.0)]  # 4 s > 2 x 1 s
    assert source.take_gaps() == []
    assert source.provenance() == {"n1/gpu0": {"gpu_mem_used_bytes": "dcgm.fb_used", "energy_j": "dcgm.total_energy"}}


def test_a_node_that_stops_reporting_has_its_own_gap():
    clock = {"wall": 1000.2, "mono": 50.2}
    source = PrometheusSource("prometheus=http://stub:9090", wall=lambda: clock["wall"], mono=lambda: clock["mono"])
    source._api = api = StubAPI({t: 1.0 for t in (1001.0, 1002.0, 1003.0, 1004.0, 1005.0, 1006.0)})
    api.second_gpu = {1001.0, 1002.0, 1006.0}  # GPU 1 misses three scrapes
    source.open()
    clock.update(wall=1006.5, mono=56.5)
    batch = source.read_batch()
    assert [sorted(t.reading) for t in batch][2] == ["n1/gpu0"]
    assert [(g.source, g.start, g.end) for g in source.take_gaps()] == [("prometheus n1/gpu1", 52.0, 56.0)]


def test_a_failed_poll_is_a_note_and_its_stretch_is_read_later():
    clock = {"wall": 1000.2, "mono": 50.2}
    source = PrometheusSource("prometheus=http://stub:9090", wall=lambda: clock["wall"], mono=lambda: clock["mono"])
    source._api = api = StubAPI({1001.0: 1.0, 1002.0: 2.0, 1003.0: 3.0})
    source.open()
    api.fail = True
    clock.update(wall=1002.5, mono=52.5)
    assert source.read_batch() == [] and any("unreachable" in n for n in source.notes())
    clock.update(wall=1002.9, mono=52.9)
    assert source.read_batch() == [] and api.range_queries == 1  # waits an interval before asking again
    api.fail = False
    clock.update(wall=1003.5, mono=53.5)
    assert [t.wall for t in source.read_batch()] == [1001.0, 1002.0, 1003.0]  # nothing lost
    assert source.take_gaps() == []


def test_the_last_partial_interval_is_read_when_the_run_ends():
    clock = {"wall": 1000.2, "mono": 50.2}
    source = PrometheusSource("prometheus=http://stub:9090", wall=lambda: clock["wall"], mono=lambda: clock["mono"])
    source._api = StubAPI({1001.0: 1.0, 1001.7: 2.0})
    source.open()
    clock.update(wall=1001.7, mono=51.7)
    assert [t.wall for t in source.read_batch()] == [1001.0]
    assert [t.wall for t in source.read_batch(final=True)] == [1001.7]  # stamped now, not at a step
    assert source.read_batch(final=True) == []


# -- failures ----------------------------------------------------------------------------------
def test_unreachable_server_at_open_is_a_clear_error():
    source = PrometheusSource(f"prometheus=http://127.0.0.1:{free_port()}", timeout_s=1)
    with pytest.raises(SourceUnavailable, match="unreachable"):
        source.open()
    with pytest.raises(ValueError, match="unreachable"):
        open_sources(f"prometheus=http://127.0.0.1:{free_port()}")
    with pytest.raises(ValueError, match="--match"):
        open_sources("prometheus=http://127.0.0.1:9", devices=[0])


# -- a real Prometheus ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Prometheus scraping a dcgm-exporter fixture (node dgx-a, two GPUs) and two exporter
    processes standing for nodes node1 and node2 (simulated GPUs)."""
    _require_prometheus()
    with dcgm_endpoint() as dcgm, node_exporters(NODES) as nodes:
        with prometheus_server(tmp_path_factory.mktemp("prometheus"), {"dcgm": [dcgm], "train": nodes}) as url:
            yield url


def _collect(source: PrometheusSource, readings: int) -> list:
    batches: list = []
    wait_for(lambda: batches.extend(source.read_batch()) or len(batches) >= readings, 30,
             f"{readings} readings from Prometheus")
    return batches


@pytest.mark.process
@needs_prometheus
def test_every_node_is_read_with_its_values(cluster):
    source = PrometheusSource(f"prometheus={cluster}")
    try:
        devices = {d.key: d for d in source.open()}
        assert sorted(devices) == ["dgx-a/gpu0", "dgx-a/gpu1", "node1/gpu0", "node1/host", "node2/gpu0", "node2/host"]
        assert source.interval_s == 1.0  # the targets' scrape interval, asked of the server
        assert devices["dgx-a/gpu0"].uuid == "GPU-a1b2c3d4-0000-0000-0000-000000000000"
        assert devices["dgx-a/gpu0"].name == "NVIDIA A100-SXM4-80GB on dgx-a" and not devices["dgx-a/gpu0"].simulated
        assert devices["node2/gpu0"].simulated and "simulated" in devices["node2/gpu0"].name
        assert devices["node2/gpu0"].uuid == "GPU-simulated-node2-0000" and devices["node2/host"].kind == "host"

        batch = _collect(source, 4)
        walls = [t.wall for t in batch]
        assert walls == sorted(walls) and all(b - a == pytest.approx(1.0) for a, b in zip(walls, walls[1:]))
        offset = time.monotonic() - time.time()
        assert all(abs(t.mono - (t.wall + offset)) < 0.5 for t in batch)
        last = batch[-1].reading
        assert set(last) == set(devices)
        gpu0, gpu1 = last["dgx-a/gpu0"], last["dgx-a/gpu1"]
        assert gpu0["sm_util"] == pytest.approx(62.5) and gpu1["sm_util"] == pytest.approx(5.0)  # ratio -> %
        assert gpu0["gpu_busy"] == 97.0 and gpu0["mem_bw_util"] == pytest.approx(31.25)
        assert gpu0["tensor_util"] == pytest.approx(25.0) and gpu0["power_w"] == 312.5 and gpu1["power_w"] == 98.25
        assert gpu0["gpu_mem_used_bytes"] == 61440 * MIB and gpu1["gpu_mem_used_bytes"] == 1024 * MIB  # MiB -> B
        assert gpu0["gpu_temp_c"] == 61.0 and gpu0["sm_clock_mhz"] == 1410.0
        energy = [t.reading["dgx-a/gpu0"]["energy_j"] for t in batch]
        assert energy[0] == 0.0 and energy == sorted(energy)  # J since the first reading
        assert 0 < energy[-1] < 5.0 * (len(energy) + 2)  # 5 J/s: joules, not millijoules
        for number, node in enumerate(NODES, start=1):
            served = node_values(number)
            for device, values in served.items():
                for metric, value in values.items():
                    assert last[f"{node}/{device}"][metric] == pytest.approx(value), (node, device, metric)
            assert last[f"{node}/gpu0"]["energy_j"] >= 0.0

        provenance = source.provenance()
        assert provenance["dgx-a/gpu0"]["sm_util"] == "dcgm.prof.sm_active"
        assert provenance["dgx-a/gpu0"]["gpu_busy"] == "dcgm.gpu_util"
        assert provenance["dgx-a/gpu0"]["mem_bw_util"] == "dcgm.prof.dram_active"  # not MEM_COPY_UTIL
        assert provenance["node1/gpu0"]["sm_util"] == "simulated"
        for device, tags in provenance.items():
            assert all(tag in PROVENANCE for tag in tags.values()), tags
            for values in (t.reading.get(device, {}) for t in batch):
                assert set(values) <= set(tags)
        assert source.take_gaps() == []
        assert any("simulated" in note for note in source.notes())
    finally:
        source.close()


@pytest.mark.process
@needs_prometheus
def test_match_restricts_the_series(cluster):
    source = PrometheusSource(f"prometheus={cluster}", match="'job=\"train\"'")
    try:
        assert sorted(d.key for d in source.open()) == ["node1/gpu0", "node1/host", "node2/gpu0", "node2/host"]
        assert {k for t in _collect(source, 2) for k in t.reading} == {"node1/gpu0", "node1/host", "node2/gpu0", "node2/host"}
    finally:
        source.close()
    with pytest.raises(SourceUnavailable, match='no dcgm-exporter .* matching job="nope"'):
        PrometheusSource(f"prometheus={cluster}", match='job="nope"').open()


@pytest.mark.process
@needs_prometheus
def test_open_sources_reads_prometheus_and_the_host(cluster):
    sources = open_sources(f'prometheus={cluster} match=job="dcgm"')
    try:
        assert sources.label == "prometheus" and not sources.simulated
        assert [d.key for d in sources.devices] == ["dgx-a/gpu0", "dgx-a/gpu1", "host"]
    finally:
        for source in sources.sources:
            source.close()


@pytest.mark.process
@needs_prometheus
def test_a_rejected_query_is_a_clear_error_then_a_note(cluster):
    with pytest.raises(SourceUnavailable, match="rejected"):
        PrometheusSource(f"prometheus={cluster}", match='job=~"("').open()  # not a valid regex
    source = PrometheusSource(f"prometheus={cluster}")
    try:
        source.open()
        source.spec = replace(source.spec, match='job=~"("')  # the server starts refusing the query
        wait_for(lambda: any("rejected" in note for note in source.notes()) or source.read_batch(), 10,
                 "the rejected query's note")
        assert any("rejected" in note for note in source.notes())
    finally:
        source.close()


@pytest.mark.process
@needs_prometheus
def test_a_server_lost_mid_run_is_a_note_not_a_crash(tmp_path):
    with dcgm_endpoint() as dcgm, prometheus_server(tmp_path, {"dcgm": [dcgm]}) as url:
        source = PrometheusSource(f"prometheus={url}", timeout_s=1)
        devices = source.open()
        assert len(devices) == 2
    try:  # the server is gone (the context above killed it)
        wait_for(lambda: any("unreachable" in note for note in source.notes()) or source.read_batch(), 10,
                 "the unreachable server's note")
        assert any("unreachable" in note for note in source.notes()), source.notes()
    finally:
        source.close()



@pytest.mark.process
@needs_prometheus
def test_a_profiled_run_records_every_node(cluster, tmp_path):
    """exporters -> Prometheus -> ``source="prometheus=..."`` in the sampler process -> the store
    and the summary: every node's GPUs, with the values their exporters serve."""
    import gpuprof_jupyter as gp

    live = LiveRows()
    with gp.profile("multi-node", source=f'prometheus={cluster} match=job="train"', store=tmp_path / "store",
                    observers=[live]) as run:
        wait_for(lambda: all(live.count.get(f"{node}/gpu0", 0) >= 2 for node in NODES), 60,
                 "two scrapes of every node's GPU")
    exp = gp.load("multi-node", store=tmp_path / "store")
    assert exp.meta.source == "prometheus" and exp.meta.simulated  # the node exporters' GPUs are simulated
    assert {d["key"] for d in exp.meta.devices} == {"node1/gpu0", "node1/host", "node2/gpu0", "node2/host", "host"}
    assert exp.meta.provenance["node1/gpu0"]["sm_util"] == "simulated"
    samples = exp.samples
    for number, node in enumerate(NODES, start=1):
        rows = samples[samples["device"] == f"{node}/gpu0"]
        assert len(rows) >= 2
        assert set(rows["sm_util"]) == {node_values(number)["gpu0"]["sm_util"]}
        assert exp.summary["devices"][f"{node}/gpu0"]["sm_util_mean"] == pytest.approx(node_values(number)["gpu0"]["sm_util"])
    assert run.experiment.id == exp.id
