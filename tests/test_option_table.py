"""One table of options (runtime/option_table.py): every front end's options are exactly the
table's, with its names, defaults and help; a run's options reach every front end that starts
a run (``gpuprof run`` took no --devices, --alert or --match before); ``Begin`` carries the
run's options record."""

from __future__ import annotations

import argparse
import inspect
import sys

import pytest

import gpuprof_jupyter as gp
from gpuprof_jupyter.cli import build_parser, main
from gpuprof_jupyter.core.protocol import Begin, Malformed, Request, check
from gpuprof_jupyter.notebook.magic import GpuProfileMagics, parse_line
from gpuprof_jupyter.runtime import option_table as table
from gpuprof_jupyter.runtime.profile import OPTIONS, profile
from gpuprof_jupyter.runtime.run_options import FIELDS, RunOptions


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def _parser(front: str) -> argparse.ArgumentParser:
    return GpuProfileMagics.gpuprofile.parser if front == table.MAGIC else _subparsers()[front]


def _flags(parser: argparse.ArgumentParser) -> dict[tuple[str, ...], argparse.Action]:
    """The parser's options (not its positionals, not -h) by their sorted spellings."""
    return {tuple(sorted(a.option_strings)): a for a in parser._actions
            if a.option_strings and not isinstance(a, argparse._HelpAction)}


# What users and tests typed before the table (issue 35): every flag, alias and default is kept.
BEFORE = {
    table.MAGIC: {("--name", "-n"): None, ("--interval",): None, ("--devices",): None, ("--param",): [],
                  ("--capture",): None, ("--source",): None, ("--match",): None, ("--store",): None,
                  ("--no-live",): False, ("--quiet",): False, ("--check",): [], ("--fail-on-check",): False,
                  ("--alert",): [], ("--trace",): None, ("--memory-history",): False, ("--stuck-after",): None,
                  ("--tune",): [],
                  ("--trial-steps",): None, ("--budget",): None, ("--objective",): None, ("--baseline",): None,
                  ("--all",): False, ("--port",): None, ("--addr",): None, ("--no-auth",): False,
                  ("--keep-after",): None},
    table.RUN: {("--store",): None, ("--price-kwh",): None, ("--price-gpu-hour",): None, ("--name", "-n"): None,
                ("--check",): [], ("--pipeline",): None, ("--accept-unjudged",): False, ("--source",): None,
                ("--interval",): None, ("--param",): [], ("--trace",): None, ("--trace-ranks",): "0",
                ("--memory-history",): False, ("--stuck-after",): None, ("--on-stuck",): "wait"},
    table.CHECK: {("--store",): None, ("--price-kwh",): None, ("--price-gpu-hour",): None, ("--rule",): [],
                  ("--pipeline",): None, ("--accept-unjudged",): False},
    table.COMPARE: {("--store",): None, ("--price-kwh",): None, ("--price-gpu-hour",): None, ("--all",): False,
                    ("--baseline",): None},
}


@pytest.mark.parametrize("front", table.PARSED)
def test_each_parsed_front_end_takes_exactly_the_tables_options(front):
    parsed = _flags(_parser(front))
    declared = {tuple(sorted(o.flags)): o for o in table.options_of(front) if o.flags}
    assert sorted(parsed) == sorted(declared)
    for flags, option in declared.items():
        action, wanted = parsed[flags], option.argparse_kwargs()
        assert action.dest == option.dest and action.help == option.help, flags
        assert action.default == wanted.get("default", False) and action.type == wanted.get("type"), flags
        const = True if option.kind == table.SWITCH else wanted.get("const")
        assert action.metavar == wanted.get("metavar") and action.const == const, flags


@pytest.mark.parametrize("front", sorted(BEFORE))
def test_every_flag_alias_and_default_of_before_is_kept(front):
    parsed = _flags(_parser(front))
    for flags, default in BEFORE[front].items():
        assert flags in parsed, f"{front} lost {flags}"
        assert parsed[flags].default == default, flags


def test_gpuprof_run_takes_every_run_option_the_magic_takes():
    run = _flags(_parser(table.RUN))
    for flags in [("--devices",), ("--alert",), ("--match",)]:
        assert flags in run
    magic_run_options = {o.name for o in table.options_of(table.MAGIC) if o.record}
    assert magic_run_options == {o.name for o in table.options_of(table.RUN) if o.record} == set(FIELDS)


