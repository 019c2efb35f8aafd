"""The store's listing index (core/store/index.py, core/listing.py) and crashed runs finished
once (core/crashed.py): rebuilt when deleted or stale, two writers, meta.json wins over a wrong
row, modes of its files, links refused, compare reading only its two experiments."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import gpuprof_jupyter as gp
from gpuprof_jupyter.core.listing import store_listing
from gpuprof_jupyter.core.store import index as index_module
from gpuprof_jupyter.core.store.directory import Store
from gpuprof_jupyter.core.store.experiment import ExperimentMeta
from gpuprof_jupyter.core.store.index import INDEX_NAME, forget

ROOT = Path(__file__).resolve().parent.parent


def _add(store: Store, name: str, sm: float = 50.0, **fields) -> ExperimentMeta:
    """A finished experiment with a stored summary (listing it reads no samples)."""
    meta = ExperimentMeta(id="", name=name, status="ok", started_at=f"2026-01-01T00:00:{len(store.entries()):02d}+00:00",
                          summary={"overall": {"sm_util_mean": sm}}, params={"bs": 32}, **fields)
    store.create(meta)
    return meta


def _indexed(root: Path) -> dict[str, str]:
    """id -> name as the index file holds them."""
    with sqlite3.connect(root / INDEX_NAME) as db:
        return dict(db.execute("SELECT id, name FROM entries"))


@pytest.fixture
def store(store_dir):
    forget(store_dir)
    yield Store(store_dir)
    forget(store_dir)


def test_index_is_rebuilt_when_deleted(store):
    metas = [_add(store, n) for n in ("a", "b", "c")]
    assert list(gp.experiments(store.root)["name"]) == ["a", "b", "c"]
    assert set(_indexed(store.root)) == {m.id for m in metas}
    os.unlink(store.root / INDEX_NAME)
    assert list(gp.experiments(store.root)["name"]) == ["a", "b", "c"]  # this process remembered them...
    assert set(_indexed(store.root)) == {m.id for m in metas}  # ...and wrote them back
    os.unlink(store.root / INDEX_NAME)
    forget(store.root)  # a fresh process with no index: every meta.json read again
    assert [r["name"] for r in store_listing(Store(store.root)).rows] == ["a", "b", "c"]
    assert set(_indexed(store.root)) == {m.id for m in metas}


def test_stale_rows_follow_meta_json(store):
    a, b = _add(store, "a", sm=10.0), _add(store, "b")
    assert gp.experiments(store.root)["sm_util_mean"].tolist() == [10.0, 50.0]
    a.summary = {"overall": {"sm_util_mean": 77.0}}
    store.save_meta(a)  # meta.json newer than its row
    c = _add(store, "c")  # a directory not in the index
    import shutil

    shutil.rmtree(store.root / b.id)  # a row whose directory is gone
    frame = gp.experiments(store.root)
    assert frame["name"].tolist() == ["a", "c"] and frame["sm_util_mean"].tolist() == [77.0, 50.0]
    assert set(_indexed(store.root)) == {a.id, c.id}


def test_meta_json_wins_over_a_wrong_row(store):
    a = _add(store, "right")
    gp.experiments(store.root)
    with sqlite3.connect(store.root / INDEX_NAME) as db:  # a teammate's bad write, or a bug
        db.execute("UPDATE entries SET name = 'wrong', key = '1:2:3:4', row = ? WHERE id = ?",
                   (json.dumps({"id": a.id, "name": "wrong", "status": "ok", "running": False}), a.id))
    forget(store.root)
    assert store_listing(Store(store.root)).rows[0]["name"] == "right"
    assert Store(store.root).resolve("right").id == a.id
    with pytest.raises(KeyError):
        Store(store.root).resolve("wrong")
    assert _indexed(store.root)[a.id] == "right"  # and the row was mended


def test_a_damaged_or_linked_index_is_never_trusted(store, tmp_path):
    _add(store, "a")
    (store.root / INDEX_NAME).write_bytes(b"not a database at all" * 100)
    forget(store.root)
    assert list(gp.experiments(store.root)["name"]) == ["a"]
    victim = tmp_path / "victim.ipynb"
    victim.write_text("mine")
    os.unlink(store.root / INDEX_NAME) if (store.root / INDEX_NAME).exists() else None
    os.symlink(victim, store.root / INDEX_NAME)  # planted by a teammate
    forget(store.root)
    _add(store, "b")
    assert list(gp.experiments(store.root)["name"]) == ["a", "b"]
    assert victim.read_text() == "mine" and (store.root / INDEX_NAME).is_symlink()


@pytest.mark.parametrize("shared, want", [(None, 0o600), (0o2770, 0o660)])
def test_index_files_follow_the_store_modes(tmp_path, shared, want):
    root = tmp_path / "store"
    if shared is not None:
        root.mkdir()
        os.chmod(root, shared)
    old = os.umask(0o077)
    try:
        _add(Store(root), "a")
        gp.experiments(root)
        with sqlite3.connect(root / INDEX_NAME) as db:  # another reader keeps the WAL files open
            db.execute("SELECT count(*) FROM entries").fetchone()
            for suffix in ("", "-wal", "-shm"):
                path = Path(f"{root / INDEX_NAME}{suffix}")
                if path.exists():
                    assert path.stat().st_mode & 0o777 == want, (suffix, oct(path.stat().st_mode))
    finally:
        os.umask(old)
        forget(root)


_WRITER = """
import sys
import gpuprof_jupyter as gp
from gpuprof_jupyter.core.store.directory import Store
from gpuprof_jupyter.core.store.experiment import ExperimentMeta
store = Store(sys.argv[1])
for i in range(12):
    store.create(ExperimentMeta(id="", name=f"{sys.argv[2]}-{i}", status="ok", summary={"overall": {}}))
    gp.experiments(sys.argv[1])
