"""The live dashboard: a SessionObserver that streams plots into a BokehModel while a cell runs.

Runs in the kernel.

Threads: the sampler thread only appends ticks (``tick``); one UI thread (``gpuprof-ui``)
owns every change to the Bokeh document: it drains the ticks 2.5 times a second
into ONE stream event on one wide source (sent as one hand-made PATCH-DOC, ``stream_patch_json``), replaces the decimated history at most once a
minute, and updates the header at most once a second. Browser events (pan, zoom) that
jupyter_bokeh applies to the same document take the same lock (docs/facts.md, "One thread per
Bokeh document" and "Messages to a busy kernel"). When the
session ends the thread stops and the widget gives way, through its display handles, to the
static ending (``views.static_plots.show_static_ending``: PNG, then plots + summary).
"""

from __future__ import annotations

import json
import threading
import time
from html import escape

from gpuprof_jupyter.core.metrics import describe_provenance
from gpuprof_jupyter.core.format import fmt_frac, fmt_gap, fmt_seconds
from gpuprof_jupyter.kernel.views.alerts_html import alert_header_html
from gpuprof_jupyter.kernel.views.live.model import (DashboardModel, band_data, current_values_text, plot_spec,
                                                     rank_step_times, step_facts)

UPDATE_PERIOD_S = 1.0  # one stream update a second (+ header, bands, history). Each update is 3 comm
# messages (jupyter_bokeh's PATCH-DOC framing) and ~4 ms of the kernel's CPU, the UI thread's main
# cost: at 2.5 a second the kernel's profiler threads used 1 % of a core, above issue 9's 0.5 %.
# The data keep their resolution (every row of the sampling interval, up to 20 a second).
HEADER_PERIOD_S = 1.0
BANDS_PERIOD_S = 2.0


def _locked_model_class():
    from jupyter_bokeh import BokehModel

    class LockedBokehModel(BokehModel):
        """A BokehModel whose browser-originated changes take the dashboard's document lock,
        and which counts what it sends (document patches, comm messages, bytes)."""

        _gpuprof_lock: threading.RLock | None = None
        _gpuprof_closed = False

        def __repr__(self) -> str:
            return "<gpuprof LockedBokehModel>"

        def close(self) -> None:
            if self._gpuprof_closed:
                return
            self._gpuprof_closed = True
            try:
                super().close()
            except KeyError:  # document callback already removed
                pass

        def _document_patched(self, event) -> None:
            """Streams go out as one hand-made PATCH-DOC (same JSON as Bokeh's); other changes
            take Bokeh's path. Bokeh's ``Protocol().create`` builds a serializer holding a
            reference to every model of the document (~1,000 at 8 GPUs) and walks each float
            in Python: 5-10 ms per update, the UI thread's largest cost."""
            if getattr(event, "setter", None) is self:
                return
            payload = stream_patch_json(event)
            if payload is None:
                return super()._document_patched(event)
            header, content = payload
            self.send({"msg": "patch", "payload": header})
            self.send({"msg": "patch", "payload": "{}"})
            self.send({"msg": "patch", "payload": content})

        def _sync_model(self, model, content, buffers):
            lock = self._gpuprof_lock
            if lock is None:
                return super()._sync_model(model, content, buffers)
            with lock:
                return super()._sync_model(model, content, buffers)

    return LockedBokehModel


_JSON_NUMBERS = (("-Infinity", '{"type":"number","value":"-inf"}'), ("Infinity", '{"type":"number","value":"+inf"}'),
                 ("NaN", '{"type":"number","value":"nan"}'))


def stream_patch_json(event) -> tuple[str, str] | None:
    """(header, content) JSON of the PATCH-DOC message Bokeh would send for a stream of plain
    number lists (NaN as Bokeh's ``{"type":"number","value":"nan"}``); None for anything else."""
    from bokeh.document.events import ColumnsStreamedEvent

    if type(event) is not ColumnsStreamedEvent or not isinstance(event.data, dict):
        return None
    data = event.data
    if not all(isinstance(k, str) and isinstance(v, list) for k, v in data.items()):
        return None
    if any(word in k for k in data for word, _ in _JSON_NUMBERS):
        return None
    try:
        entries = json.dumps(list(data.items()), separators=(",", ":"), allow_nan=True)
    except (TypeError, ValueError):
        return None
    if entries.count('"') != 2 * len(data):
        return None  # a string among the values: not plain numbers
    for word, rep in _JSON_NUMBERS:
        if word in entries:
            entries = entries.replace(word, rep)
    rollover = "null" if event.rollover is None else str(int(event.rollover))
    content = ('{"events":[{"kind":"ColumnsStreamed","model":{"id":%s},"attr":%s,'
               '"data":{"type":"map","entries":%s},"rollover":%s}]}'
               % (json.dumps(event.model.id), json.dumps(event.attr), entries, rollover))
    from bokeh.util.serialization import make_id

    return json.dumps({"msgid": make_id(), "msgtype": "PATCH-DOC", "num_buffers": 0}), content


