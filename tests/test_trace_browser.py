"""The report's traced-window section and comparison, seen in headless Chromium (offline)."""

from __future__ import annotations

from pathlib import Path

import pytest

import gpuprof_jupyter as gp

EVIL = "<img src=x onerror=alert(1)>"


def _traced(store_dir, name, width):
    import torch
    from torch.profiler import record_function

    model, x = torch.nn.Linear(width, width), torch.randn(64, width)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with gp.profile(name=name, source="sim", store=store_dir, interval=0.02, trace="steps=2:4"):
        for i in range(6):
            with record_function(EVIL if i == 2 else f"iteration {i}"):
                loss = model(x).sum()
                opt.zero_grad()
                loss.backward()
                opt.step()
            gp.step(64)


@pytest.mark.browser
def test_report_shows_the_traced_window(store_dir, tmp_path, offline_page, artifacts_dir):
    _traced(store_dir, "narrow", 64)
    _traced(store_dir, "wide", 512)
    path = gp.report(path=tmp_path / "report.html", store=store_dir)
    assert EVIL not in path.read_text()
    dialogs = []
    offline_page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    offline_page.goto(path.as_uri())
    section = offline_page.locator(".gpuprof-trace").first
    section.scroll_into_view_if_needed()
    assert section.is_visible()
    text = section.inner_text()
    assert "traced window" in text and "steps=2:4: complete, 2 step(s)" in text
    assert "CPU activities only" in text and "self CPU time" in text and "aten::" in text
    rows = section.locator("table tbody tr")
    assert rows.count() >= 3
    link = offline_page.locator(".gpuprof-trace-link a[download]").first
    href = link.get_attribute("href")
    assert href.endswith(".trace.json") and (Path(path).parent / href).is_file()
    compare = offline_page.locator(".gpuprof-trace-compare")
    assert compare.is_visible() and "traced window slowdown" in compare.inner_text()
    assert EVIL in offline_page.inner_text("body")  # a record_function label, shown as text (a phase)
    assert dialogs == []
    offline_page.evaluate("() => document.querySelector('.gpuprof-trace-compare').scrollIntoView()")
    offline_page.screenshot(path=str(artifacts_dir / "report_trace_compare.png"))
    section.scroll_into_view_if_needed()
    offline_page.evaluate("() => { const s = document.querySelectorAll('.gpuprof-experiment')[0]; "
                          "s.querySelector('.gpuprof-trace').scrollIntoView(); }")
    offline_page.screenshot(path=str(artifacts_dir / "report_trace.png"))
