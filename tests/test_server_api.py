"""The server extension's routes through pytest-jupyter's ``jp_fetch``, authentication on.

pytest-jupyter's fixtures are imported into this module only (not as a global plugin), so
its autouse fixtures touch no other test. Requests run on its event loop with
``run_until_complete`` (its async-test hook is a plugin hook, not loaded here).
"""

from __future__ import annotations

import json
import os
import socket

import pytest
from tornado.httpclient import HTTPClientError

from pytest_jupyter.jupyter_server import *  # noqa: F403 - jp_fetch, jp_serverapp, ... (module scope only)

import gpuprof_jupyter as gp
from tests.fake_nvml import FakeNvml, h100
from tests.fakes import wait_for
from gpuprof_jupyter.core.store.directory import Store
from gpuprof_jupyter.core.store.experiment import ExperimentMeta
from gpuprof_jupyter.core.store.samples_file import SampleStreamWriter, samples_schema

pytestmark = pytest.mark.process  # every test here starts a process or a server

TS_TYPES = os.path.join(os.path.dirname(__file__), "..", "labextension", "src", "types.ts")


@pytest.fixture
def jp_server_config():
    return {"ServerApp": {"jpserver_extensions": {"gpuprof_jupyter.server": True}},
            "GPUProfiler": {"poll_interval_s": 0.2, "idle_stop_s": 30.0}}


@pytest.fixture
def api(jp_fetch, jp_asyncio_loop, jp_serverapp):
    """api(path, **kw) -> (status, parsed body); HTTP errors come back as their status too."""

    def call(path, raw=False, **kwargs):
        try:
            response = jp_asyncio_loop.run_until_complete(jp_fetch("gpuprof", "api", *path.split("/"), **kwargs))
        except HTTPClientError as exc:
            body = exc.response.body.decode() if exc.response is not None else ""
            return exc.code, (json.loads(body) if body.startswith("{") else body)
        body = response.body.decode()
        call.headers = response.headers
        return response.code, (body if raw else json.loads(body))

    yield call
    jp_serverapp.web_app.settings["gpuprof"]["poller"].stop()


def _record(root, name, **options):
    with gp.profile(name, source="sim:compute-bound", store=root / ".gpuprof", interval=0.02, **options) as run:
        for _ in gp.track(range(5)):
            gp.step(8)
    return run.experiment


@pytest.fixture
def recorded(jp_root_dir):
    return [_record(jp_root_dir, "baseline", params={"batch_size": 32}),
            _record(jp_root_dir, "bigger", params={"batch_size": 64})]


def _wait_devices(api, state, until=lambda body: True, timeout=10.0):
    """The devices endpoint's body once its state is ``state`` and ``until(body)`` holds."""
    def ready():
        status, body = api("devices")
        assert status == 200, body
        return body if body["state"] == state and until(body) else None

    return wait_for(ready, timeout, f"the devices endpoint in state {state!r}")


# ----------------------------------------------------------------------------- data
def test_devices_two_fake_gpus_then_shared_and_stopped(api, jp_serverapp):
    with FakeNvml([h100(0), h100(1, power_instant_mw=123_456)]):
        body = _wait_devices(api, "ok")
        assert body["state"] == "ok", body
        assert [d["key"] for d in body["devices"]] == ["gpu0", "gpu1"]
        gpu0, gpu1 = body["devices"]
        assert gpu0["name"] == "NVIDIA H100 80GB HBM3"
        assert gpu0["latest"]["sm_util"] == 62.5 and gpu0["latest"]["gpu_mem_total_bytes"] == 80 * 1024**3
        assert gpu1["latest"]["power_w"] == pytest.approx(123.456)
        assert gpu0["latest"]["provenance"]["sm_util"]
        first = len(gpu0["history"]["t"])
        again = _wait_devices(api, "ok", until=lambda body: len(body["devices"][0]["history"]["t"]) > max(first, 1))
        assert len(again["devices"][0]["history"]["t"]) >= 2  # the history grows between requests
        poller = jp_serverapp.web_app.settings["gpuprof"]["poller"]
        assert poller.running  # one poller, shared: both requests above read the same one
        poller.stop()
        assert not poller.running


def test_devices_no_gpu_is_a_state_not_an_error(api):
    with FakeNvml([], library_present=False):
        body = _wait_devices(api, "no_gpu")
    assert body["state"] == "no_gpu" and body["reason"] == "nvml_unavailable", body
    assert "libnvidia-ml" in body["message"] and body["devices"] == []


