"""The README and docs/ say only what is true, as far as a test can tell (issue 22 part 1).

* every `gpuprof` command and option named in code they show exists (read from the commands'
  own help), and so does every `%gpuprofile` option;
* every code block marked ```` ```python runnable ```` runs (one process per file, blocks in
  order, in an empty directory, with the simulated GPU);
* every API call in the README's table exists with the documented signature;
* every relative link points to a file; the server settings table is the traitlets' help;
* every `jupyter gpuprof-server`-like command is a console script of pyproject.toml, and every
  `GPUProfiler.<name>` a setting.
"""

from __future__ import annotations

import ast
import inspect
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import gpuprof_jupyter as gp
from gpuprof_jupyter.cli import build_parser
from gpuprof_jupyter.kernel.views.magic import GpuProfileMagics
from gpuprof_jupyter.server.config import GPUProfiler, settings_markdown

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md")), ROOT / "benchmarks" / "README.md"]
FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```", re.S | re.M)
_OPTION = re.compile(r"(?<![\w-])(--?[a-zA-Z][\w-]*)")


def _name(path: Path) -> str:
    return str(path.relative_to(ROOT))


def code_texts(text: str) -> list[str]:
    """The code a page shows: fenced blocks, then inline `code` outside them."""
    blocks = [body for _, body in FENCE.findall(text)]
    prose = FENCE.sub("", text)
    return blocks + re.findall(r"`([^`\n]+)`", prose)


def _options(help_text: str) -> set[str]:
    return set(_OPTION.findall(help_text))


def cli_help() -> tuple[set[str], dict[str, set[str]]]:
    """Commands and each command's options, read from `gpuprof --help` and `gpuprof CMD --help`."""
    parser = build_parser()
    commands = set(re.search(r"\{([\w,]+)\}", parser.format_help()).group(1).split(","))
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    return commands, {name: _options(p.format_help()) for name, p in sub.choices.items()}


def named_commands(text: str):
    """(command, options) for each command line starting `gpuprof CMD` in the page's code (a
    shell line or an inline span; not gpuprof_jupyter, not %gpuprofile, not prose such as "the
    gpuprof command"); the options stop at `--` (what follows is the profiled command's)."""
    for code in code_texts(text):
        for line in code.splitlines():
            for match in re.finditer(r"^\s*(?:\$\s*|!)?gpuprof\s+([a-z][\w-]*)([^|;#]*)", line):
                rest = match.group(2).split(" -- ")[0]
                yield match.group(1), set(_OPTION.findall(rest))


def named_magic_options(text: str):
    for code in code_texts(text):
        for line in code.splitlines():
            match = re.search(r"%%?gpuprofile\b(.*)", line)
            if match:
                rest = re.sub(r"""(["']).*?\1""", "", match.group(1))  # quoted values (rules) are not options
                yield from _OPTION.findall(rest)


def magic_table_options(text: str) -> set[str]:
    """The options in the first column of the README's table of the magic's options."""
    if "### The magic's options" not in text:
        return set()
    section = text.split("### The magic's options", 1)[1].split("\n#", 1)[0]
    cells = [line.split(" | ")[0] for line in section.splitlines() if line.startswith("| `")]
    return {option for cell in cells for code in re.findall(r"`([^`]+)`", cell) for option in _OPTION.findall(code)}


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_every_gpuprof_command_and_option_exists(page):
    commands, options = cli_help()
    for command, used in named_commands(page.read_text()):
        assert command in commands, f"{_name(page)}: `gpuprof {command}` is not a command ({sorted(commands)})"
        unknown = used - options[command] - {"-", "--"}
        assert not unknown, f"{_name(page)}: `gpuprof {command}` has no option {sorted(unknown)}"
    magic = _options(GpuProfileMagics.gpuprofile.parser.format_help())
    unknown = (set(named_magic_options(page.read_text())) | magic_table_options(page.read_text())) - magic
    assert not unknown, f"{_name(page)}: %%gpuprofile has no option {sorted(unknown)}"


def test_the_pages_name_commands_at_all():
    """The scan above is not vacuous: the README shows commands and magic options."""
    commands = {c for c, _ in named_commands(README.read_text())}
    assert {"list", "compare", "check", "export", "report", "run"} <= commands
    assert {"-n", "--capture"} <= set(named_magic_options(README.read_text()))
    assert {"--check", "--store", "--match", "--trace", "--no-live"} <= magic_table_options(README.read_text())


def runnable_blocks(text: str) -> list[str]:
    return [body for info, body in FENCE.findall(text) if info.split() == ["python", "runnable"]]


def test_some_blocks_are_runnable():
    assert runnable_blocks(README.read_text())


@pytest.mark.timeout(180)
@pytest.mark.parametrize("page", [p for p in PAGES if runnable_blocks(p.read_text())], ids=_name)
def test_runnable_blocks_run(page, tmp_path):
    script = "\n\n".join(runnable_blocks(page.read_text()))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "GPUPROF_SOURCE": "sim"}
    env.pop("GPUPROF_STORE", None)
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=170)
    assert done.returncode == 0, f"{_name(page)}: a runnable block failed:\n{done.stdout}\n{done.stderr}"


