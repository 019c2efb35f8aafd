"""The IPython magic: ``%%gpuprofile`` profiles a cell, ``%gpuprofile`` manages experiments.

The cell runs in the user namespace as it would without the magic (last expression shown,
variables kept). On an exception or KeyboardInterrupt the experiment is saved with status
``error``/``interrupted``, the summary is shown, and the user's own exception propagates.
"""

from __future__ import annotations

import ast
import shlex

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments
from IPython.display import display

from ..runtime.profile import describe_error, status_for
from ..runtime.session import ProfileSession, current_session
from ..runtime.settings import capture, dataloader_settings, parse_capture, parse_params
from ..sources.select import probe_gpus, validate_source_spec
from ..store.directory import Store

LINE_COMMANDS = ("list", "show", "delete", "status", "compare")


def split_args(line: str) -> list[str]:
    """The magic's arguments as a POSIX shell splits them: one pair of matching quotes is
    stripped from every value (``-n "amp run"`` -> ``amp run``, ``--param note="a b"`` ->
    ``note=a b``). IPython's own split keeps quotes (DESIGN fact 14); this is the one place
    they go. Backslashes are kept as typed (Windows paths)."""
    lexer = shlex.shlex(line, posix=True)
    lexer.whitespace_split, lexer.escape, lexer.commenters = True, "", ""
    try:
        return list(lexer)
    except ValueError as exc:  # "No closing quotation"
        raise UsageError(f"%%gpuprofile {line.strip()}: {exc}") from None


def _parse_devices(text: str | None) -> list[int] | None:
    if not text:
        return None
    try:
        devices = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise UsageError(f"--devices takes visible GPU indices like 0,1; got {text!r}") from None
    if not devices or any(d < 0 for d in devices) or len(set(devices)) != len(devices):
        raise UsageError(f"--devices takes distinct indices >= 0 like 0,1; got {text!r}")
    return devices


def split_last_expression(tree: ast.Module) -> tuple[ast.Module, ast.Expression | None]:
    """Split off a final expression so it can be evaluated and shown like IPython does."""
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
        return tree, last
    return tree, None


