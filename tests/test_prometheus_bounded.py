"""Issue 19 part 3: the Prometheus source stays bounded against a misbehaving server.

Each case runs against a real HTTP server on loopback (tests/prometheus_server.py's
FakePrometheus): a body dripped a byte at a time, a 150 MB answer, answers of the wrong types,
NaN and infinite values, credentials in the URL. The source's clocks are injected, so when it
polls is decided here; only the HTTP exchange is real.
"""

from __future__ import annotations

import base64
import json

import pytest

from gpuprof_jupyter.core.protocol import Ping
from gpuprof_jupyter.core.sources.base import SourceUnavailable
from gpuprof_jupyter.core.sources.prometheus import PrometheusSource, parse_prometheus_spec
from gpuprof_jupyter.core.sources.prometheus_api import MAX_ANSWER_BYTES
from gpuprof_jupyter.core.sources.prometheus_names import MIB
from tests.fakes import wait_for
from tests.prometheus_server import FakePrometheus, fake_prometheus, free_port

SECRET = "s3cret%21pw"  # percent-encoded in the URL: "s3cret!pw"


@pytest.fixture
def fake():
    with fake_prometheus() as server:
        yield server


class Clock:
    """The source's wall and monotonic clocks, moved by the test."""

    def __init__(self) -> None:
        self.wall, self.mono = 1000.2, 50.2

    def advance(self, seconds: float) -> None:
        self.wall += seconds
        self.mono += seconds


def opened(url: str, clock: Clock, **kwargs) -> PrometheusSource:
    source = PrometheusSource(f"prometheus={url}", wall=lambda: clock.wall, mono=lambda: clock.mono, **kwargs)
    devices = source.open()
    assert [d.key for d in devices] == ["n1/gpu0"] and devices[0].simulated
    return source


def walls(batch) -> list[float]:
    return [t.wall for t in batch]


@pytest.mark.parametrize("mode", ["drip", "drip_headers"])
def test_a_dripping_server_fails_the_query_at_its_deadline_and_the_stretch_is_read_later(fake, mode):
    clock = Clock()
    source = opened(fake.url, clock, timeout_s=0.5)
    fake.range_answer = mode  # a byte every 0.2 s, until the server stops: a per-read timeout never fires
    clock.advance(2)
    assert source.read_batch() == []  # returns at all: the drip lasts until the test ends
    assert any("did not answer in full within 0.5 s" in note for note in source.notes()), source.notes()
    wait_for(fake.hung_up.is_set, 60, "the client to hang up on the dripping answer")  # it gave up, mid-answer
    fake.range_answer = None
    clock.advance(1)
    assert walls(source.read_batch()) == [1001.0, 1002.0, 1003.0]  # no answer: the stretch is asked again


@pytest.mark.parametrize("mode", ["huge", "huge_declared"])
def test_an_answer_over_the_size_cap_is_not_read_and_later_data_is(fake, mode):
    clock = Clock()
    source = opened(fake.url, clock)
    fake.range_answer = mode
    clock.advance(2)
    assert source.read_batch() == []
    assert any(f"more than {MAX_ANSWER_BYTES // 2**20:g} MiB" in note for note in source.notes()), source.notes()
    assert fake.huge_sent < FakePrometheus.HUGE / 4  # the client hung up early (what got out: socket buffers)
    fake.range_answer = None
    clock.advance(2)
    batch = source.read_batch()
    assert walls(batch) == [1003.0, 1004.0]  # 1001-1002 skipped (the same answer would come again)
    assert batch[0].reading["n1/gpu0"]["gpu_mem_used_bytes"] == 1024 * MIB


def _point(value) -> dict:
    return FakePrometheus.range_body({"DCGM_FI_DEV_GPU_UTIL": [[1001.0, "50"], [1002.0, value]]})


@pytest.mark.parametrize("body", [
    ["a", "list", "as", "the", "body"],
    "a string",
    {"status": "success", "data": None},
    {"status": "success", "data": {"result": None}},
    {"status": "success", "data": {"result": [None]}},
    {"status": "success", "data": {"result": [{"metric": None, "values": []}]}},
    {"status": "success", "data": {"result": [{"metric": {"__name__": "DCGM_FI_DEV_GPU_UTIL"}, "values": None}]}},
    _point(None),
    _point(50),
    _point([1]),
    _point("fifty"),
], ids=["list-body", "string-body", "data-none", "result-none", "series-none", "labels-none", "values-none",
        "value-none", "value-number", "value-list", "value-text"])
