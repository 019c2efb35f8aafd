"""Live dashboard shown while a ``%%gpuprofile`` cell runs (Bokeh inside ipywidgets)."""

from .bokehjs import load_bokehjs
from .dashboard import LiveDashboard

__all__ = ["LiveDashboard", "load_bokehjs"]
