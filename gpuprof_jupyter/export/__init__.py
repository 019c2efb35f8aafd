"""Writing files a person asked for: ``pipeline.yaml``, the HTML report, the merged Chrome trace.

Runs in the kernel, the Jupyter server and the ``gpuprof`` command.

The renderers (``render/``) return text; these modules look the runs up in the store, call
them, and write the result atomically (all or nothing). ``export`` sits above ``render`` and
below the process folders; a renderer never imports it (pyproject.toml's import contracts).
"""