def test_experiments_list_with_summary_columns(api, recorded):
    status, body = api("experiments")
    assert status == 200
    assert body["store"] == ".gpuprof"
    names = [r["name"] for r in body["rows"]]
    assert names == ["baseline", "bigger"]
    row = body["rows"][0]
    assert row["status"] == "ok" and row["running"] is False and row["simulated"] is True
    assert row["sm_util_mean"] > 0 and row["batch_size"] == 32
    assert {"sm_util_mean", "mem_bw_util_mean", "power_mean_w", "energy_kwh", "duration_s"} <= set(body["columns"])


def test_a_multi_node_job_is_one_row_with_its_parts_and_its_report_and_export_take_it(api, jp_root_dir):
    from tests import jobparts

    store = Store(jp_root_dir / ".gpuprof")
    jobparts.write_part(store, "ft-0412", host="node-a", node=0, ranks=[0, 1], world=6, parts=3)
    running = jobparts.write_part(store, "ft-0412", host="node-b", node=1, ranks=[2, 3], world=6, parts=3,
                                  status="running")
    running.pid, running.host = os.getpid(), socket.gethostname()  # its writer: alive
    store.save_meta(running)
    status, body = api("experiments")
    assert status == 200 and len(body["rows"]) == 1, body["rows"]
    row = body["rows"][0]
    assert (row["id"], row["status"], row["running"]) == ("ft-0412", "running", True)
    assert row["parts"] == "2/3 (missing: 2) (running: node-b)" and row["running_ids"] == [running.id]
    assert len(row["part_ids"]) == 2 and {"parts", "part_ids", "running_ids"} <= set(body["columns"])
    ts = open(TS_TYPES).read()
    assert all(f"  {key}?:" in ts for key in ("parts", "part_ids", "running_ids"))  # the sidebar reads them
    status, html = api("report", raw=True, params={"ids": "ft-0412"})  # the job, every node's ranks
    assert status == 200 and "node-b" in html
    status, body = api("export", method="POST", body=json.dumps({"id": "ft-0412"}))
    assert status == 200 and (jp_root_dir / "pipeline.yaml").is_file(), body


def test_experiments_of_another_directory(api, jp_root_dir):
    (jp_root_dir / "project").mkdir()
    _record(jp_root_dir / "project", "elsewhere")
    status, body = api("experiments", params={"store": "project/.gpuprof"})
    assert status == 200 and [r["name"] for r in body["rows"]] == ["elsewhere"]
    status, body = api("experiments", params={"store": "nothing-here/.gpuprof"})
    assert status == 200 and body["rows"] == []


def test_one_experiment_summary_and_decimated_series(api, recorded):
    status, body = api(f"experiments/{recorded[1].id}")
    assert status == 200, body
    assert body["name"] == "bigger" and body["running"] is False and body["offset"] is None
    assert body["summary"]["overall"]["sm_util_mean"] > 0
    gpu0 = body["series"]["gpu0"]
    assert set(gpu0) == {"t", "sm_util", "mem_bw_util", "power_w", "gpu_mem_used_bytes"}
    assert len(gpu0["t"]) == len(gpu0["sm_util"]) > 0
    assert "cpu_util" in body["series"]["host"]
    status, body = api("experiments/20990101T000000-nope00")
    assert status == 404 and "no experiment" in body["message"]


