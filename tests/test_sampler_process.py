"""Issue 9: the sampler process. The kernel never opens NVML; faults in the process, the
kernel, NVML or the disk leave a complete experiment, a note, and no stray process.

These tests run the real process (``python -m gpuprof_jupyter.sampler_process``), with the
fake NVML installed in it through ``GPUPROF_FAKE_NVML`` where NVML is needed.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import random
import signal
import subprocess
import sys
import textwrap
import time
from datetime import datetime
from pathlib import Path

import psutil
import pytest

from gpuprof_jupyter.core.protocol import Events, Ping, Request, Status
from gpuprof_jupyter.core.store.directory import Store
from gpuprof_jupyter.core.store.samples_file import STREAM_NAME, read_stream_batches
from gpuprof_jupyter.runtime.link import sampler_link
from gpuprof_jupyter.runtime import exporter_control
from gpuprof_jupyter.core.fault_injection import FAULT_STEP_ENV as FAULT_ENV
from gpuprof_jupyter.runtime.session import ProfileSession
from tests.fake_nvml import sampler_process_env
from tests.fakes import wait_for
from tests.kernel_helpers import execute, running_kernel, text_of

pytestmark = pytest.mark.process  # every test here starts a process or a server


def sampler_processes(kernel_pid: int | None = None) -> list[psutil.Process]:
    """Live sampler processes (of one kernel, when given)."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        cmd = proc.info["cmdline"] or []
        if "gpuprof_jupyter.sampler_process" in cmd and proc.info["status"] != psutil.STATUS_ZOMBIE:
            if kernel_pid is None or str(kernel_pid) in cmd:
                found.append(proc)
    return found


def stream_rows(directory) -> int:
    """Rows of a run's sample stream on disk (complete batches only)."""
    return sum(batch.num_rows for batch in read_stream_batches(Path(directory) / STREAM_NAME))


def gone(pid: int) -> bool:
    return not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


# -- the kernel never opens NVML -------------------------------------------------------------------
def test_the_kernel_never_loads_nvml_yet_profiles_fake_gpus(tmp_path):
    """A real kernel: %load_ext, a profiled cell on NVML (the fake, in the sampler process),
    %gpuprofile status and gpu_available(): pynvml is never even imported in the kernel."""
    env = sampler_process_env({"gpus": ["a100", "h100"]})
    store = tmp_path / "store"
    with running_kernel(tmp_path, env) as (km, kc):
        code = textwrap.dedent("""\
            %load_ext gpuprof_jupyter
            """)
        execute(kc, code)
        reply, _ = execute(kc, f"%%gpuprofile --source nvml --no-live --interval 0.05 --store {store} -n real\n"
                               "import time; time.sleep(0.6)")
        assert reply["status"] == "ok"
        reply, messages = execute(kc, f"%gpuprofile status --store {store}")
        status = text_of(messages)
        reply, messages = execute(kc, "import sys, gpuprof_jupyter\n"
                                      "print(gpuprof_jupyter.gpu_available(), 'pynvml' in sys.modules)")
        assert text_of(messages).split() == ["True", "False"], text_of(messages)
    assert "gpu0 NVIDIA A100" in status and "gpu1 NVIDIA H100" in status, status
    experiment = Store(store).load("real")
    assert experiment.meta.source == "nvml"
    assert experiment.meta.provenance["gpu1"]["sm_util"].startswith("gpm")
    assert experiment.meta.context["sampler_pid"] != experiment.meta.context["kernel_pid"]
    assert set(experiment.samples.device) == {"gpu0", "gpu1", "host"}


