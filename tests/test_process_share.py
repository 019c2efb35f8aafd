"""Per-process attribution on shared GPUs: this kernel's share against other processes.

The fake NVML (tests/fake_nvml.py, ProcessListsFake) reports this process's PID and a foreign
one (999999) in the running-process lists and in nvmlDeviceGetProcessUtilization.
"""

from __future__ import annotations

import os
import re
import time

import pandas as pd
import pynvml
import pytest

import gpuprof_jupyter as gp
from tests.fake_nvml import GIB, NOT_SUPPORTED, FakeMig, FakeNvml, a100, h100, sampler_process_env
from gpuprof_jupyter.core.analysis.compare import compare_experiments
from gpuprof_jupyter.core.analysis.sharing import describe_others, others_by_device
from gpuprof_jupyter.core.analysis.summary import summary_of
from gpuprof_jupyter.core.metrics import METRICS
from gpuprof_jupyter.core.sources import gpu_processes
from gpuprof_jupyter.core.sources.gpu_processes import ProcessShareSource
from gpuprof_jupyter.core.sources.process_attribution import (
    MEMORY, PID, UNMATCHED, ReservedEvidence, attribute, in_host_pid_namespace, split_shares)
from gpuprof_jupyter.core.store.directory import Store
from gpuprof_jupyter.core.store.experiment import Experiment, ExperimentMeta
from gpuprof_jupyter.core.plots.columns import LatestValues
from gpuprof_jupyter.core.plots.spec import plot_spec
from gpuprof_jupyter.render.live_header import current_values_text, share_text
from gpuprof_jupyter.render.summary_html import render_summary_html, render_summary_text

FOREIGN = 999999
ME = os.getpid()
SHARE = ("own_sm_util", "other_sm_util", "own_gpu_mem_bytes", "other_gpu_mem_bytes")


def shared_gpu(i: int = 0, **kw):
    """A GPU running this process (3 GiB, SM 60 %) and a foreign one (5 GiB, SM 25 %)."""
    kw.setdefault("processes", [(ME, 3 * GIB), (FOREIGN, 5 * GIB)])
    kw.setdefault("process_sm_util", {ME: 60, FOREIGN: 25})
    return a100(i, **kw)


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def opened(fake, **kw) -> ProcessShareSource:
    kw.setdefault("host_namespace", lambda: True)
    src = ProcessShareSource(**kw)
    assert src.open() == []  # adds metrics to the GPU source's devices
    return src


# ----------------------------------------------------------------------------- the rules
def test_host_namespace_matches_by_pid_and_an_absent_kernel_is_a_real_zero():
    listed = {ME: 3.0 * GIB, FOREIGN: 5.0 * GIB}
    a = attribute(listed, {ME, ME + 1}, host_namespace=True)
    assert (a.ours, a.method, a.others_at_least) == (frozenset({ME}), PID, 1)
    alone = attribute({FOREIGN: 5.0 * GIB}, {ME}, host_namespace=True)
    assert (alone.ours, alone.method, alone.others_at_least) == (frozenset(), PID, 1)
    assert split_shares(alone.ours, {FOREIGN: 30.0}, {FOREIGN: 5.0 * GIB}) == {
        "own_sm_util": 0.0, "other_sm_util": 30.0, "own_gpu_mem_bytes": 0.0, "other_gpu_mem_bytes": 5.0 * GIB}


def test_another_namespace_never_trusts_an_equal_pid():
    # the kernel is pid ME in its container; a host process happens to have the same number
    a = attribute({ME: 1.0 * GIB, FOREIGN: 5.0 * GIB}, {ME}, host_namespace=False)
    assert a.ours is None and a.method == UNMATCHED and a.others_at_least == 1


