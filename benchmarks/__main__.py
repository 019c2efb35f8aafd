"""``python -m benchmarks [--quick|--full] [--only NAME ...]``: run every benchmark of issue 5,
write ``benchmarks/results/<name>.json`` and the results table in ``benchmarks/README.md``, and
update the figures README.md and docs/ cite from it (``[8.9 ms][trace.stop_ms]``).
Exit status 1 when a gated target is missed (the table says which and why)."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
import traceback
from pathlib import Path

from ._common import RESULTS, machine

# The order does not change the results: long_run's peak RSS is VmHWM, which execve resets
# (ru_maxrss carried a torch-importing parent's RSS into its workers; see bench_long_run._peak).
ORDER = ["long_run", "sampler_cost", "cadence", "overhead", "live_browser", "ui_traffic", "startup", "trace", "alert_trace", "hooks", "tune",
         "store_scale", "stuck", "job_scale", "session"]
README = Path(__file__).resolve().parent / "README.md"
START, END = "<!-- results:start -->", "<!-- results:end -->"


def _run_ui_traffic(mode: str) -> dict:
    """Issue 3's benchmark, owned by the dashboard engineer: call it, read its results."""
    try:
        mod = importlib.import_module("benchmarks.bench_ui_traffic")
    except ModuleNotFoundError as exc:
        if exc.name != "benchmarks.bench_ui_traffic":
            raise
        return {"missing": "benchmarks/bench_ui_traffic.py is not in the tree yet (owned by the live-dashboard work)",
                "figures": []}
    if hasattr(mod, "run"):
        return mod.run(mode)
    import subprocess

    args = [sys.executable, "-m", "benchmarks.bench_ui_traffic"] + ([] if mode == "full" else ["--quick"])
    subprocess.run(args, check=True, cwd=str(RESULTS.parent.parent), timeout=1200)
    data = json.loads((RESULTS / "ui_traffic.json").read_text())
    return {"raw": data, "figures": ui_traffic_figures(data)}


def ui_traffic_figures(data: dict) -> list[dict]:
    """bench_ui_traffic's JSON as gated figures. Bytes per second over a minute = the measured
    stream traffic plus the once-a-minute history refresh averaged over its minute (a quick run
    of 15 s per case never reaches a refresh, so it is taken from the fast-forwarded run)."""
    from ._common import figure

    refresh = {r["gpus"]: r.get("history_bytes_per_s_avg", 0) for r in data.get("long_run", [])}
    figs = []
    for case in data.get("traffic", []):
        tag = f"{case['rate_hz']} Hz, {case['gpus']} GPU(s)"
        per_minute = case["bytes_per_s"] + refresh.get(case["gpus"], 0)
        figs += [
            figure(f"doc_updates_{case['rate_hz']}hz_{case['gpus']}gpu", f"document updates per second, {tag}",
                   case["doc_updates_per_s"], "/s", "<= 6 /s", 6, gated=True,
                   note=f"busiest 1 s window: {case['max_doc_updates_in_1s']}; "
                        f"{case['updates_before_execute_reply']} updates before the execute reply"),
            figure(f"comm_msgs_{case['rate_hz']}hz_{case['gpus']}gpu", f"comm messages per second, {tag}",
                   case["comm_messages_per_s"], "/s"),
            figure(f"bytes_{case['rate_hz']}hz_{case['gpus']}gpu", f"bytes per second over a minute, {tag}",
                   round(per_minute / 1000, 1), "KB/s", "<= 50 KB/s", 50, gated=True,
                   note=f"stream {case['bytes_per_s'] / 1000:.1f} KB/s + history refresh "
                        f"{refresh.get(case['gpus'], 0) / 1000:.1f} KB/s"),
        ]
    for run in data.get("long_run", []):
        figs.append(figure(f"browser_points_{run['rate_hz']}hz_{run['gpus']}gpu",
                           f"points per series in the browser after a fast-forwarded {run['hours']:g} h run, "
                           f"{run['rate_hz']} Hz, {run['gpus']} GPU(s)", run["points_per_series"], "points", "<= 5,000", 5000,
                           gated=True, note=f"spike kept: {run['spike_kept']}"))
    return figs


