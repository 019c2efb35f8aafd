"""The static ending of a profiled cell: the live view gives way to static plots and the summary.

Runs in the kernel. What is shown is built by ``render/static_plots.py``; this module only puts it
on the page (docs/facts.md, "Exported pages": a live widget renders empty in an exported notebook).
"""

from __future__ import annotations

from gpuprof_jupyter.render.static_plots import static_output_bundles


def show_static_ending(experiment, handles=(None, None)) -> None:
    """Display the static ending, or put it in place of two outputs shown earlier (``handles``,
    IPython display handles: the live dashboard's). Plots that fail leave the summary and a note."""
    from IPython.display import display

    try:
        bundles = static_output_bundles(experiment)
    except Exception as exc:  # noqa: BLE001 - never lose the summary
        from gpuprof_jupyter.render.summary_html import summary_bundle

        summary = summary_bundle(experiment)
        summary["text/plain"] += f"\n  (plots unavailable: {type(exc).__name__}: {exc})"
        bundles = ({"text/plain": ""}, summary)
    for handle, bundle in zip(handles, bundles):
        if handle is not None:
            handle.update(bundle, raw=True)
        else:
            display(bundle, raw=True)