def test_memory_evidence_needs_one_candidate_twice_in_a_row():
    listed = {4242: 3.0 * GIB, FOREIGN: 1.0 * GIB}
    first = attribute(listed, {ME}, False, reserved=2.5 * GIB)
    assert first.ours is None and first.candidate == 4242  # once is not enough
    second = attribute(listed, {ME}, False, reserved=2.5 * GIB, previous_candidate=first.candidate)
    assert (second.ours, second.method) == (frozenset({4242}), MEMORY)
    two = {4242: 3.0 * GIB, FOREIGN: 6.0 * GIB}  # both hold more than the kernel reserved
    assert attribute(two, {ME}, False, 2.5 * GIB, previous_candidate=4242).method == UNMATCHED
    small = attribute(listed, {ME}, False, reserved=64 * 1024**2, previous_candidate=4242)
    assert small.method == UNMATCHED  # a tiny reservation matches too much to mean anything
    assert attribute(listed, {ME}, False, reserved=None, previous_candidate=4242).method == UNMATCHED


def test_lower_bound_of_others_is_sound_in_a_container():
    tree = {ME, ME + 1, ME + 2}  # kernel + two DataLoader workers
    listed = {p: 1.0 * GIB for p in range(10, 15)}  # 5 host PIDs, none comparable
    assert attribute(listed, tree, False).others_at_least == 2
    assert attribute({10: 1.0 * GIB}, {ME}, False).others_at_least == 0  # alone: maybe us
    assert attribute({}, {ME}, False).ours == frozenset()  # nobody on the GPU: a real 0


def test_reserved_evidence_is_the_window_minimum():
    evidence = ReservedEvidence(window_s=3.0)
    evidence.observe(10.0, {"gpu0": {"torch_mem_reserved_bytes": 4.0 * GIB, "torch_mem_allocated_bytes": 1.0}})
    evidence.observe(11.0, {"gpu0": {"torch_mem_reserved_bytes": 2.0 * GIB}})  # empty_cache()
    evidence.observe(12.0, {"gpu0": {"torch_mem_reserved_bytes": 5.0 * GIB}, "gpu1": {}})
    assert evidence() == {"gpu0": 2.0 * GIB}
    assert evidence(now=14.5) == {"gpu0": 5.0 * GIB}  # the 2 GiB report left the window


def test_process_tree_of_a_gone_pid_is_empty():
    assert ME in gpu_processes.process_tree() and gpu_processes.process_tree(2**22 + 12345) == set()


def test_pid_namespace_check(tmp_path):
    assert in_host_pid_namespace(str(tmp_path / "absent")) is None
    (tmp_path / "f").write_text("")
    assert in_host_pid_namespace(str(tmp_path / "f")) is False


# ----------------------------------------------------------------------------- the source
def test_own_and_other_shares_and_memory_with_a_foreign_pid():
    gpu = shared_gpu(graphics_processes=[(ME, 3 * GIB), (FOREIGN + 1, 1 * GIB)])  # ME in both lists: once
    with FakeNvml([gpu, a100(1)]) as fake:
        src = opened(fake, clock=Clock())
        reading = src.read()
        src.close()
    assert reading["gpu0"] == {"own_sm_util": 60.0, "other_sm_util": 25.0,
                               "own_gpu_mem_bytes": 3.0 * GIB, "other_gpu_mem_bytes": 6.0 * GIB}
    assert reading["gpu1"] == dict.fromkeys(SHARE, 0.0)  # nobody there: real zeros
    assert fake.count("nvmlDeviceGetProcessUtilization") == 2 + 1  # gpu0: size, then samples; gpu1: NOT_FOUND
    share = src.final_context()["gpu_sharing"]
    assert share["pid_namespace"] == "host"
    assert share["devices"]["gpu0"]["attribution"] == ["pid"]
    assert share["devices"]["gpu0"]["other_processes_max"] == 2
    assert share["devices"]["gpu0"]["other_gpu_mem_peak_bytes"] == 6.0 * GIB
    assert str(FOREIGN) not in repr(share)


