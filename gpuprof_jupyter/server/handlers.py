"""Handlers under ``{base_url}gpuprof/api/``: every verb authenticated, POST XSRF-checked.

Runs in the Jupyter server.

    GET  devices                     the server's device poller (``devices.py``)
    GET  experiments?store=REL       one row per experiment, summary columns; ETag, and 304 to
                                     an If-None-Match naming the current one, or "*"
    GET  experiments/ID?store=REL[&offset=N]   summary + decimated series; tail of a running run
    GET  report?ids=A,B&store=REL    the standalone HTML report (``render.report.render_report``)
    POST export   {"id", "store", "path", "step", "force"}  -> pipeline.yaml (``export.pipeline``)
    GET  sessions                    each of this server's kernels' session state: idle while
                                     holding GPU memory, memory held, user (``sessions.py``)

Store and output paths are relative to the server's root and never leave it (``paths.py``);
no answer names an absolute path (error messages and the listing's problems are scrubbed).
Blocking work (NVML, reading the store, Bokeh) runs off the event loop.
"""

from __future__ import annotations

import json
import os
import threading

from jupyter_server.base.handlers import APIHandler, JupyterHandler
from jupyter_server.utils import url_path_join
from tornado import web
from tornado.ioloop import IOLoop

from gpuprof_jupyter.server.config import GPUProfiler
from gpuprof_jupyter.server.devices import DevicePoller
from gpuprof_jupyter.server.experiments import Finisher, Followers, NotFound, experiment_detail, list_experiments
from gpuprof_jupyter.server.paths import PathRefused, relative_to_root, resolve_under_root, scrub_paths

SETTINGS_KEY = "gpuprof"


class _Base(APIHandler):
    @property
    def gpuprof(self) -> dict:
        return self.settings[SETTINGS_KEY]

    @property
    def config_obj(self) -> GPUProfiler:
        return self.gpuprof["config"]

    @property
    def root(self) -> str:
        return self.gpuprof["root"]

    def write_error(self, status_code: int, **kwargs) -> None:
        """APIHandler's JSON error, its message without the server's absolute paths."""
        exc_info = kwargs.get("exc_info")
        exc = exc_info[1] if exc_info else None
        if isinstance(exc, web.HTTPError) and exc.log_message:
            message = exc.log_message % exc.args if exc.args else exc.log_message
            scrubbed = web.HTTPError(exc.status_code, scrub_paths(message, self.root), reason=exc.reason)
            kwargs["exc_info"] = (web.HTTPError, scrubbed, exc_info[2])
        super().write_error(status_code, **kwargs)

    def _path(self, relpath: str | None, default: str):
        try:
            return resolve_under_root(self.root, relpath, default)
        except PathRefused as exc:
            raise web.HTTPError(exc.status, str(exc)) from None

    def _store(self):
        from gpuprof_jupyter.core.store.directory import Store

        return Store(self._path(self.get_argument("store", None), self.config_obj.default_store))

    async def _off_loop(self, fn, *args):
        return await IOLoop.current().run_in_executor(None, fn, *args)


class DevicesHandler(_Base):
    @web.authenticated
    async def get(self):
        history = self.get_argument("history", "1") not in ("0", "false")
        self.finish(json.dumps(self.gpuprof["poller"].snapshot(history=history)))