# -- the sampler process crashes --------------------------------------------------------------------
def test_sampler_process_killed_mid_run_keeps_what_was_written(store_dir, fresh_sampler):
    link = fresh_sampler()
    session = ProfileSession("crash", source="sim", store=store_dir, interval=0.05).start()
    first = link.pid
    wait_for(lambda: stream_rows(session._directory) > 20, 30, "rows are on disk")
    os.kill(first, signal.SIGKILL)
    wait_for(lambda: not link.alive, 5, "the link notices the process died")
    experiment = session.stop()
    assert experiment.meta.status == "ok"  # the user's cell went on
    assert any("stopped unexpectedly" in n for n in experiment.meta.notes), experiment.meta.notes
    assert len(experiment.samples) > 20  # what was written is kept, read back from Parquet
    assert (Store(store_dir).directory(experiment.meta) / "samples.parquet").exists()
    nxt = ProfileSession("after", source="sim", store=store_dir, interval=0.05).start()
    wait_for(lambda: nxt.rows_seen > 0, 30, "the new process samples")
    after = nxt.stop()
    assert link.pid != first and after.meta.status == "ok" and len(after.samples) > 0
    assert not any("stopped unexpectedly" in n for n in after.meta.notes)


# -- NVML hangs ------------------------------------------------------------------------------------
def test_a_hung_nvml_call_delays_neither_the_cell_nor_its_end(store_dir, fresh_sampler, tmp_path):
    """The 6th reading hangs until the test lets it go (after the run ended): the run ends
    while the call is still stuck, with the stall a recorded gap."""
    release = tmp_path / "release"
    fresh_sampler(sampler_process_env({"gpus": ["a100"], "hang": {
        "function": "nvmlDeviceGetMemoryInfo", "after_calls": 6, "seconds": 600, "release_file": str(release)}}))
    session = ProfileSession("hang", source="nvml", store=store_dir, interval=0.05).start()

    def stuck_for_over_a_second() -> bool:  # the 6th reading hangs
        last = sampler_link().request(Ping(lateness=True)).get("last_sample_at")
        return last is not None and time.monotonic() - last > 1.2

    wait_for(stuck_for_over_a_second, 30, "the fast lane is stuck in NVML for over a second")
    try:
        experiment = session.stop()  # returns while the call is stuck: it ends only once released
    finally:
        release.touch()
    gaps = experiment.meta.gaps
    assert gaps and gaps[-1][1] - gaps[-1][0] > 1.0, gaps  # the stall is a recorded gap
    assert any("stopped answering" in n for n in experiment.meta.notes), experiment.meta.notes
    # the next run works (the hung thread is left behind; a new source is opened)
    nxt = ProfileSession("next", source="host", store=store_dir, interval=0.05).start()
    wait_for(lambda: nxt.rows_seen > 0, 30, "the next run samples")
    assert nxt.stop().meta.status == "ok"


# -- the kernel dies -------------------------------------------------------------------------------
KILLED_CELL = """\
%%gpuprofile --source sim --no-live --interval 0.05 --store {store} -n doomed
import torch, time, gpuprof_jupyter as gp
from torch.utils.data import DataLoader, TensorDataset
loader = DataLoader(TensorDataset(torch.zeros(100000, 4)), batch_size=8, num_workers=2,
                    multiprocessing_context="fork", persistent_workers=True)
steps = 0
while True:
    for (x,) in loader:
        time.sleep(0.01)
        gp.step(len(x))
        steps += 1
        if steps == 20:
            open({marker!r}, "w").close()
"""


def simulated_rows_after(directory, wall: float) -> bool:
    """Has the stream a simulated GPU row after ``wall``? The simulated GPU is sampled only up to
    the kernel's events handed over, so the steps before ``wall`` reached the process."""
    return any(w > wall for batch in read_stream_batches(Path(directory) / STREAM_NAME)
               for w, d in zip(batch.column("wall_time").to_pylist(), batch.column("device").to_pylist())
               if d == "gpu0")


