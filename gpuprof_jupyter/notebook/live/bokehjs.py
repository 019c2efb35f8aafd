"""BokehJS for the live plots: loaded into the page at ``%load_ext``, never saved in the notebook.

Runs in the kernel.

jupyter_bokeh's widget needs BokehJS on the page (docs/facts.md, "BokehJS on the page") and hubs
are often offline, so it is sent INLINE (~4 MB). ``bokeh.io.output_notebook`` would store it in
the notebook twice (8 MB, docs/facts.md, "Exported pages"). Here Bokeh's own loading bundle is
displayed under a display id and, when the cell ends, replaced by one line of text: the page has
already run it (a front end runs an output's JavaScript as it renders it), and the saved
notebook keeps only the line. Where it is absent (a reloaded page, nbconvert's HTML, GitHub),
static endings show their PNG.
"""

from __future__ import annotations

LOADED_TEXT = ("gpuprof_jupyter: BokehJS {version} loaded into this page for the live plots (not saved "
               "in the notebook; after reloading the page, run %reload_ext gpuprof_jupyter)")


def bokehjs_bundle() -> dict:
    """The display bundle ``output_notebook(INLINE)`` would publish, captured instead of shown."""
    from bokeh.io import notebook as bokeh_notebook
    from bokeh.resources import INLINE

    captured: list[dict] = []
    publish = bokeh_notebook.publish_display_data
    bokeh_notebook.publish_display_data = lambda data, *args, **kwargs: captured.append(data)
    try:
        bokeh_notebook.load_notebook(INLINE, hide_banner=True)
    finally:
        bokeh_notebook.publish_display_data = publish
    bundles = [b for b in captured if bokeh_notebook.JS_MIME_TYPE in b]
    if len(bundles) != 1:
        raise RuntimeError(f"bokeh published {len(captured)} bundle(s), expected one with {bokeh_notebook.JS_MIME_TYPE}")
    return bundles[0]


def load_bokehjs(ipython) -> None:
    """Show BokehJS's loading bundle, then replace it by a line when this cell ends."""
    try:
        from ipykernel.zmqshell import ZMQInteractiveShell
    except ImportError:  # pragma: no cover
        return
    if not isinstance(ipython, ZMQInteractiveShell):
        return  # terminal IPython: no front end to load into
    import bokeh
    from IPython.display import display

    handle = display(bokehjs_bundle(), raw=True, display_id=True)

    def replace_with_line(result=None) -> None:
        ipython.events.unregister("post_run_cell", replace_with_line)
        handle.update({"text/plain": LOADED_TEXT.format(version=bokeh.__version__)}, raw=True)

    ipython.events.register("post_run_cell", replace_with_line)