class ExperimentsHandler(_Base):
    """The sidebar polls this every few seconds: an unchanged listing is a 304 without a body,
    and a changed one's body is built once per version, whichever tab asks, and gzipped once
    for the clients that accept it (a browser does: 10,000 rows are 7.7 MB of JSON)."""

    @web.authenticated
    async def get(self):
        store = self._store()
        etag, body, gzipped = await self._off_loop(self._listing, store)
        self.set_header("ETag", etag)
        self.set_header("Vary", "Accept-Encoding")
        if self.check_etag_header():  # tornado's If-None-Match: one of its tags (weak or strong), or "*"
            self.set_status(304)
            self.finish()
            return
        if "gzip" in self.request.headers.get("Accept-Encoding", ""):
            self.set_header("Content-Encoding", "gzip")
            self.set_header("Content-Type", "application/json")
            self.finish(gzipped)
            return
        self.finish(body)

    def _listing(self, store) -> tuple[str, str, bytes]:
        """(ETag, body, body gzipped) of the store's listing; made again only when its version changed."""
        import gzip

        relpath = relative_to_root(self.root, store.root)
        cache = self.gpuprof["listings"]
        cached = cache.get(relpath, ("", "", b""))
        version, text = list_experiments(store, unless=cached[0].strip('"'), finish=self.gpuprof["finisher"],
                                         scrub=lambda p: scrub_paths(p, self.root))
        if text is None:
            return cached
        body = f'{{"store": {json.dumps(relpath)}, {text[1:]}'
        cache[relpath] = (f'"{version}"', body, gzip.compress(body.encode(), compresslevel=5, mtime=0))
        return cache[relpath]


class ExperimentHandler(_Base):
    @web.authenticated
    async def get(self, experiment_id: str):
        store = self._store()
        offset = self.get_argument("offset", None)
        if offset is not None:
            try:
                offset = int(offset)
                if offset < 0:
                    raise ValueError
            except ValueError:
                raise web.HTTPError(400, f"offset must be a byte offset >= 0, not {offset!r}") from None
        try:
            payload = await self._off_loop(experiment_detail, store, experiment_id, self.gpuprof["followers"],
                                           self.config_obj.max_points, offset)
        except NotFound as exc:
            raise web.HTTPError(404, str(exc)) from None
        self.finish(json.dumps(payload))


def _ids(text: str | None) -> list[str]:
    ids = [part.strip() for part in (text or "").split(",") if part.strip()]
    if not ids:
        raise web.HTTPError(400, "ids: give one or more experiment ids, comma-separated")
    return ids


def _render_report(store, ids: list[str]) -> str:
    from gpuprof_jupyter.render.report import render_report
    from gpuprof_jupyter.server.experiments import load_listed

    return render_report([load_listed(store, i) for i in ids])


class ReportHandler(_Base):
    """A page, not JSON: text/html, and the page CSP (an API's ``default-src 'none'`` would block
    the report's inline BokehJS). Errors stay JSON (APIHandler.write_error)."""

    @property
    def content_security_policy(self) -> str:
        return JupyterHandler.content_security_policy.fget(self)

    @web.authenticated
    async def get(self):
        store = self._store()
        ids = _ids(self.get_argument("ids", None))
        try:
            html = await self._off_loop(_render_report, store, ids)
        except NotFound as exc:
            raise web.HTTPError(404, str(exc)) from None
        self.finish(html, set_content_type="text/html; charset=UTF-8")


def _export(store, experiment_id: str, target, step: str, force: bool):
    from gpuprof_jupyter.export.pipeline import export_pipeline
    from gpuprof_jupyter.server.experiments import load_listed

    experiment = load_listed(store, experiment_id)
    return export_pipeline(experiment, path=target, step=step, force=force, store=store)


