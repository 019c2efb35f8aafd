"""The live view's cost with its page open: JupyterLab and Chromium on the same small machine
(issue 40, part 2: "the browser on the training thread's sibling hyperthread").

``_live_blocks`` drives the kernel with jupyter_client and drops what the kernel sends, so it
measures the kernel and the sampler process only. A user on a laptop or a small notebook VM
also has the Jupyter server forwarding each comm message and a browser tab parsing it and
redrawing the plots, on the same cores as the training loop. Here the same cell of alternating
blocks (the live view's work in the kernel switched on and off, nothing placed) runs in a real
JupyterLab, its notebook open in Debian's headless Chromium with the live plots in view. While
the view is paused the kernel sends nothing, so the server and the page have nothing to do
either: on / off is what the whole live view costs the training loop, page included. Each block
also records the CPU of the Jupyter server and of every Chromium process (on against off: what
the page's updates cost them), which counts as the condition measured, not as interference.
Quiet, then with a busy process per core (started by the runner, left to the scheduler).
A screenshot of the page during the quiet run goes to ``artifacts/bench_live_browser.png``.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

from ._common import ROOT, figure, save

NAME = "live_browser"
SHOT = ROOT / "artifacts" / "bench_live_browser.png"


def _chromium_pids() -> list[int]:
    """Every Chromium process on the machine (the benchmark's own browser: nothing else runs one)."""
    import psutil

    return [proc.pid for proc in psutil.process_iter(["name"]) if (proc.info["name"] or "").startswith("chrom")]


def _server_pids(server_pid: int) -> list[int]:
    """The Jupyter server and its helpers, without its kernels (the block cell counts the kernel
    and its sampler process as the profiled side)."""
    import psutil

    pids = [server_pid]
    for child in psutil.Process(server_pid).children(recursive=True):
        try:
            command = " ".join(child.cmdline())
        except psutil.Error:  # ended meanwhile
            continue
        if "ipykernel" not in command and "gpuprof_jupyter" not in command:
            pids.append(child.pid)
    return pids


def _cells(cfg: dict, out_dir: Path) -> list[str]:
    from ._live_blocks import KERNEL_CODE
    from ._train import TRAIN_SETUP
    from .bench_overhead import NO_HISTORY_WRITES

    blocks = ("%%gpuprofile --source nvml -n live-blocks-{condition}\n"
              "import json as _j\n"
              f"_watch = _j.load(open({str(out_dir / 'watch.json')!r}))\n"
              f"_out = _lb_blocks({cfg['rounds']}, _n, _warm, _watch.pop('busy'), _watch)\n"
              f"open({str(out_dir)!r} + '/{{condition}}.json', 'w').write(_j.dumps(_out))")
    return ["%load_ext gpuprof_jupyter",
            f"import sys; sys.path.insert(0, {str(ROOT)!r})\n{NO_HISTORY_WRITES}\n{TRAIN_SETUP}\n{KERNEL_CODE}\n"
            f"_n = steps_for({cfg['block_s']}); _warm = steps_for({cfg['warm_s']}) if {cfg['warm_s']} else 0",
            "%%gpuprofile --source nvml -n warm\ntrain_steps(5)",
            blocks.format(condition="quiet"), blocks.format(condition="busy")]


def run_lab(n_gpus: int, cfg: dict) -> dict:
    """One JupyterLab, one page, one kernel: {"quiet": blocks, "busy": blocks}."""
    from playwright.sync_api import sync_playwright

    from tests.conftest import CHROMIUM, CHROMIUM_ARGS
    from tests.lab_helpers import _notebook, _open_notebook, _run_cell, _wait_idle, serve_lab

    from ._common import fake_nvml_env
    from ._live_blocks import _spinners

    with tempfile.TemporaryDirectory() as tmp_name, sync_playwright() as playwright:
        tmp = Path(tmp_name)
        root, out_dir = tmp / "lab", tmp / "out"
        root.mkdir()
        out_dir.mkdir()
        cells = _cells(cfg, out_dir)
        _notebook(root / "bench.ipynb", cells)
        env = {**os.environ, **fake_nvml_env(n_gpus, "h100", realistic=True), "GPUPROF_STORE": str(tmp / "store")}
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            with serve_lab(root, tmp, env) as lab:
                page = browser.new_context(viewport={"width": 1400, "height": 1000}).new_page()
                _open_notebook(page, lab, "bench.ipynb")
                for index in range(3):  # %load_ext, the setup, a warm profiled cell
                    _run_cell(page, index)
                    _wait_idle(page, 300)
                out = {}
                for index, condition in ((3, "quiet"), (4, "busy")):
                    spinners = _spinners() if condition == "busy" else []
                    try:
                        watch = {"busy": [s.pid for s in spinners], "the Jupyter server": _server_pids(lab["pid"]),
                                 "Chromium (every process)": _chromium_pids()}
                        (out_dir / "watch.json").write_text(json.dumps(watch))
                        _run_cell(page, index, finished=False)
                        out[condition] = _wait_for_blocks(page, index, out_dir / f"{condition}.json",
                                                          shot=SHOT if condition == "quiet" else None)
                    finally:
                        for spinner in spinners:
                            spinner.kill()
                            spinner.join(5)
                    _wait_idle(page, 120)
                return out
        finally:
            browser.close()


def _wait_for_blocks(page, index: int, path: Path, shot: Path | None, timeout_s: float = 1800) -> list[dict]:
    """Keep the running cell's live plots in view until its blocks are written (a screenshot of
    them once they run); Playwright's own waits, so the page keeps being served meanwhile."""
    deadline, started = time.monotonic() + timeout_s, time.monotonic()
    outputs = page.locator(".jp-Notebook .jp-CodeCell").nth(index).locator(".jp-OutputArea")
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"the block cell wrote nothing in {timeout_s:.0f} s")
        if outputs.count():
            outputs.first.scroll_into_view_if_needed()
            if shot is not None and time.monotonic() - started > 20:
                shot.parent.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(shot))
                shot = None
        page.wait_for_timeout(1000)
    return json.loads(path.read_text())


def figures(results: dict) -> list[dict]:
    """The ratio, GIL-wait and thread rows of ``_live_blocks`` for the page-open runs, and what
    the page's updates cost the Jupyter server and Chromium (on - off, % of one core)."""
    from ._live_blocks import figures as block_figures

    rows = block_figures(results, setting="JupyterLab with the page open in headless Chromium on the same machine, "
                                          "no placement")
    for tag, s in results.items():
        where = ("a busy process per core" if tag.endswith("_busy") else "quiet")
        on, off = s["on"].get("watched_pct", {}), s["off"].get("watched_pct", {})
        for name in sorted(set(on) | set(off)):
            key = "server" if "server" in name else "chromium"
            rows.append(figure(f"page_cpu_{key}_{tag}", f"CPU the live view adds to {name}, % of one core, on - off, {where}",
                               round(on.get(name, 0.0) - off.get(name, 0.0), 2), "%",
                               note=f"{on.get(name, 0.0):.2f} % on, {off.get(name, 0.0):.2f} % off"))
    return rows


def run(mode: str = "quick") -> dict:
    from ._live_blocks import CFG, summarise

    cfg = CFG[mode]
    results = {}
    for condition, blocks in run_lab(1, cfg).items():
        results["lab_1gpu" + ("_busy" if condition == "busy" else "")] = {**summarise(blocks), "blocks": blocks}
    data = {"figures": figures(results), "runs": results, "config": cfg}
    save(NAME, data, mode)
    return data


if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 1 else "quick"
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    print(json.dumps(run(mode)["figures"], indent=1))