"""


@pytest.mark.process
def test_two_writers_at_once_lose_nothing(store):
    """Two kernels creating and listing in one store at the same time."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, str(store.root), who], env=env) for who in ("x", "y")]
    assert [p.wait(120) for p in procs] == [0, 0]
    names = sorted(gp.experiments(store.root)["name"])
    assert names == sorted(f"{w}-{i}" for w in "xy" for i in range(12))
    with sqlite3.connect(store.root / INDEX_NAME) as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert sorted(_indexed(store.root).values()) == names


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _crashed_run(store: Store) -> ExperimentMeta:
    """A run left 'running' by a sampler process that died: a stream of 3 s on one GPU."""
    from gpuprof_jupyter.core.store.samples_file import SampleStreamWriter, samples_schema

    meta = ExperimentMeta(id="", name="killed", interval_s=0.5, devices=[{"key": "gpu0", "kind": "gpu", "name": "sim"}])
    directory = store.create(meta)
    writer = SampleStreamWriter(directory, samples_schema(["sm_util"]))
    writer.write({"t": [0.5 * i for i in range(6)], "wall_time": [0.0] * 6, "device": ["gpu0"] * 6,
                  "sm_util": [40.0] * 6})
    writer.close()
    meta.pid = _dead_pid()
    store.save_meta(meta)
    return meta


@pytest.mark.process
def test_a_crashed_run_is_finished_once_by_the_first_finder(store, monkeypatch):
    from gpuprof_jupyter.core import crashed
    from gpuprof_jupyter.core.analysis import summary

    meta = _crashed_run(store)
    finishes, summaries = [], []
    real_finish, real_summarize = crashed.finish_experiment, summary.summarize
    monkeypatch.setattr(crashed, "finish_experiment", lambda *a, **k: finishes.append(1) or real_finish(*a, **k))
    monkeypatch.setattr(summary, "summarize", lambda e: summaries.append(1) or real_summarize(e))
    results = []
    threads = [threading.Thread(target=lambda: results.append(store_listing(Store(store.root)).rows)) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(finishes) == 1 and len(summaries) == 1  # three finders, one finish
    for rows in results:
        assert [(r["status"], r["running"]) for r in rows] == [("crashed", False)]
    on_disk = json.loads((store.root / meta.id / "meta.json").read_text())
    assert on_disk["status"] == "crashed" and on_disk["summary"]["overall"]["sm_util_mean"] == 40.0
    assert sum("ended without finishing" in n for n in on_disk["notes"]) == 1
    assert (store.root / meta.id / "samples.parquet").exists()
    for _ in range(3):  # later polls: nothing finished or summarised again
        store_listing(Store(store.root))
        gp.experiments(store.root)
    assert len(finishes) == 1 and len(summaries) == 1


def test_compare_reads_only_its_two_experiments(store, monkeypatch):
    metas = [_add(store, f"run-{i}") for i in range(8)]
    gp.experiments(store.root)  # the index knows them all
    read = []
    real = index_module.read_meta
    monkeypatch.setattr(index_module, "read_meta", lambda path: read.append(Path(path).parent.name) or real(path))
    monkeypatch.setattr("gpuprof_jupyter.core.store.directory.read_meta",
                        lambda path: read.append(Path(path).parent.name) or real(path))
    experiments = gp.api.load_many(["run-2", "run-6"], store=store.root)
    assert [e.name for e in experiments] == ["run-2", "run-6"]
    assert sorted(set(read)) == sorted([metas[2].id, metas[6].id])


def test_listing_problems_name_no_absolute_path(store):
    _add(store, "good")
    bad = store.root / "20990101T000000-bad000"
    bad.mkdir()
    (bad / "meta.json").write_text("{broken")
    other = store.root / "20990101T000000-other0"
    other.mkdir()
    (other / "meta.json").write_text(json.dumps({"id": "elsewhere", "name": "x"}))
    with pytest.warns(UserWarning):
        listing = store_listing(Store(store.root))
    assert [r["name"] for r in listing.rows] == ["good"]
    assert len(listing.problems) == 2 and "id 'elsewhere' is not the directory's name" in " ".join(listing.problems)
    assert not any(str(store.root) in p or "/tmp" in p for p in listing.problems), listing.problems
