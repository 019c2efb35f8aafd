"""Live dashboard shown while a ``%%gpuprofile`` cell runs (Bokeh inside ipywidgets).

Runs in the kernel.
"""

from gpuprof_jupyter.notebook.live.bokehjs import load_bokehjs
from gpuprof_jupyter.notebook.live.dashboard import LiveDashboard

__all__ = ["LiveDashboard", "load_bokehjs"]
