"""The live view's work in the kernel happens on the link's wake-up: no thread of its own, one
wake-up (one GIL acquisition) per update, nothing on a timer; and its benchmark switch."""

from __future__ import annotations

import threading
from types import SimpleNamespace

from gpuprof_jupyter.core.protocol import LiveUpdate
from gpuprof_jupyter.notebook.live.dashboard import LiveDashboard


class Page:
    """Stands for the widget and the header: records what is sent and on which thread."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, tuple]] = []
        self.value = ""

    def send_patch(self, patch) -> None:
        self.sent.append((threading.current_thread().name, patch))


def _dashboard(monkeypatch) -> LiveDashboard:
    def build(self, session):
        self.widget, self.header = Page(), Page()

    monkeypatch.setattr(LiveDashboard, "_build", build)
    dash = LiveDashboard(ending=lambda experiment, handles: None)
    dash._header_html = lambda elapsed_s: f"elapsed {elapsed_s:.0f}"
    return dash


def _from_the_link(dash: LiveDashboard, update: LiveUpdate) -> None:
    thread = threading.Thread(target=dash.live, args=(update,), name="gpuprof-link")
    thread.start()
    thread.join()


def test_an_update_is_forwarded_on_the_links_wake_up_and_the_view_starts_no_thread(monkeypatch):
    dash = _dashboard(monkeypatch)
    before = set(threading.enumerate())
    dash.started(SimpleNamespace(t0=0.0))
    assert set(threading.enumerate()) == before  # nothing of the view's own wakes on a timer
    patches = [("h1", "c1"), ("h2", "c2")]
    _from_the_link(dash, LiveUpdate(patches=patches, latest={"gpu0": {"sm_util": 50.0}}))
    assert dash.widget.sent == [("gpuprof-link", p) for p in patches]
    assert dash.header.value.startswith("elapsed") and dash.latest == {"gpu0": {"sm_util": 50.0}}
    assert dash.doc_updates == 2


def test_a_paused_view_sends_nothing_until_resumed_and_nothing_after_the_cell(monkeypatch):
    dash = _dashboard(monkeypatch)
    dash.started(SimpleNamespace(t0=0.0))
    dash.pause()
    _from_the_link(dash, LiveUpdate(patches=[("h", "c")], latest={"gpu0": {"sm_util": 1.0}}, gaps=[(1.0, 2.0)]))
    assert dash.widget.sent == [] and dash.header.value == ""
    assert dash.latest == {"gpu0": {"sm_util": 1.0}} and dash.gaps == [(1.0, 2.0)]  # the header's facts still kept
    dash.resume()
    _from_the_link(dash, LiveUpdate(patches=[("h2", "c2")]))
    assert dash.widget.sent == [("gpuprof-link", ("h2", "c2"))]
    widget = dash.widget
    dash.finished(None)
    dash.live(LiveUpdate(patches=[("h3", "c3")]))
    assert widget.sent == [("gpuprof-link", ("h2", "c2"))]
