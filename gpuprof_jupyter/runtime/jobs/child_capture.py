"""``--trace on-alert`` in a child process: the run asks, this process traces its next steps.

Runs in any process that holds a run as a child: a ``torchrun`` rank under ``gpuprof run``,
a profiled cell's spawned child.

The run judges the alert and its limits (``runtime/hooks/alert_trace.py``) and writes one
``trace`` line on this child's connection (``ChildListener.request_trace``). The child's sender
thread reads it (``poll``: twice a second, never blocking; nothing is read otherwise) and hands
it to an ``AlertCapture`` of this process with no limits of its own: the same bounded window
opens at the next step boundary on the training thread. From then on this process folds its
events too (``ActivityLog.forward``, as a ``--trace-ranks`` rank does), to count its steps. When
the window closes its trace is written beside the socket, under the name the run gave, and its
record is sent to the run (a ``capture`` message) after the events of its steps; the run numbers
its steps as it counts them and moves the file into the experiment.
"""

from __future__ import annotations

import gzip
import json
import os
import socket
import threading
import time

from gpuprof_jupyter.core.child_channel import CAPTURE, MAX_LINE, TRACE_REQUEST, WALL0_ENV, encode
from gpuprof_jupyter.runtime.hooks.alert_trace import AlertCapture
from gpuprof_jupyter.runtime.hooks.trace_window import TraceSpec


class RequestedCaptures:
    """One child's captures at its run's request. ``run``: the ``ChildRun`` (its activity,
    channel, lock and notes); ``training_thread``: where torch.profiler may start (set when
    torch is imported)."""

    def __init__(self, run) -> None:
        self.run = run
        self.training_thread: int | None = None
        self.capture: AlertCapture | None = None
        self._inbox = b""  # a request line not read whole yet
        self._name = "trace-alert.json.gz"  # the file the run asked for, beside the socket

    def poll(self, sock: socket.socket) -> None:
        """On the sender thread: the run's requests that arrived, handled; never waits."""
        try:
            data = sock.recv(1 << 16, socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            return  # the connection's failures are the sender's to report
        self._inbox += data
        if len(self._inbox) > MAX_LINE:
            self._inbox = b""
        while b"\n" in self._inbox:
            line, self._inbox = self._inbox.split(b"\n", 1)
            try:
                request = json.loads(line)
            except ValueError:
                continue
            if isinstance(request, dict) and request.get("type") == TRACE_REQUEST:
                self._trace(request)

    def _trace(self, request: dict) -> None:
        run = self.run
        if self.capture is None:
            try:
                wall0 = float(os.environ.get(WALL0_ENV, ""))
            except ValueError:
                wall0 = time.time() - (time.monotonic() - run.activity.t0)
            spec = TraceSpec("on-alert", 0, int(request.get("steps") or 5))
            self.capture = AlertCapture(spec, run.activity.t0, wall0, run.trace_notes, run.activity, self._save,
                                        interval_s=0.0, max_bytes=float("inf"), on_capture=self._send)
        self.capture.begin(self.training_thread or threading.main_thread().ident)
        self._name = os.path.basename(str(request.get("name") or self._name))
        with run._lock:
            if run.activity.forward is None:  # fold here from now on, to count the steps traced
                run.activity.forward = []
        alert = request.get("alert") if isinstance(request.get("alert"), dict) else {}
        self.capture.alert({**alert, "t_s": 0.0, "rule": "asked by the run"} if not alert.get("rule") else alert)

    def _save(self, trace: dict, name: str) -> tuple[str, int]:
        """The window's trace beside the socket, under the run's name: (its name, bytes)."""
        path = os.path.join(os.path.dirname(self.run.path), self._name)
        with gzip.open(path, "wt", encoding="utf-8", compresslevel=1) as f:
            json.dump(trace, f, separators=(",", ":"))
        return self._name, os.path.getsize(path)

    def _send(self, record: dict) -> None:
        """On the training thread, the window closed: its steps' events, then its record."""
        run = self.run
        run.send_events()
        with run._lock:
            run._send(encode(CAPTURE, window=record))

    def close(self) -> None:
        """At exit: a window still open is kept as partial and sent."""
        if self.capture is not None:  # this process folds its events since it was asked
            self.capture.close(len(self.run.activity.steps))


__all__ = ["RequestedCaptures"]
