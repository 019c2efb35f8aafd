"""A finisher never shrinks a run (core/store/keep_more.py, core/finish.py, core/crashed.py):
whichever path finishes a run (normal, crashed, died, finished again), steps.parquet, the
samples and the summary are never replaced by ones holding less; what could not be recovered
is a note."""

from __future__ import annotations

import json
import pyarrow.parquet as pq
import pytest

import gpuprof_jupyter as gp
from gpuprof_jupyter.core.finish import finish_experiment
from gpuprof_jupyter.core.listing import store_listing
from gpuprof_jupyter.core.store.directory import STEPS_NAME, Store
from gpuprof_jupyter.core.store.experiment import ExperimentMeta
from gpuprof_jupyter.core.store.index import forget
from gpuprof_jupyter.core.store.samples_file import PARQUET_NAME, SampleStreamWriter, samples_schema
from tests.test_store_index import _crashed_run, _dead_pid


@pytest.fixture
def store(store_dir):
    forget(store_dir)
    yield Store(store_dir)
    forget(store_dir)


def _steps(count: int) -> list[tuple]:
    return [(0.1 * (i + 1), 0.1, 0.01, 32, 1, False) for i in range(count)]


def _finished_run(store: Store, steps: int = 120, samples: int = 40) -> ExperimentMeta:
    """A run finished the normal way: ``samples`` rows of one GPU, ``steps`` steps."""
    meta = ExperimentMeta(id="", name="finished", status="running", interval_s=0.5, duration_s=samples * 0.5,
                          devices=[{"key": "gpu0", "kind": "gpu", "name": "sim"}])
    directory = store.create(meta)
    schema = samples_schema(["sm_util"])
    writer = SampleStreamWriter(directory, schema)
    writer.write({"t": [0.5 * i for i in range(samples)], "wall_time": [0.0] * samples, "device": ["gpu0"] * samples,
                  "sm_util": [40.0] * samples})
    writer.close()
    meta.status = "ok"
    notes: list[str] = []
    finish_experiment(store, meta, _steps(steps), [], notes, schema=schema)
    assert not notes, notes
    return meta


def _on_disk(store: Store, meta: ExperimentMeta) -> tuple[int, int, dict]:
    directory = store.root / meta.id
    return (pq.ParquetFile(directory / STEPS_NAME).metadata.num_rows,
            pq.ParquetFile(directory / PARQUET_NAME).metadata.num_rows,
            json.loads((directory / "meta.json").read_text()))


@pytest.mark.process
def test_a_finished_run_with_a_planted_dead_pid_keeps_its_120_steps_when_listed(store):
    meta = _finished_run(store)
    assert _on_disk(store, meta)[:2] == (120, 40)
    on_disk = json.loads((store.root / meta.id / "meta.json").read_text())
    on_disk.update(status="running", pid=_dead_pid())  # what a killed writer of meta.json could leave
    (store.root / meta.id / "meta.json").write_text(json.dumps(on_disk))

    rows = store_listing(Store(store.root)).rows
    assert [(r["status"], r["running"]) for r in rows] == [("crashed", False)]
    steps, samples, saved = _on_disk(store, meta)
    assert (steps, samples) == (120, 40)
    assert saved["status"] == "crashed"
    assert saved["summary"]["steps"]["count"] == 120
    assert saved["summary"]["devices"]["gpu0"]["measured_s"] > 0
    assert len(gp.load(meta.id, store=store.root).steps) == 120
    assert not any("steps and rule results" in n for n in saved["notes"])  # its steps are on disk
    assert any("steps.parquet" in n and "120" in n for n in saved["notes"]), saved["notes"]


def test_finishing_again_with_fewer_steps_keeps_the_steps_on_disk_with_a_note(store):
    meta = _finished_run(store, steps=120)
    finish_experiment(store, meta, _steps(50), [], meta.notes)  # a second finisher that saw fewer
    steps, samples, saved = _on_disk(store, meta)
    assert (steps, samples) == (120, 40)
    assert saved["summary"]["steps"]["count"] == 120
    notes = saved["notes"]
    assert any("steps.parquet holds 120 rows" in n and "50" in n for n in notes), notes
    finish_experiment(store, meta, _steps(200), [], [])  # more than on disk: written
    assert _on_disk(store, meta)[0] == 200


def test_a_summary_is_not_replaced_by_one_that_covers_less(store):
    meta = _finished_run(store, steps=120)
    (store.root / meta.id / STEPS_NAME).unlink()  # a steps file lost since the first finish
    (store.root / meta.id / PARQUET_NAME).unlink()
    meta.summary = {}  # a finisher that never read it: the one on disk counts
    finish_experiment(store, meta, [], [], meta.notes)
    saved = json.loads((store.root / meta.id / "meta.json").read_text())
    notes = saved["notes"]
    assert saved["summary"]["steps"]["count"] == 120
    assert saved["summary"]["devices"]["gpu0"]["measured_s"] > 0
    assert any("summary" in n and "kept" in n for n in notes), notes


@pytest.mark.process
def test_a_crashed_run_with_no_steps_on_disk_says_its_steps_are_lost(store):
    from gpuprof_jupyter.core.crashed import finish_crashed

    meta = _crashed_run(store)  # a stream of 6 rows, no steps.parquet
    directory = store.root / meta.id
    assert finish_crashed(store, meta.id)
    saved = json.loads((directory / "meta.json").read_text())
    assert sum("steps and rule results" in n for n in saved["notes"]) == 1
    assert pq.ParquetFile(directory / PARQUET_NAME).metadata.num_rows == 6