def test_reads_once_a_second_and_no_kernel_ran_is_zero():
    clock = Clock()
    gpu = shared_gpu(process_sm_util={})  # NVML_ERROR_NOT_FOUND: no process ran a kernel
    with FakeNvml([gpu]):
        src = opened(fake=None, clock=clock)
        assert src.interval_s == 1.0
        first = src.read()
        clock.t += 0.1
        assert src.read() == {}  # sooner than its native window: nothing new
        clock.t += 1.0
        assert src.read()["gpu0"]["own_sm_util"] == 0.0
        src.close()
    assert first["gpu0"]["own_sm_util"] == 0.0 and first["gpu0"]["other_gpu_mem_bytes"] == 5.0 * GIB


def test_container_without_evidence_says_so_and_records_nothing():
    gpu = shared_gpu(processes=[(4242, 3 * GIB)], process_sm_util={4242: 70})  # our host PID: unknown
    with FakeNvml([gpu]):
        src = opened(None, host_namespace=lambda: False, clock=Clock())
        assert src.read() == {}  # not zero: not measured
        src.close()
    [note] = src.notes()
    assert note.startswith("gpu0: NVML reports host PIDs; this kernel runs in another PID namespace")
    share = src.final_context()["gpu_sharing"]
    assert share["pid_namespace"] == "separate"
    assert share["devices"]["gpu0"]["attribution"] == ["unmatched"]
    assert share["devices"]["gpu0"]["other_processes_max"] == 0  # alone in the container: no others claimed


def test_container_kernel_found_by_its_reserved_memory():
    clock = Clock()
    gpu = shared_gpu(processes=[(4242, 3 * GIB), (FOREIGN, 1 * GIB)], process_sm_util={4242: 70, FOREIGN: 10})
    with FakeNvml([gpu]):
        src = opened(None, host_namespace=lambda: False, clock=clock,
                     own_reserved=lambda: {"gpu0": 2.5 * GIB})
        assert src.read() == {}  # one candidate once: not yet
        clock.t += 1.0
        reading = src.read()
        src.close()
    assert reading["gpu0"] == {"own_sm_util": 70.0, "other_sm_util": 10.0,
                               "own_gpu_mem_bytes": 3.0 * GIB, "other_gpu_mem_bytes": 1.0 * GIB}
    assert src.final_context()["gpu_sharing"]["devices"]["gpu0"]["attribution"] == ["memory", "unmatched"]
    assert any("only one on the GPU holding at least its torch reserved memory" in n for n in src.notes())


def test_mig_slices_are_not_available(monkeypatch):
    parent = h100(0, mig_mode=True, migs=[FakeMig("MIG-0f0f0f0f-1111-2222-3333-000000000001")])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", parent.migs[0].uuid)
    with FakeNvml([parent]) as fake:
        src = opened(fake, clock=Clock())
        assert src.read() == {} and src.provenance() == {}
        src.close()
    assert any("not available on MIG slices" in n for n in src.notes())
    assert src.final_context()["gpu_sharing"]["devices"]["gpu0"]["attribution"] == ["not_available"]


@pytest.mark.parametrize("old", ["not_supported", "function_missing"])
def test_process_utilization_missing_keeps_the_memory_split(old):
    gpu = shared_gpu()
    missing = ["nvmlDeviceGetProcessUtilization"] if old == "function_missing" else []
    if old == "not_supported":
        gpu.errors["nvmlDeviceGetProcessUtilization"] = NOT_SUPPORTED
    clock = Clock()
    with FakeNvml([gpu], missing_functions=missing) as fake:
        src = opened(fake, clock=clock)
        first = src.read()
        clock.t += 1.0
        src.read()
        src.close()
    assert first["gpu0"] == {"own_gpu_mem_bytes": 3.0 * GIB, "other_gpu_mem_bytes": 5.0 * GIB}
    assert fake.count("nvmlDeviceGetProcessUtilization") <= 1  # dropped after the first refusal
    notes = [n for n in src.notes() if "own_sm_util, other_sm_util not available" in n]
    assert len(notes) == 1 and "nvmlDeviceGetProcessUtilization" in notes[0]