class ExportHandler(_Base):
    @web.authenticated
    async def post(self):
        from gpuprof_jupyter.export.pipeline import ExportRefused, PipelineError

        try:
            body = json.loads(self.request.body or b"")
        except ValueError as exc:
            raise web.HTTPError(400, f"the request body is not JSON: {exc}") from None
        if not isinstance(body, dict):
            raise web.HTTPError(400, "the request body must be a JSON object")
        experiment_id = body.get("id")
        if not isinstance(experiment_id, str) or not experiment_id:
            raise web.HTTPError(400, "'id': the experiment id to export is required")
        step, force = body.get("step", "train"), body.get("force", False)
        if not isinstance(step, str) or not step.strip():
            raise web.HTTPError(400, "'step' must be a non-empty string")
        if not isinstance(force, bool):
            raise web.HTTPError(400, "'force' must be true or false")
        store = self._path(body.get("store"), self.config_obj.default_store)
        target = self._path(body.get("path"), "pipeline.yaml")
        if target.is_dir():
            raise web.HTTPError(400, f"'path' {body.get('path')!r} is a directory, not a YAML file")
        from gpuprof_jupyter.core.store.directory import Store

        try:
            result = await self._off_loop(_export, Store(store), experiment_id, target, step, force)
        except NotFound as exc:
            raise web.HTTPError(404, str(exc)) from None
        except ExportRefused as exc:
            raise web.HTTPError(409, str(exc)) from None
        except (PipelineError, ValueError) as exc:
            raise web.HTTPError(400, str(exc)) from None
        relpath = relative_to_root(self.root, result.path)  # the browser never sees the server's absolute paths
        self.finish(json.dumps({
            "path": relpath, "step": result.step, "experiment": result.experiment,
            "created": result.created, "baseline": result.baseline,
            "message": str(result).replace(str(result.path), relpath),
            "changes": [{"key": k, "old": None if o is None else str(o), "new": None if n is None else str(n),
                         "comment": c} for k, o, n, c in result.changes],
        }))


class SessionsHandler(_Base):
    @web.authenticated
    async def get(self):
        rows = await self._off_loop(self.gpuprof["sessions"])
        self.finish(json.dumps({"sessions": rows}))


def _kernel_states(server_app):
    """A function: this server's kernels' session states (``sessions.session_states``)."""
    from gpuprof_jupyter.server.sessions import session_states

    def states() -> list[dict]:
        return session_states(server_app.runtime_dir, server_app.kernel_manager.list_kernel_ids())

    return states


def _import_analysis() -> None:
    """Import what computes a new listing row or finishes a crashed run (numpy, pandas, the
    summary) now, in the background, not in the first poll that needs it (half a second)."""
    import gpuprof_jupyter.core.analysis.table  # noqa: F401
    import gpuprof_jupyter.core.crashed  # noqa: F401


def setup_handlers(server_app, config: GPUProfiler) -> None:
    """Add the routes to ``server_app.web_app`` and its settings (config, poller, followers);
    called by the extension app (``app.py``) once the server's web app exists."""
    web_app = server_app.web_app
    root = os.path.realpath(os.path.expanduser(web_app.settings.get("server_root_dir") or server_app.root_dir))
    web_app.settings[SETTINGS_KEY] = {
        "config": config,
        "root": root,
        "poller": DevicePoller(config.poll_interval_s, config.history_s, config.idle_stop_s,
                               enabled=config.devices_enabled),
        "followers": Followers(config.max_points),
        "listings": {},  # store (relative) -> (ETag, JSON body) of its last listing
        "finisher": Finisher(),  # runs whose sampler process died, finished off the polls
        "sessions": _kernel_states(server_app),
    }
    from gpuprof_jupyter.server.sessions import register_metrics

    register_metrics(web_app.settings[SETTINGS_KEY]["sessions"])  # on the server's /metrics
    from gpuprof_jupyter.server.culling import start_culling

    web_app.settings[SETTINGS_KEY]["culler"] = start_culling(server_app, config, web_app.settings[SETTINGS_KEY]["sessions"])
    threading.Thread(target=_import_analysis, name="server-import-analysis", daemon=True).start()
    base = url_path_join(web_app.settings["base_url"], "gpuprof", "api")
    web_app.add_handlers(".*$", [
        (url_path_join(base, "devices"), DevicesHandler),
        (url_path_join(base, "experiments"), ExperimentsHandler),
        (url_path_join(base, "experiments", r"([^/]+)"), ExperimentHandler),
        (url_path_join(base, "report"), ReportHandler),
        (url_path_join(base, "export"), ExportHandler),
        (url_path_join(base, "sessions"), SessionsHandler),
    ])
    server_app.log.info("gpuprof_jupyter server extension: %s (root %s)", base, root)
