"""Shared-host store safety: private by default, shared only where the directory is shared on
purpose, two kernels profiling into one store at once lose nothing, and a teammate (a second
user, created here: CI runs as root) cannot make the profiler touch anything outside the store:
planted links, a hostile meta.json, a FIFO as .lock, a store that is not ours."""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path

import pytest

from gpuprof_jupyter.core.store.directory import Store, StoreProblem
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


@pytest.mark.process
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


@pytest.mark.process
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


@pytest.mark.process
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


# -- a teammate turned hostile: the attacks run as a second user ------------------------------------
TEAM, MALLORY = "gpt-team", "gpt-mallory"


@pytest.fixture(scope="module")
def mallory(tmp_path_factory):
    """A second user, in the team group; the tests (root, as in CI) are the victim. The arena is
    a folder both can reach; the victim's own files sit in a 0700 folder inside it."""
    import grp
    import pwd
    import shutil
    import subprocess
    import tempfile

    if os.geteuid() != 0 or not shutil.which("useradd"):
        pytest.skip("needs root and useradd to create a second user (CI runs as root)")
    subprocess.run(["userdel", MALLORY], capture_output=True)  # left by an interrupted run
    subprocess.run(["groupdel", TEAM], capture_output=True)
    subprocess.run(["groupadd", TEAM], check=True)
    arena = Path(tempfile.mkdtemp(prefix="gpuprof-arena-"))
    try:
        subprocess.run(["useradd", "-M", "-N", "-g", TEAM, "-s", "/usr/sbin/nologin", MALLORY], check=True)
        os.chmod(arena, 0o755)
        yield {"arena": arena, "uid": pwd.getpwnam(MALLORY).pw_uid, "gid": grp.getgrnam(TEAM).gr_gid}
    finally:
        shutil.rmtree(arena, ignore_errors=True)
        subprocess.run(["userdel", MALLORY], capture_output=True)
        subprocess.run(["groupdel", TEAM], capture_output=True)


def as_mallory(code: str, succeeds: bool = True):
    """Run ``code`` (standard library only) as the second user; its CompletedProcess."""
    import subprocess

    done = subprocess.run(["/usr/bin/python3", "-c", code], user=MALLORY, group=TEAM, capture_output=True,
                          text=True, timeout=30, cwd="/")
    assert (done.returncode == 0) == succeeds, done.stderr
    return done


@pytest.fixture
def team_store(mallory, tmp_path_factory):
    """A team store as docs/store.md sets it up (owned by the victim, group team, 2770), and the
    victim's private folder with a file that must stay untouched."""
    import secrets

    arena = mallory["arena"] / secrets.token_hex(4)
    arena.mkdir(mode=0o755)
    os.chmod(arena, 0o755)
    root = arena / "team"
    root.mkdir()
    os.chown(root, 0, mallory["gid"])
    os.chmod(root, 0o2770)
    home = arena / "victim"
    home.mkdir(mode=0o700)
    secret = home / "secret.ipynb"
    secret.write_text("my notebook")
    os.chmod(secret, 0o600)
    precious = arena / "precious"  # a folder of the victim's outside the store
    precious.mkdir()
    (precious / "meta.json").write_text("{}")
    (precious / "data.txt").write_text("keep me")
    return {"root": root, "secret": secret, "precious": precious, "arena": arena}


def _untouched(paths: dict) -> None:
    secret = paths["secret"]
    assert secret.read_text() == "my notebook" and stat.S_IMODE(secret.lstat().st_mode) == 0o600
    assert (paths["precious"] / "data.txt").read_text() == "keep me"


@pytest.mark.process
def test_a_link_planted_as_the_stream_is_refused_and_its_target_untouched(team_store):
    store = Store(team_store["root"])
    directory = store.create(ExperimentMeta(id="", name="mine"))
    as_mallory(f"import os; os.symlink({str(team_store['secret'])!r}, {str(directory / 'samples.arrows')!r})")
    with pytest.raises(PermissionError, match="samples.arrows already exists .*someone else put it there"):
        SampleStreamWriter(directory, samples_schema(["sm_util"]))
    _untouched(team_store)


def _recorded_run(root: Path):
    """A run in the store ``root`` whose stream holds one row and is closed."""
    store = Store(root)
    meta = ExperimentMeta(id="", name="mine")
    directory = store.create(meta)
    writer = SampleStreamWriter(directory, samples_schema(["sm_util"]))
    writer.write({"t": [0.0], "wall_time": [0.0], "device": ["gpu0"], "sm_util": [1.0]})
    writer.close()
    return store, meta, directory, writer


@pytest.mark.process
def test_links_planted_as_finished_files_are_replaced_never_followed(team_store):
    import pyarrow as pa

    from gpuprof_jupyter.core.store.samples_file import stream_to_parquet

    store, meta, directory, writer = _recorded_run(team_store["root"])
    secret = str(team_store["secret"])
    as_mallory("import os\n" + "\n".join(f"os.symlink({secret!r}, {str(directory / name)!r})"
                                         for name in ("samples.parquet", "steps.parquet", "trace.json.gz")))
    stream_to_parquet(directory, writer.schema)
    store.save_steps(meta, pa.table({"t_end_s": [1.0]}))
    store.save_trace(meta, {"traceEvents": []})
    store.save_meta(meta)
    for name in ("samples.parquet", "steps.parquet", "trace.json.gz", "meta.json"):
        assert (directory / name).is_file() and not (directory / name).is_symlink(), name
        assert (directory / name).stat().st_uid == os.geteuid()
    _untouched(team_store)


