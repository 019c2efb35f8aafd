"""Test doubles shared by the core tests: a fake clock and a scriptable source."""

from __future__ import annotations

import threading
import time

from gpuprof_jupyter.core.sources.base import DeviceInfo


class FakeClock:
    """Monotonic time that only moves when told to (``sleep`` advances it)."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start
        self.lock = threading.Lock()
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        with self.lock:
            self.sleeps.append(seconds)
            self.now += max(seconds, 0.0)


class ScriptedSource:
    """A source whose readings (or exceptions) come from a function of the call count."""

    simulated = False

    def __init__(self, name="scripted", script=None, clock=None, read_cost_s: float = 0.0) -> None:
        self.name = name
        self.script = script or (lambda i: {"gpu0": {"sm_util": float(i)}})
        self.calls = 0
        self.clock = clock
        self.read_cost_s = read_cost_s
        self.closed = False

    def open(self):
        return [DeviceInfo(key="gpu0", kind="gpu", name="Scripted GPU")]

    def read(self):
        i = self.calls
        self.calls += 1
        if self.clock is not None and self.read_cost_s:
            self.clock.now += self.read_cost_s
        return self.script(i)

    def provenance(self):
        return {"gpu0": {"sm_util": "simulated"}}

    def notes(self):
        return []

    def context(self):
        return {}

    def close(self):
        self.closed = True


def wait_for(condition, timeout: float, what: str, poll_s: float = 0.1):
    """Poll ``condition()`` every ``poll_s`` until it returns something truthy (returned);
    TimeoutError names ``what``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(poll_s)
    raise TimeoutError(f"gave up waiting for {what} after {timeout:g} s")


class LiveRows:
    """A session observer (``gp.profile(..., observers=[rows])``): per device, the time of the
    newest live row and how many came, as the kernel's live view hears of them from the
    sampler process (``LiveUpdate``)."""

    def __init__(self) -> None:
        self.newest: dict[str, float] = {}
        self.count: dict[str, int] = {}

    def started(self, session) -> None:
        pass

    def live(self, update) -> None:
        for device, count in update.rows.items():
            self.newest[device] = update.newest[device]
            self.count[device] = self.count.get(device, 0) + count

    def finished(self, experiment) -> None:
        pass


class PlotsOnThePage:
    """Stands for the live view: names its plots' sources and keeps the texts it is sent."""

    live_plots = True

    def __init__(self) -> None:
        self.patches: list[tuple[str, str]] = []

    def started(self, session) -> None:
        from gpuprof_jupyter.core.plots.spec import plot_spec

        self.spec = plot_spec(session.meta)
        session.show_live_plots({"recent": "r1", "history": "h1", "bands": "b1"}, self.spec, 1500, 60.0)

    def live(self, update) -> None:
        self.patches.extend(update.patches)

    def finished(self, experiment) -> None:
        pass

    def streamed(self) -> list[dict]:
        import json

        events = [json.loads(content)["events"][0] for _, content in self.patches]
        return [dict(e["data"]["entries"]) for e in events if e["kind"] == "ColumnsStreamed"]


def flushed_rows(session):
    """The rows the sampler process has flushed to the running experiment's stream so far (a
    pandas frame, empty before the first flush, every few seconds)."""
    import pandas as pd

    from gpuprof_jupyter.core.store.samples_file import STREAM_NAME, read_stream_tail

    table, _ = read_stream_tail(session.store.directory(session.meta) / STREAM_NAME)
    return table.to_pandas() if table is not None else pd.DataFrame(columns=["t", "device"])
