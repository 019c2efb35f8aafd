#!/usr/bin/env bash
# Build the JupyterLab extension (labextension/ -> gpuprof_jupyter/labextension/) with this
# machine's Node and the venv's jlpm (JupyterLab's bundled yarn). Run before `pip install -e`
# (or let the hatch-jupyter-builder hook in pyproject.toml do the same); a wheel built after
# this carries the result, so a pip user needs no Node.
#   VENV=.venv scripts/build_labextension.sh   (default VENV: .venv beside this repo)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv}"
export PATH="$(cd "$VENV/bin" && pwd):$PATH"  # jlpm and `jupyter labextension build`
command -v node >/dev/null || { echo "build_labextension: node (>= 18) is needed to build labextension/" >&2; exit 1; }
cd labextension
jlpm install --immutable 2>/dev/null || jlpm install
jlpm build