@pytest.mark.process
def test_a_hostile_meta_json_is_listed_as_a_problem_and_never_used_as_a_path(team_store):
    """A teammate's experiment claims the victim's name, a later start and an id that is a path:
    the victim's ``delete`` removes the victim's own run, nothing outside the store."""
    store = Store(team_store["root"])
    meta = ExperimentMeta(id="", name="baseline", started_at="2026-01-01T00:00:00+00:00")
    mine = store.create(meta)
    store.save_meta(meta)
    root, precious = team_store["root"], team_store["precious"]
    hostile = [("20990101T000000-abs", str(precious)), ("20990101T000001-rel", "../precious"),
               ("20990101T000002-self", "20990101T000002-self")]  # the last one is a link, below
    code = ["import json, os"]
    for name, evil_id in hostile[:2]:
        code += [f"os.mkdir({str(root / name)!r})",
                 f"open({str(root / name / 'meta.json')!r}, 'w').write(json.dumps({{'id': {evil_id!r}, "
                 f"'name': 'baseline', 'started_at': '2099-01-01T00:00:00+00:00'}}))"]
    code.append(f"os.symlink({str(precious)!r}, {str(root / hostile[2][0])!r})")
    as_mallory("\n".join(code))
    (precious / "meta.json").write_text(json.dumps({"id": hostile[2][0], "name": "baseline",
                                                    "started_at": "2099-01-02T00:00:00+00:00"}))
    with pytest.warns(StoreProblem) as warned:
        listed = store.list()
    assert [m.id for m in listed] == [meta.id]
    problems = " ".join(str(w.message) for w in warned)
    assert all(name in problems for name, _ in hostile), problems
    deleted = store.delete("baseline")  # the same problems, already reported once
    assert deleted.id == meta.id and not mine.exists()
    _untouched(team_store)
    assert sorted(p.name for p in precious.iterdir()) == ["data.txt", "meta.json"]


@pytest.mark.process
def test_a_fifo_planted_as_the_lock_fails_at_once_with_a_clear_error(team_store):
    import threading

    store = Store(team_store["root"])
    store.create(ExperimentMeta(id="", name="first"))  # .lock exists, the victim's
    lock = team_store["root"] / ".lock"
    as_mallory(f"import os; os.unlink({str(lock)!r}); os.mkfifo({str(lock)!r})")
    outcome = []

    def create():
        try:
            store.create(ExperimentMeta(id="", name="second"))
        except Exception as exc:  # noqa: BLE001 - what the test looks at
            outcome.append(exc)

    thread = threading.Thread(target=create, daemon=True)
    thread.start()
    thread.join(20)
    assert not thread.is_alive(), "Store.create blocked on a FIFO planted as .lock"
    [error] = outcome
    assert isinstance(error, PermissionError) and ".lock in the store is not a regular file" in str(error)
    as_mallory(f"import os; os.unlink({str(lock)!r}); os.symlink({str(team_store['secret'])!r}, {str(lock)!r})")
    with pytest.raises(PermissionError, match=r"\.lock in the store is a link"):
        store.create(ExperimentMeta(id="", name="third"))
    _untouched(team_store)


@pytest.mark.process
def test_a_store_of_another_user_is_refused_unless_it_is_a_group_store_of_ours(team_store, mallory):
    arena = team_store["arena"]
    theirs = arena / "mallory-store"
    theirs.mkdir()
    os.chown(theirs, mallory["uid"], mallory["gid"])
    as_mallory(f"import os; os.chmod({str(theirs)!r}, 0o2777)")  # even open to all: still not ours
    link = arena / "link-to-theirs"
    link.symlink_to(theirs)
    for root in (theirs, link):
        with pytest.raises(PermissionError, match=f"belongs to user '{MALLORY}', not to you"):
            Store(root).create(ExperimentMeta(id="", name="mine"))
    assert list(theirs.iterdir()) == []  # nothing written there, not even .lock
    os.chown(theirs, mallory["uid"], os.getegid())  # now a group store of a group we are in: 2770 as documented
    os.chmod(theirs, 0o2770)
    directory = Store(theirs).create(ExperimentMeta(id="", name="mine"))
    assert directory.parent == theirs and (directory / "meta.json").is_file()


@pytest.mark.process
def test_a_sticky_team_store_keeps_teammates_from_removing_your_runs(team_store):
    """docs/store.md's optional hardening: with the sticky bit (3770) a member cannot rename or
    delete another member's experiment directory (the files inside stay group-writable)."""
    root = team_store["root"]
    os.chmod(root, 0o3770)
    store = Store(root)
    directory = store.create(ExperimentMeta(id="", name="mine"))
    assert stat.S_IMODE(directory.stat().st_mode) == 0o2770
    done = as_mallory(f"import os; os.rename({str(directory)!r}, {str(root / 'x')!r})", succeeds=False)
    assert "PermissionError" in done.stderr
    assert [m.name for m in store.list()] == ["mine"]


@pytest.mark.process
def test_a_run_directory_swapped_for_a_link_redirects_nothing(team_store):
    """A teammate renames the victim's running experiment and puts a link to a folder of the
    victim's in its place: finishing fails (noted by the caller), nothing is written there."""
    import shutil

    from gpuprof_jupyter.core.store.samples_file import stream_to_parquet

    store, meta, directory, writer = _recorded_run(team_store["root"])
    precious = team_store["precious"]
    shutil.copy(directory / "samples.arrows", precious / "samples.arrows")  # a stream there too, as bait
    before = sorted(p.name for p in precious.iterdir())
    as_mallory(f"import os; os.rename({str(directory)!r}, {str(directory) + '-moved'!r}); "
               f"os.symlink({str(precious)!r}, {str(directory)!r})")
    for finish in (lambda: stream_to_parquet(directory, writer.schema), lambda: store.save_meta(meta)):
        with pytest.raises(OSError):
            finish()
    assert sorted(p.name for p in precious.iterdir()) == before
    _untouched(team_store)
