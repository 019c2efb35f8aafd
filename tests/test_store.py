"""Store: round trip, atomic writes, crash recovery, corrupt files, two writers."""

from __future__ import annotations

import json
import multiprocessing
import subprocess
import sys
import warnings

import pytest

import gpuprof_jupyter as gp
from gpuprof_jupyter.core.store.atomic import write_atomic, write_json_atomic
from gpuprof_jupyter.core.store.directory import Store, StoreProblem
from gpuprof_jupyter.core.store.experiment import SCHEMA_VERSION, ExperimentMeta
from gpuprof_jupyter.core.store.samples_file import STREAM_NAME, SampleStreamWriter, read_samples_table, samples_schema


def quick_run(store_dir, name=None, **options):
    with gp.profile(name, source="sim:compute-bound", store=store_dir, interval=0.02, **options) as run:
        for _ in gp.track(range(5)):
            gp.step(8)
    return run.experiment


@pytest.mark.process
def test_round_trip_meta_samples_steps(store_dir):
    saved = quick_run(store_dir, "baseline", params={"batch_size": 32})
    loaded = Store(store_dir).load("baseline")
    assert loaded.id == saved.id and loaded.meta.params == {"batch_size": 32}
    assert loaded.status == "ok" and loaded.meta.simulated
    samples = loaded.samples
    assert {"t", "wall_time", "device", "sm_util", "cpu_util"} <= set(samples.columns)
    assert set(samples["device"]) == {"gpu0", "host"}
    assert len(loaded.steps) == 5 and loaded.steps["n_samples"].sum() == 40
    assert loaded.summary["overall"]["sm_util_mean"] == pytest.approx(saved.summary["overall"]["sm_util_mean"])
    assert (store_dir / saved.id / "samples.parquet").exists()
    assert not (store_dir / saved.id / STREAM_NAME).exists()


@pytest.mark.process
def test_reused_name_keeps_history_and_load_returns_latest(store_dir):
    first = quick_run(store_dir, "tune")
    second = quick_run(store_dir, "tune")
    assert first.id != second.id
    assert Store(store_dir).load("tune").id == second.id
    assert Store(store_dir).load(first.id).id == first.id
    assert list(gp.experiments(store_dir)["name"]) == ["tune", "tune"]


@pytest.mark.process
def test_default_names_are_unique_and_readable(store_dir):
    names = [quick_run(store_dir).name for _ in range(3)]
    assert names == ["run-1", "run-2", "run-3"]


def _create_default(root, queue):
    store = Store(root)
    names = []
    for _ in range(10):
        meta = ExperimentMeta(id="", name="")
        store.create(meta)
        names.append(meta.name)
    queue.put(names)


@pytest.mark.process
def test_two_kernels_sharing_a_store_get_distinct_names(store_dir):
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_create_default, args=(str(store_dir), queue)) for _ in range(2)]
    for p in procs:
        p.start()
    names = queue.get(timeout=30) + queue.get(timeout=30)
    for p in procs:
        p.join()
    assert len(set(names)) == 20
    assert len(Store(store_dir).list()) == 20


def test_atomic_write_keeps_old_file_when_writing_fails(tmp_path):
    target = tmp_path / "meta.json"
    write_json_atomic(target, {"a": 1})

    def broken(f):
        f.write(b'{"half": ')
        raise OSError("disk full")

    with pytest.raises(OSError):
        write_atomic(target, broken)
    assert json.loads(target.read_text()) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["meta.json"]  # no temp file left behind


@pytest.mark.process
def test_corrupt_meta_is_reported_and_skipped(store_dir):
    quick_run(store_dir, "good")
    bad = store_dir / "20990101T000000-bad"
    bad.mkdir()
    (bad / "meta.json").write_text("{not json")
    with pytest.warns(StoreProblem, match="not a readable experiment"):
        frame = gp.experiments(store_dir)
    assert list(frame["name"]) == ["good"]
    with warnings.catch_warnings():
        warnings.simplefilter("error", StoreProblem)  # warned once, not again on every call
        assert list(gp.experiments(store_dir)["name"]) == ["good"]
        store = Store(store_dir)
        assert [m.name for m in store.list()] == ["good"]
    assert any("not a readable experiment" in p for p in store.problems)  # still listed, not warned