def test_a_killed_kernel_leaves_a_complete_experiment_and_no_stray_process(tmp_path):
    """SIGKILL a real kernel mid-cell while forked DataLoader workers hold its sockets: the
    sampler process notices (its watchdog, sampler_process/main.py), saves the run as ``died``
    with Parquet and steps, and exits."""
    store = tmp_path / "store"
    with running_kernel(tmp_path) as (km, kc):
        execute(kc, "%load_ext gpuprof_jupyter")
        kernel_pid = int(text_of(execute(kc, "import os; print(os.getpid())")[1]).strip())
        marker = tmp_path / "20-steps"
        kc.execute(KILLED_CELL.format(store=store, marker=str(marker)))
        meta_path = wait_for(lambda: next(Store(store).root.glob("*/meta.json"), None), 60, "the run starts")
        kernel = psutil.Process(kernel_pid)
        wait_for(lambda: len(kernel.children(recursive=True)) >= 3, 60, "DataLoader workers and the sampler run")
        wait_for(lambda: marker.exists() and simulated_rows_after(Path(meta_path).parent, marker.stat().st_mtime), 60,
                 "20 steps reach the sampler process, and a write period after them")
        [sampler] = sampler_processes(kernel_pid)
        killed_at = time.time()
        os.kill(kernel_pid, signal.SIGKILL)
        wait_for(lambda: json.loads(Path(meta_path).read_text())["status"] == "died", 30, "the run is saved as died")
        wait_for(lambda: not sampler.is_running() or sampler.status() == psutil.STATUS_ZOMBIE, 10,
                 "the sampler process exits")
    experiment = Store(store).load("doomed")
    assert experiment.meta.status == "died" and experiment.meta.ended_at
    # ended_at is when the process noticed, after the kill (not the kernel's last word); how soon
    # is the machine's: the wait above bounds it
    noticed = datetime.fromisoformat(experiment.meta.ended_at).timestamp()
    assert noticed >= killed_at, (noticed, killed_at)
    assert (Path(meta_path).parent / "samples.parquet").exists()
    assert len(experiment.samples) > 20 and len(experiment.steps) > 10
    assert experiment.summary  # readable and comparable like any other run
    assert not sampler_processes(kernel_pid)


# -- nothing left behind ---------------------------------------------------------------------------
def test_no_process_or_thread_left_after_100_cells_and_a_shutdown(tmp_path):
    store = tmp_path / "store"
    with running_kernel(tmp_path) as (km, kc):
        execute(kc, "%load_ext gpuprof_jupyter\nimport threading")
        cell = f"%%gpuprofile --source sim --no-live --interval 0.02 --store {store}\nx = 1"
        for _ in range(100):
            reply, messages = execute(kc, cell)
            assert reply["status"] == "ok", text_of(messages)
        reply, messages = execute(kc, textwrap.dedent("""\
            from gpuprof_jupyter.core.protocol import Ping
            from gpuprof_jupyter.runtime.link import sampler_link
            link = sampler_link()
            print(sorted(t.name for t in threading.enumerate() if t.name.startswith("gpuprof")))
            print(link.starts, link.pid)
            ping = link.request(Ping())
            print(sorted(ping["threads"]), ping["torch_imported"])
            """))
        kernel_threads, starts_pid, child_threads = text_of(messages).strip().splitlines()
        kernel_pid = km.provisioner.process.pid if km.provisioner else None
        assert kernel_threads == "['gpuprof-link']"
        starts, child_pid = starts_pid.split()
        assert starts == "1"  # one process for all 100 cells
        assert "gpuprof-sampler" not in child_threads and "gpuprof-writer" not in child_threads, child_threads
        assert child_threads.endswith("False")  # the process never imports torch (so never CUDA)
        assert len(Store(store).list()) == 100
    wait_for(lambda: not psutil.pid_exists(int(child_pid)) or
             psutil.Process(int(child_pid)).status() == psutil.STATUS_ZOMBIE, 5, "the sampler exits with its kernel")
    if kernel_pid is not None:
        assert not sampler_processes(kernel_pid)


# -- the disk fails for a while: tests/test_stream_disk_full.py ------------------------------------


