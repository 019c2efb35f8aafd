"""The live dashboard: a SessionObserver that streams plots into the page while a cell runs.

Runs in the kernel.

The plots are jupyter_bokeh's widget filled from a document built once per plot structure
(``notebook/live/document.py``); the kernel keeps no Bokeh document and builds no change to it: the
sampler process prepares every change (``sampler_process/live_view.py``: one stream a second on
one wide source, the decimated history at most once a minute, the bands) as PATCH-DOC texts.
No thread of its own: the link's thread, woken once a second by each ``LiveUpdate``, forwards
its texts to the page and rewrites the header on that same wake-up (``live``: the latest values
the process sent, the steps only the kernel sees): one kernel thread's wake-up (one GIL
acquisition) an update, and nothing of the view's on a timer (benchmarks/README.md, "The live
view's cost, unpinned"). When the session ends, the widget gives way, through its display
handles, to the static ending (``notebook/static_ending.py``: PNG, then plots + summary) and is
closed.
"""

from __future__ import annotations

import threading
import time

from gpuprof_jupyter.core.plots.columns import RECENT_ROWS
from gpuprof_jupyter.core.plots.spec import plot_spec
from gpuprof_jupyter.render.live_header import header_fixed_html, live_header_html

HEADER_MIN_GAP_S = 0.5  # the header's text: on each update's wake-up (once a second), never closer than this


def _live_widget_class():
    """jupyter_bokeh's widget (same model and view in the page), fed from the kernel without a
    Bokeh document: its state is ``live_document``'s JSON text, its changes hand-made
    PATCH-DOC messages; what the page sends back (pan, zoom) stays in the page."""
    from importlib.metadata import version

    from ipywidgets import DOMWidget
    from traitlets import Bool, Unicode

    module, module_version = "@bokeh/jupyter_bokeh", "^" + version("jupyter_bokeh")

    class LiveBokehWidget(DOMWidget):
        _model_name = Unicode("BokehModel").tag(sync=True)
        _model_module = Unicode(module).tag(sync=True)
        _model_module_version = Unicode(module_version).tag(sync=True)
        _view_name = Unicode("BokehView").tag(sync=True)
        _view_module = Unicode(module).tag(sync=True)
        _view_module_version = Unicode(module_version).tag(sync=True)
        # The page sends back every change BokehJS makes itself: the shared time axis's start and
        # end after each stream, a y axis's when its data moves (two to ten messages a second,
        # each a wake-up of the kernel's shell thread while the cell runs). With this, BokehJS
        # sends one and holds the rest, merged per property, until the kernel is idle: nothing
        # in the kernel reads them (benchmarks/README.md, "The live view with its page open").
        combine_events = Bool(True).tag(sync=True)
        render_bundle = Unicode("").tag(sync=True)

        def __repr__(self) -> str:
            return "<gpuprof live plots>"

        def send_patch(self, message: tuple[str, str]) -> None:
            header, content = message  # jupyter_bokeh's framing: header, metadata, content
            self.send({"msg": "patch", "payload": header})
            self.send({"msg": "patch", "payload": "{}"})
            self.send({"msg": "patch", "payload": content})

    return LiveBokehWidget


