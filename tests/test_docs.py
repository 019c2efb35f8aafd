"""The README and docs/ say only what is true, as far as a test can tell (issue 22 part 1).

* every `gpuprof` command and option named in code they show exists (read from the commands'
  own help), and so does every `%gpuprofile` option;
* every code block marked ```` ```python runnable ```` runs (one process per file, blocks in
  order, in an empty directory, with the simulated GPU) and prints what the ```` ```text prints ````
  block after it says (doctest's matching: ``...`` for figures that vary);
* every API call in the README's table exists with the documented signature;
* every relative link points to a file; the server settings table is the traitlets' help;
* every `jupyter gpuprof-server`-like command is a console script of pyproject.toml, and every
  `GPUProfiler.<name>` a setting.
"""

from __future__ import annotations

import ast
import doctest
import inspect
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import gpuprof_jupyter as gp
from benchmarks.__main__ import (
    ORDER,
    figure_row,
    figure_text,
    figure_value,
    saved_figures,
)
from gpuprof_jupyter.cli import build_parser
from gpuprof_jupyter.notebook.magic import GpuProfileMagics
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
    return [code for code, _ in runnable_blocks_and_outputs(text)]


def runnable_blocks_and_outputs(text: str) -> list[tuple[str, str | None]]:
    """Each ```` ```python runnable ```` block with what the page says it prints: the next block
    when it is a ```` ```text prints ```` one (``...`` stands for figures that vary), else None."""
    fences = FENCE.findall(text)
    out = []
    for i, (info, body) in enumerate(fences):
        if info.split() == ["python", "runnable"]:
            following = fences[i + 1] if i + 1 < len(fences) else ("", "")
            out.append((body, following[1] if following[0].split() == ["text", "prints"] else None))
    return out


_BLOCK_END = "<<gpuprof docs: end of block>>"


def run_page_blocks(text: str, cwd: Path) -> list[str]:
    """Run a page's runnable blocks in order in one process (simulated GPU, an empty folder);
    what went wrong: a failure, or a block whose output differs from its ```` ```text prints ````."""
    blocks = runnable_blocks_and_outputs(text)
    script = "\n\n".join(f"{code}\nprint({_BLOCK_END!r}, flush=True)" for code, _ in blocks)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "GPUPROF_SOURCE": "sim"}
    env.pop("GPUPROF_STORE", None)
    done = subprocess.run([sys.executable, "-c", script], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=170)
    if done.returncode != 0:
        return [f"a runnable block failed:\n{done.stdout}\n{done.stderr}"]
    checker, flags = doctest.OutputChecker(), doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    wrong = []
    for (code, want), got in zip(blocks, done.stdout.split(_BLOCK_END + "\n")):
        if want is not None and not checker.check_output(want, got, flags):
            wrong.append(f"the block ending {code.strip().splitlines()[-1]!r} printed:\n{got}\nthe page says:\n{want}")
    return wrong


def test_some_blocks_are_runnable():
    assert runnable_blocks(README.read_text())
    assert all(want for _, want in runnable_blocks_and_outputs(README.read_text())), "the README says what it prints"


@pytest.mark.process
@pytest.mark.timeout(180)
@pytest.mark.parametrize("page", [p for p in PAGES if runnable_blocks(p.read_text())], ids=_name)
def test_runnable_blocks_run_and_print_what_the_page_says(page, tmp_path):
    wrong = run_page_blocks(page.read_text(), tmp_path)
    assert not wrong, f"{_name(page)}: " + "\n".join(wrong)


@pytest.mark.process
def test_a_block_printing_other_than_its_page_says_is_caught(tmp_path):
    page = ("```python runnable\nprint('waited for data only 0 %')\n```\n\n"
            "```text prints\nwaited for data ... of the time\n```\n")
    assert len(run_page_blocks(page, tmp_path)) == 1
    assert run_page_blocks(page.replace("only 0 %", "74 % of the time"), tmp_path) == []


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


_SESSION = ["%load_ext gpuprof_jupyter",
            "%%gpuprofile -n first --source sim --interval 0.05\nimport time\nfor _ in range(10): time.sleep(0.02)",
            "import gpuprof_jupyter; gpuprof_jupyter.report('first', path='report.html')",
            "%gpuprofile serve --port 0", "%gpuprofile serve stop"]