def test_interrupting_the_kernel_stops_the_cell_not_the_sampler_process(tmp_path):
    """Kernel > Interrupt signals the kernel's process group: the cell ends "interrupted", the
    sampler process (in a session of its own, ignoring SIGINT) goes on serving the next cells."""
    store = tmp_path / "store"
    with running_kernel(tmp_path) as (km, kc):
        execute(kc, "%load_ext gpuprof_jupyter\nfrom gpuprof_jupyter.runtime.link import sampler_link")
        msg_id = kc.execute(f"%%gpuprofile --source sim --no-live --store {store} -n stopped\n"
                            "import time\nwhile True: time.sleep(0.05)",
                            stop_on_error=False)  # else the kernel aborts the next request (a loaded machine: for a while)
        meta_path = wait_for(lambda: next(Store(store).root.glob("*/meta.json"), None), 60, "the run starts")
        wait_for(lambda: stream_rows(Path(meta_path).parent) > 0, 60, "the cell runs and is sampled")
        km.interrupt_kernel()
        reply = kc.get_shell_msg(timeout=60)
        while reply["parent_header"].get("msg_id") != msg_id:
            reply = kc.get_shell_msg(timeout=60)
        assert reply["content"]["status"] == "error" and reply["content"]["ename"] == "KeyboardInterrupt"
        reply, messages = execute(kc, f"%%gpuprofile --source sim --no-live --store {store} -n next\n"
                                      "print(sampler_link().starts)")
        assert reply["status"] == "ok" and text_of(messages).strip().splitlines()[0] == "1", text_of(messages)
    assert Store(store).load("stopped").status == "interrupted"
    assert Store(store).load("next").status == "ok"


def test_each_run_takes_the_kernels_cuda_visible_devices_as_of_its_start(store_dir, fresh_sampler, monkeypatch):
    """Notebooks change os.environ between cells: the process started with both GPUs visible,
    the next run sees only what the kernel sees then."""
    from tests.fake_nvml import h100

    fresh_sampler(sampler_process_env({"gpus": ["a100", "h100"]}))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    both = ProfileSession("both", source="nvml", store=store_dir, interval=0.05).start().stop()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    one = ProfileSession("one", source="nvml", store=store_dir, interval=0.05).start().stop()
    assert len(both.meta.gpu_devices) == 2
    assert [d["uuid"] for d in one.meta.gpu_devices] == [h100(1).uuid]
    assert one.meta.gpu_devices[0]["key"] == "gpu0"  # visible index 0, as torch numbers it


def test_a_whole_run_with_steps_never_imports_pandas_in_the_sampler_process(store_dir, fresh_sampler):
    """Issue 22: pandas cost the first profiled cell 0.15-0.35 s of the process's CPU; writing the
    stream and the steps, the live view's changes, the Parquet file and the summary are done
    without it."""
    from gpuprof_jupyter.runtime.reporting import step
    from tests.fakes import PlotsOnThePage

    link = fresh_sampler(sampler_process_env({"gpus": ["h100", "h100"]}))
    page = PlotsOnThePage()
    session = ProfileSession("steps", source="nvml", store=store_dir, interval=0.05, observers=[page]).start()
    for _ in range(3):
        time.sleep(0.05)
        step(8)
    wait_for(lambda: page.streamed(), 30, "the live plots' first stream")
    experiment = session.stop()
    assert link.request(Ping())["pandas_imported"] is False
    assert experiment.meta.summary["steps"]["count"] == 3
    assert experiment.meta.summary["steps"]["samples"] == 24.0
    assert experiment.meta.summary["devices"]["gpu1"]["measured_s"] > 0
    assert len(experiment.steps) == 3 and experiment.steps["n_samples"].tolist() == [8, 8, 8]


