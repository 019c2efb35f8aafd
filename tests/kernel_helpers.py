"""Drive a real IPython kernel: execute code, collect IOPub messages with their timestamps."""

from __future__ import annotations

import os
import queue
import time
from contextlib import contextmanager

from jupyter_client.manager import KernelManager


@contextmanager
def running_kernel(cwd, extra_env: dict | None = None):
    env = {**os.environ, **(extra_env or {})}
    km = KernelManager(kernel_name="python3")
    km.start_kernel(cwd=str(cwd), env=env)
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=90)
        yield km, kc
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def _messages_of(kc, msg_id: str, timeout: float, what: str):
    """The IOPub messages of the cell ``msg_id`` as they come (each with its receive time);
    TimeoutError saying ``what`` once ``timeout`` s have passed."""
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(what)
        try:
            msg = kc.get_iopub_msg(timeout=remaining)
        except queue.Empty:
            continue
        if msg["parent_header"].get("msg_id") == msg_id:
            msg["received"] = time.monotonic()
            yield msg


def execute(kc, code: str, timeout: float = 120, on_message=None):
    """Run ``code``; return (reply content, IOPub messages for it, reply receive time)."""
    msg_id = kc.execute(code)
    messages = []
    for msg in _messages_of(kc, msg_id, timeout, f"no idle status within {timeout} s for: {code[:80]!r}"):
        messages.append(msg)
        if on_message:
            on_message(msg)
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            break
    reply = kc.get_shell_msg(timeout=timeout)
    while reply["parent_header"].get("msg_id") != msg_id:
        reply = kc.get_shell_msg(timeout=timeout)
    return reply["content"], messages


def text_of(messages) -> str:
    """Everything the cell printed or displayed, as text. Consecutive stream messages of one stream
    are joined as they were written: ipykernel may split one print into two messages when its
    flush timer fires in between (a loaded machine)."""
    parts = []
    last_stream = None
    for msg in messages:
        content = msg["content"]
        if msg["msg_type"] == "stream":
            if last_stream == content.get("name") and parts:
                parts[-1] += content["text"]
            else:
                parts.append(content["text"])
            last_stream = content.get("name")
            continue
        last_stream = None
        if msg["msg_type"] in ("display_data", "execute_result", "update_display_data"):
            parts.append(content["data"].get("text/plain", ""))
            parts.append(content["data"].get("text/html", ""))
        elif msg["msg_type"] == "error":
            parts.append(f"{content['ename']}: {content['evalue']}")
    return "\n".join(parts)


def wait_for_output(kc, msg_id: str, text: str, timeout: float = 60) -> None:
    """Read IOPub until the cell ``msg_id`` prints ``text`` (TimeoutError if it does not)."""
    printed = ""
    for msg in _messages_of(kc, msg_id, timeout, f"the cell did not print {text!r} within {timeout} s"):
        if msg["msg_type"] == "stream":
            printed += msg["content"]["text"]
            if text in printed:
                return
