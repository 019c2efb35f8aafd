"""One contract, every source: NVML (on the fake), simulated, host, torch memory."""

from __future__ import annotations

import math
import time

import pytest

import gpuprof_jupyter as gp
from gpuprof_jupyter.core.metrics import METRICS, PROVENANCE
from gpuprof_jupyter.core.sources.host import HostSource
from gpuprof_jupyter.core.sources.nvml import NvmlSource
from gpuprof_jupyter.core.sources.simulated import SimulatedSource
from gpuprof_jupyter.core.sources.torch_memory import TorchMemorySource
from tests.fake_nvml import FakeNvml, a100, h100, sampler_process_env
from tests.fakes import LiveRows, flushed_rows, wait_for


@pytest.fixture
def fake_nvml():
    with FakeNvml([a100(0), h100(1)]) as fake:
        yield fake


def _sources():
    return {
        "nvml": lambda: NvmlSource(slow_interval_s=0.05),
        "sim": lambda: SimulatedSource("sim:compute-bound:2"),
        "host": HostSource,
        "torch": lambda: TorchMemorySource({0: "gpu0"}),
    }


def check_source_contract(source, kind: str) -> None:
    """The contract every source keeps: known metrics as floats, a provenance tag each, shares
    within 0-100 %, simulated devices named so, and every device it opened read with at least one
    metric (a source that opens devices and returns nothing breaks it)."""
    devices = source.open()
    keys = {d.key for d in devices}
    provenance = source.provenance()
    read_metrics: dict[str, set] = {key: set() for key in keys}
    for _ in range(3):
        time.sleep(0.02)
        reading = source.read()
        for device, values in reading.items():
            if devices:
                assert device in keys
            for metric, value in values.items():
                assert metric in METRICS, f"{kind} produced unknown metric {metric}"
                assert isinstance(value, float), (metric, value)
                assert provenance[device][metric] in PROVENANCE, provenance[device][metric]
                if not math.isnan(value) and METRICS[metric].unit in ("%",):
                    assert -1e-9 <= value <= 100.0 + 1e-9, (metric, value)
                read_metrics.setdefault(device, set()).add(metric)
    unread = sorted(key for key, metrics in read_metrics.items() if not metrics)
    assert not unread, f"{kind} opened {unread} but read nothing from them"
    for device in devices:
        assert device.simulated == source.simulated
        if source.simulated:
            assert "simulated" in device.name
    assert isinstance(source.notes(), list) and isinstance(source.context(), dict)


@pytest.mark.parametrize("kind", list(_sources()))
def test_source_contract(kind, fake_nvml):
    source = _sources()[kind]()
    try:
        check_source_contract(source, kind)
    finally:
        source.close()


def test_the_contract_fails_a_source_that_reads_nothing():
    """A source that opens its devices and then always returns ``{}`` must not pass."""

    class Silent(SimulatedSource):
        def read(self):
            return {}

    source = Silent("sim:compute-bound:1")
    try:
        with pytest.raises(AssertionError, match="read nothing"):
            check_source_contract(source, "silent")
    finally:
        source.close()


@pytest.mark.process
def test_a_lost_gpu_does_not_stop_the_live_view_of_the_others(fresh_sampler, store_dir):
    """Live rows wait until every device has reported up to their time; a device gone silent
    (a lost GPU) stops holding the others once it is silent for longer than any source lags."""
    import time

    from tests.fakes import LiveRows

    fresh_sampler(sampler_process_env({"gpus": ["a100", {"kind": "h100", "lost_after_reads": 8}]}))
    rows = LiveRows()
    started = time.monotonic()
    with gp.profile("lost-live", source="nvml", store=store_dir, interval=0.02, observers=[rows]):
        wait_for(lambda: rows.newest.get("gpu0", 0) - started > 5.0, 30, "gpu0's live rows going on past the loss")
    assert rows.newest["gpu1"] < rows.newest["gpu0"] - 3.0


@pytest.mark.process
def test_session_on_fake_nvml_records_gpus_and_host_and_survives_a_lost_gpu(fresh_sampler, store_dir):
    """Through the sampler process, with the fake NVML installed in it."""
    fresh_sampler(sampler_process_env({"gpus": ["a100", {"kind": "h100", "lost_after_reads": 8}]}))
    with gp.profile("lost", source="nvml", store=store_dir, interval=0.02) as run:
        def gpu0_went_on():  # gpu1 is lost after 8 reads; gpu0 and the host go on sampling
            last = flushed_rows(run.session).groupby("device")["t"].max()
            return "gpu1" in last and last.get("gpu0", 0) > last["gpu1"] + 0.3

        wait_for(gpu0_went_on, 30, "gpu0 sampled 0.3 s past gpu1's loss")
    exp = run.experiment
    samples = exp.samples
    assert exp.meta.source == "nvml" and not exp.meta.simulated
    per_device = samples.groupby("device")["t"].max()
    assert per_device["gpu1"] < per_device["gpu0"] - 0.2  # gpu1's series ended, gpu0's went on
    assert per_device["host"] >= per_device["gpu0"] - 0.05
    assert any("gpu1" in n and "lost" in n.lower() for n in exp.meta.notes)
    tags = exp.meta.provenance
    assert tags["gpu0"]["sm_util"] == "nvml.utilization.gpu"  # A100: kernel-active time
    assert tags["gpu1"]["sm_util"] == "gpm.sm_util"  # H100: share of SMs busy
    assert [d["uuid"] for d in exp.meta.gpu_devices] == [a100(0).uuid, h100(1).uuid]
    assert exp.meta.context.get("driver_version")


