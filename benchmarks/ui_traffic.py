"""Measure what the live dashboard sends to the front end, at the kernel's IOPub socket.

Used by the kernel-level tests and ``benchmarks/bench_ui_traffic.py``: a real ipykernel runs
``%load_ext gpuprof_jupyter`` and a ``%%gpuprofile`` cell; every IOPub message is timed as it
arrives, so we can tell that plot updates reached the front end while the cell was still
executing (before its execute reply), and how many document updates, comm messages and
bytes per second that took.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field


@dataclass
class Traffic:
    duration_s: float = 0.0  # from execute request to execute reply
    doc_updates: int = 0  # Bokeh PATCH-DOC messages (one per document change)
    comm_messages: int = 0  # all comm_msg on IOPub during the cell (widgets included)
    comm_bytes: int = 0  # JSON content + binary buffers of those messages
    updates_before_reply: int = 0
    first_update_s: float | None = None
    last_update_s: float | None = None
    update_times_s: list = field(default_factory=list)
    ending_displayed: bool = False  # update_display_data with the static plots arrived
    ending_has_png: bool = False  # ...and the PNG output replaced the widget
    errors: list = field(default_factory=list)

    @property
    def updates_per_s(self) -> float:
        return self.doc_updates / self.duration_s if self.duration_s else 0.0

    @property
    def bytes_per_s(self) -> float:
        return self.comm_bytes / self.duration_s if self.duration_s else 0.0

    @property
    def messages_per_s(self) -> float:
        return self.comm_messages / self.duration_s if self.duration_s else 0.0

    def max_updates_in_window(self, window_s: float = 1.0) -> int:
        times, best, j = self.update_times_s, 0, 0
        for i, t in enumerate(times):
            while times[j] < t - window_s:
                j += 1
            best = max(best, i - j + 1)
        return best

    def to_dict(self) -> dict:
        out = asdict(self)
        out.pop("update_times_s")
        out.update(updates_per_s=self.updates_per_s, bytes_per_s=self.bytes_per_s,
                   messages_per_s=self.messages_per_s, max_updates_in_1s=self.max_updates_in_window(1.0))
        return out


def _size(msg) -> int:
    size = len(json.dumps(msg.get("content", {}), default=str))
    for buf in msg.get("buffers", []) or []:
        size += len(buf)
    return size


def run_profiled_cell(cell_body: str, options: str = "--source sim", setup: str = "", timeout_s: float = 300.0,
                      env: dict | None = None, on_update=None) -> Traffic:
    """Start a kernel, run ``%%gpuprofile OPTIONS`` over ``cell_body``, return its traffic.
    ``on_update(n)`` is called as the n-th plot update arrives (a test may end the cell then)."""
    import os
    import tempfile

    from jupyter_client.manager import start_new_kernel

    store = tempfile.mkdtemp(prefix="gpuprof-traffic-")
    env = {**os.environ, "GPUPROF_STORE": store, **(env or {})}
    km, kc = start_new_kernel(kernel_name="python3", env=env)
    try:
        kc.execute_interactive("%load_ext gpuprof_jupyter\n" + setup, timeout=120)
        traffic = Traffic()
        msg_id = kc.execute(f"%%gpuprofile {options}\n{cell_body}")
        t0 = time.monotonic()
        reply_at = None
        deadline = t0 + timeout_s
        idle = False
        while not idle and time.monotonic() < deadline:
            try:
                msg = kc.get_iopub_msg(timeout=1.0)
            except Exception:
                if reply_at is None:
                    try:
                        reply = kc.get_shell_msg(timeout=0.01)
                        if reply["parent_header"].get("msg_id") == msg_id:
                            reply_at = time.monotonic() - t0
                    except Exception:
                        pass
                continue
            now = time.monotonic() - t0
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind = msg["msg_type"]
            if kind == "comm_msg":
                traffic.comm_messages += 1
                traffic.comm_bytes += _size(msg)
                payload = msg["content"].get("data", {}).get("content", {})
                text = payload.get("payload") if isinstance(payload, dict) else None
                if isinstance(text, str) and '"msgtype":"PATCH-DOC"' in text.replace(" ", ""):
                    traffic.doc_updates += 1
                    traffic.update_times_s.append(now)
                    traffic.first_update_s = traffic.first_update_s or now
                    traffic.last_update_s = now
                    if on_update is not None:
                        on_update(traffic.doc_updates)
            elif kind == "update_display_data":
                data = msg["content"].get("data", {})
                if "gpuprof-static" in data.get("text/html", ""):
                    traffic.ending_displayed = True
                if "image/png" in data:  # the static ending's PNG is its own output, in the widget's place
                    traffic.ending_has_png = True
            elif kind == "error":
                traffic.errors.append(f"{msg['content']['ename']}: {msg['content']['evalue']}")
            elif kind == "status" and msg["content"]["execution_state"] == "idle":
                idle = True
        # the execute reply (shell) marks the end of the cell
        while reply_at is None and time.monotonic() < deadline:
            reply = kc.get_shell_msg(timeout=timeout_s)
            if reply["parent_header"].get("msg_id") == msg_id:
                reply_at = time.monotonic() - t0
        traffic.duration_s = reply_at or (time.monotonic() - t0)
        traffic.updates_before_reply = sum(1 for t in traffic.update_times_s if t < traffic.duration_s)
        return traffic
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