@pytest.mark.process
def test_corrupt_samples_are_reported_not_fatal(store_dir):
    exp = quick_run(store_dir, "damaged")
    (store_dir / exp.id / "samples.parquet").write_bytes(b"PAR1 garbage")
    loaded = Store(store_dir).load("damaged")
    with pytest.warns(StoreProblem, match="unreadable"):
        assert len(loaded.samples) == 0
    assert loaded.summary  # the stored summary survives


@pytest.mark.process
def test_newer_schema_is_reported_not_misread(store_dir):
    exp = quick_run(store_dir, "future")
    path = store_dir / exp.id / "meta.json"
    data = json.loads(path.read_text())
    data["schema_version"] = SCHEMA_VERSION + 1
    path.write_text(json.dumps(data))
    with pytest.warns(StoreProblem, match="newer"):
        assert Store(store_dir).list() == []


def test_old_meta_without_new_fields_loads_with_defaults():
    meta = ExperimentMeta.from_json({"id": "x", "name": "old", "unknown_future_field": 1})
    assert meta.params == {} and meta.gaps == []


def test_crashed_recording_keeps_flushed_samples(store_dir):
    """A kernel killed mid-run: the stream holds every flushed batch, status reads 'crashed'."""
    store = Store(store_dir)
    meta = ExperimentMeta(id="", name="killed", devices=[{"key": "gpu0", "kind": "gpu", "name": "x"}])
    directory = store.create(meta)
    meta.pid = 2**22 + 12345  # a pid that does not exist
    store.save_meta(meta)
    writer = SampleStreamWriter(directory, samples_schema(["sm_util"]))
    for i in range(3):
        writer.write({"t": [i * 0.1], "wall_time": [0.0], "device": ["gpu0"], "sm_util": [float(i)]})
    with open(directory / STREAM_NAME, "ab") as f:
        f.write(b"\x00\x01torn")  # a batch cut off by the crash
    table = read_samples_table(directory)
    assert table.num_rows == 3
    [listed] = store.list()
    assert listed.status == "crashed"
    assert list(store.load("killed").samples["sm_util"]) == [0.0, 1.0, 2.0]


@pytest.mark.process
def test_experiments_survive_a_new_process(store_dir):
    quick_run(store_dir, "baseline")
    code = (
        "import gpuprof_jupyter as g, sys; f = g.experiments(sys.argv[1]); "
        "print(f.loc[0, 'name'], f.loc[0, 'status'], f.loc[0, 'sm_util_mean'] >= 0)"
    )
    out = subprocess.run([sys.executable, "-c", code, str(store_dir)], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["baseline", "ok", "True"]


@pytest.mark.process
def test_delete_removes_latest_with_that_name(store_dir):
    quick_run(store_dir, "tmp")
    Store(store_dir).delete("tmp")
    assert Store(store_dir).list() == []
    with pytest.raises(KeyError, match="no experiment named 'tmp'"):
        Store(store_dir).load("tmp")


@pytest.mark.process
def test_a_failing_save_step_loses_nothing(store_dir, monkeypatch):
    """Converting to Parquet fails in the sampler process (e.g. a full disk): metadata saved,
    samples kept in the stream, a warning in the kernel."""
    from gpuprof_jupyter.core.fault_injection import FAULT_STEP_ENV as FAULT_ENV

    monkeypatch.setenv(FAULT_ENV, "converting samples to Parquet (they stay in samples.arrows)")
    with pytest.warns(RuntimeWarning, match="converting samples to Parquet"):
        exp = quick_run(store_dir, "full-disk")
    loaded = Store(store_dir).load("full-disk")
    assert loaded.status == "ok"
    assert any("converting samples to Parquet (they stay in samples.arrows) failed" in n for n in loaded.meta.notes)
    assert (store_dir / exp.id / STREAM_NAME).exists()
    assert set(loaded.samples["device"]) == {"gpu0", "host"}