def test_running_experiment_followed_by_offset_tail_reads(api, jp_root_dir):
    """The kernel's stream grows; each tail read returns only the rows after its offset."""
    store = Store(jp_root_dir / ".gpuprof")
    meta = ExperimentMeta(id="", name="training", interval_s=0.5,
                          devices=[{"key": "gpu0", "kind": "gpu", "name": "sim"}])
    directory = store.create(meta)  # pid = this process: alive, so it stays "running"
    writer = SampleStreamWriter(directory, samples_schema(["sm_util", "power_w"]))

    def flush(start, n):
        t = [0.5 * i for i in range(start, start + n)]
        writer.write({"t": t, "wall_time": [1.9e9 + x for x in t], "device": ["gpu0"] * n,
                      "sm_util": [float(i % 100) for i in range(start, start + n)], "power_w": [200.0] * n})

    try:
        flush(0, 10)
        status, body = api("experiments")
        assert [r["running"] for r in body["rows"]] == [True]
        status, first = api(f"experiments/{meta.id}")
        assert status == 200 and first["running"] and first["summary"] is None
        assert first["offset"] == os.path.getsize(directory / "samples.arrows")
        assert 4.5 <= first["series"]["gpu0"]["t"][-1] < 5.0  # min/max buckets of the interval's width
        assert max(v for v in first["series"]["gpu0"]["sm_util"] if v is not None) == 9.0
        flush(10, 5)
        status, tail = api(f"experiments/{meta.id}", params={"offset": first["offset"]})
        assert tail["tail"] is True and tail["series"]["gpu0"]["t"] == [5.0, 5.5, 6.0, 6.5, 7.0]
        assert tail["offset"] > first["offset"]
        status, empty = api(f"experiments/{meta.id}", params={"offset": tail["offset"]})
        assert empty["series"] == {} and empty["offset"] == tail["offset"]  # nothing new: nothing read
        with open(directory / "samples.arrows", "ab") as f:
            f.write(b"\xff\xff\xff\xff\x10\x00")  # a flush cut in the middle: left for the next read
        status, torn = api(f"experiments/{meta.id}", params={"offset": tail["offset"]})
        assert torn["series"] == {} and torn["offset"] == tail["offset"]
        status, bad = api(f"experiments/{meta.id}", params={"offset": "-3"})
        assert status == 400 and "offset" in bad["message"]
        status, reloaded = api(f"experiments/{meta.id}")  # a page reload: the server's follower, grown
        assert 7.0 <= reloaded["series"]["gpu0"]["t"][-1] < 7.5 and reloaded["offset"] == tail["offset"]
    finally:
        writer.close()


def test_report_is_the_html_report(api, recorded):
    ids = ",".join(e.id for e in recorded)
    status, html = api("report", raw=True, params={"ids": ids})
    assert status == 200
    assert html.startswith("<!DOCTYPE html>") and "baseline" in html and "bigger" in html
    assert api.headers["Content-Type"].startswith("text/html")  # a page, opened in a browser tab
    assert "default-src 'none'" not in api.headers["Content-Security-Policy"]  # its inline BokehJS runs
    assert "<h2>comparison</h2>" in html
    status, body = api("report", params={"ids": ""})
    assert status == 400 and "ids" in body["message"]


def test_export_writes_pipeline_yaml_under_the_root(api, recorded, jp_root_dir):
    status, body = api("export", method="POST", body=json.dumps({"id": recorded[1].id}))
    assert status == 200, body
    assert body["path"] == "pipeline.yaml" and body["created"] is True
    assert body["message"].startswith("exported 'bigger' to pipeline.yaml") and str(jp_root_dir) not in body["message"]
    text = (jp_root_dir / "pipeline.yaml").read_text()
    assert "batch_size: 64" in text and "bigger" in text


@pytest.mark.parametrize("payload, words", [
    ("{not json", "not JSON"),
    ("[1, 2]", "JSON object"),
    ("{}", "'id'"),
    ('{"id": "x", "force": "yes"}', "'force'"),
    ('{"id": "x", "step": ""}', "'step'"),
])
def test_export_bad_json_is_400_with_a_message(api, payload, words):
    status, body = api("export", method="POST", body=payload)
    assert status == 400 and words in body["message"], body


def test_export_to_a_notebook_or_a_settings_file_is_400_naming_it_and_leaves_it_whole(api, recorded, jp_root_dir):
    import nbformat

    notebook = jp_root_dir / "nb2.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1")]), notebook)
    settings = jp_root_dir / "settings.yaml"
    settings.write_text("theme: dark\n")
    before = {p: p.read_bytes() for p in (notebook, settings)}
    for name in ("nb2.ipynb", "settings.yaml", "settings.json"):
        status, body = api("export", method="POST", body=json.dumps({"id": recorded[1].id, "path": name}))
        assert status == 400 and name in body["message"], body
        assert str(jp_root_dir) not in body["message"]
    assert {p: p.read_bytes() for p in before} == before
    assert not (jp_root_dir / "settings.json").exists()
    nbformat.read(notebook, as_version=4)