def stream_lists(source, data: dict[str, list], rollover: int) -> None:
    """``source.stream(data, rollover)`` without re-validating the whole source afterwards.

    Bokeh's ``stream`` re-validates every column of the source (1,500 rows x up to 57
    columns) after each append: half of the UI thread's time at 8 GPUs. Here the Python-side
    lists are extended and trimmed in place, as Bokeh does, and the same ColumnsStreamed
    event goes to the document's subscribers (the widget). Anything unusual: Bokeh's path.
    """
    from bokeh.document.events import ColumnsStreamedEvent

    doc = source.document
    current = source.data
    if doc is None or set(data) != set(current) or not all(isinstance(current[k], list) for k in data):
        source.stream(data, rollover=rollover)
        return
    for k, values in data.items():
        column = current[k]
        column.extend(values)
        if len(column) > rollover:
            del column[:-rollover]
    doc.callbacks.trigger_on_change(ColumnsStreamedEvent(doc, source, "data", data, rollover, None))


class LiveDashboard:
    """SessionObserver: header + plots while the cell runs, static ending after."""

    def __init__(self, ending, update_period_s: float = UPDATE_PERIOD_S, history_refresh_s: float = 60.0) -> None:
        self.ending = ending  # shows the static ending in place of the dashboard (static_plots.show_static_ending)
        self.update_period_s = update_period_s
        self.history_refresh_s = history_refresh_s
        self.lock = threading.RLock()
        self.session = None
        self.model: DashboardModel | None = None
        self.figures = None
        self.widget = None
        self.header = None
        self.handle = None
        self.handle_below = None
        self.doc_updates = 0
        self.history_rows = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._bands_key = None
        self._header_fixed = None
        self._failed: str | None = None

    # -- SessionObserver ----------------------------------------------------------------------
    def started(self, session) -> None:
        self.session = session
        meta = session.meta
        try:
            self._build(session)
        except Exception as exc:  # the dashboard must never break the user's cell
            self._failed = f"{type(exc).__name__}: {exc}"
            return
        self._thread = threading.Thread(target=self._run, name="gpuprof-ui", daemon=True)
        self._thread.start()
        del meta

    def tick(self, tick) -> None:
        model = self.model
        if model is not None:
            model.push(tick)

    def gaps(self, gaps) -> None:
        model = self.model
        if model is not None:
            model.add_gaps(gaps)

    def finished(self, experiment) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)
            self._thread = None
        self.ending(experiment, (self.handle, self.handle_below))
        for w in (self.widget, self.header, getattr(self, "box", None)):
            if w is not None:
                try:
                    w.close()
                except Exception:
                    pass

    # -- building -------------------------------------------------------------------------------
    def _build(self, session) -> None:
        import ipywidgets  # pandas is already imported: the session's sample writer did it
        from IPython.display import display

        from gpuprof_jupyter.kernel.views.live.figures import build_figures

        meta = session.meta
        spec = plot_spec(meta)
        self.model = DashboardModel(spec, session.t0, session.interval)
        empty = self.model.empty_data()
        self.figures = build_figures(spec, empty, dict(empty), band_data([], [], None))
        cls = _locked_model_class()
        self.widget = cls(self.figures.layout)
        self.widget._gpuprof_lock = self.lock
        self.header = ipywidgets.HTML(value=self._header_html(0.0))
        self.box = ipywidgets.VBox([self.header, self.widget])
        self.handle = display(self.box, display_id=True)
        # the static ending is two adjacent outputs (PNG, then plots + summary): hold the second
        # place now, before the cell's own output
        self.handle_below = display({"text/plain": ""}, raw=True, display_id=True)

    # -- UI thread ------------------------------------------------------------------------------
    def _run(self) -> None:
        from gpuprof_jupyter.kernel.runtime.session import current_session

        next_header = next_bands = 0.0
        next_history = time.monotonic() + self.history_refresh_s
        session = self.session
        while not self._stop.wait(self.update_period_s):
            now = time.monotonic()
            try:
                self._apply_batch()
                if now >= next_history:
                    next_history = now + self.history_refresh_s
                    self._apply_history()
                if now >= next_bands:
                    next_bands = now + BANDS_PERIOD_S
                    self._apply_bands(now - session.t0)
                if now >= next_header:
                    next_header = now + HEADER_PERIOD_S
                    html = self._header_html(now - session.t0)
                    if html != self.header.value:  # one comm message, only when the text changed
                        self.header.value = html
            except Exception as exc:  # keep the cell running; say so in the header
                self._failed = f"{type(exc).__name__}: {exc}"
            if current_session() is not session and not self._stop.wait(5.0):
                break  # the session ended without telling us: do not outlive it

    def _apply_batch(self) -> None:
        batch = self.model.drain()
        if batch is None:
            return
        with self.lock:
            stream_lists(self.figures.recent, batch.data, self.model.recent_rows)
        self.doc_updates += 1

    def _apply_history(self) -> None:
        data = self.model.history_data()
        with self.lock:
            self.figures.history.data = data
        self.history_rows = len(data["t"])
        self.doc_updates += 1

    def _apply_bands(self, now_s: float) -> None:
        activity = self.session.activity
        phases = list(activity.phases) if activity is not None else []
        key = (tuple((p.name, p.start_s, p.end_s) for p in phases), tuple(self.model.gaps),
               any(p.end_s is None for p in phases) and int(now_s // 10))
        if key == self._bands_key:
            return
        self._bands_key = key
        data = band_data(phases, self.model.gaps, now_s)
        with self.lock:
            self.figures.bands.data = data
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
                ('<span style="background:#fff3cd;color:#5c4400;padding:1px 6px;border-radius:3px;'
                 'font-weight:bold">SIMULATED</span> ' if sim else "")
                + f"<b>gpuprof</b> <b>{escape(meta.name)}</b> · {escape(device_names(meta.gpu_devices))}",
                f"source: {escape(meta.source)}{' (simulated)' if sim else ''} · sm_util is {escape(prov)}"
                " · elapsed "))
        first, second = self._header_fixed[1]
        parts = [first, second + escape(fmt_seconds(elapsed_s))]
        model = self.model
        if model is not None and model.latest:
            parts.append(escape(" | ".join(current_values_text(model.spec, model.latest))))
        activity = session.activity
        children = getattr(session, "children", None)
        steps = activity.steps if activity is not None else []
        if not steps and children is not None:  # the run's child processes train (a spawned rank...)
            primary = children.primary()
            steps = primary.activity.steps if primary is not None else []
        facts = step_facts(steps, elapsed_s) if steps else None
        if facts:
            rate = (f"{facts['samples_per_s']:.1f} samples/s" if facts.get("samples_per_s")
                    else f"{facts['steps_per_s']:.2f} steps/s" if facts.get("steps_per_s") else "n/a")
            parts.append(f"steps: {facts['count']} · throughput {rate} · waiting for data "
                         f"{escape(fmt_frac(facts.get('data_wait_frac')))} (last 10 s)")
        ranks = rank_step_times(children, elapsed_s) if children is not None else ""
        if ranks:
            parts.append(escape(ranks))
        if model is not None and model.gaps:
            total = sum(e - s for s, e in model.gaps)
            last = model.gaps[-1]
            parts.append(f'<span style="color:#8a6d00">{fmt_gap(last[0], last[1])} '
                         f"({len(model.gaps)} gap(s), {total:.1f} s, not interpolated)</span>")
        fired = getattr(session, "alerts_fired", None)
        if fired:
            parts.append(alert_header_html(fired))
        if self._failed:
            parts.append(f'<span style="color:#c62828">dashboard: {escape(self._failed)}</span>')
        return ('<div class="gpuprof-live-header" style="font-family:sans-serif;font-size:12px;line-height:1.4">'
                + "<br>".join(parts) + "</div>")


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
