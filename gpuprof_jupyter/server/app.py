"""``jupyter gpuprof-server``: the server extension as a jupyter_server ``ExtensionApp``.

Runs in the Jupyter server.

Why an app: ``jupyter server --help-all`` prints its help while it parses the command line,
before it loads any extension, so it can list only the classes jupyter_server itself knows.
An extension app has a command of its own whose help lists its classes, as ``jupyter lab
--help-all`` lists LabApp's: ``jupyter gpuprof-server --help-all`` lists ``GPUProfiler``'s
settings (``config.py``). Inside ``jupyter lab`` or ``jupyter server`` the extension manager
links and loads this app into the server already running (no second server; routes and
``c.GPUProfiler.<name>`` as before); run alone, ``jupyter gpuprof-server`` starts a Jupyter
server with the extension enabled, as ``jupyter server`` would with it turned on.
"""

from __future__ import annotations

from jupyter_server.extension.application import ExtensionApp
from traitlets import default

from gpuprof_jupyter.server.config import GPUProfiler


class GPUProfilerApp(ExtensionApp):
    """Adds the routes under ``{base_url}gpuprof/api/`` with a ``GPUProfiler`` configured from
    the server's config (its files, its command line)."""

    name = "gpuprof-server"  # `jupyter gpuprof-server`; not `gpuprof`, the command line tool
    description = ("A Jupyter server with the GPU Profiler server extension (the endpoints of the JupyterLab "
                   "sidebar and status bar, under {base_url}gpuprof/api/). The extension's settings are the "
                   "GPUProfiler options at the end of --help-all; `jupyter lab` and `jupyter server` take them "
                   "too: --GPUProfiler.<name>=... or c.GPUProfiler.<name> in jupyter_server_config.py.")
    classes = [*ExtensionApp.classes, GPUProfiler]

    @classmethod
    def get_extension_package(cls) -> str:
        """The key of ``ServerApp.jpserver_extensions`` (the module holding the extension
        points), not the top package ExtensionApp would guess."""
        return "gpuprof_jupyter.server"

    @default("open_browser")
    def _default_open_browser(self) -> bool:
        """No page of its own to open: like ``jupyter server``, not ``jupyter lab``."""
        return self.serverapp.config["ServerApp"].get("open_browser", False)

    def initialize_handlers(self) -> None:
        from gpuprof_jupyter.server.handlers import setup_handlers

        setup_handlers(self.serverapp, GPUProfiler(parent=self))


main = GPUProfilerApp.launch_instance  # the console script `jupyter-gpuprof-server`
