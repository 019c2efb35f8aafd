"""The jupyter_server extension behind the JupyterLab "GPU Profiler" sidebar and status bar.

Runs in the Jupyter server.

Routes under ``{base_url}gpuprof/api/`` (``api.py``), settings as traitlets (``config.py``),
the server's own 1 Hz device poller (``devices.py``), store paths kept under the server's
root (``paths.py``) and the experiment payloads (``experiments.py``), all added by the
extension app (``app.py``, also the command ``jupyter gpuprof-server``). Enabled by
``etc/jupyter/jupyter_server_config.d/gpuprof_jupyter.json`` in the wheel, or explicitly
with ``--ServerApp.jpserver_extensions='{"gpuprof_jupyter.server": true}'``.

Messages from the browser to a busy kernel wait until its cell ends (docs/facts.md, "Messages
to a busy kernel"): what
must work while a cell trains goes through here, reading the store, never the kernel.
"""

from __future__ import annotations


def _jupyter_server_extension_points():
    from gpuprof_jupyter.server.app import GPUProfilerApp

    return [{"module": "gpuprof_jupyter.server", "app": GPUProfilerApp}]
