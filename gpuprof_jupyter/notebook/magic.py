"""The IPython magic: ``%%gpuprofile`` profiles a cell, ``%gpuprofile`` manages experiments.

Runs in the kernel.

This module holds the arguments (built from the table of options, ``runtime/option_table.py``;
parsed here, quotes stripped in one place) and the line commands. IPython itself runs a profiled cell (``notebook.profiled_cell``): the header becomes a
start call, the cell's end stops the session, so the cell behaves exactly as without the
magic (``await``, last value shown, tracebacks). On an exception or KeyboardInterrupt the
experiment is saved with status ``error``/``interrupted`` and the user's exception stands.
"""

from __future__ import annotations

import shlex

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments

from gpuprof_jupyter.core.store.directory import Store
from gpuprof_jupyter.runtime.option_table import MAGIC, options_of

LINE_COMMANDS = ("list", "show", "delete", "status", "compare", "serve", "watch", "start", "session")


def split_args(line: str) -> list[str]:
    """The magic's arguments as a POSIX shell splits them: one pair of matching quotes is
    stripped from every value (``-n "amp run"`` -> ``amp run``, ``--param note="a b"`` ->
    ``note=a b``). IPython's own split keeps quotes (docs/facts.md, "IPython magics"); this is the one place
    they go. Backslashes are kept as typed (Windows paths)."""
    lexer = shlex.shlex(line, posix=True)
    lexer.whitespace_split, lexer.escape, lexer.commenters = True, "", ""
    try:
        return list(lexer)
    except ValueError as exc:  # "No closing quotation"
        raise UsageError(f"%%gpuprofile {line.strip()}: {exc}") from None


def table_arguments(func):
    """The magic's options from the table (``runtime/option_table.py``), as IPython's
    ``@argument`` decorators stacked in the table's order (IPython builds the parser from them)."""
    for option in reversed(options_of(MAGIC)):
        func = argument(*option.flags, **option.argparse_kwargs())(func)
    return func


@magics_class
class GpuProfileMagics(Magics):
    @magic_arguments()
    @table_arguments
    @argument("command", nargs="*",
              help="Line form only: list | show NAME | delete NAME | status | compare [NAMES...] | "
                   "serve [stop] | start [OPTIONS] | session [on|off] [--keep-after 10s]")
    @line_cell_magic
    def gpuprofile(self, line: str, cell: str | None = None):
        """Profile a cell's GPU and host activity, or manage saved experiments.

        Cell:  %%gpuprofile [-n NAME] [--interval S] [--devices 0,1] [--param K=V ...]
                            [--capture VAR,...] [--source nvml|host|sim[:SCENARIO]|prometheus=URL [--match SEL]]
                            [--store DIR] [--no-live] [--quiet]
                            [--check RULE ...] [--fail-on-check] [--alert RULE ...]
                            [--trace steps=A:B|seconds=S:T|on-alert[=N]] [--memory-history] [--stuck-after S|off]
                            [--tune [VAR.FIELD=V1,V2] ...] [--trial-steps N] [--budget 5min]
                            [--objective throughput|energy_per_sample|time]
        Line:  %gpuprofile list | show NAME | delete NAME | status | compare [NAMES... | --all] [--baseline NAME]
               %gpuprofile serve [--port 9464] [--addr 127.0.0.1] [--no-auth] | serve stop   (Prometheus /metrics)
               %gpuprofile start [OPTIONS]   (profile the rest of this cell: what the header does)
               %gpuprofile session [on | off] [--keep-after 10s]   (the kernel's whole session, cell by cell)

        Values are split as a shell splits them: quote a value with spaces, -n "amp run".
        The cell runs exactly as without the magic (await, !cmd, %magics, the last value).
        """
        __tracebackhide__ = True  # the user's traceback shows their cell, not this magic
        if cell is None:
            return self._line_command(parse_line(line))
        args = parse_line(line)
        if args.tune:  # --tune: the magic runs the cell's trials itself (the header was not rewritten)
            from gpuprof_jupyter.notebook.tune_view import run_tune_cell

            return run_tune_cell(self.shell, args, cell)
        from gpuprof_jupyter.notebook.profiled_cell import run_directly

        return run_directly(self.shell, args, cell)

    # -- %gpuprofile COMMAND ----------------------------------------------------------------
    def _line_command(self, args):
        store = Store(args.store) if args.store else Store()
        if not args.command:
            raise UsageError(f"%gpuprofile needs a command: {' | '.join(LINE_COMMANDS)} (or use %%gpuprofile on a cell)")
        command, rest = args.command[0], args.command[1:]
        if command == "start":  # the rewritten %%gpuprofile header: profile the rest of this cell
            from gpuprof_jupyter.notebook.profiled_cell import start

            args.command = rest
            return start(args)
        if command == "list":
            from gpuprof_jupyter.api import experiments

            return experiments(store)
        if command in ("show", "delete"):
            if len(rest) != 1:
                raise UsageError(f"%gpuprofile {command} takes one experiment name or id")
            try:
                if command == "delete":
                    meta = store.delete(rest[0])
                    print(f"deleted experiment {meta.name!r} (id {meta.id}) from {store.root}")
                    return None
                from gpuprof_jupyter.api import load

                experiment = load(rest[0], store)  # a multi-node job's id too
            except (KeyError, PermissionError) as exc:  # PermissionError: a store not ours (docs/store.md)
                raise UsageError(exc.args[0] if isinstance(exc, KeyError) else str(exc)) from None
            from gpuprof_jupyter.notebook.static_ending import show_static_ending

            show_static_ending(experiment)
            return None
        if command == "watch":  # a running multi-node job, every rank (docs/multi-node.md)
            if len(rest) != 1:
                raise UsageError("%gpuprofile watch takes one job id (torchrun's --rdzv-id, Slurm's job id)")
            from gpuprof_jupyter.notebook.watch import watch

            try:  # --source prometheus=URL [--match ...]: each node's GPUs beside the ranks
                return watch(rest[0], store, source=args.source, match=args.match)
            except ValueError as exc:
                raise UsageError(str(exc)) from None
        if command == "status":
            from gpuprof_jupyter.notebook.status import status_text

            print(status_text(store))
            return None
        if command == "serve":
            return _serve(args, rest)
        if command == "session":
            from gpuprof_jupyter.notebook.session_view import session_command

            return session_command(rest, args.keep_after)
        if command == "compare":
            from gpuprof_jupyter.notebook.compare_widget import compare

            try:
                return compare(*rest, all=args.all, baseline=args.baseline, store=store, all_hint="%gpuprofile compare --all")
            except (KeyError, LookupError, ValueError) as exc:
                raise UsageError(str(exc.args[0] if exc.args else exc)) from None
        raise UsageError(f"unknown %gpuprofile command {command!r}: use {' | '.join(LINE_COMMANDS)}")