def test_old_driver_lists_processes_with_v2():
    with FakeNvml([shared_gpu()], missing_functions=["nvmlDeviceGetComputeRunningProcesses_v3",
                                                     "nvmlDeviceGetGraphicsRunningProcesses_v3"]) as fake:
        reading = opened(fake, clock=Clock()).read()
    assert reading["gpu0"]["other_gpu_mem_bytes"] == 5.0 * GIB


def test_no_permission_to_list_processes_keeps_the_sm_split():
    gpu = shared_gpu()
    gpu.errors["nvmlDeviceGetComputeRunningProcesses"] = pynvml.NVML_ERROR_NO_PERMISSION
    with FakeNvml([gpu]) as fake:
        src = opened(fake, clock=Clock())
        reading = src.read()
    assert reading["gpu0"] == {"own_sm_util": 60.0, "other_sm_util": 25.0}
    assert any("cannot list the processes" in n for n in src.notes())


# ------------------------------------------------------------------- end to end, stored
def _foreign_pid_in(text: str) -> bool:
    return re.search(rf"(?<![\d.]){FOREIGN}(?!\d)", text) is not None


def _scan_store(store_dir) -> None:
    files = [path for path in store_dir.rglob("*") if path.is_file()]
    assert any(path.name == "meta.json" for path in files)
    for path in files:  # meta.json, samples, notes: nowhere
        assert not _foreign_pid_in(path.read_bytes().decode("latin-1")), path


def share_experiment(gpu, name: str, reads: int = 3, **kw) -> Experiment:
    """An experiment made of ProcessShareSource readings on a fake clock, 1 s apart (the lead
    registers the source in the sampler process; until then it is read here directly)."""
    clock = Clock()
    rows = []
    with FakeNvml([gpu]):
        src = opened(None, clock=clock, **kw)
        for i in range(reads):
            values = src.read().get("gpu0", {})
            rows.append({"t": float(i), "wall_time": 1.9e9 + i, "device": "gpu0", "sm_util": 90.0, **values})
            clock.t += 1.0
        src.close()
    provenance = src.provenance() or {"gpu0": {}}
    provenance["gpu0"]["sm_util"] = "nvml.utilization.gpu"
    units = {m: METRICS[m].unit for tags in provenance.values() for m in tags}
    meta = ExperimentMeta(
        id=f"share-{name}", name=name, status="ok", duration_s=float(reads), interval_s=1.0, source="nvml",
        devices=[{"key": "gpu0", "kind": "gpu", "name": gpu.name}], provenance=provenance, units=units,
        context=src.final_context(), notes=src.notes(), params={"run": name})
    return Experiment(meta, samples=pd.DataFrame(rows))


@pytest.mark.process
def test_foreign_pid_is_nowhere_in_what_the_sampler_process_stores(fresh_sampler, store_dir):
    fresh_sampler(sampler_process_env({"gpus": [
        {"kind": "a100", "processes": [[ME, 3 * GIB], [FOREIGN, 5 * GIB]],
         "graphics_processes": [[FOREIGN, 5 * GIB]], "process_sm_util": {str(ME): 60, str(FOREIGN): 25}}]}))
    with gp.profile("shared", source="nvml", store=store_dir, interval=0.05):
        time.sleep(0.2)
    _scan_store(store_dir)


def test_own_and_other_in_the_stored_experiment_summary_and_html(store_dir):
    exp = share_experiment(shared_gpu(), "shared", host_namespace=lambda: True)
    Store(store_dir).create(exp.meta)
    _scan_store(store_dir)
    assert "gpu_sharing" in (store_dir / exp.meta.id / "meta.json").read_text()
    assert others_by_device(exp.meta.context) == {
        "gpu0": {"processes": 1, "used_memory_bytes": 5.0 * GIB, "sm_util_mean": 25.0}}
    gpu0 = summary_of(exp)["devices"]["gpu0"]
    assert gpu0["own_sm_util_mean"] == pytest.approx(60.0) and gpu0["other_sm_util_mean"] == pytest.approx(25.0)
    assert gpu0["own_gpu_mem_peak_bytes"] == 3.0 * GIB and gpu0["other_gpu_mem_peak_bytes"] == 5.0 * GIB
    html, text = render_summary_html(exp), render_summary_text(exp)
    assert "SM yours / others" in html and "60 % / 25 %" in html and "3.0 GiB / 5.0 GiB" in text
    assert not _foreign_pid_in(html + text)


