"""``gpuprof``: the profiler outside notebooks, for CI.

Runs in the ``gpuprof`` command's own process.

    gpuprof run [--name N] [--check RULE ...] [--alert RULE ...] [--accept-unjudged] [--source S [--match SEL]]
                [--devices 0,1] -- python train.py ...   (the options: runtime/option_table.py)
    gpuprof check EXPERIMENT_OR_STORE [--rule RULE ...] [--accept-unjudged]
    gpuprof compare [NAMES ... | --all] [--baseline NAME]
    gpuprof export EXPERIMENT [--path pipeline.yaml] [--step train] [--force]
    gpuprof report [NAMES ...] [-o report.html]
    gpuprof trace EXPERIMENT [-o trace.json]
    gpuprof list   (the text: render/listing_text.py)

Exit status: 0 success; 1 a rule failed (or the profiled script failed: its own status);
2 a usage error (malformed rule, a rule's metric that is neither the profiler's nor logged in the
run, unknown experiment, malformed pipeline file); 3 no rule failed
but one could not be judged (its metric has no reading, the run or its steps are too short:
``--accept-unjudged`` exits 0 then). A gate never passes what it cannot judge (docs/scripts.md);
4 ``gpuprof run --on-stuck stop`` stopped a job that made no step for too long (status ``stuck``,
docs/flight-recorder.md).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from gpuprof_jupyter.runtime.option_table import CHECK, COMPARE, RUN, add_options, given

EXIT_OK, EXIT_RULE_FAILED, EXIT_USAGE, EXIT_CANNOT_JUDGE, EXIT_STUCK = 0, 1, 2, 3, 4
STOP_GRACE_S = 10.0  # --on-stuck stop: SIGTERM, then SIGKILL for what still runs after this


class CliError(Exception):
    """A usage problem: printed as ``gpuprof: error: ...``, exit status 2."""


def _store(path):
    from gpuprof_jupyter.core.store.directory import Store

    return Store(path) if path else Store()


def _load_target(target: str, store_path: str | None):
    """EXPERIMENT_OR_STORE: an experiment directory, a store directory (its latest run), or a name/id."""
    from gpuprof_jupyter.core.store.directory import META_NAME, Store

    path = Path(target)
    if path.is_dir() and (path / META_NAME).is_file():
        store = Store(path.parent)
        return store.load(path.name)
    if path.is_dir() and not store_path:
        from gpuprof_jupyter.api import last

        try:
            return last(Store(path))
        except LookupError:
            raise CliError(f"{target} holds no experiments") from None
    from gpuprof_jupyter.api import load

    try:
        return load(target, _store(store_path))  # a job's id too: its parts as one experiment
    except KeyError as exc:
        raise CliError(exc.args[0]) from None


def _parse_rules(rules):
    """The rules as a run's options hold them (``RunOptions.checks``); CliError for a malformed one."""
    from gpuprof_jupyter.runtime.run_options import RunOptions

    try:
        return RunOptions(checks=rules or []).checks
    except ValueError as exc:
        raise CliError(str(exc)) from None


def gate_status(results, accept_unjudged: bool = False) -> int:
    """The exit status of a gate: 2 when a rule names an unknown metric (a typo is never
    accepted as unjudged), else 1 when a rule failed, else 3 when one could not be judged (0 with
    ``accept_unjudged``), else 0."""
    from gpuprof_jupyter.core.analysis.rules import FAIL

    unknown = [r for r in results if getattr(r, "unknown", False)]
    for result in unknown:
        print(f"gpuprof: error: rule {result.rule!r}: {result.detail}", file=sys.stderr)
    if unknown:
        return EXIT_USAGE
    if any(r.verdict == FAIL for r in results):
        return EXIT_RULE_FAILED
    if any(not r.judged for r in results) and not accept_unjudged:
        return EXIT_CANNOT_JUDGE
    return EXIT_OK


def _print_results(results) -> None:
    from gpuprof_jupyter.render.findings_html import checks_text

    for line in checks_text(results):
        print(line)


def _prices(args):
    prices = {}
    if getattr(args, "price_kwh", None) is not None:
        prices["kwh"] = args.price_kwh
    if getattr(args, "price_gpu_hour", None) is not None:
        prices["gpu_hour"] = args.price_gpu_hour
    return prices or None