class LiveDashboard:
    """SessionObserver: header + plots while the cell runs, static ending after."""

    live_plots = True  # the session's sampler process keeps the rows until the plots are named

    def __init__(self, ending, history_refresh_s: float = 60.0) -> None:
        self.ending = ending  # shows the static ending in place of the dashboard (static_plots.show_static_ending)
        self.history_refresh_s = history_refresh_s
        self.session = None
        self.spec = None  # core.plots.spec.PlotSpec of the plots
        self.latest: dict[str, dict] = {}  # device -> its newest values (the sampler process's)
        self.gaps: list[tuple[float, float]] = []  # recorded gaps so far (s since the start)
        self.document = None  # notebook.live.document.LiveDocument: the page's plots, as sent
        self.widget = None
        self.header = None
        self.box = None
        self.handle = None
        self.handle_below = None
        self.doc_updates = 0
        self.paused = False  # pause(): the benchmark's switch (benchmarks/_live_blocks.py)
        self._lock = threading.Lock()  # live() (the link's thread) against finished() (the cell's)
        self._live = False  # between started() and finished()
        self._next_header = 0.0
        self._header_fixed = None
        self._failed: str | None = None

    # -- SessionObserver ----------------------------------------------------------------------
    def started(self, session) -> None:
        self.session = session
        try:
            self._build(session)
        except Exception as exc:  # noqa: BLE001 - the dashboard must never break the user's cell
            self._failed = f"{type(exc).__name__}: {exc}"
            return
        self._live = True

    def live(self, update) -> None:
        """The link's thread, once a second: the update's texts to the page and the header, on
        the wake-up the update brought (never a thread of the view's own to wake)."""
        with self._lock:
            for device, values in update.latest.items():
                self.latest[device] = values
            self.gaps.extend((gap[0], gap[1]) for gap in update.gaps)
            if not self._live or self.paused:
                return
            try:
                self._forward(update.patches)
                now = time.monotonic()
                if now >= self._next_header:
                    self._next_header = now + HEADER_MIN_GAP_S
                    html = self._header_html(now - self.session.t0)
                    if html != self.header.value:  # one comm message, only when the text changed
                        self.header.value = html
            except Exception as exc:  # noqa: BLE001 - keep the cell running; say so in the header
                self._failed = f"{type(exc).__name__}: {exc}"

    def pause(self) -> None:
        """Stop sending anything to the page (the updates' texts are dropped: the page misses
        those rows) until ``resume``. A benchmark's switch: the same run with and without the
        view's work in the kernel, in alternating blocks of steps (benchmarks/_live_blocks.py)."""
        self.paused = True

    def resume(self) -> None:
        self.paused = False

    def finished(self, experiment) -> None:
        with self._lock:  # an update being forwarded ends first; none after
            self._live = False
        self.ending(experiment, (self.handle, self.handle_below))
        self._close()

    def _close(self) -> None:
        """Close the widgets once the static ending has replaced them. Their last state is made
        small first: nbclient/nbconvert keep every widget state they saw (closed or not) in the
        saved notebook's ``metadata.widgets``, and the plots' document is ~40 KB a cell."""
        if self.widget is not None and self.document is not None:
            self.widget.render_bundle = self.document.blank
        if self.header is not None:
            self.header.value = ""
        for w in (self.box, self.widget, self.header):
            if w is not None:
                try:
                    w.close()
                except Exception:  # noqa: BLE001 - a widget already gone closes as closed
                    pass
        self.box = self.widget = self.header = self.document = None

    # -- building -------------------------------------------------------------------------------
    def _build(self, session) -> None:
        import ipywidgets
        from IPython.display import display

        from gpuprof_jupyter.notebook.live.document import live_document

        self.spec = spec = plot_spec(session.meta)
        self.document = live_document(spec)
        self.widget = _live_widget_class()(render_bundle=self.document.bundle)
        self.header = ipywidgets.HTML(value=self._header_html(0.0))
        self.box = ipywidgets.VBox([self.header, self.widget])
        self.handle = display(self.box, display_id=True)
        # the static ending is two adjacent outputs (PNG, then plots + summary): hold the second
        # place now, before the cell's own output
        self.handle_below = display({"text/plain": ""}, raw=True, display_id=True)
        session.show_live_plots(self.document.sources, spec, RECENT_ROWS, self.history_refresh_s)

    # -- forwarding -------------------------------------------------------------------------------
    def _forward(self, patches: list) -> None:
        """The sampler process's PATCH-DOC texts, to the page as they are."""
        for patch in patches:
            self.widget.send_patch(patch)
            self.doc_updates += 1

    def _header_html(self, elapsed_s: float) -> str:
        """The header's HTML (``render/live_header.py``) from what this view and the session hold now."""
        session = self.session
        meta = session.meta
        if self._header_fixed is None or self._header_fixed[0] is not meta:  # what does not change: once
            self._header_fixed = (meta, header_fixed_html(meta))
        activity = session.activity
        children = getattr(session, "children", None)
        steps = activity.steps if activity is not None else []
        if not steps and children is not None:  # the run's child processes train (a spawned rank...)
            primary = children.primary()
            steps = primary.activity.steps if primary is not None else []
        return live_header_html(self._header_fixed[1], elapsed_s, self.spec, self.latest,
                                steps, activity.requests.records if activity is not None else None, children,
                                list(self.gaps), getattr(session, "alerts_fired", None), self._failed)
