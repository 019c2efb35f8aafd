"""The quickstart as committed: written by scripts/make_quickstart.py (its documented way), and
no cell leaves a stray ``Out[...]`` (a value nobody asked to see). No kernel: the cells are read,
not run (tests/test_quickstart.py runs them and checks the same on the executed notebook)."""

from __future__ import annotations

import ast
import importlib.util
import json
from pathlib import Path

from IPython.core.inputtransformer2 import TransformerManager

ROOT = Path(__file__).resolve().parent.parent
QUICKSTART = ROOT / "notebooks" / "quickstart.ipynb"


def _cells() -> list[tuple[str, str]]:
    """(cell type, source) of each cell the script writes (read without nbformat, which costs
    the fast test run a second to import)."""
    spec = importlib.util.spec_from_file_location("make_quickstart", ROOT / "scripts" / "make_quickstart.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.CELLS


def _source(cell: dict) -> str:
    """A cell's source as nbformat reads it: a file may hold it as one string or as its lines."""
    source = cell["source"]
    return source if isinstance(source, str) else "".join(source)


def shows_a_value(source: str) -> bool:
    """Whether a cell ends in an expression IPython would echo as ``Out[...]``: not a print(), not
    a magic (whose display is its own), not a statement, not silenced with ';'."""
    code = TransformerManager().transform_cell(source)
    body = ast.parse(code).body
    if not body or not isinstance(body[-1], ast.Expr) or source.rstrip().endswith(";"):
        return False
    value = body[-1].value
    name = value.func.attr if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) else (
        value.func.id if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) else None)
    return name not in ("print", "run_line_magic", "run_cell_magic")


def test_the_committed_quickstart_is_what_the_script_writes():
    committed = json.loads(QUICKSTART.read_text(encoding="utf-8"))
    assert committed["nbformat"] == 4
    assert [(c["cell_type"], _source(c)) for c in committed["cells"]] == _cells(), \
        "notebooks/quickstart.ipynb differs from scripts/make_quickstart.py: run `python scripts/make_quickstart.py`"
    assert all(not c.get("outputs") for c in committed["cells"] if c["cell_type"] == "code")


def test_no_cell_leaves_a_stray_out():
    code = [source for kind, source in _cells() if kind == "code"]
    stray = [source for source in code[:-1] if shows_a_value(source)]
    assert stray == [], f"cells echoing a value as Out[...]: {stray}"
    assert shows_a_value(code[-1]), "the last cell shows the experiments table on purpose"


def test_the_check_catches_a_stray_value():
    assert shows_a_value("x = 1\ntrain(loader)") and shows_a_value("gp.report(path='r.html')  # a path")
    assert not shows_a_value("_ = train(loader)") and not shows_a_value("print(gp.report())")
    assert not shows_a_value("%gpuprofile compare") and not shows_a_value("train(loader);")


def test_what_the_quickstart_says_of_compare_is_what_the_magic_does():
    """The magic's ``compare`` takes the last two runs unless named or ``--all`` (notebook/magic.py)."""
    sources = [source for _kind, source in _cells()]
    at = next(i for i, source in enumerate(sources) if source.strip() == "%gpuprofile compare")
    said = sources[at - 1]
    assert "the last two runs" in said and "every run against the first" in said.split("--all", 1)[-1], said