def _pipeline_profiling(spec: str) -> tuple[str, dict]:
    """``pipeline.yaml[:STEP]`` -> ("FILE:STEP", the step's ``profiling`` mapping; default step: train)."""
    file, _, step = spec.partition(":") if not Path(spec).exists() else (spec, "", "")
    step = step or "train"
    from ruamel.yaml import YAML, YAMLError

    try:
        doc = YAML(typ="safe").load(Path(file).read_text(encoding="utf-8"))
        steps = doc["workflow"]["steps"]
        found = next(s for s in steps if s.get("name") == step)
        profiling = found.get("profiling") or {}
        if not isinstance(profiling, dict):
            raise TypeError("profiling is not a mapping")
        thresholds = profiling.get("thresholds")
        if isinstance(thresholds, str):  # one rule written without its list
            profiling["thresholds"] = thresholds = [thresholds]
        if thresholds is not None and not (isinstance(thresholds, list) and all(isinstance(t, str) for t in thresholds)):
            raise TypeError("profiling.thresholds is not a list of rules (text)")
        return f"{file}:{step}", profiling
    except (OSError, YAMLError, KeyError, TypeError, StopIteration, AttributeError) as exc:
        raise CliError(f"cannot read rules of step {step!r} from {file}: {type(exc).__name__} {exc}") from None


def _read_gate(spec: str | None) -> tuple[str, dict] | None:
    """``--pipeline pipeline.yaml[:STEP]``, read once: ("FILE:STEP", its profiling), or None."""
    return _pipeline_profiling(spec) if spec else None


def _rules_from_pipeline(gate: tuple[str, dict] | None) -> list[str]:
    """The gate step's profiling.thresholds."""
    return list(gate[1].get("thresholds") or []) if gate else []


def _warn_gate_provenance(experiment, gate: tuple[str, dict] | None) -> None:
    """A gate whose thresholds were set on metrics from other APIs (``profiling.provenance``)
    warns loudly, on stderr, beside its results."""
    if not gate:
        return
    from gpuprof_jupyter.core.analysis.provenance import recorded_provenance_warnings

    where, profiling = gate
    recorded = profiling.get("provenance")
    for warning in recorded_provenance_warnings(experiment.meta, recorded if isinstance(recorded, dict) else {},
                                                where):
        print(f"gpuprof: WARNING: {warning}", file=sys.stderr)


# -- commands -------------------------------------------------------------------------------
def cmd_check(args) -> int:
    from gpuprof_jupyter.core.analysis.rules import evaluate_rules, stored_results

    experiment = _load_target(args.target, args.store)
    gate = _read_gate(args.pipeline)
    rules = list(args.rule) + _rules_from_pipeline(gate)
    if not rules:
        rules = [r.rule for r in stored_results(experiment)]
        if not rules:
            raise CliError(f"no rules: give --rule RULE (experiment {experiment.name!r} recorded none)")
    parsed = _parse_rules(rules)
    results = evaluate_rules(experiment, parsed, prices=_prices(args))
    print(f"experiment {experiment.name!r} (id {experiment.id}, {experiment.status})")
    _warn_gate_provenance(experiment, gate)
    _print_results(results)
    return gate_status(results, args.accept_unjudged)


