"""The session record in a real kernel (one kernel for the module): every cell accounted after %load_ext alone."""

from __future__ import annotations

import json

import pytest

from tests.kernel_helpers import execute, running_kernel, text_of

pytestmark = pytest.mark.kernel

GIB = 1 << 30
SETUP = f"""\
import os, json
from tests.fake_nvml import sampler_process_env
os.environ.update(sampler_process_env({{"gpus": [{{"kind": "a100", "processes": [[os.getpid(), {5 * GIB}]], "util_gpu": 0}},
                                                 {{"kind": "a100", "util_gpu": 80}}]}}))
"""


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("session")
    env = {"GPUPROF_STORE": str(tmp_path / "store"), "GPUPROF_SESSION_INTERVAL": "0.5s",
           "GPUPROF_SESSION_KEEP_AFTER": "2s"}
    with running_kernel(tmp_path, env) as (km, kc):
        reply, _ = execute(kc, SETUP)
        assert reply["status"] == "ok"
        reply, messages = execute(kc, "%load_ext gpuprof_jupyter\nimport gpuprof_jupyter")
        assert reply["status"] == "ok", text_of(messages)
        yield kc, tmp_path


def _session(kc, wait_for: str = "True") -> list[dict]:
    """The rows of gpuprof_jupyter.session(), once ``wait_for`` (an expression of ``rows``) holds."""
    code = f"""\
import time as _t, json as _j
_deadline = _t.monotonic() + 60
while True:
    _df = gpuprof_jupyter.session()
    rows = _j.loads(_df.to_json(orient="records", date_format="iso"))
    if ({wait_for}) or _t.monotonic() > _deadline:
        break
    _t.sleep(0.3)
print("ROWS" + _j.dumps(rows) + "ATTRS" + _j.dumps(_df.attrs, default=str))
"""
    reply, messages = execute(kc, code)
    assert reply["status"] == "ok", text_of(messages)
    text = text_of(messages)
    rows_text, attrs_text = text.split("ROWS", 1)[1].split("ATTRS", 1)
    return json.loads(rows_text), json.loads(attrs_text.strip())


def test_every_cell_is_accounted_and_a_forgotten_long_cell_is_kept(kernel):
    kc, tmp_path = kernel
    reply, messages = execute(kc, "import threading\nprint(sorted(t.name for t in threading.enumerate() "
                                  "if t.name.startswith('gpuprof')))")
    assert text_of(messages).strip() == "['gpuprof-link']"  # no thread or hook of the record in the kernel
    assert execute(kc, "import time\ntime.sleep(3)  # forgot the magic")[0]["status"] == "ok"
    reply, _ = execute(kc, "%%gpuprofile --source sim -n profiled --quiet\nx = sum(range(1000))")
    assert reply["status"] == "ok"
    assert execute(kc, "raise ValueError('oops')")[0]["status"] == "error"
    rows, attrs = _session(kc, "any(r['kind'] == 'cell' and (r['source'] or '').startswith('import time') and r['experiment'] "
                               "for r in rows) and any(r['source'] == \"raise ValueError('oops')\" and "
                               "r['memory_held_bytes'] is not None for r in rows if r['kind'] == 'cell')")
    cells = {r["source"]: r for r in rows if r["kind"] == "cell"}
    slept = cells["import time"]
    assert slept["duration_s"] >= 3.0 and slept["status"] == "ok"
    assert slept["gpu_busy_s"] > 0 and slept["memory_held_bytes"] == 5 * GIB
    assert slept["experiment"]  # kept from the session record
    profiled = cells["%%gpuprofile --source sim -n profiled --quiet"]
    assert profiled["experiment"] and profiled["experiment"] != slept["experiment"]
    assert cells["raise ValueError('oops')"]["status"] == "error"
    assert [r["cell"] for r in rows if r["kind"] == "cell"] == sorted(r["cell"] for r in rows if r["kind"] == "cell")
    idle = [r for r in rows if r["kind"] == "idle"]
    assert idle and all(r["idle_s"] is not None for r in idle)
    assert all(r["provenance"] == "session record, every 0.5 s" for r in rows)
    assert "utilization.gpu" in attrs["provenance"]["gpu_busy_s"]

    import gpuprof_jupyter as gp

    kept = gp.load(slept["experiment"], store=tmp_path / "store")
    assert kept.meta.source == "session-record" and kept.meta.context["from_session_record"]
    assert f"cell-{slept['cell']}" in gp.experiments(tmp_path / "store")["name"].tolist()  # listed like any other


def test_the_timeline_and_the_settings_through_the_magic(kernel):
    kc, _ = kernel
    reply, messages = execute(kc, "%gpuprofile session")
    assert reply["status"] == "ok"
    html = "".join(m["content"]["data"].get("text/html", "") for m in messages if m["msg_type"] == "display_data")
    assert "Session record (on, every 0.5 s)" in text_of(messages)
    assert "gpuprof-static-plot" in html and "%gpuprofile show" in html  # the Bokeh timeline; profiled cells linked
    reply, messages = execute(kc, "%gpuprofile session --keep-after 10s")
    assert "longer than 10 s" in text_of(messages)
    reply, messages = execute(kc, "%gpuprofile session --keep-after soon")
    assert reply["status"] == "error" and "--keep-after takes a duration" in text_of(messages)
    reply, messages = execute(kc, "%gpuprofile session off")
    assert "session record off (it cost" in text_of(messages)
    rows, attrs = _session(kc, "True")
    assert attrs["on"] is False
    before = len(rows)
    execute(kc, "y = 2")
    rows, _ = _session(kc, "True")
    assert len(rows) == before  # off: no more marks
