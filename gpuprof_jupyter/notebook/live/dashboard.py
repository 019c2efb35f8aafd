"""The live dashboard: a SessionObserver that streams plots into the page while a cell runs.

Runs in the kernel.

The plots are jupyter_bokeh's widget filled from a document built once per plot structure
(``views.live.document``); the kernel keeps no Bokeh document and builds no change to it: the
sampler process prepares every change (``sampler_process/live_view.py``: one stream a second on
one wide source, the decimated history at most once a minute, the bands) as PATCH-DOC texts.
Threads: the link's thread only hands each ``LiveUpdate`` over (``live``); one UI thread
(``gpuprof-ui``) wakes for each update (once a second), forwards its texts to the page and
rewrites the header on the same wake-up (the latest values the process sent, the steps only the
kernel sees); with no update it still wakes every ``HEADER_IDLE_S`` for the elapsed time. When the
session ends the thread stops, the widget gives way, through its display handles, to the
static ending (``notebook/static_ending.py``: PNG, then plots + summary) and is
closed.
"""

from __future__ import annotations

import threading
import time
from collections import deque

from gpuprof_jupyter.core.metrics import describe_provenance
from gpuprof_jupyter.core.figure import measured
from gpuprof_jupyter.core.format import fmt_figure, fmt_gap
from gpuprof_jupyter.render.alerts_html import alert_header_html
from gpuprof_jupyter.render.html import coloured, html, join, simulated_badge
from gpuprof_jupyter.core.plots.columns import RECENT_ROWS
from gpuprof_jupyter.core.plots.spec import plot_spec
from gpuprof_jupyter.notebook.live.header import current_values_text, rank_step_times, request_text, step_facts, steps_text

HEADER_MIN_GAP_S = 0.5  # the header's text: on each update's wake-up (once a second), never closer than this
HEADER_IDLE_S = 2.0  # no update came (the process is slow or gone): the header's elapsed time still moves


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
        combine_events = Bool(False).tag(sync=True)
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
        self._patches: deque = deque()  # PATCH-DOC texts to forward (the link's thread appends)
        self._woken = threading.Event()
        self.document = None  # views.live.document.LiveDocument: the page's plots, as sent
        self.widget = None
        self.header = None
        self.box = None
        self.handle = None
        self.handle_below = None
        self.doc_updates = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
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
        self._thread = threading.Thread(target=self._run, name="gpuprof-ui", daemon=True)
        self._thread.start()

    def live(self, update) -> None:
        """The link's thread: hand over only."""
        for device, values in update.latest.items():
            self.latest[device] = values
        self.gaps.extend((gap[0], gap[1]) for gap in update.gaps)
        self._patches.extend(update.patches)
        self._woken.set()  # one wake-up an update: its texts and the header together

    def finished(self, experiment) -> None:
        self._stop.set()
        self._woken.set()
        if self._thread is not None:
            self._thread.join(5.0)
            self._thread = None
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

    # -- UI thread ------------------------------------------------------------------------------
    def _run(self) -> None:
        from gpuprof_jupyter.runtime.session import current_session

        next_header = 0.0
        session = self.session
        while not self._stop.is_set():
            self._woken.wait(HEADER_IDLE_S)
            self._woken.clear()
            now = time.monotonic()
            try:
                self._forward()
                if now >= next_header:
                    next_header = now + HEADER_MIN_GAP_S
                    html = self._header_html(now - session.t0)
                    if html != self.header.value:  # one comm message, only when the text changed
                        self.header.value = html
            except Exception as exc:  # noqa: BLE001 - keep the cell running; say so in the header
                self._failed = f"{type(exc).__name__}: {exc}"
            if current_session() is not session and not self._stop.wait(5.0):
                break  # the session ended without telling us: do not outlive it

    def _forward(self) -> None:
        """The sampler process's PATCH-DOC texts, to the page as they are."""
        patches = self._patches
        for _ in range(len(patches)):  # the link's thread only appends
            self.widget.send_patch(patches.popleft())
            self.doc_updates += 1

    def _header_html(self, elapsed_s: float) -> str:
        session = self.session
        meta = session.meta
        if self._header_fixed is None or self._header_fixed[0] is not meta:  # what does not change: once
            sim = meta.simulated
            tags = sorted({t for d in meta.gpu_devices for m, t in meta.provenance.get(d["key"], {}).items()
                           if m == "sm_util"})
            prov = "; ".join(describe_provenance(t) for t in tags) or "not measured"
            self._header_fixed = (meta, (
                html("{}<b>gpuprof</b> <b>{}</b> · {}", html("{} ", simulated_badge()) if sim else "", meta.name,
                     device_names(meta.gpu_devices)),
                html("source: {}{} · sm_util is {} · elapsed ", meta.source, " (simulated)" if sim else "", prov)))
        first, second = self._header_fixed[1]
        parts = [first, second + fmt_figure(measured(elapsed_s, "s", "the run's clock"))]
        if self.latest and self.spec is not None:
            parts.append(" | ".join(current_values_text(self.spec, self.latest)))
        activity = session.activity
        children = getattr(session, "children", None)
        steps = activity.steps if activity is not None else []
        if not steps and children is not None:  # the run's child processes train (a spawned rank...)
            primary = children.primary()
            steps = primary.activity.steps if primary is not None else []
        facts = step_facts(steps, elapsed_s) if steps else None
        if facts:
            parts.append(steps_text(facts))
        serving = request_text(activity.requests.records, elapsed_s) if activity is not None else ""
        if serving:
            parts.append(serving)
        ranks = rank_step_times(children, elapsed_s) if children is not None else ""
        if ranks:
            parts.append(ranks)
        gaps = list(self.gaps)
        if gaps:
            total = sum(e - s for s, e in gaps)
            last = gaps[-1]
            total = fmt_figure(measured(total, "s", "the sampler's recorded gaps"))
            parts.append(coloured(f"{fmt_gap(last[0], last[1])} ({len(gaps)} gap(s), {total}, not interpolated)",
                                  "gap"))
        fired = getattr(session, "alerts_fired", None)
        if fired:
            parts.append(alert_header_html(fired))
        if self._failed:
            parts.append(coloured(f"dashboard: {self._failed}", "bad"))
        return str(html("<div class='gpuprof-live-header' style='font-family:sans-serif;font-size:12px;line-height:1.4'>"
                        "{}</div>", join(parts, "<br>")))


def device_names(gpus: list[dict]) -> str:
    """'gpu0: A100' or, for many alike, '8 x A100 (gpu0-gpu7)'."""
    if not gpus:
        return "no GPU"
    names: dict[str, list[str]] = {}
    for d in gpus:
        names.setdefault(d["name"], []).append(d["key"])
    parts = []
    for name, keys in names.items():
        parts.append(f"{keys[0]}: {name}" if len(keys) == 1 else f"{len(keys)} x {name} ({keys[0]}-{keys[-1]})")
    return ", ".join(parts)
