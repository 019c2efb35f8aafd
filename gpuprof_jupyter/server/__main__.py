"""``python -m gpuprof_jupyter.server``: ``jupyter gpuprof-server`` (``app.py``), or with
``--markdown`` alone the settings table of docs/jupyterlab.md.

Runs in the Jupyter server's environment: as the server itself, or (``--markdown``,
``--help-all``) as a command that prints and starts no server.

The table is built from the same traitlets help that ``--help-all`` prints
(``config.settings_markdown``); tests/test_docs.py checks that the page still holds it.
"""

from __future__ import annotations

import sys

from gpuprof_jupyter.server.app import main
from gpuprof_jupyter.server.config import settings_markdown

if __name__ == "__main__":
    if sys.argv[1:] == ["--markdown"]:
        sys.stdout.write(settings_markdown())
    else:
        sys.exit(main())