def test_container_runs_do_not_warn_about_themselves():
    runs = [share_experiment(shared_gpu(processes=[(4242, 3 * GIB)], process_sm_util={4242: 80}), name,
                             host_namespace=lambda: False)  # only the kernel, by its host PID
            for name in ("before", "after")]
    assert all(any("another PID namespace" in n for n in e.meta.notes) for e in runs)
    assert "own_sm_util" not in runs[0].samples
    kinds = [w.kind for w in compare_experiments(runs).warnings]
    assert "other-processes" not in kinds
    assert "not measured: another PID namespace" in render_summary_text(runs[0])
    crowded = share_experiment(shared_gpu(processes=[(4242, 3 * GIB), (4243, 1 * GIB), (4244, 1 * GIB)],
                                          process_sm_util={4242: 80, 4243: 5}), "crowded",
                               host_namespace=lambda: False, own_pids=lambda: {ME})
    warnings = {w.kind: w for w in compare_experiments([runs[0], crowded]).warnings}
    assert "2 other processes on gpu0" in warnings["other-processes"].message  # 3 listed, a 1-process tree


def test_legacy_per_pid_context_warns_with_counts_only():
    context = {"other_gpu_processes": [
        {"device": "gpu0", "pid": 31337, "name": "python", "used_memory_bytes": 2 * GIB},
        {"device": "gpu0", "pid": 31338, "name": "python", "used_memory_bytes": 1 * GIB}]}
    text = describe_others(others_by_device(context))
    assert text == "2 other processes on gpu0 (3.0 GiB)" and "31337" not in text


def test_idle_others_do_not_make_a_comparison_unfair():
    context = {"gpu_sharing": {"devices": {"gpu0": {"attribution": ["pid"], "other_processes_max": 1,
                                                    "other_gpu_mem_peak_bytes": 2.0 * GIB,
                                                    "other_sm_util_mean": 0.2}}}}

    class E:
        class meta:
            pass

    E.meta.context = context
    from gpuprof_jupyter.core.analysis.compare import other_processes

    assert other_processes(E) == {}
    context["gpu_sharing"]["devices"]["gpu0"]["other_sm_util_mean"] = 30.0
    assert list(other_processes(E)) == ["gpu0"]


# ------------------------------------------------------------------------ live header
def test_live_header_shows_own_share_and_keeps_it_between_slow_readings(monkeypatch):
    class Meta:
        name, simulated = "run", False
        devices = [{"key": "gpu0", "kind": "gpu", "name": "A100"}]
        gpu_devices = devices
        provenance = {"gpu0": {"sm_util": "nvml.utilization.gpu"}}
        units = {"sm_util": "%", "own_sm_util": "%"}

    spec = plot_spec(Meta)
    latest = LatestValues()  # kept in the sampler process, sent with each live update
    shares = {"own_sm_util": 60.0, "other_sm_util": 25.0, "own_gpu_mem_bytes": 3.0 * GIB,
              "other_gpu_mem_bytes": 5.0 * GIB}
    latest.add("gpu0", {"sm_util": 90.0, **shares}, 1.0)
    latest.add("gpu0", {"sm_util": 91.0}, 1.1)
    [line] = current_values_text(spec, latest.values)
    assert line == "gpu0 SM 91 % · yours SM 60 % / others 25 %, mem 3.0 GiB / 5.0 GiB"
    latest.add("gpu0", {"sm_util": 92.0}, 5.0)  # shares stale after 2.5 s: gone
    assert current_values_text(spec, latest.values) == ["gpu0 SM 92 %"]
    assert share_text({"own_sm_util": float("nan"), "other_sm_util": 3.0}) == ""