def test_any_query_arguments_get_a_clear_answer_and_change_nothing(api, recorded, jp_root_dir):
    """Property (Hypothesis): whatever a client puts in the store, ids, offset, history or the
    experiment id, the answer is 200, 400, 403 or 404 with a message, never a 500, and the
    store lists the same afterwards."""
    from hypothesis import HealthCheck, example, given, settings
    from hypothesis import strategies as st
    from tests.property_budget import examples

    text = st.one_of(st.text(max_size=20), st.sampled_from(
        ["", ".gpuprof", "..", "../x", "/etc", "a/../..", "C:\\x", "%00", "\x00", "-1", "1e9", "nan", " ", ",",
         recorded[0].id, f"{recorded[0].id},{recorded[1].id}", "x" * 300]))
    before = api("experiments")[1]["rows"]

    @settings(max_examples=examples(40), deadline=None, suppress_health_check=list(HealthCheck))
    @given(route=st.sampled_from(["experiments", "experiment", "report", "devices"]), store=st.none() | text,
           value=text, experiment=text)
    @example(route="experiments", store="x" * 300, value="", experiment="")  # over NAME_MAX: was a 500
    def ask(route, store, value, experiment):
        params = {} if store is None else {"store": store}
        if route == "experiment":
            path, params = f"experiments/{_quote(experiment)}", {**params, "offset": value}
        elif route == "report":
            path, params = "report", {**params, "ids": value}
        elif route == "devices":
            path, params = "devices", {"history": value}
        else:
            path = "experiments"
        status, body = api(path, params=params, raw=route == "report")
        assert status in (200, 400, 403, 404), (path, params, status, body)
        if status != 200:
            assert json.loads(body)["message"] if isinstance(body, str) else body["message"]

    ask()
    assert api("experiments")[1]["rows"] == before


def _quote(segment: str) -> str:
    from urllib.parse import quote

    return quote(segment, safe="") or "x"


# ----------------------------------------------------------------------------- refusals
@pytest.mark.parametrize("path, method, body", [
    ("devices", "GET", None), ("experiments", "GET", None), ("experiments/x", "GET", None),
    ("report?ids=x", "GET", None), ("export", "POST", "{}"),
])
def test_no_token_is_403(jp_fetch, jp_asyncio_loop, jp_serverapp, path, method, body):
    url, _, query = path.partition("?")
    params = dict([query.split("=")]) if query else None
    with pytest.raises(HTTPClientError) as info:
        jp_asyncio_loop.run_until_complete(
            jp_fetch("gpuprof", "api", *url.split("/"), method=method, body=body, params=params,
                     headers={"Authorization": ""}))
    assert info.value.code == 403
    jp_serverapp.web_app.settings["gpuprof"]["poller"].stop()


def test_paths_escaping_the_root_are_refused(api, jp_root_dir, tmp_path, recorded):
    outside = tmp_path / "outside"
    outside.mkdir()
    _record(outside, "secret")
    os.symlink(outside / ".gpuprof", jp_root_dir / "link-out")
    for store, code in [("../outside/.gpuprof", 403), (str(outside / ".gpuprof"), 400), ("link-out", 403),
                        ("a/../../outside/.gpuprof", 403)]:
        status, body = api("experiments", params={"store": store})
        assert status == code, (store, body)
        assert "secret" not in json.dumps(body)
    status, body = api("export", method="POST",
                       body=json.dumps({"id": recorded[0].id, "path": "../outside/pipeline.yaml"}))
    assert status == 403 and not (outside / "pipeline.yaml").exists()
    status, body = api("report", params={"ids": recorded[0].id, "store": "/etc"})
    assert status == 400


def test_payload_keys_match_the_typescript_types(api, recorded):
    """labextension/src/types.ts names these keys: the answers must carry every one."""
    ts = open(TS_TYPES).read()
    status, row = api("experiments")
    for key in ("id", "name", "status", "started_at", "duration_s", "devices", "source", "simulated",
                "sm_util_mean", "mem_bw_util_mean", "power_mean_w", "energy_kwh", "running"):
        assert f"  {key}:" in ts and key in row["rows"][0], key
    status, detail = api(f"experiments/{recorded[0].id}")
    for key in ("id", "name", "status", "running", "tail", "offset", "summary", "series"):
        assert f"  {key}:" in ts and key in detail, key
    status, devices = api("devices")
    for key in ("state", "reason", "message", "interval_s", "updated", "devices", "notes"):
        assert f"  {key}:" in ts and key in devices, key


