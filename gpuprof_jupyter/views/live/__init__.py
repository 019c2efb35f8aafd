"""Live dashboard shown while a ``%%gpuprofile`` cell runs (Bokeh inside ipywidgets)."""

from .dashboard import LiveDashboard, on_extension_load

__all__ = ["LiveDashboard", "on_extension_load"]