@pytest.mark.process
def test_no_nvml_library_gives_one_note_and_host_metrics(fresh_sampler, store_dir):
    fresh_sampler(sampler_process_env({"gpus": [], "library_present": False}))
    live = LiveRows()
    with gp.profile("nogpu", source="nvml", store=store_dir, interval=0.02, observers=[live]) as run:
        wait_for(lambda: "host" in live.newest, 30, "a live host row")
    exp = run.experiment
    assert set(exp.samples["device"]) == {"host"}
    assert exp.meta.source == "host"
    assert sum("no GPU metrics" in n for n in exp.meta.notes) == 1


@pytest.mark.process
def test_devices_flag_selects_among_visible(fresh_sampler, store_dir):
    fresh_sampler(sampler_process_env({"gpus": ["a100", "h100"]}))
    live = LiveRows()
    with gp.profile("one", source="nvml", devices=[1], store=store_dir, interval=0.02, observers=[live]) as run:
        wait_for(lambda: {"gpu1", "host"} <= live.newest.keys(), 30, "live rows of gpu1 and the host")
    assert set(run.experiment.samples["device"]) == {"gpu1", "host"}


@pytest.mark.process
def test_other_processes_on_our_gpus_are_counted_ours_are_not(fresh_sampler, store_dir):
    import os

    fresh_sampler(sampler_process_env({"gpus": [
        {"kind": "a100", "processes": [[os.getpid(), 2 * 1024**3], [1, 5 * 1024**3]]}, "h100"]}))
    with gp.profile("shared", source="nvml", store=store_dir, interval=0.02) as run:
        def shares_read():  # once a second, on their own lane
            rows = flushed_rows(run.session)
            return "other_gpu_mem_bytes" in rows and rows["other_gpu_mem_bytes"].notna().any()

        wait_for(shares_read, 30, "a per-process share reading")
    sharing = run.experiment.meta.context["gpu_sharing"]["devices"]  # counts only: no PID, no name
    assert sharing["gpu0"]["other_processes_max"] == 1 and sharing["gpu0"]["other_gpu_mem_peak_bytes"] == 5 * 1024**3
    assert sharing["gpu0"]["own_gpu_mem_peak_bytes"] == 2 * 1024**3  # this process is the kernel: ours
    assert sharing["gpu1"]["other_processes_max"] == 0


@pytest.mark.process
@pytest.mark.parametrize("source", ["sim", "nvml"])
def test_the_live_plots_get_whole_rows_in_order(fresh_sampler, store_dir, source):
    """The sampler process prepares the plots' streams: every slot once, in time order, with
    all its devices, also when one source is batched and lags the others (the simulated GPU
    follows the kernel's events, the host is read at once)."""
    if source == "nvml":
        fresh_sampler(sampler_process_env({"gpus": ["a100", "h100"]}))
    from tests.fakes import PlotsOnThePage

    page = PlotsOnThePage()
    with gp.profile("rows", source=source, store=store_dir, interval=0.1, observers=[page]):
        wait_for(lambda: sum(len(s["t"]) for s in page.streamed()) >= 30, 60, "3 s of streamed rows")
    streams = page.streamed()
    times = [t for stream in streams for t in stream["t"]]
    assert times == sorted(set(times)), "a slot streamed twice or out of order"
    gpu_columns = [c for c in page.spec.columns if c.startswith("sm_util__gpu")]
    for stream in streams[:-1]:  # the last one (the run's end) may hold rows the simulated GPU had not covered
        for column in gpu_columns:
            assert not any(isinstance(v, dict) for v in stream[column]), f"a row without {column}: {stream}"
    assert math.isclose(times[1] - times[0], 0.1, abs_tol=1e-6)


def test_the_live_view_waits_for_a_simulated_gpu_as_long_as_the_kernels_events_can_take(tmp_path):
    """The simulated GPU's rows wait for the kernel's events; on a loaded machine they come
    seconds late. Rows of the host are held for them (not streamed without the GPU, whose rows
    would then come after their slot): up to EVENTS_LAG_S, and no longer (a GPU gone silent)."""
    from gpuprof_jupyter.core.protocol import Begin, Tick
    from gpuprof_jupyter.runtime.run_options import RunOptions
    from gpuprof_jupyter.sampler_process.lanes import EVENTS_LAG_S
    from gpuprof_jupyter.sampler_process.live_buffer import LiveBuffer
    from gpuprof_jupyter.sampler_process.run import Run

    now = time.monotonic()
    begin = Begin(token="t", t0=now - 10.0, options=RunOptions(interval=0.1, store=tmp_path, source="sim"),
                  meta={"id": "", "name": "lag"})
    run = Run(begin, kernel_pid=None)
    run.open()
    assert [s.name for s in run.lanes.sources if getattr(s, "follows_events", False)] == ["sim"]

    def rows_sent_behind(lag_s: float) -> list[float]:
        """Host rows every 0.1 s until now, the GPU's until now - lag_s: the host rows sent past it."""
        run.live_buffer = LiveBuffer(run.view.slot_index)  # no device known, none held
        gpu_until = now - lag_s
        for i in range(1, 100):
            t = now - 10.0 + 0.1 * i
            reading = {"host": {"cpu_util": 1.0}, **({"gpu0": {"sm_util": 50.0}} if t <= gpu_until else {})}
            run.live_buffer.ticks.append(Tick(t, t, reading))
        rows = run.live_batch({}).rows
        return [t for t, device, _ in rows if device == "host" and t > gpu_until + 0.1]

    assert rows_sent_behind(EVENTS_LAG_S - 1.0) == []  # late events: waited for (2 s used to be the limit)
    assert rows_sent_behind(EVENTS_LAG_S + 2.0) != []  # a GPU silent longer holds nobody back