def cmd_run(args) -> int:
    from gpuprof_jupyter.core.child_channel import MEMORY_HISTORY_ENV, RUN_METRICS_ENV, parse_trace_ranks
    from gpuprof_jupyter.core.job_identity import agent_job
    from gpuprof_jupyter.core.store.experiment import RunStatus
    from gpuprof_jupyter.runtime.run_options import RunOptions
    from gpuprof_jupyter.runtime.session import ProfileSession
    from gpuprof_jupyter.render.alerts_html import alert_text
    from gpuprof_jupyter.render.oom_text import explain_oom
    from gpuprof_jupyter.render.summary_html import render_summary_text

    command = list(args.cmd)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise CliError("gpuprof run needs a command after --, e.g. gpuprof run -- python train.py")
    gate = _read_gate(args.pipeline)
    job = agent_job(os.environ, command)  # a part of a multi-node job (docs/multi-node.md): named after it
    try:
        chosen = given(args, RUN)
        chosen["name"] = chosen.get("name") or (job and job["key"])
        options = RunOptions.resolve(**{**chosen, "checks": [*args.check, *_rules_from_pipeline(gate)]})
        parse_trace_ranks(args.trace_ranks)
        if args.on_stuck == "stop" and options.stuck_after == 0:
            raise ValueError("--on-stuck stop needs the stuck watch: --stuck-after is off")
        on_alert = options.trace is not None and options.trace.kind == "on-alert"
        # --trace steps=A:B and --memory-history are the command's processes' (below), not this one's, which
        # trains nothing; --trace on-alert stays here: the session asks the offending rank (runtime.hooks.alert_trace)
        session = ProfileSession(options.replace(trace=options.trace if on_alert else None, memory_history=False),
                                 cell_source=" ".join(command),
                                 child_environ=False)
        if job is not None:
            session.extra_context = {"job": job}
        session.start()
    except ValueError as exc:
        raise CliError(str(exc)) from None
    trace = None if on_alert else options.trace
    metrics_fd, metrics_path = tempfile.mkstemp(prefix="gpuprof-run-", suffix=".jsonl")
    os.close(metrics_fd)
    env = {**os.environ, RUN_METRICS_ENV: metrics_path, "GPUPROF_RUN_NAME": session.meta.name}
    if options.memory_history and session._directory is not None:  # the command's processes record it
        env[MEMORY_HISTORY_ENV] = str(session._directory)
    if session.children is not None:  # every Python process of the command loads the hooks (docs/scripts.md)
        if trace is not None:
            session.children.trace = (str(trace), args.trace_ranks)
        env.update(session.children.environ(env))
    status, error, returncode = RunStatus.OK, None, 0
    stopped: list[dict] = []  # the stuck episode that stopped the job (--on-stuck stop)
    try:
        try:
            child = subprocess.Popen(command, env=env)
        except OSError as exc:
            status, error, returncode = RunStatus.ERROR, f"could not start {command[0]!r}: {exc}", 127
        else:
            session.on_stuck = lambda record: _on_stuck(record, child, args.on_stuck == "stop", stopped)
            try:
                returncode = child.wait()
            except KeyboardInterrupt:
                child.send_signal(signal.SIGINT)
                try:
                    returncode = child.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    child.kill()
                    returncode = child.wait()
                status, error = RunStatus.INTERRUPTED, "interrupted (Ctrl-C)"
            session.on_stuck = None
            if stopped and status == RunStatus.OK:
                from gpuprof_jupyter.core.analysis.stuck import stuck_message

                status, error = RunStatus.STUCK, f"stopped (--on-stuck stop): {stuck_message(stopped[0])}"
            if status == RunStatus.OK and returncode != 0:
                status, error = RunStatus.ERROR, f"command exited with status {returncode}"
    finally:
        session.meta.user_metrics.update(_read_metrics(metrics_path))
        session.activity.user_metrics.update(session.meta.user_metrics)
        session.meta.context["command"] = command
        experiment = session.stop(status, error)
        Path(metrics_path).unlink(missing_ok=True)
    print(render_summary_text(experiment))
    for alert in experiment.meta.alerts or []:  # --alert: each time one fired, as the live header would show it
        print(f"  {alert_text(alert)}")
    print(f"saved to {session.store.root / experiment.id}")
    explain_oom(experiment)  # died of out-of-memory: why and what fits, on stderr (render.oom_text)
    _warn_gate_provenance(experiment, gate)
    from gpuprof_jupyter.core.analysis.rules import stored_results

    if status == RunStatus.STUCK:
        return EXIT_STUCK
    if returncode != 0:
        return returncode if 0 < returncode < 256 else 1
    if status == RunStatus.INTERRUPTED:
        return 130
    return gate_status(stored_results(experiment), args.accept_unjudged)


def _on_stuck(record: dict, job: subprocess.Popen, stop: bool, stopped: list[dict]) -> None:
    """A stuck episode (the stuck watch's thread, its stacks saved): said on stderr, and with
    ``--on-stuck stop`` the job's whole process tree ended (SIGTERM, then SIGKILL)."""
    from gpuprof_jupyter.core.analysis.stuck import stuck_message

    files = ", ".join(record.get("stacks", {}).values()) or "none could be saved"
    stop = stop and not stopped and job.poll() is None
    print(f"gpuprof: {stuck_message(record)}; stacks: {files}" + ("; stopping the job (--on-stuck stop)" if stop
                                                                 else "; still watching"), file=sys.stderr, flush=True)
    if stop:
        record["stopped"] = True
        stopped.append(record)
        _end_tree(job.pid)


def _end_tree(pid: int) -> None:
    """SIGTERM to a process and all its descendants, SIGKILL to those left after ``STOP_GRACE_S``."""
    import psutil

    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.Error:
        return
    for process in processes:
        try:
            process.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(processes, timeout=STOP_GRACE_S)
    for process in alive:
        try:
            process.kill()
        except psutil.Error:
            pass


def _read_metrics(path: str) -> dict:
    import json

    values: dict = {}
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                try:
                    values.update(json.loads(line))
                except ValueError:
                    continue
    except OSError:
        pass
    return values


def cmd_compare(args) -> int:
    from gpuprof_jupyter.core.analysis.compare import compare_experiments
    from gpuprof_jupyter.api import runs_to_compare
    from gpuprof_jupyter.render.comparison import comparison_text

    try:
        experiments, notes = runs_to_compare(args.names, _store(args.store), all_runs=args.all,
                                             all_hint="gpuprof compare --all")
        comparison = compare_experiments(experiments, args.baseline or 0, prices=_prices(args))
    except (KeyError, LookupError, ValueError) as exc:
        raise CliError(exc.args[0]) from None
    comparison.notes += notes
    print(comparison_text(comparison))
    return EXIT_OK


