"""Issue 9: the sampler process. The kernel never opens NVML; faults in the process, the
kernel, NVML or the disk leave a complete experiment, a note, and no stray process.

These tests run the real process (``python -m gpuprof_jupyter.sampler_process``), with the
fake NVML installed in it through ``GPUPROF_FAKE_NVML`` where NVML is needed.
"""

from __future__ import annotations

import json
import os
import signal
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from gpuprof_jupyter.kernel.runtime.session import ProfileSession
from gpuprof_jupyter.kernel.link import sampler_link
from gpuprof_jupyter.core.store.directory import Store
from tests.fake_nvml import sampler_process_env
from tests.fakes import wait_for
from tests.kernel_helpers import execute, running_kernel, text_of


def sampler_processes(kernel_pid: int | None = None) -> list[psutil.Process]:
    """Live sampler processes (of one kernel, when given)."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        cmd = proc.info["cmdline"] or []
        if "gpuprof_jupyter.sampler_process" in cmd and proc.info["status"] != psutil.STATUS_ZOMBIE:
            if kernel_pid is None or str(kernel_pid) in cmd:
                found.append(proc)
    return found


# -- the kernel never opens NVML -------------------------------------------------------------------
def test_the_kernel_never_loads_nvml_yet_profiles_fake_gpus(tmp_path):
    """A real kernel: %load_ext, a profiled cell on NVML (the fake, in the sampler process),
    %gpuprofile status and gpu_available(): pynvml is never even imported in the kernel."""
    env = sampler_process_env({"gpus": ["a100", "h100"]})
    store = tmp_path / "store"
    with running_kernel(tmp_path, env) as (km, kc):
        code = textwrap.dedent(f"""\
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
    time.sleep(3.0)  # longer than one write period (2 s): rows are on disk
    os.kill(first, signal.SIGKILL)
    wait_for(lambda: not link.alive, 5, "the link notices the process died")
    experiment = session.stop()
    assert experiment.meta.status == "ok"  # the user's cell went on
    assert any("stopped unexpectedly" in n for n in experiment.meta.notes), experiment.meta.notes
    assert len(experiment.samples) > 20  # what was written is kept, read back from Parquet
    assert (Store(store_dir).directory(experiment.meta) / "samples.parquet").exists()
    nxt = ProfileSession("after", source="sim", store=store_dir, interval=0.05).start()
    time.sleep(0.3)
    after = nxt.stop()
    assert link.pid != first and after.meta.status == "ok" and len(after.samples) > 0
    assert not any("stopped unexpectedly" in n for n in after.meta.notes)


# -- NVML hangs ------------------------------------------------------------------------------------
def test_a_hung_nvml_call_delays_neither_the_cell_nor_its_end(store_dir, fresh_sampler):
    fresh_sampler(sampler_process_env({"gpus": ["a100"], "hang": {
        "function": "nvmlDeviceGetMemoryInfo", "after_calls": 6, "seconds": 30}}))
    session = ProfileSession("hang", source="nvml", store=store_dir, interval=0.05).start()
    time.sleep(1.5)  # the 6th reading hangs after ~0.3 s
    began = time.monotonic()
    experiment = session.stop()
    assert time.monotonic() - began < 5.0  # not the 30 s of the hung call
    gaps = experiment.meta.gaps
    assert gaps and gaps[-1][1] - gaps[-1][0] > 1.0, gaps  # the stall is a recorded gap
    assert any("stopped answering" in n for n in experiment.meta.notes), experiment.meta.notes
    # the next run works (the hung thread is left behind; a new source is opened)
    nxt = ProfileSession("next", source="host", store=store_dir, interval=0.05).start()
    time.sleep(0.3)
    assert nxt.stop().meta.status == "ok"


# -- the kernel dies -------------------------------------------------------------------------------
KILLED_CELL = """\
%%gpuprofile --source sim --no-live --interval 0.05 --store {store} -n doomed
import torch, time, gpuprof_jupyter as gp
from torch.utils.data import DataLoader, TensorDataset
loader = DataLoader(TensorDataset(torch.zeros(100000, 4)), batch_size=8, num_workers=2,
                    multiprocessing_context="fork", persistent_workers=True)
while True:
    for (x,) in loader:
        time.sleep(0.01)
        gp.step(len(x))
"""


def test_a_killed_kernel_leaves_a_complete_experiment_and_no_stray_process(tmp_path):
    """SIGKILL a real kernel mid-cell while forked DataLoader workers hold its sockets: the
    sampler process notices within 2 s, saves the run as ``died`` with Parquet and steps, and exits."""
    store = tmp_path / "store"
    with running_kernel(tmp_path) as (km, kc):
        execute(kc, "%load_ext gpuprof_jupyter")
        kernel_pid = int(text_of(execute(kc, "import os; print(os.getpid())")[1]).strip())
        kc.execute(KILLED_CELL.format(store=store))
        meta_path = wait_for(lambda: next(Store(store).root.glob("*/meta.json"), None), 60, "the run starts")
        kernel = psutil.Process(kernel_pid)
        wait_for(lambda: len(kernel.children(recursive=True)) >= 3, 60, "DataLoader workers and the sampler run")
        time.sleep(3.0)  # some steps and one write period
        [sampler] = sampler_processes(kernel_pid)
        killed_at = time.monotonic()
        os.kill(kernel_pid, signal.SIGKILL)
        wait_for(lambda: json.loads(Path(meta_path).read_text())["status"] == "died", 15, "the run is saved as died")
        finished = time.monotonic() - killed_at
        wait_for(lambda: not sampler.is_running() or sampler.status() == psutil.STATUS_ZOMBIE, 10,
                 "the sampler process exits")
    experiment = Store(store).load("doomed")
    assert experiment.meta.status == "died"
    assert finished < 2.0 + 3.0  # noticed within 2 s (+ writing Parquet and the summary)
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
            from gpuprof_jupyter.kernel.link import sampler_link
            link = sampler_link()
            print(sorted(t.name for t in threading.enumerate() if t.name.startswith("gpuprof")))
            print(link.starts, link.pid)
            ping = link.request("ping")
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
        execute(kc, "%load_ext gpuprof_jupyter\nfrom gpuprof_jupyter.kernel.link import sampler_link")
        msg_id = kc.execute(f"%%gpuprofile --source sim --no-live --store {store} -n stopped\n"
                            "import time\nwhile True: time.sleep(0.05)")
        wait_for(lambda: next(Store(store).root.glob("*/meta.json"), None), 60, "the run starts")
        time.sleep(1.0)
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
