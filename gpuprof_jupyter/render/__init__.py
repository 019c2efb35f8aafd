"""Renderers: a run or a comparison as HTML, text, plots, a report, a Chrome trace or ``pipeline.yaml``,
and every other text a person reads (the live header, --tune's table, the status, the listing).

Runs in the kernel, the Jupyter server and the ``gpuprof`` command, which all import it; it imports
none of them (a contract in pyproject.toml). The kernel's own views (the magic, widgets, the live
view) stay in ``notebook/``: they gather the facts and display what these return.
"""