# -- issue 18: faults at the boundary (one owner per run, a typed protocol) ------------------------------
def test_an_end_past_its_timeout_is_finished_once_by_the_kernel_with_every_row(store_dir, fresh_sampler, monkeypatch):
    """SIGSTOP the process past the (shortened) end timeout, then SIGCONT: the kernel kills and
    reaps it before finishing the run itself, so the late process can never replace the
    samples with an empty file."""
    link = fresh_sampler()
    monkeypatch.setenv("GPUPROF_TEST_END_S", "1")
    session = ProfileSession("stopped", source="sim", store=store_dir, interval=0.05).start()
    directory = session._directory
    wait_for(lambda: stream_rows(directory) > 20, 30, "rows are on disk")
    pid = link.pid
    os.kill(pid, signal.SIGSTOP)
    written = stream_rows(directory)  # its writer is stopped too: nothing more comes
    try:
        experiment = session.stop()
    finally:
        if not gone(pid):
            os.kill(pid, signal.SIGCONT)
    assert gone(pid)  # killed and reaped before the kernel finished the run
    assert any("did not answer End" in n for n in experiment.meta.notes), experiment.meta.notes
    saved = Store(store_dir).load("stopped")
    assert saved.status == "ok" and len(saved.samples) == written > 20
    assert saved.summary and (Store(store_dir).directory(saved.meta) / "samples.parquet").exists()
    assert len(Store(store_dir).list()) == 1


def test_a_source_that_hangs_in_open_blocks_neither_requests_nor_leaves_a_run(store_dir, fresh_sampler, monkeypatch,
                                                                                tmp_path):
    """NVML's init hangs until the test lets it go; the sources' deadline is 1 s: begin fails
    with a note and the kernel saves the run itself; ping and status are answered while it is
    still stuck; when the hung call returns, the process creates nothing."""
    release = tmp_path / "release"
    link = fresh_sampler({**sampler_process_env({"gpus": ["a100"], "hang": {
        "function": "nvmlInitWithFlags", "after_calls": 1, "seconds": 600, "release_file": str(release)}}),
        "GPUPROF_TEST_OPEN_DEADLINE_S": "1", "GPUPROF_TEST_PROBE_DEADLINE_S": "1"})
    session = ProfileSession("hung-open", source="nvml", store=store_dir, interval=0.05)
    try:
        with pytest.warns(RuntimeWarning, match="did not finish within 1 s"):
            session.start()
        assert link.request(Ping(), timeout=60)["pid"] == link.pid
        status = link.request(Status(), timeout=60)  # NVML is still stuck: answered after its own deadline
        assert status["devices"] == [] and "did not finish" in status["problem"]
        experiment = session.stop()
    finally:
        release.touch()  # only now can the hung init return: all the above was answered while it hung
    assert experiment.meta.status == "ok" and any("did not finish within 1 s" in n for n in experiment.meta.notes)
    wait_for(lambda: not any(t.startswith("gpuprof-opening") for t in link.request(Ping())["threads"]), 30,
             "the hung open returns")
    assert [(m.name, m.status) for m in Store(store_dir).list()] == [("hung-open", "ok")]


def test_a_begin_the_kernel_gave_up_on_is_cancelled_not_left_running(store_dir, fresh_sampler, monkeypatch):
    """The kernel's begin timeout (shortened to 1 s) passes while NVML's init takes 3 s: the
    kernel cancels, saves its own record, and the process drops the run when its sources open."""
    link = fresh_sampler(sampler_process_env({"gpus": ["a100"], "hang": {
        "function": "nvmlInitWithFlags", "after_calls": 1, "seconds": 3}}))
    starts = link.starts
    monkeypatch.setenv("GPUPROF_TEST_BEGIN_S", "1")
    session = ProfileSession("given-up", source="nvml", store=store_dir, interval=0.05)
    with pytest.warns(RuntimeWarning, match="did not answer Begin"):
        session.start()
    experiment = session.stop()
    assert experiment.meta.status == "ok"
    wait_for(lambda: link.request(Ping())["beginning"] is None, 30, "the cancelled begin ends")
    assert [(m.name, m.status) for m in Store(store_dir).list()] == [("given-up", "ok")]
    assert Store(store_dir).load("given-up").meta.id == experiment.meta.id
    monkeypatch.delenv("GPUPROF_TEST_BEGIN_S")
    nxt = ProfileSession("after", source="nvml", store=store_dir, interval=0.05).start()
    wait_for(lambda: nxt.rows_seen > 0, 30, "the same process samples the next run")
    assert nxt.stop().meta.status == "ok" and link.starts == starts  # told, not killed


