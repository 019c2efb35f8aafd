"""The plots' data without Bokeh, shared by the kernel's views and the sampler process.

Runs in both processes (and in the Jupyter server and the ``gpuprof`` command, which render
the static plots): ``spec`` says which panels and columns an experiment's plots have,
``columns`` turns rows into column batches and the decimated history, ``patch_doc`` writes
the PATCH-DOC text the page's plots apply. The sampler process prepares the live view's
changes with them; the kernel only forwards those texts (docs/live_view.md).
"""