def run_one(name: str, mode: str) -> dict:
    if name == "ui_traffic":
        return _run_ui_traffic(mode)
    return importlib.import_module(f"benchmarks.bench_{name}").run(mode)


def _fmt(v) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return f"{v:,.4g}" if abs(v) < 1000 else f"{v:,.0f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def saved_figures(name: str) -> list[dict]:
    """The figures of ``results/<name>.json`` as the table shows them (ui_traffic's JSON is raw)."""
    data = json.loads((RESULTS / f"{name}.json").read_text())
    return data.get("figures") or (ui_traffic_figures(data) if name == "ui_traffic" else [])


def figure_value(f: dict) -> str:
    """A figure's value as the table prints it ("8.9 ms"): what a page citing the row must say."""
    return f"{_fmt(f['value'])} {f['unit']}"


def figure_text(f: dict) -> str:
    """A figure's label with its note, as the table's "figure" column prints them."""
    return f"{f['label']} ({f['note']})" if f.get("note") else f["label"]


def figure_row(name: str, f: dict) -> str:
    """One row of the results table (tests/test_docs.py checks the table against these)."""
    status = "" if f.get("ok") is None else ("met" if f["ok"] else "**MISSED**")
    if f.get("ok") is not None and not f.get("gated"):
        status = "met (not gated)" if f["ok"] else "missed (not gated)"
    return f"| {name} | {figure_text(f)} | {figure_value(f)} | {f.get('target') or ''} | {status} |"


