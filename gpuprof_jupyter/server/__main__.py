"""`python -m gpuprof_jupyter.server --help-all`: the server extension's settings.

Runs in the Jupyter server's environment, as a command of its own (it starts no server).

`jupyter server --help-all` lists only the classes jupyter_server knows before it loads any
extension, so an extension's settings cannot appear there; this prints them in the same format.
`--markdown` prints the table of docs/server.md.
"""

from __future__ import annotations

import sys

from gpuprof_jupyter.server.config import GPUProfiler, settings_markdown


def main(argv: list[str]) -> int:
    if "--markdown" in argv:
        sys.stdout.write(settings_markdown())
    else:
        sys.stdout.write(GPUProfiler.class_get_help() + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