def api_rows() -> list[tuple[str, str]]:
    """(name, documented parameters) for each `gpuprof_jupyter.NAME(...)` in the README's API table."""
    section = README.read_text().split("### Python API", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `gpuprof_jupyter.")]
    return [(m.group(1), m.group(2)) for row in rows
            for m in re.finditer(r"`gpuprof_jupyter\.(\w+)\(([^`]*)\)`", row.split(" | ")[0])]


def test_the_api_table_lists_the_public_calls():
    assert {name for name, _ in api_rows()} >= {"experiments", "load", "last", "profile", "step", "track", "phase",
                                              "log", "compare", "diagnose", "check", "export_pipeline", "report",
                                              "gpu_available"}


@pytest.mark.parametrize("name, documented", api_rows(), ids=lambda v: v if isinstance(v, str) and "(" not in v else None)
def test_api_table_signature_is_the_real_one(name, documented):
    real = inspect.signature(getattr(gp, name)).parameters
    args = ast.parse(f"def f({documented}): pass").body[0].args
    kinds = [(a, inspect.Parameter.POSITIONAL_OR_KEYWORD) for a in args.args]
    kinds += [(a, inspect.Parameter.KEYWORD_ONLY) for a in args.kwonlyargs]
    kinds += [(a, inspect.Parameter.VAR_POSITIONAL) for a in [args.vararg] if a]
    kinds += [(a, inspect.Parameter.VAR_KEYWORD) for a in [args.kwarg] if a]
    defaults = dict(zip([a.arg for a in args.args][len(args.args) - len(args.defaults):], args.defaults))
    defaults.update({a.arg: d for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None})
    for arg, kind in kinds:
        assert arg.arg in real, f"gpuprof_jupyter.{name}() has no parameter {arg.arg!r}"
        assert real[arg.arg].kind == kind, f"gpuprof_jupyter.{name}(): {arg.arg!r} is {real[arg.arg].kind}, not {kind}"
        if arg.arg in defaults:
            assert real[arg.arg].default == ast.literal_eval(defaults[arg.arg]), \
                f"gpuprof_jupyter.{name}(): {arg.arg!r} defaults to {real[arg.arg].default!r}"
    documented_names = {a.arg for a, _ in kinds}
    for param in real.values():  # what the table leaves out must be optional
        assert param.name in documented_names or param.default is not param.empty or param.kind in (
            param.VAR_POSITIONAL, param.VAR_KEYWORD), f"gpuprof_jupyter.{name}() requires {param.name!r}, not in the table"


def test_the_tune_signature_in_the_table_is_complete():
    """tune() is called with its keywords spelled out (no **options catch-all documents them):
    the table names every parameter it has."""
    documented, = [params for name, params in api_rows() if name == "tune"]
    args = ast.parse(f"def f({documented}): pass").body[0].args
    named = [a.arg for a in args.args + args.kwonlyargs + [args.vararg, args.kwarg] if a]
    assert sorted(named) == sorted(inspect.signature(gp.tune).parameters), documented


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_relative_links_point_to_files(page):
    for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
        path = target.split("#", 1)[0]
        if not path or re.match(r"[a-z]+:", path):
            continue
        assert (page.parent / path).exists(), f"{_name(page)} links to {target}, which does not exist"


def test_server_settings_table_is_the_traitlets_help():
    """The table is the traitlets' help; the page names the command whose --help-all prints
    that help (tests/test_server_app.py runs it)."""
    text = (ROOT / "docs" / "jupyterlab.md").read_text()
    table = text.split("<!-- server-settings:start -->\n", 1)[1].split("<!-- server-settings:end -->", 1)[0]
    assert table == settings_markdown(), "docs/jupyterlab.md: regenerate with python -m gpuprof_jupyter.server --markdown"
    for name in ("poll_interval_s", "history_s", "idle_stop_s", "devices_enabled", "default_store", "max_points"):
        assert f"`c.GPUProfiler.{name}`" in table
    assert any("jupyter gpuprof-server --help-all" in code for code in code_texts(text.split("## Settings", 1)[1]))


def named_jupyter_commands(text: str) -> list[str]:
    """The `jupyter gpuprof-...` subcommands in the page's code (jupyter runs the console script
    `jupyter-gpuprof-...`)."""
    return [name for code in code_texts(text) for name in re.findall(r"(?<![\w-])jupyter[ -](gpuprof[\w-]*)", code)]


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_every_jupyter_gpuprof_command_and_server_setting_exists(page):
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    for name in named_jupyter_commands(page.read_text()):
        assert f"jupyter-{name}" in scripts, f"{_name(page)}: `jupyter {name}` is no console script of pyproject.toml"
    settings = GPUProfiler.class_traits(config=True)
    for code in code_texts(page.read_text()):
        for name in re.findall(r"GPUProfiler\.(\w+)", code):
            assert name in settings, f"{_name(page)}: GPUProfiler has no setting {name!r}"


def test_the_pages_name_the_server_command():
    assert "gpuprof-server" in named_jupyter_commands((ROOT / "docs" / "jupyterlab.md").read_text())


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_no_private_jargon(page):
    text = page.read_text()
    for word in ("the seeds", "Workflow-v6", "Workflow v6"):
        assert word not in text, f"{_name(page)} says {word!r}: say what it means"


def test_readme_is_a_guide_not_a_manual():
    assert len(README.read_text().splitlines()) <= 240