class TestBaseUrl:
    @pytest.fixture
    def jp_base_url(self):
        return "/user/someone/"

    def test_routes_live_under_the_base_url(self, api, recorded, jp_fetch, jp_asyncio_loop):
        status, body = api("experiments")
        assert status == 200 and len(body["rows"]) == 2
        response = jp_asyncio_loop.run_until_complete(jp_fetch("gpuprof", "api", "devices"))
        assert response.effective_url.split("?")[0].endswith("/user/someone/gpuprof/api/devices")


# ----------------------------------------------------------------------------- scale (issue 19)
def test_unchanged_listing_is_a_304_without_a_body(api, recorded, jp_root_dir):
    status, body = api("experiments")
    etag = api.headers["Etag"]
    assert status == 200 and len(body["rows"]) == 2 and etag.startswith('"')
    status, body = api("experiments", raw=True, headers={"If-None-Match": etag})
    assert status == 304 and not body
    _record(jp_root_dir, "third")
    status, body = api("experiments", headers={"If-None-Match": etag})
    assert status == 200 and [r["name"] for r in body["rows"]][-1] == "third" and api.headers["Etag"] != etag



@pytest.mark.parametrize("header", ["*", ' * ', 'W/"{etag}"', '"other", "{etag}"'])
def test_if_none_match_star_or_a_listed_tag_is_a_304(api, recorded, header):
    status, _ = api("experiments")
    etag = api.headers["Etag"]
    status, body = api("experiments", raw=True, headers={"If-None-Match": header.format(etag=etag.strip('"'))})
    assert status == 304 and not body, (header, status)
    status, _ = api("experiments", headers={"If-None-Match": '"other"'})
    assert status == 200

def test_no_answer_names_an_absolute_path(api, recorded, jp_root_dir):
    store = jp_root_dir / ".gpuprof"
    bad = store / "20990101T000000-bad000"
    bad.mkdir()
    (bad / "meta.json").write_text("{broken")
    os.chmod(bad / "meta.json", 0)
    answers = [api("experiments"), api("experiments/20990101T000000-bad000"), api("experiments/20990101T000000-nope00"),
               api("report", params={"ids": "20990101T000000-bad000"}),
               api("export", method="POST", body=json.dumps({"id": recorded[0].id, "path": "sub/dir/../x.yaml"}))]
    (jp_root_dir / "broken.yaml").write_text("workflow: [unclosed")
    answers.append(api("export", method="POST", body=json.dumps({"id": recorded[0].id, "path": "broken.yaml"})))
    assert answers[0][1]["problems"], answers[0]
    assert answers[-1][0] == 400 and "broken.yaml" in answers[-1][1]["message"], answers[-1]  # it named the file
    for root in {str(jp_root_dir), os.path.realpath(jp_root_dir)}:
        for status, body in answers:
            assert root not in json.dumps(body), body


def test_experiment_directory_linking_out_of_the_root_is_refused(api, recorded, jp_root_dir, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    secret = _record(outside, "secret")
    link = jp_root_dir / ".gpuprof" / secret.id
    os.symlink(outside / ".gpuprof" / secret.id, link)
    status, body = api("experiments")
    assert status == 200 and [r["name"] for r in body["rows"]] == ["baseline", "bigger"]
    assert any("is a link" in p for p in body["problems"]) and "secret" not in json.dumps(body["rows"])
    status, body = api(f"experiments/{secret.id}")
    assert status == 404 and "is a link" in body["message"]
    status, body = api("report", raw=True, params={"ids": secret.id})
    assert status == 404


def test_a_crashed_run_is_finished_off_the_poll(api, jp_root_dir, jp_serverapp):
    from test_store_index import _crashed_run

    meta = _crashed_run(Store(jp_root_dir / ".gpuprof"))
    status, body = api("experiments")  # the poll that finds it: answered at once, finishing goes on aside
    assert status == 200 and [(r["status"], r["running"]) for r in body["rows"]] == [("crashed", False)]
    jp_serverapp.web_app.settings["gpuprof"]["finisher"].wait()
    status, body = api("experiments")
    assert body["rows"][0]["sm_util_mean"] == 40.0
    on_disk = json.loads((jp_root_dir / ".gpuprof" / meta.id / "meta.json").read_text())
    assert on_disk["status"] == "crashed" and sum("ended without finishing" in n for n in on_disk["notes"]) == 1