def cmd_export(args) -> int:
    from gpuprof_jupyter.export.pipeline import ExportRefused, PipelineError, export_pipeline

    experiment = _load_target(args.experiment, args.store)
    baseline = _load_target(args.baseline, args.store) if args.baseline else None
    try:
        result = export_pipeline(experiment, args.path, args.step, baseline=baseline, force=args.force,
                                 prices=_prices(args), captured=args.captured or False)
    except PipelineError as exc:
        raise CliError(str(exc)) from None
    except ExportRefused as exc:
        print(f"gpuprof: refused: {exc}", file=sys.stderr)
        return EXIT_RULE_FAILED
    print(result)
    for key, _old, new, comment in result.changes:
        print(f"  {key}: {new}  # {comment}")
    for warning in result.warnings:
        print(f"gpuprof: WARNING: {warning}", file=sys.stderr)
    return EXIT_OK


def cmd_report(args) -> int:
    from gpuprof_jupyter.export.report import report

    try:
        path = report(*args.names, path=args.output, store=_store(args.store), prices=_prices(args), title=args.title)
    except (KeyError, LookupError) as exc:
        raise CliError(exc.args[0]) from None
    print(f"wrote {path}")
    return EXIT_OK


def cmd_trace(args) -> int:
    from gpuprof_jupyter.export.trace import write_merged_trace
    from gpuprof_jupyter.render.chrome_trace import NoTrace

    experiment = _load_target(args.experiment, args.store)
    try:
        path = write_merged_trace(experiment, args.output)
    except NoTrace as exc:
        raise CliError(exc.args[0]) from None
    info = experiment.meta.trace
    print(f"wrote {path}: {info.get('spec')} ({info.get('status')}, {', '.join(info.get('activities') or [])} "
          "activities) with gpuprof counters; open it in https://ui.perfetto.dev or chrome://tracing")
    return EXIT_OK


def cmd_list(args) -> int:
    """The store's listing rows as a text table under a line naming the store read (no pandas:
    a whole ``gpuprof list`` of 10,000 experiments stays under half a second)."""
    from gpuprof_jupyter.core.listing import JOB_FIELDS, job_rows, store_listing
    from gpuprof_jupyter.render.listing_text import LIST_COLUMNS, listing_text

    store = _store(args.store)
    rows = job_rows(store_listing(store, LIST_COLUMNS + ("source", "simulated") + JOB_FIELDS)).rows  # a job: one row
    sys.stdout.write(listing_text(store.root.absolute(), rows) + "\n")
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    """The commands; the options of a run, a gate and a comparison come from the table
    (``runtime/option_table.py``), as do every command's ``--store`` and ``--price-*``."""
    parser = argparse.ArgumentParser(prog="gpuprof", description="GPU profiler: run, check, compare, export, report, trace.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("run", help="profile a command's whole process tree and save the experiment")
    add_options(p, RUN)
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- COMMAND ARGS...")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("check", help="evaluate rules on a saved experiment; exit 1 when one fails, 3 when one "
                       "cannot be judged")
    p.add_argument("target", metavar="EXPERIMENT_OR_STORE", help="name, id, experiment directory or store directory")
    add_options(p, CHECK)
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("compare", help="compare experiments against a baseline (text)")
    p.add_argument("names", nargs="*", help="names or ids (default: the last two runs; the output says so)")
    add_options(p, COMPARE)
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("export", help="write an experiment's settings into pipeline.yaml")
    add_options(p, "export")
    p.add_argument("experiment", help="name, id or experiment directory")
    p.add_argument("--path", default="pipeline.yaml", help="pipeline file (default: pipeline.yaml)")
    p.add_argument("--step", default="train", help="workflow step to update (default: train)")
    p.add_argument("--baseline", help="what the measured effect is against (default: guessed from the file)")
    p.add_argument("--force", action="store_true", help="export even if the experiment failed a rule")
    p.add_argument("--captured", action="append", metavar="VAR", default=[],
                   help="also write this --capture'd variable's keys (train_config.num_workers ...; repeatable)")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("report", help="write a standalone HTML report")
    add_options(p, "report")
    p.add_argument("names", nargs="*", help="names or ids (default: every experiment)")
    p.add_argument("-o", "--output", default="report.html", help="output file (default: report.html)")
    p.add_argument("--title", help="report title")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("trace", help="write the --trace window as one Chrome/Perfetto trace with our counters")
    add_options(p, "trace")
    p.add_argument("experiment", help="name, id or experiment directory")
    p.add_argument("-o", "--output", default="trace.json", help="output file (default: trace.json)")
    p.set_defaults(func=cmd_trace)

    p = sub.add_parser("list", help="list the store's experiments")
    add_options(p, "list")
    p.set_defaults(func=cmd_list)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except CliError as exc:
        print(f"gpuprof: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ValueError as exc:  # prices and other argument values
        print(f"gpuprof: error: {exc}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
