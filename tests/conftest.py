"""Shared fixtures: a temporary store, a leak check for sampler threads, headless Chromium."""

from __future__ import annotations

import ast
import multiprocessing
import os
import re
import shutil
import threading
import time
from pathlib import Path

import pytest
from hypothesis import settings

# Property tests run the same examples on every machine (CI lands or not on the code, not on the
# draw); `pytest --hypothesis-profile=explore` searches afresh with more examples, for a developer
# hunting the next bug (each one found becomes an @example).
settings.register_profile("repeatable", derandomize=True, database=None)
settings.register_profile("explore", max_examples=500)  # tests/property_budget.py: at least this
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "repeatable"))

ARTIFACTS = Path(__file__).resolve().parent.parent / "artifacts"
CHROMIUM = os.environ.get("GPUPROF_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
    "--disable-sync", "--no-first-run", "--disable-quic",
]


_ONLY_EXCLUSIONS = re.compile(r"\s*not\s+\w+(\s+and\s+not\s+\w+)*\s*")


def pytest_ignore_collect(collection_path: Path, config) -> bool | None:
    """Under ``-m "not kernel and not browser and not process"`` (``make test-fast``), a test
    module whose ``pytestmark`` names an excluded marker holds no test to run: it is not even
    imported (the kernel and server tests' imports, nbformat and jupyter_server, cost the fast
    run seconds). Only for an expression of exclusions alone, where this decides the same as
    pytest's own selection: a test's own marks can only exclude it further."""
    expression = config.option.markexpr
    if not expression or not _ONLY_EXCLUSIONS.fullmatch(expression) or collection_path.suffix != ".py":
        return None
    excluded = set(re.findall(r"not\s+(\w+)", expression))
    return bool(excluded & _module_marks(collection_path)) or None


def _module_marks(path: Path) -> set[str]:
    """The markers a test module's top-level ``pytestmark`` names (read, not imported)."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return set()
    marks = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets):
            marks |= {n.attr for n in ast.walk(node.value)
                      if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Attribute) and n.value.attr == "mark"}
    return marks


@pytest.fixture
def store_dir(tmp_path) -> Path:
    return tmp_path / "store"


@pytest.fixture(autouse=True)
def no_leaked_sampler():
    """Fail any test that leaves a gpuprof thread running (pyinstrument does the same). The
    link to the sampler process (``gpuprof-link``) lives as long as the kernel, by design."""
    yield

    def running() -> list[str]:
        return [t.name for t in threading.enumerate()
                if t.name.startswith("gpuprof-") and t.name != "gpuprof-link" and t.is_alive()]

    deadline = time.monotonic() + 5.0  # a thread told to stop may take a loaded machine's moment to end
    while running() and time.monotonic() < deadline:
        time.sleep(0.05)
    leaked = running()
    from gpuprof_jupyter.runtime import session

    active = session.current_session()
    if active is not None:
        active.stop()
    assert not leaked, f"threads left running: {leaked}"
    assert active is None, "a profiling session was left running"


@pytest.fixture(scope="session")
def artifacts_dir() -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS


@pytest.fixture(scope="module")
def browser():
    """Debian's headless Chromium through Playwright (its own browser download is not used).

    Module-scoped: Playwright's sync API keeps an asyncio loop running on the main thread while
    it is open, which breaks later modules that run their own loop (pytest-jupyter's server)."""
    if not Path(CHROMIUM).exists() or shutil.which(CHROMIUM) is None:
        pytest.fail(f"Chromium not found at {CHROMIUM}: .ci/run installs Debian's chromium package")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


LOCAL_URLS = ("file:", "data:", "blob:", "http://127.0.0.1", "http://localhost", "ws://127.0.0.1")


def block_remote_requests(context) -> None:
    """Abort every request of a browser context that would leave the machine. With Playwright's
    sync API the handler runs only inside Playwright calls: wait with page.wait_for_timeout."""
    def route(route):
        if route.request.url.startswith(LOCAL_URLS):
            return route.continue_()
        return route.abort()

    context.route("**/*", route)


@pytest.fixture
def offline_page(browser):
    """A page that can reach nothing but file:// and localhost: proves "opens offline"."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    block_remote_requests(context)
    page = context.new_page()
    yield page
    context.close()


@pytest.fixture
def fresh_sampler(monkeypatch):
    """``start(env)``: this test's own sampler process, started with ``env`` set (e.g.
    ``tests.fake_nvml.sampler_process_env(spec)`` for fake GPUs); closed afterwards, so the
    next test gets a plain one."""
    from gpuprof_jupyter.runtime.link import sampler_link

    def start(env: dict | None = None):
        for key, value in (env or {}).items():
            monkeypatch.setenv(key, value)
        link = sampler_link()
        link.close()
        return link.ensure()

    yield start
    sampler_link().close()
    monkeypatch.delenv("GPUPROF_FAKE_NVML", raising=False)


def _spin() -> None:
    while True:
        pass


@pytest.fixture
def busy_cores():
    """One process spinning on each core, for the whole test (a loaded shared machine)."""
    ctx = multiprocessing.get_context("spawn")
    spinners = [ctx.Process(target=_spin, daemon=True) for _ in range(os.cpu_count() or 1)]
    for p in spinners:
        p.start()
    yield len(spinners)
    for p in spinners:
        p.kill()
        p.join(5)