@pytest.mark.parametrize("front", sorted(table.EVERY_COMMAND - set(table.PARSED)))
def test_every_command_shares_the_tables_store_and_prices(front):
    parsed = _flags(_subparsers()[front])
    for option in table.options_of(front):
        assert parsed[tuple(sorted(option.flags))].help == option.help


def test_the_keyword_front_ends_take_exactly_the_tables_keywords():
    own = {name: p.default for name, p in inspect.signature(profile).parameters.items() if p.kind != p.VAR_KEYWORD}
    profile_keywords = set(own) | (set(OPTIONS) - {"observers", "child_environ"})
    assert profile_keywords == set(table.keywords(table.PROFILE))
    assert all(table.BY_NAME[name].api_default == default for name, default in own.items())
    tune = inspect.signature(gp.tune).parameters
    keywords = [name for name, p in tune.items() if p.kind == p.KEYWORD_ONLY and name not in ("namespace", "on_plan")]
    assert keywords == list(table.keywords(table.TUNE))
    assert all(tune[name].default == table.BY_NAME[name].api_default for name in keywords)
    assert tune["budget"].default == "5min" and tune["objective"].default == "throughput"  # as before


def test_a_runs_options_are_the_records_fields_and_given_picks_them(tmp_path):
    assert {o.name for o in table.OPTIONS if o.record} == set(FIELDS)
    args = parse_line(f'-n x --check "sm_util > 1" --param a=1 --alert "sm_util < 50 for >30%" --store {tmp_path} '
                      "--devices 0 --no-live")
    given = table.given(args, table.MAGIC)
    assert set(given) == set(FIELDS)
    assert given["checks"] == ["sm_util > 1"] and given["params"] == ["a=1"] and given["devices"] == "0"
    options = RunOptions.resolve(**given)
    assert options.name == "x" and options.devices == [0] and options.params == {"a": 1}


@pytest.mark.parametrize("extra, message", [
    (["--devices", "0,a"], "--devices takes visible GPU indices"),
    (["--alert", "accuracy >= 0.9"], "accuracy"),
    (["--source", "sim", "--match", 'job="x"'], "--match needs --source prometheus="),
])
def test_gpuprof_run_checks_the_flags_it_did_not_take(tmp_path, capsys, extra, message):
    """Before anything starts: the same check and message as the magic's (RunOptions)."""
    assert main(["run", "--store", str(tmp_path / "store"), *extra, "--", sys.executable, "-c", "pass"]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "store").exists() or not list((tmp_path / "store").glob("*/meta.json"))


def test_begin_carries_the_options_record_and_a_record_without_them_is_malformed(tmp_path):
    options = RunOptions("x", interval=0.2, store=tmp_path, source="sim", checks=["sm_util > 1"])
    begin = Begin(token="t", t0=1.0, options=options, meta={})
    assert check(Request(1, begin), (Request,)).body.options is options
    assert not {"interval", "store", "source", "devices", "checks", "alerts"} & {
        f for f in Begin.__dataclass_fields__ if f != "options"}
    with pytest.raises(Malformed, match="Begin.options"):
        check(Request(2, Begin(token="t", t0=1.0, options={"interval": 0.2}, meta={})), (Request,))


@pytest.mark.process
def test_gpuprof_run_profiles_the_devices_chosen_and_keeps_its_alerts(store_dir, capsys):
    script = ("import time, gpuprof_jupyter as gp\n"  # steps of 0.15 s, as the magic's alert test has
              "for _ in range(16):\n    time.sleep(0.1)\n    gp.step(32)\n")
    rc = main(["run", "--store", str(store_dir), "--source", "sim:compute-bound:2", "--devices", "1",
               "--interval", "0.05", "-n", "one-gpu", "--alert", "sm_util > 1 for >10% within step",
               "--", sys.executable, "-c", script])
    out = capsys.readouterr().out
    assert rc == 0, out
    meta = gp.load("one-gpu", store=store_dir).meta
    assert [d["key"] for d in meta.devices if d.get("kind") == "gpu"] == ["gpu1"]
    assert meta.alerts and meta.alerts[0]["rule"] == "sm_util > 1 for >10% within step"
    assert "alert at t=" in out and "[sm_util > 1 for >10% within step]" in out