@pytest.mark.process
@pytest.mark.timeout(180)
def test_the_uninstall_note_names_every_file_written_outside_the_store(tmp_path):
    """A session in IPython (a profiled cell, a report, the exporter served and stopped) with a
    fresh home: every file it leaves outside the store and the files asked for is named."""
    home, work, temp = tmp_path / "home", tmp_path / "work", tmp_path / "tmp"
    for folder in (home, work, temp):
        folder.mkdir()
    script = ("from IPython.core.interactiveshell import InteractiveShell\nshell = InteractiveShell.instance()\n"
              f"for cell in {_SESSION!r}:\n    assert shell.run_cell(cell).success, cell\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUPROF_", "XDG_"))}
    env.update(HOME=str(home), TMPDIR=str(temp), PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", script], cwd=work, env=env, capture_output=True, text=True,
                          timeout=170)
    assert done.returncode == 0, done.stdout + done.stderr
    note = next(p for p in README.read_text().split("\n\n") if p.startswith("Uninstall:"))
    named = [c for c in re.findall(r"`([^`]+)`", note) if c.startswith("~/")]
    left = ["~/" + str(p.relative_to(home)) for p in home.rglob("*") if p.is_file()
            and p.relative_to(home).parts[0] != ".ipython"]  # IPython's own history
    assert left and all(any(f.startswith(n) for n in named) for f in left), (left, named)
    assert all(any(f.startswith(n) for f in left) for n in named), f"named but never written: {named} {left}"
    assert sorted(p.name for p in work.iterdir()) == [".gpuprof", "report.html"]  # the store, what was asked for
    assert not list(temp.iterdir()), "temporary files left behind"


# -- figures from the benchmark table -----------------------------------------------------------
# A page cites a row of the table with a reference link named after it, `[8.9 ms][trace.stop_ms]`,
# defined once on the page: `[trace.stop_ms]: ../benchmarks/README.md#results`. The text is the
# row's value as the table prints it, or words of the row's note ("2.39 ms" of "step p50 2.39 ms
# inside vs 2.28 ms outside").
CITATION = re.compile(r"\[([^\]]+)\]\[([a-z_]+\.[a-z0-9_]+)\]")
CITED_ROW = re.compile(r"^\[([a-z_]+\.[a-z0-9_]+)\]:\s*(\S+)", re.MULTILINE)
_FIGURE = re.compile(r"(?<![\w.])\d[\d,.]*(?:-\d[\d,.]*)?\s?(?:x|%|ms|s|us|µs|KB|MB|GB|B|KB/s|/s)(?![\w/])")


def bench_figures() -> dict[str, dict]:
    """Every figure of benchmarks/results/*.json by ``benchmark.id``, as the table shows them."""
    return {f"{name}.{f['id']}": f for name in ORDER for f in saved_figures(name)}


def wrong_citations(page: Path, text: str, figures: dict[str, dict]) -> list[str]:
    """Citations whose row does not exist, whose link is not the table, or whose figure is not the table's."""
    text = re.sub(r"`[^`\n]*`", "", text)  # a citation shown as code is an example, not a citation
    targets, wrong = dict(CITED_ROW.findall(text)), []
    for key, target in targets.items():
        path, _, anchor = target.partition("#")
        if (page.parent / path).resolve() != ROOT / "benchmarks" / "README.md" or anchor != "results":
            wrong.append(f"[{key}]: {target} is not benchmarks/README.md#results")
    for shown, key in CITATION.findall(text):
        f = figures.get(key)
        if key not in targets:
            wrong.append(f"{shown!r}: [{key}] is not defined on the page")
        elif f is None:
            wrong.append(f"{shown!r}: the table has no row {key}")
        elif shown != figure_value(f) and not re.search(rf"(?<![\w.])(?<!\d,){re.escape(shown)}(?![\w.]|,\d)", figure_text(f)):
            wrong.append(f"{shown!r} cites {key}, whose row says {figure_value(f)!r} ({figure_text(f)})")
    return wrong


def uncited_table_figures(text: str) -> list[str]:
    """In a table with a "measured" column, a measured figure that is not a citation (rows whose
    "run" column names another run than the table are left alone)."""
    uncited = []
    for block in re.split(r"\n(?!\|)", text):
        rows = [[c.strip() for c in line.strip("|").split("|")] for line in block.splitlines() if line.startswith("|")]
        if len(rows) < 3 or "measured" not in rows[0]:
            continue
        measured, run = rows[0].index("measured"), rows[0].index("run") if "run" in rows[0] else None
        for row in rows[2:]:
            if run is not None and "the table" not in row[run]:
                continue
            uncited += [f"{row[0][:60]}: {m}" for m in _FIGURE.findall(CITATION.sub("", row[measured]))]
    return uncited


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_figures_from_the_benchmark_table_are_cited_and_the_tables(page):
    text = page.read_text()
    assert not wrong_citations(page, text, bench_figures())
    assert not uncited_table_figures(text), "cite the row: [value][bench.id], [bench.id]: ../benchmarks/README.md#results"