def test_an_answer_of_the_wrong_types_is_a_source_error_with_back_off_and_the_window_moves_on(fake, body):
    clock = Clock()
    source = opened(fake.url, clock)
    fake.range_answer = body
    clock.advance(2)
    for _ in range(5):  # the batch lane polls four times a second
        assert source.read_batch() == []
        clock.advance(0.1)
    assert fake.range_queries() == 1  # at most one query a scrape interval after a failure
    assert any("Prometheus at" in note and "skipped" in note for note in source.notes()), source.notes()
    fake.range_answer = None
    clock.advance(0.6)
    batch = source.read_batch()
    assert walls(batch) == [1003.0]  # one bad point never blocks later data
    assert batch[0].reading["n1/gpu0"]["sm_util"] == 50.0


def test_non_finite_values_are_dropped_with_one_note(fake):
    clock = Clock()
    source = opened(fake.url, clock)
    fake.range_answer = FakePrometheus.range_body({
        "DCGM_FI_DEV_GPU_UTIL": [[1001.0, "NaN"], [1002.0, "+Inf"], [1003.0, "-Inf"], [1004.0, "40"]],
        "DCGM_FI_DEV_FB_USED": [[1001.0, "1e308"], [1002.0, "1024"], [1003.0, "1024"], [1004.0, "1024"]],  # x MiB: inf
    })
    clock.advance(4)
    batch = source.read_batch()
    assert walls(batch) == [1002.0, 1003.0, 1004.0]
    json.dumps([t.reading for t in batch], allow_nan=False)  # what reaches meta.json is valid JSON
    assert batch[0].reading["n1/gpu0"] == {"gpu_mem_used_bytes": 1024 * MIB}
    assert batch[2].reading["n1/gpu0"]["sm_util"] == 40.0
    notes = [note for note in source.notes() if "non-finite" in note]
    assert len(notes) == 1 and "7 non-finite value(s)" in notes[0], notes  # 3 points x 2 metrics, one overflow
    clock.advance(1)
    source.read_batch()  # the same answer again
    notes = [note for note in source.notes() if "non-finite" in note]
    assert len(notes) == 1 and "14 non-finite value(s)" in notes[0], notes  # still one note


def test_credentials_are_sent_as_basic_auth_and_never_stored_or_shown(fake):
    url = fake.url.replace("http://", f"http://gpuprofuser:{SECRET}@")
    clock = Clock()
    source = opened(url, clock)
    assert fake.requests[-1][1] == "Basic " + base64.b64encode(b"gpuprofuser:s3cret!pw").decode()
    assert SECRET in str(source.spec)  # the whole spec travels to the sampler process, to connect
    fake.range_answer = []
    clock.advance(2)
    source.read_batch()
    shown = [repr(source.spec), source.spec.url, json.dumps(source.context()), *source.notes()]
    assert source.notes() and not [text for text in shown if "gpuprofuser" in text or "s3cret" in text], shown
    for bad in (f"prometheus=http://gpuprofuser:{SECRET}@h:notaport", f"prometheus=ftp://gpuprofuser:{SECRET}@h"):
        with pytest.raises(ValueError) as error:
            parse_prometheus_spec(bad)
        assert "s3cret" not in str(error.value) and "gpuprofuser" not in str(error.value)
    with pytest.raises(SourceUnavailable) as error:
        PrometheusSource(f"prometheus=http://gpuprofuser:{SECRET}@127.0.0.1:{free_port()}", timeout_s=1).open()
    assert "unreachable" in str(error.value) and "s3cret" not in str(error.value)


@pytest.mark.process
def test_a_profiled_run_keeps_credentials_out_and_leaves_no_batch_lane_behind(fake, tmp_path):
    """End to end in the sampler process: good answers, then a dripping server until the run
    ends. The rows before are kept, meta.json is valid JSON without the password (nor is the
    standalone report), and the batch lane has ended with the run."""
    import gpuprof_jupyter as gp
    from gpuprof_jupyter.runtime.link import sampler_link

    store = tmp_path / "store"
    url = fake.url.replace("http://", f"http://gpuprofuser:{SECRET}@")
    with gp.profile("creds", source=f"prometheus={url}", store=store):
        wait_for(lambda: fake.range_queries() >= 2, 30, "two good range queries")
        fake.range_answer = "drip"
        queries = fake.range_queries()
        wait_for(lambda: fake.range_queries() > queries, 30, "a dripping range query")
    (meta_file,) = store.glob("*/meta.json")
    text = meta_file.read_text()
    assert "s3cret" not in text and "gpuprofuser" not in text
    meta = json.loads(text, parse_constant=lambda name: pytest.fail(f"{name} in meta.json"))
    assert meta["context"]["prometheus_url"] == fake.url
    assert any("did not answer in full within" in note for note in meta["notes"]), meta["notes"]
    exp = gp.load("creds", store=store)
    assert len(exp.samples[exp.samples["device"] == "n1/gpu0"]) >= 1
    threads = sampler_link().request(Ping())["threads"]
    assert "gpuprof-batch-lane" not in threads, threads
    report = gp.report("creds", path=tmp_path / "report.html", store=store)
    html = open(report).read()
    assert fake.url in html and "s3cret" not in html and "gpuprofuser" not in html