def table(results: dict, mode: str, elapsed: dict) -> str:
    m = machine()
    lines = [
        f"Last run: `python -m benchmarks --{mode}` on {time.strftime('%Y-%m-%d %H:%M %Z')}, "
        f"{m.get('lscpu_model_name', '?')} ({m.get('lscpu_hypervisor_vendor', 'bare metal')}), nproc {m.get('nproc')}, "
        f"{m.get('mem_gib', '?')} GiB, Python {m['python']}, {m['platform']}; "
        + ", ".join(f"{k} {v}" for k, v in m.get("packages", {}).items()) + ". No GPU: NVML is tests/fake_nvml.py.",
        "",
        "| benchmark | figure | value | target | status |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name in ORDER:
        data = results.get(name)
        if data is None:
            continue
        if "error" in data:
            lines.append(f"| {name} | failed to run | {data['error'].splitlines()[-1][:120]} | | **ERROR** |")
            continue
        if data.get("missing"):
            lines.append(f"| {name} | {data['missing']} | | | not run |")
            continue
        lines += [figure_row(name, f) for f in data.get("figures", [])]
    lines.append("")
    lines.append("Wall time per benchmark: " + ", ".join(f"{k} {v:.0f} s" for k, v in elapsed.items())
                 + f"; total {sum(elapsed.values()):.0f} s.")
    return "\n".join(lines)


def cited_values() -> dict[str, str]:
    """Every saved figure's value as pages cite it, by ``benchmark.id``."""
    return {f"{name}.{f['id']}": figure_value(f) for name in ORDER if (RESULTS / f"{name}.json").exists()
            for f in saved_figures(name)}


def refresh_citations(pages: list[Path], before: dict[str, str], after: dict[str, str]) -> list[Path]:
    """Rewrite each ``[value][benchmark.id]`` citing a figure's old value with its new value; the
    pages changed. A citation of words from a row's note is left for its author
    (tests/test_docs.py names it when the row changed)."""
    changed = []
    for page in pages:
        text = page.read_text()
        new = text
        for key, value in after.items():
            old = before.get(key)
            if old is not None and old != value:
                new = new.replace(f"[{old}][{key}]", f"[{value}][{key}]")
        if new != text:
            page.write_text(new)
            changed.append(page)
    return changed


def write_readme(text: str) -> None:
    if not README.exists():
        return
    body = README.read_text()
    if START in body and END in body:
        head, rest = body.split(START, 1)
        _, tail = rest.split(END, 1)
        README.write_text(f"{head}{START}\n{text}\n{END}{tail}")


_PLACE = "<rows go here>"


def _rows_placed(lines: list[str], name: str) -> list[str]:
    """The table's lines without ``name``'s rows and with ``_PLACE`` where they go: where they
    were, or (a benchmark new to the table) after the rows of the ones before it in ORDER."""
    def owner(line: str) -> str | None:
        return line.split("|")[1].strip() if line.startswith("| ") else None

    mine = [i for i, line in enumerate(lines) if owner(line) == name]
    if mine:
        at = mine[0]
    else:
        earlier = set(ORDER[:ORDER.index(name)]) if name in ORDER else set(ORDER)
        before = [i for i, line in enumerate(lines) if owner(line) in earlier]
        rule = next(i for i, line in enumerate(lines) if line.startswith("| ---"))
        at = (max(before) if before else rule) + 1
    lines = lines[:at] + [_PLACE] + lines[at:]
    return [line for line in lines if owner(line) != name]


def replace_rows(name: str, rows: list[str], mode: str) -> None:
    """Put ``rows`` in place of benchmark ``name``'s rows in the README's table (a benchmark run
    alone with ``--only``), and say below the table when they were rerun."""
    body = README.read_text()
    if START not in body or END not in body:
        return
    head, rest = body.split(START, 1)
    block, tail = rest.split(END, 1)
    lines = block.strip("\n").splitlines()
    lines = _rows_placed(lines, name)
    at = lines.index(_PLACE)
    lines[at:at + 1] = rows
    rerun = f"Rerun alone: {name} (`--{mode} --only {name}`, {time.strftime('%Y-%m-%d %H:%M %Z')})."
    lines = [line for line in lines if not line.startswith(f"Rerun alone: {name} ")] + [rerun]
    README.write_text(f"{head}{START}\n" + "\n".join(lines) + f"\n{END}{tail}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--quick", action="store_const", const="quick", dest="mode", help="about 9 minutes on 2 cores (default; benchmarks/README.md gives each part's time)")
    group.add_argument("--full", action="store_const", const="full", dest="mode", help="longer runs of each benchmark (several times quick mode)")
    group.add_argument("--tiny", action="store_const", const="tiny", dest="mode", help="seconds; smoke test only, README untouched")
    parser.add_argument("--only", nargs="*", choices=ORDER, help="run only these")
    args = parser.parse_args(argv)
    mode = args.mode or "quick"
    try:
        import nvitop  # noqa: F401
    except ImportError:
        print("benchmarks need nvitop (a benchmark-only dependency): pip install -e '.[bench]'", file=sys.stderr)
        return 2
    results, elapsed = {}, {}
    before = cited_values()
    for name in args.only or ORDER:
        t = time.perf_counter()
        print(f"[benchmarks] {name} ({mode}) ...", flush=True)
        try:
            results[name] = run_one(name, mode)
        except Exception:
            results[name] = {"error": traceback.format_exc()}
            print(results[name]["error"], file=sys.stderr)
        elapsed[name] = time.perf_counter() - t
        for f in results[name].get("figures", []):
            mark = "" if f.get("ok") is None else (" ok" if f["ok"] else " MISSED")
            print(f"  {f['label']}: {_fmt(f['value'])} {f['unit']}  [{f.get('target') or '-'}]{mark}", flush=True)
    text = table(results, mode, elapsed)
    if mode != "tiny" and not args.only:
        write_readme(text)
        (RESULTS / "summary.json").write_text(json.dumps({"mode": mode, "elapsed_s": elapsed, "machine": machine()}, indent=2) + "\n")
    elif mode != "tiny":  # the rows of what ran replace theirs; the table says which were rerun alone
        for name, data in results.items():
            if "error" not in data and not data.get("missing"):
                replace_rows(name, [figure_row(name, f) for f in data.get("figures", [])], mode)
    if mode != "tiny":
        root = README.parent.parent
        for page in refresh_citations([root / "README.md", *sorted((root / "docs").glob("*.md"))], before,
                                      cited_values()):
            print(f"[benchmarks] figures cited in {page.relative_to(root)} updated", flush=True)
    print(text)
    missed = [f for d in results.values() for f in d.get("figures", []) if f.get("gated") and f.get("ok") is False]
    errors = [k for k, d in results.items() if "error" in d]
    return 1 if missed or errors else 0


if __name__ == "__main__":
    sys.exit(main())
