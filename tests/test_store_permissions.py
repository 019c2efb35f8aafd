"""Shared-host store safety: private by default, shared only where the directory is shared on
purpose, and two kernels profiling into one store at once lose nothing."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest

from gpuprof_jupyter.core.store.directory import Store
from gpuprof_jupyter.core.store.experiment import ExperimentMeta
from gpuprof_jupyter.core.store.samples_file import SampleStreamWriter, samples_schema
from tests.kernel_helpers import running_kernel, text_of
from tests.test_store import quick_run


def _modes(root: Path) -> dict[str, int]:
    """Relative path -> permission bits (setgid included) of everything under ``root``."""
    return {str(p.relative_to(root)): stat.S_IMODE(p.stat().st_mode) for p in sorted(root.rglob("*"))}


@pytest.fixture
def umask_022():
    old = os.umask(0o022)  # the usual umask, which would make files 0644 and strip a group's write bit
    yield
    os.umask(old)


def test_a_store_the_profiler_creates_is_private(tmp_path, umask_022):
    root = tmp_path / "nested" / "store"
    exp = quick_run(root, "private")
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    modes = _modes(root)
    assert {exp.id, f"{exp.id}/meta.json", f"{exp.id}/samples.parquet", f"{exp.id}/steps.parquet", ".lock"} <= set(modes)
    for path, mode in modes.items():
        assert mode == (0o700 if (root / path).is_dir() else 0o600), (path, oct(mode))


def test_the_stream_of_a_running_experiment_is_private_too(tmp_path, umask_022):
    store = Store(tmp_path / "store")
    directory = store.create(ExperimentMeta(id="", name="live"))
    writer = SampleStreamWriter(directory, samples_schema(["sm_util"]))
    try:
        assert stat.S_IMODE(writer.path.stat().st_mode) == 0o600
    finally:
        writer.close()


@pytest.mark.parametrize("shared, want_dir, want_file", [
    (0o2770, 0o2770, 0o660),  # a team directory: setgid, group-writable: stays shared
    (0o750, 0o750, 0o640),  # group may read
    (0o755, 0o750, 0o640),  # "other" bits are never passed on
    (0o700, 0o700, 0o600),
], ids=["team-2770", "group-read-750", "world-755", "private-700"])
def test_files_in_an_existing_directory_follow_its_group_bits(tmp_path, umask_022, shared, want_dir, want_file):
    root = tmp_path / "team"
    root.mkdir()
    os.chmod(root, shared)
    exp = quick_run(root, "shared")
    assert stat.S_IMODE(root.stat().st_mode) == shared  # left as it was
    modes = _modes(root)
    assert modes[exp.id] == want_dir
    for path, mode in modes.items():
        if not (root / path).is_dir():
            assert mode == want_file, (path, oct(mode))


KERNEL_RUNS = 6
_CODE = """
import gpuprof_jupyter as gp
ids = []
for i in range({runs}):
    with gp.profile(None, source="sim:compute-bound", store={store!r}, interval=0.02, params={{"kernel": {k}}}) as run:
        for _ in gp.track(range(3)):
            gp.step(4)
    ids.append(run.experiment.id)
print("IDS", *ids)
"""


def test_two_kernels_profiling_into_one_store_at_once_lose_nothing(tmp_path):
    """Two real kernels, each creating experiments with default names into one store, at once."""
    store = tmp_path / "store"
    with running_kernel(tmp_path) as (_km1, kc1), running_kernel(tmp_path) as (_km2, kc2):
        clients = [kc1, kc2]
        msg_ids = [kc.execute(_CODE.format(runs=KERNEL_RUNS, store=str(store), k=k)) for k, kc in enumerate(clients)]
        outputs = []
        for kc, msg_id in zip(clients, msg_ids):
            reply = kc.get_shell_msg(timeout=300)
            while reply["parent_header"].get("msg_id") != msg_id:  # wait_for_ready's kernel_info
                reply = kc.get_shell_msg(timeout=300)
            assert reply["content"]["status"] == "ok", reply["content"]
            outputs.append(_stream_text(kc, msg_id))
    ids = [line.split()[1:] for text in outputs for line in text.splitlines() if line.startswith("IDS")]
    assert [len(i) for i in ids] == [KERNEL_RUNS, KERNEL_RUNS], outputs
    metas = Store(store).list()
    assert sorted(m.id for m in metas) == sorted(ids[0] + ids[1])
    names = [m.name for m in metas]
    assert sorted(names, key=lambda n: int(n.split("-")[1])) == [f"run-{i}" for i in range(1, 2 * KERNEL_RUNS + 1)]
    assert {m.params["kernel"] for m in metas} == {0, 1}
    assert all(m.status == "ok" for m in metas)
    for meta in metas:
        assert len(Store(store).load(meta.id).samples) > 0  # every run's samples are there


def _stream_text(kc, msg_id, timeout: float = 60) -> str:
    """What the cell ``msg_id`` printed, read from IOPub until it goes idle."""
    messages, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        msg = kc.get_iopub_msg(timeout=timeout)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        messages.append(msg)
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            break
    return text_of(messages)