def test_a_cited_figure_changed_by_hand_fails():
    page = ROOT / "docs" / "trace.md"
    text = page.read_text()
    shown, key = CITATION.search(text).groups()
    assert key == "trace.window_slowdown" and not wrong_citations(page, text, bench_figures())
    changed = text.replace(f"[{shown}][{key}]", "[" + re.sub(r"\d", lambda d: str((int(d.group()) + 1) % 10), shown)
                           + f"][{key}]", 1)
    assert len(wrong_citations(page, changed, bench_figures())) == 1
    assert "no row trace.stop_ns" in wrong_citations(page, text.replace("[trace.stop_ms]", "[trace.stop_ns]"),
                                                        bench_figures())[0]
    assert "not defined" in wrong_citations(page, CITED_ROW.sub("", text), bench_figures())[0]
    table = "| what | measured | target | run |\n| --- | --- | --- | --- |\n| stop | 8.9 ms | | the table |\n"
    assert uncited_table_figures(table) == ["stop: 8.9 ms"]
    assert uncited_table_figures(table.replace("8.9 ms", "[8.9 ms][trace.stop_ms]")) == []


def test_the_benchmark_table_is_generated_from_the_results():
    """benchmarks/README.md's rows are the JSON's, as `python -m benchmarks` writes them (no hand edits)."""
    table = (ROOT / "benchmarks" / "README.md").read_text()
    rows = [line for line in table.splitlines() if line.split("|")[1:2] and line.split("|")[1].strip() in ORDER]
    assert rows == [figure_row(name, f) for name in ORDER for f in saved_figures(name)]


@pytest.mark.process
def test_the_tune_pages_pipeline_comment_is_what_export_writes(tmp_path):
    """docs/tune.md's `pipeline.yaml` line, written by the code: a baseline and a winner saved with
    the doc's settings, the doc's figures as the kept trial's evidence (runtime/tune/driver.py)."""
    import math
    import time

    from gpuprof_jupyter.core.analysis.gain import Gain
    from gpuprof_jupyter.runtime.tune.driver import why_lines
    from gpuprof_jupyter.runtime.tune.measure import TrialFigures
    from gpuprof_jupyter.runtime.tune.search import TuneResult
    from gpuprof_jupyter.runtime.tune.spec import make_spec
    from gpuprof_jupyter.runtime.tune.trial import Trial
    from gpuprof_jupyter.export.pipeline import export_pipeline

    [line] = [x for info, body in FENCE.findall((ROOT / "docs" / "tune.md").read_text()) if info == "yaml"
              for x in body.splitlines() if "throughput" in x]
    key = line.split(":", 1)[0].strip()
    *numbers, against, wait0, wait1 = re.findall(
        r"(\d+) -> (\d+): \+(\d+) % throughput \(95 % CI \+(\d+) %\.\.\+(\d+) %\) against (\S+), data wait (\d+) % -> (\d+) %",
        line)[0]
    old, new, gain, lo, hi, wait0, wait1 = (float(n) for n in (*numbers, wait0, wait1))
    runs = []
    for name, setting in (("base", int(old)), ("winner", int(new))):
        with gp.profile(name=name, source="sim", interval=0.05, store=tmp_path / "store", params={key: setting}):
            for _ in range(3):
                time.sleep(0.02)
                gp.step(n_samples=4)
        runs.append(gp.load(name, store=tmp_path / "store"))
    baseline = Trial(1, "baseline", {}, {}, verdict="baseline", figures=TrialFigures(data_wait_frac=wait0 / 100))
    kept = Trial(3, f"{key} {old:.0f} -> {new:.0f}", {key: int(new)}, {key: (int(old), int(new))}, verdict="kept",
                 gain=Gain("throughput", gain / 100, lo / 100, hi / 100), against=against,
                 figures=TrialFigures(data_wait_frac=wait1 / 100))
    result = TuneResult(make_spec(), "tune", trials=[baseline, kept], noise=math.nan)
    export_pipeline(runs[1], tmp_path / "pipeline.yaml", "train", baseline=runs[0], store=tmp_path / "store",
                    evidence=why_lines(result))
    written = [x.strip() for x in (tmp_path / "pipeline.yaml").read_text().splitlines() if x.strip().startswith(key)]
    assert written == [line.strip()]


def test_a_new_benchmark_run_rewrites_the_values_pages_cite(tmp_path):
    from benchmarks.__main__ import refresh_citations

    page = tmp_path / "page.md"
    text = ("stop [8.9 ms][trace.stop_ms], steps of [2.39 ms][trace.window_slowdown], [1.05 x][trace.window_slowdown]\n\n"
            "[trace.stop_ms]: ../benchmarks/README.md#results\n")
    page.write_text(text)
    before = {"trace.stop_ms": "8.9 ms", "trace.window_slowdown": "1.05 x"}
    assert refresh_citations([page], before, before) == []
    assert refresh_citations([page], before, {**before, "trace.stop_ms": "9.4 ms", "trace.window_slowdown": "1.1 x"})
    assert page.read_text() == text.replace("[8.9 ms]", "[9.4 ms]").replace("[1.05 x]", "[1.1 x]")  # the note's words stay