def _stop_if_alive(pid: int) -> None:
    """SIGSTOP ``pid`` unless it has already gone (a Timer's thread must not raise)."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGSTOP)


def test_a_begin_whose_cancel_is_not_answered_either_kills_the_process_and_cleans_up(store_dir, fresh_sampler,
                                                                                     monkeypatch):
    """The process stops answering (SIGSTOP) during a begin: the begin times out, the Cancel
    times out too, so the kernel kills and reaps the process, removes what that process had
    created and never finished, and keeps its own record of the run; the next run gets a new
    process."""
    import threading

    from gpuprof_jupyter.core.store.experiment import ExperimentMeta

    link = fresh_sampler(sampler_process_env({"gpus": ["a100"], "hang": {
        "function": "nvmlInitWithFlags", "after_calls": 1, "seconds": 3}}))
    starts, pid = link.starts, link.pid
    store = Store(store_dir)
    for name, owner in (("half-made", pid), ("someone-else", 1)):  # as a sampler process creates a run
        meta = ExperimentMeta(id="", name=name)
        store.create(meta)
        meta.pid = owner
        store.save_meta(meta)
    monkeypatch.setenv("GPUPROF_TEST_BEGIN_S", "1")
    monkeypatch.setenv("GPUPROF_TEST_CANCEL_S", "1")
    send = link._send

    def send_then_stop(message):  # stopped once the Begin is sent (NVML init then takes 3 s): a loaded
        send(message)             # machine's slow start is never taken for the unanswered begin
        if type(getattr(message, "body", None)).__name__ == "Begin":
            threading.Timer(0.3, _stop_if_alive, (pid,)).start()

    monkeypatch.setattr(link, "_send", send_then_stop)
    session = ProfileSession("unanswered", source="nvml", store=store_dir, interval=0.05)
    try:
        with pytest.warns(RuntimeWarning, match="did not answer Begin"):
            session.start()
        experiment = session.stop()
    finally:
        if not gone(pid):
            os.kill(pid, signal.SIGCONT)
    assert gone(pid)  # killed and reaped: it can write nothing more
    names = sorted((m.name, m.status) for m in store.list())
    assert names == [("someone-else", "running"), ("unanswered", "ok")], names  # its half-made run removed
    assert experiment.meta.status == "ok"
    monkeypatch.delenv("GPUPROF_TEST_BEGIN_S")
    nxt = ProfileSession("after", source="sim", store=store_dir, interval=0.05).start()
    wait_for(lambda: nxt.rows_seen > 0, 30, "a new process samples the next run")
    assert nxt.stop().meta.status == "ok" and link.starts == starts + 1 and link.pid != pid


def test_a_live_view_named_after_its_process_died_leaves_the_run_saved(store_dir, fresh_sampler):
    """The sampler process is killed before the live view names its plots: naming them raises
    nothing, and the run ends with what was written and a note."""
    from tests.fakes import PlotsOnThePage

    link = fresh_sampler()
    session = ProfileSession("gone-early", source="sim", store=store_dir, interval=0.05).start()
    wait_for(lambda: session.rows_seen > 0, 30, "the run samples")
    link.kill()
    PlotsOnThePage().started(session)  # tells the gone process: no exception
    experiment = session.stop()
    assert Store(store_dir).load("gone-early").meta.id == experiment.meta.id
    assert any("sampler process" in n for n in experiment.meta.notes), experiment.meta.notes


def _fuzz(rng: random.Random):
    """A random tuple (pickled, as the old protocol's messages were) or random bytes."""
    atoms = ["ping", "begin", "end", "events", "quit", "reply", "serve", "probe", 0, 1, -1, 2**70, 1.5, None,
             {}, {"as_of": "x"}, [], b"\x00", (), ("ping",)]
    if rng.random() < 0.5:
        return pickle.dumps(tuple(rng.choice(atoms) for _ in range(rng.randint(0, 5))))
    return rng.randbytes(rng.randint(0, 64))


def test_a_thousand_malformed_messages_mid_run_are_answered_and_the_run_is_saved_whole(store_dir, fresh_sampler):
    link = fresh_sampler()
    starts = link.starts
    session = ProfileSession("fuzzed", source="sim", store=store_dir, interval=0.05).start()
    wait_for(lambda: session.rows_seen > 0, 30, "the run samples")
    rng = random.Random(18)
    wrong = [pickle.dumps(m) for m in (Request("1", Ping()), Request(10**9, "ping"), Events(as_of="soon"),
                                        Request(10**9 + 1, Status(cuda_visible_devices=3)))]
    messages = wrong + [_fuzz(rng) for _ in range(1000 - len(wrong))]
    fuzz_began = time.monotonic() - session.t0
    for raw in messages:
        with link._send_lock:
            link.conn.send_bytes(raw)
    wait_for(lambda: link.request(Ping())["malformed"] == 1000, 60, "every message is answered")
    fuzz_ended, rows = time.monotonic() - session.t0, session.rows_seen
    wait_for(lambda: session.rows_seen > rows, 60, "the run samples after the fuzz")
    experiment = session.stop()
    assert link.alive and link.starts == starts
    assert experiment.meta.status == "ok"
    assert any("answered 1000 malformed message(s)" in n for n in experiment.meta.notes), experiment.meta.notes
    t = experiment.samples.t
    assert t.min() < fuzz_began and t.max() > fuzz_ended  # sampled before, and on after, the 1000 messages


def test_a_failing_exporter_is_turned_off_and_the_live_view_goes_on(store_dir, fresh_sampler, monkeypatch):
    """``exporter.update`` raises on the live thread: the exporter goes off with one note, the
    live rows keep coming in this run and the next ones."""
    link = fresh_sampler()
    exporter_control.serve(0, "127.0.0.1")
    monkeypatch.setenv(FAULT_ENV, "feeding the Prometheus exporter")
    session = ProfileSession("exporter-fails", source="sim", store=store_dir, interval=0.05).start()
    wait_for(lambda: session.rows_seen > 0, 30, "live rows arrive")
    seen = session.rows_seen
    wait_for(lambda: session.rows_seen > seen, 30, "live rows arrive after the exporter failed")
    experiment = session.stop()
    monkeypatch.delenv(FAULT_ENV)
    assert any("the Prometheus exporter failed (RuntimeError: injected" in n and "off" in n
               for n in experiment.meta.notes), experiment.meta.notes
    for name in ("later-1", "later-2"):
        later = ProfileSession(name, source="sim", store=store_dir, interval=0.05).start()
        wait_for(lambda: later.rows_seen > 0, 30, "the live view works in a later run")
        assert later.stop().meta.status == "ok"
    assert "gpuprof-live" in link.request(Ping())["threads"]


KILLED_SCRIPT = """\
import sys, time
from gpuprof_jupyter.runtime.session import ProfileSession
session = ProfileSession("killed", source="sim", store=sys.argv[1], interval=0.05).start()
print(session.meta.context["sampler_pid"], flush=True)
time.sleep(600)
"""


def test_a_sigkilled_kernel_is_saved_died_with_its_end_time(store_dir):
    """No DataLoader worker holds the socket: end of file reaches the process first (before the
    watchdog); the run is still ``died``, with ``ended_at``, and the process exits."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    kernel = subprocess.Popen([sys.executable, "-c", KILLED_SCRIPT, str(store_dir)], stdout=subprocess.PIPE,
                              text=True, env=env)
    try:
        sampler_pid = int(kernel.stdout.readline())
        meta_path = wait_for(lambda: next(store_dir.glob("*/meta.json"), None), 60, "the run starts")
        wait_for(lambda: stream_rows(meta_path.parent) > 0, 60, "rows are on disk")
    finally:
        kernel.kill()
        kernel.wait()
    wait_for(lambda: json.loads(meta_path.read_text())["status"] == "died", 15, "the run is saved as died")
    wait_for(lambda: gone(sampler_pid), 15, "the sampler process exits")
    experiment = Store(store_dir).load("killed")
    assert experiment.meta.ended_at and experiment.meta.error == "kernel died"
    assert len(experiment.samples) > 0 and experiment.summary


def test_the_link_hands_events_over_on_the_wake_up_a_live_update_brings(store_dir, monkeypatch):
    """Benchmarks/README.md: every wake-up of a kernel thread costs the training thread more than
    its own CPU. The live updates come once a second; the link's thread hands the kernel's events
    over right after each one, so the timer (here: an hour) never has to wake it."""
    import gpuprof_jupyter as gp
    from gpuprof_jupyter.runtime import link as link_module

    monkeypatch.setattr(link_module, "HANDOVER_PERIOD_S", 3600.0)
    seen: list[tuple[str, float]] = []
    send, dispatch = link_module.SamplerLink._send, link_module.SamplerLink._dispatch

    def spy_send(self, message):
        if isinstance(message, Events):
            seen.append(("events", time.monotonic()))
        return send(self, message)

    def spy_dispatch(self, raw):
        live = dispatch(self, raw)
        if live:
            seen.append(("update", time.monotonic()))
        return live

    monkeypatch.setattr(link_module.SamplerLink, "_send", spy_send)
    monkeypatch.setattr(link_module.SamplerLink, "_dispatch", spy_dispatch)
    try:
        with gp.profile("one-wake", source="sim", store=store_dir, interval=0.05):
            deadline = time.monotonic() + 3.5
            while time.monotonic() < deadline:
                time.sleep(0.05)
                gp.step()
            during = list(seen)
    finally:
        monkeypatch.undo()
        sampler_link().hand_over_soon()  # the link's thread takes its usual periods again
    kinds = [kind for kind, _ in during]
    updates = kinds.count("update")
    # once a second (the sender waits 1 s after each): about 4 in the 3.5 s, twice a second would be 7
    assert 2 <= updates <= 5, during
    # one thread receives and hands over: each hand-over right after the update that brought it;
    # none of its own (a lone "events" after the first update would be the timer's). An update
    # read late, just behind another, may bring none: the last hand-over is too recent.
    first = kinds.index("update")
    after = kinds[first:]
    assert "events" in after and all(after[i - 1] == "update" for i, k in enumerate(after) if k == "events"), during


def test_without_live_updates_the_links_timer_still_hands_events_over(store_dir, monkeypatch):
    """The edge of the one-wake-up design: a process whose updates bring no hand-over (a stuck
    live thread, say) still gets the kernel's events, every HANDOVER_PERIOD_S."""
    import gpuprof_jupyter as gp
    from gpuprof_jupyter.runtime import link as link_module

    monkeypatch.setattr(link_module, "HANDOVER_WITH_UPDATE_S", 3600.0)  # updates never bring one
    monkeypatch.setattr(link_module, "HANDOVER_PERIOD_S", 0.4)
    handed: list[float] = []
    send = link_module.SamplerLink._send

    def spy(self, message):
        if isinstance(message, Events):
            handed.append(time.monotonic())
        return send(self, message)

    monkeypatch.setattr(link_module.SamplerLink, "_send", spy)
    try:
        with gp.profile("timer", source="sim", store=store_dir, interval=0.05):
            deadline = time.monotonic() + 3.0
            while time.monotonic() < deadline:
                time.sleep(0.05)
                gp.step()
            during = list(handed)
    finally:
        monkeypatch.undo()
        sampler_link().hand_over_soon()
    assert len(during) >= 3, during  # the timer's, about every 0.4 s
