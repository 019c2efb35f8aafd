"""The server extension's settings (``--GPUProfiler.<name>=...`` or jupyter_server_config.py).

Runs in the Jupyter server.
"""

from __future__ import annotations

from traitlets import Bool, Float, Int, Unicode
from traitlets.config import Configurable


class GPUProfiler(Configurable):
    """Settings of the GPU Profiler server extension; handlers read them from
    ``web_app.settings["gpuprof"]``, never from globals."""

    poll_interval_s = Float(
        1.0, min=0.2,
        help="Seconds between two reads of the GPUs by the server's device poller (status bar and "
             "sidebar); one poller per server, shared by every browser tab.",
    ).tag(config=True)

    history_s = Float(
        120.0, min=0.0,
        help="Seconds of device history kept for the sidebar's sparklines; 0 keeps only the latest reading.",
    ).tag(config=True)

    idle_stop_s = Float(
        60.0, min=0.0,
        help="The device poller stops (and lets NVML go) when no browser asked for devices for this many "
             "seconds, and starts again on the next request; 0 never stops it.",
    ).tag(config=True)

    devices_enabled = Bool(
        True,
        help="Read the GPUs at all. False: the devices endpoint always answers the no-GPU state "
             "(reason 'disabled') and NVML is never opened by the server.",
    ).tag(config=True)

    default_store = Unicode(
        ".gpuprof",
        help="The store read when a request names none: a path relative to the server's root directory.",
    ).tag(config=True)

    max_points = Int(
        600, min=10,
        help="Most points per device and metric in an experiment's series (min/max decimation keeps the extremes).",
    ).tag(config=True)


    cull_idle_gpu_s = Float(
        0.0, min=0.0,
        help="Shut down a kernel whose GPUs have sat idle for this many seconds while it held their memory "
             "(from its session record); 0, the default, never does. Its notebook is warned cull_warning_s "
             "ahead. Independent of ServerApp/MappingKernelManager.cull_idle_timeout, which culls by kernel "
             "activity alone; both may be on.",
    ).tag(config=True)

    cull_warning_s = Float(
        300.0, min=0.0,
        help="With cull_idle_gpu_s: seconds ahead of the shutdown that the notebook is warned (a notification "
             "and the status bar); the warning is withdrawn if a cell runs or the memory is freed meanwhile.",
    ).tag(config=True)

    cull_check_s = Float(
        30.0, min=1.0,
        help="With cull_idle_gpu_s: seconds between two checks of the kernels' session states.",
    ).tag(config=True)


def settings_markdown() -> str:
    """The settings as a Markdown table, built from the traitlets' own help (docs/jupyterlab.md
    holds this table; tests/test_docs.py checks that it still matches)."""
    rows = ["| setting | type | default | what it does |", "| --- | --- | --- | --- |"]
    for name, trait in sorted(GPUProfiler.class_traits(config=True).items()):
        help_text = " ".join(trait.help.split()).replace("|", "\\|")
        rows.append(f"| `c.GPUProfiler.{name}` | {type(trait).__name__} | "
                    f"`{trait.default_value!r}` | {help_text} |")
    return "\n".join(rows) + "\n"
