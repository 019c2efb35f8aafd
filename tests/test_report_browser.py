"""The HTML report opens offline in headless Chromium with its plots; names stay text."""

from __future__ import annotations

import re
import time

import pytest

import gpuprof_jupyter as gp

EVIL = "<script>alert(1)</script>"


@pytest.fixture
def story_store(store_dir):
    runs = [("baseline", "input-bound", {"batch_size": 32, "amp": False}, 0.921, 1.0),
            ("b64-amp", "amp", {"batch_size": 64, "amp": True}, 0.923, 0.25),
            (EVIL, "amp", {"batch_size": 64, "amp": True, "num_workers": EVIL}, 0.924, 0.25)]
    for name, scenario, params, accuracy, seconds in runs:
        with gp.profile(name=name, source=f"sim:{scenario}", store=store_dir, interval=0.02, params=params,
                        checks=["sm_util > 60 for >=80%", "accuracy >= 0.92"]):
            with gp.phase("train"):
                time.sleep(seconds)
            gp.log(accuracy=accuracy, note=EVIL)
    return store_dir


@pytest.mark.browser
def test_report_offline_with_plots(story_store, tmp_path, offline_page, artifacts_dir):
    path = gp.report(path=tmp_path / "report.html", store=story_store, prices={"kwh": 0.2})
    html = path.read_text()
    assert EVIL not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    remote = re.findall(r"<(?:script|link)\b[^>]*\b(?:src|href)\s*=\s*[\"']?(?:https?:)?//[^\s\"'>]*", html, re.I)
    assert remote == [], remote  # BokehJS is inline: no script or stylesheet from a CDN
    dialogs, failed = [], []
    offline_page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    offline_page.on("requestfailed", lambda r: failed.append(r.url))
    offline_page.goto(path.as_uri())
    offline_page.wait_for_function(
        "() => window.Bokeh && Bokeh.documents.length > 0 && Bokeh.index && Object.keys(Bokeh.index).length >= 4",
        timeout=30_000)
    # plots drawn: canvases inside Bokeh's shadow roots
    canvases = offline_page.evaluate("""() => {
        let n = 0; const walk = (root) => { root.querySelectorAll('*').forEach(el => {
            if (el.tagName === 'CANVAS' && el.width > 50) n++; if (el.shadowRoot) walk(el.shadowRoot); }); };
        walk(document); return n; }""")
    assert canvases >= 4
    text = offline_page.inner_text("body")
    assert EVIL in text  # shown as text, in the comparison and its own section
    assert "Input-bound" in text or "GPU underused" in text
    assert "PASS" in text and "FAIL" in text and "accuracy" in text and "train" in text
    assert "not a fair comparison" in text
    assert dialogs == [] and failed == []
    offline_page.wait_for_timeout(500)
    offline_page.screenshot(path=str(artifacts_dir / "report.png"), full_page=False)


@pytest.mark.browser
@pytest.mark.process
def test_report_shows_where_memory_went_and_a_serving_runs_latency(store_dir, tmp_path, offline_page, artifacts_dir):
    """This round's new sections as a reader sees them offline: the memory bars of two runs on one
    scale, a serving run's latency percentiles, and a gate it cannot judge (never PASS)."""
    import pyarrow as pa

    from gpuprof_jupyter.core.analysis.summary import summary_of
    from tests.memexp import memory_run

    store = gp.Store(store_dir)
    for batch in (16, 64):
        run = memory_run(batch, name=f"mem-b{batch}")
        summary_of(run)
        store.create(run.meta)
        store.save_steps(run.meta, pa.Table.from_pandas(run.steps, preserve_index=False))
        store.save_meta(run.meta)
    with gp.profile(name="serve", source="sim", store=store_dir, interval=0.02,
                    checks=["latency_p99 < 50 ms", "sm_util > 60 for >=80% per step"]):
        for i in range(60):
            with gp.request(batch_size=4):
                time.sleep(0.004 if i % 10 else 0.012)
    path = gp.report("mem-b16", "mem-b64", "serve", path=tmp_path / "report.html", store=store_dir)
    offline_page.goto(path.as_uri())
    offline_page.wait_for_function("() => window.Bokeh && Bokeh.documents.length > 0", timeout=30_000)
    bars = offline_page.locator(".gpuprof-memory .gpuprof-mem-bar")
    assert bars.count() >= 2
    widths = offline_page.evaluate("""() => [...document.querySelectorAll('.gpuprof-mem-activations')]
                                      .map(e => e.getBoundingClientRect().width)""")
    assert len(widths) >= 2 and widths[1] > widths[0] > 0, widths  # batch 64 holds more activations, one scale
    text = offline_page.inner_text("body")
    assert "where the memory went" in text and "latency p50 / p90 / p95 / p99 / max" in text
    assert re.search(r"PASS\s+latency_p99 < 50 ms", text), text[-3000:]  # a table row: verdict, rule
    assert re.search(r"CANNOT JUDGE \(simulated\)\s+sm_util > 60", text) and not re.search(r"PASS\s+sm_util", text)
    offline_page.locator(".gpuprof-memory").first.scroll_into_view_if_needed()
    offline_page.screenshot(path=str(artifacts_dir / "report_memory_serving.png"), full_page=False)