def _serve(args, rest: list[str]) -> None:
    """``%gpuprofile serve [--port P] [--addr A] [--no-auth]`` or ``serve stop``: the exporter's endpoint."""
    from gpuprof_jupyter.core.config import ConfigError
    from gpuprof_jupyter.runtime import exporter_control

    if rest == ["stop"]:
        print(exporter_control.stop())
        return None
    if rest:
        raise UsageError(f"%gpuprofile serve takes --port, --addr and --no-auth, or 'stop'; got {' '.join(rest)!r}")
    if args.port is not None and not 0 <= args.port <= 65535:
        raise UsageError(f"--port must be in 0..65535 (0 picks a free one), got {args.port}")
    try:
        port, addr = exporter_control.listen_settings(args.port, args.addr)
        print(exporter_control.serve(port, addr, auth=not args.no_auth))
    except (ConfigError, exporter_control.ExporterBindError, exporter_control.ExporterTokenError) as exc:
        raise UsageError(str(exc)) from None
    return None


def parse_line(line: str):
    """The magic's arguments (quotes stripped once, ``split_args``); UsageError if malformed."""
    return GpuProfileMagics.gpuprofile.parser.parse_args(split_args(line))


def load_ipython_extension(ipython) -> None:
    from gpuprof_jupyter.notebook.status import warm_up

    warm_up()  # the sampler process starts first, in the background: it has the most to do before the first cell
    from gpuprof_jupyter.notebook.session_view import start_session_record

    start_session_record(ipython)  # the session record (docs/session.md): a message to that process, nothing waits

    from gpuprof_jupyter.notebook.profiled_cell import install, preload
    from gpuprof_jupyter.render.summary_html import render_summary_html

    ipython.register_magics(GpuProfileMagics)
    install(ipython)  # the %%gpuprofile header transformer and the cell events
    # An Experiment as a cell's value (``gp.load(...)``) shows its HTML summary; the store knows no HTML.
    ipython.display_formatter.formatters["text/html"].for_type_by_name(
        "gpuprof_jupyter.core.store.experiment", "Experiment", render_summary_html)
    preload()  # and what the first profiled cell imports, on a thread
    try:
        from gpuprof_jupyter.notebook.live import load_bokehjs
    except ImportError:
        return
    load_bokehjs(ipython)


def unload_ipython_extension(ipython) -> None:
    """Undo the cell transformer; ``%reload_ext`` then loads BokehJS into a reloaded page again."""
    from gpuprof_jupyter.notebook.profiled_cell import uninstall

    uninstall(ipython)


__all__ = ["GpuProfileMagics", "load_ipython_extension", "parse_line", "split_args"]