@magics_class
class GpuProfileMagics(Magics):
    @magic_arguments()
    @argument("-n", "--name", help="Experiment name (default: run-N, unique in the store). Re-using a name keeps history.")
    @argument("--interval", type=float, default=None, help="Sampling interval in seconds (default: config, else 0.1).")
    @argument("--devices", help="Visible GPU indices to profile, e.g. 0,1 (default: all visible).")
    @argument("--param", action="append", default=[], metavar="KEY=VALUE", help="Record a setting (repeatable).")
    @argument("--capture", metavar="VAR,...", help="Record these variables' values after the cell.")
    @argument("--source", help="nvml, host or sim[:SCENARIO[:NGPUS]] (default: nvml if a GPU is visible, else host).")
    @argument("--store", help="Store directory (default: $GPUPROF_STORE or .gpuprof/).")
    @argument("--no-live", action="store_true", help="No live dashboard while the cell runs.")
    @argument("--quiet", action="store_true", help="Show nothing (implies --no-live); the experiment is still saved.")
    @argument("--check", action="append", default=[], metavar="RULE",
              help="Rule checked when the cell ends (repeatable), e.g. \"sm_util > 60 for >=80%%\" or \"accuracy >= 0.92\".")
    @argument("--fail-on-check", action="store_true", help="Raise after saving when a --check rule fails.")
    @argument("--baseline", help="Line form, compare: the baseline experiment (default: the first).")
    @argument("command", nargs="*", help="Line form only: list | show NAME | delete NAME | status | compare [NAMES...]")
    @line_cell_magic
    def gpuprofile(self, line: str, cell: str | None = None):
        """Profile a cell's GPU and host activity, or manage saved experiments.

        Cell:  %%gpuprofile [-n NAME] [--interval S] [--devices 0,1] [--param K=V ...]
                            [--capture VAR,...] [--source nvml|host|sim[:SCENARIO]]
                            [--store DIR] [--no-live] [--quiet]
        Line:  %gpuprofile list | show NAME | delete NAME | status | compare [NAMES...] [--baseline NAME]
        """
        __tracebackhide__ = True  # the user's traceback shows their cell, not this magic
        args = self.gpuprofile.parser.parse_args(split_args(line))
        if cell is None:
            return self._line_command(args)
        if args.command:
            raise UsageError(f"unexpected argument(s) for %%gpuprofile: {' '.join(args.command)}")
        return self._profile_cell(args, cell)

    # -- %%gpuprofile -----------------------------------------------------------------------
    def _session_options(self, args) -> dict:
        try:
            source = validate_source_spec(args.source)
            params = parse_params(args.param)
            capture_names = parse_capture(args.capture)
            from ..analysis.rules import parse_rules

            checks = parse_rules(args.check)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        if args.interval is not None and not 0.001 <= args.interval <= 3600:
            raise UsageError(f"--interval must be between 0.001 and 3600 s, got {args.interval}")
        if args.name is not None and not args.name.strip():
            raise UsageError("--name must not be empty")
        return {
            "name": args.name,
            "interval": args.interval,
            "devices": _parse_devices(args.devices),
            "source": source,
            "store": Store(args.store) if args.store else None,
            "params": params,
            "capture": capture_names,
            "checks": checks,
        }

    def _compile(self, cell: str):
        shell = self.shell
        transformed = shell.transform_cell(cell)
        filename = shell.compile.cache(transformed, shell.execution_count)  # "Cell In[n]" in tracebacks
        tree = shell.transform_ast(shell.compile.ast_parse(transformed, filename=filename))
        body, last = split_last_expression(tree)
        code = shell.compile(body, filename, "exec")
        last_code = shell.compile(last, filename, "eval") if last is not None else None
        return code, last_code

    def _profile_cell(self, args, cell: str):
        __tracebackhide__ = True
        options = self._session_options(args)
        code, last_code = self._compile(cell)  # a SyntaxError stops here: the cell never ran
        capture_names = options.pop("capture")
        live = not (args.no_live or args.quiet)
        observers = []
        dashboard = None
        if live:
            dashboard = _make_live_dashboard()
            if dashboard is not None:
                observers.append(dashboard)
        try:  # a bad rule, source, device or config file: UsageError, the cell never runs
            session = ProfileSession(cell_source=cell, observers=observers, **options)
            session.start()
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        ns = self.shell.user_ns
        error: BaseException | None = None
        result = None
        try:
            exec(code, ns)
            if last_code is not None:
                result = eval(last_code, ns)
        except BaseException as exc:  # noqa: B036 - recorded, then re-raised unchanged
            error = exc
        finally:
            self._record_settings(session, ns, capture_names)
            experiment = session.stop(status_for(error), describe_error(error))
            if not args.quiet and dashboard is None:
                from .summary_html import summary_bundle

                display(summary_bundle(experiment), raw=True)
        if error is not None:
            raise error
        if args.fail_on_check:
            from ..analysis.rules import raise_if_failed

            raise_if_failed(experiment)
        return result

    @staticmethod
    def _record_settings(session: ProfileSession, ns: dict, names: list[str]) -> None:
        meta = session.meta
        auto = dataloader_settings(ns)
        meta.params = {**auto, **meta.params}  # explicit --param wins
        values, notes = capture(ns, names)
        meta.captured.update(values)
        meta.notes.extend(notes)

    # -- %gpuprofile COMMAND ----------------------------------------------------------------
    def _line_command(self, args):
        store = Store(args.store) if args.store else Store()
        if not args.command:
            raise UsageError(f"%gpuprofile needs a command: {' | '.join(LINE_COMMANDS)} (or use %%gpuprofile on a cell)")
        command, rest = args.command[0], args.command[1:]
        if command == "list":
            from ..api import experiments

            return experiments(store)
        if command in ("show", "delete"):
            if len(rest) != 1:
                raise UsageError(f"%gpuprofile {command} takes one experiment name or id")
            try:
                if command == "delete":
                    meta = store.delete(rest[0])
                    print(f"deleted experiment {meta.name!r} (id {meta.id}) from {store.root}")
                    return None
                experiment = store.load(rest[0])
            except KeyError as exc:
                raise UsageError(exc.args[0]) from None
            from .static_plots import static_output_bundle

            display(static_output_bundle(experiment), raw=True)
            return None
        if command == "status":
            print(_status_text(store))
            return None
        if command == "compare":
            from .compare_widget import compare

            try:
                return compare(*rest, baseline=args.baseline, store=store)
            except (KeyError, LookupError, ValueError) as exc:
                raise UsageError(str(exc.args[0] if exc.args else exc)) from None
        raise UsageError(f"unknown %gpuprofile command {command!r}: use {' | '.join(LINE_COMMANDS)}")


def _status_text(store: Store) -> str:
    session = current_session()
    lines = [f"store: {store.root.resolve()} ({len(store.list())} experiments)"]
    if session is not None and session.meta is not None:
        lines.append(f"profiling: {session.meta.name!r} ({session.meta.source}), {session.recorder.rows} rows so far")
    else:
        lines.append("profiling: nothing running")
    devices, problem = probe_gpus()
    if devices:
        lines.append("NVML: " + ", ".join(f"{d.key} {d.name}" for d in devices))
    else:
        lines.append(f"NVML: unavailable ({problem})")
    return "\n".join(lines)


def _make_live_dashboard():
    """The live dashboard observer, or None when its view is not available."""
    try:
        from .live import LiveDashboard
    except ImportError:
        return None
    return LiveDashboard()


def load_ipython_extension(ipython) -> None:
    ipython.register_magics(GpuProfileMagics)
    try:
        from .live import on_extension_load
    except ImportError:
        return
    on_extension_load(ipython)


def unload_ipython_extension(ipython) -> None:
    pass


__all__ = ["GpuProfileMagics", "load_ipython_extension", "split_args"]
