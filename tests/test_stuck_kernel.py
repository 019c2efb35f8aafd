"""Issue 41 part 1 in a real kernel: a profiled cell blocked in a ``time.sleep`` inside its loop
is caught with its stack (``sys._current_frames()`` from the kernel's own link thread); a cell
waiting for ``input()`` before any step is not."""

from __future__ import annotations

import queue
import time

import pytest

import gpuprof_jupyter as gp
from tests.kernel_helpers import execute, text_of, wait_for_output
from tests.test_magic_kernel import kernel  # noqa: F401 - the same kernel, its store in tmp_path

pytestmark = pytest.mark.kernel

HUNG = """\
%%gpuprofile --source sim -n hung --no-live --stuck-after 1
import time
for step in range(10):
    time.sleep(0.01)
    if step == 5:
        print("hanging", flush=True)
        time.sleep(600)
    gpuprof_jupyter.step()
"""

WAITS = """\
%%gpuprofile --source sim -n waits --no-live --stuck-after 1
import time
answer = input("go? ")
for step in range(5):
    time.sleep(0.01)
    gpuprof_jupyter.step()
"""


def test_a_cell_blocked_in_its_loop_is_caught_and_one_waiting_for_input_is_not(kernel):
    km, kc, tmp_path = kernel
    store = tmp_path / "store"
    msg_id = kc.execute(HUNG)
    wait_for_output(kc, msg_id, "hanging")
    deadline = time.monotonic() + 120
    while not list(store.glob("*/stacks-cell.txt")):  # caught: its stacks saved while the cell still sleeps
        assert time.monotonic() < deadline, "the blocked cell was not caught"
        time.sleep(0.1)
    km.interrupt_kernel()
    reply = kc.get_shell_msg(timeout=60)
    assert reply["parent_header"]["msg_id"] == msg_id and reply["content"]["ename"] == "KeyboardInterrupt"
    exp = gp.load("hung", store=store)
    record, = exp.meta.context["stuck"]
    assert record["who"] == "the profiled cell" and record["steps"] == 5
    assert record["where"].startswith("cell:7 ") and "`time.sleep(600)`" in record["where"], record
    assert record["stacks"] == {"the profiled cell": "stacks-cell.txt"}
    reply, messages = execute(kc, "%gpuprofile show hung")
    assert "The profiled cell stuck" in text_of(messages)  # the finding, in the summary

    msg_id = kc.execute(WAITS, allow_stdin=True)
    request = kc.get_stdin_msg(timeout=60)  # the cell waits for input() before any step
    assert request["msg_type"] == "input_request"
    time.sleep(4)  # four thresholds: a step-less wait is never stuck
    kc.input("yes")
    while True:
        try:
            reply = kc.get_shell_msg(timeout=60)
        except queue.Empty:
            pytest.fail("the cell waiting for input did not end")
        if reply["parent_header"]["msg_id"] == msg_id:
            break
    assert reply["content"]["status"] == "ok"
    exp = gp.load("waits", store=store)
    assert "stuck" not in exp.meta.context and exp.summary["steps"]["count"] == 5
