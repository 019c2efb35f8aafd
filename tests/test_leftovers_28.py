"""Leftovers of the last round (sampler_process/run.py and lanes.py, sampler_process/exporter/host.py, the
server's listing), each reproduced as a user meets it."""

from __future__ import annotations

import re
import time

import pytest

from gpuprof_jupyter.core.protocol import Begin, Gap
from gpuprof_jupyter.runtime.run_options import RunOptions
from gpuprof_jupyter.sampler_process.run import Run
from tests.fakes import wait_for
from tests.test_exporter import scrape_text, served  # noqa: F401 (fixture)


def _run(tmp_path) -> Run:
    begin = Begin(token="t", t0=time.monotonic(), options=RunOptions(interval=0.1, store=tmp_path / "store"),
                  meta={"id": "", "name": "gaps"})
    return Run(begin, kernel_pid=None)


def test_a_lane_gap_after_batch_source_gaps_reaches_the_live_view_once_and_none_is_repeated(tmp_path):
    run = _run(tmp_path)
    t0 = run.t0
    run.lanes._batch_gaps.extend([Gap(t0 + 1, t0 + 2, "sim"), Gap(t0 + 3, t0 + 4, "sim")])
    first = run.live_batch({}).gaps
    assert first == [[1.0, 2.0, "sim"], [3.0, 4.0, "sim"]]
    run.recorder.on_gap(Gap(t0 + 5, t0 + 6))  # the sampling lane's own gap, after them
    second = run.live_batch({}).gaps
    assert second == [[5.0, 6.0]]
    run.lanes._batch_gaps.append(Gap(t0 + 7, t0 + 8, "sim"))
    run.recorder.on_gap(Gap(t0 + 9, t0 + 10))
    third = run.live_batch({}).gaps
    assert sorted(third) == sorted([[7.0, 8.0, "sim"], [9.0, 10.0]])
    assert run.live_batch({}).gaps == []


@pytest.mark.process
def test_the_exporter_served_after_a_run_reads_the_devices_with_that_runs_source(served, fresh_sampler, tmp_path):
    """A run ended while nothing served; ``%gpuprofile serve`` afterwards reads the devices
    between runs with the last run's source (here the host only), not the configured one
    (which would find the fake GPU)."""
    from gpuprof_jupyter.runtime.session import ProfileSession
    from tests.fake_nvml import sampler_process_env

    fresh_sampler(sampler_process_env())
    ProfileSession("host-only", source="host", store=tmp_path / "store", interval=0.05).start().stop()
    url = re.search(r"(http://\S+/metrics)", served.serve(0, "127.0.0.1", auth=False)).group(1)
    wait_for(lambda: 'gpuprof_host_cpu_util{' in scrape_text(url), 20, "the host's readings between runs")
    time.sleep(1.5)  # a second reading: the devices read are settled
    text = scrape_text(url)
    assert 'device="host"' in text and 'device="gpu0"' not in text, text
