"""A run's options declared once (runtime/run_options.py): one record checks every
value, each front end only turns its ValueError into its own error."""

from __future__ import annotations

import os

import pytest
from IPython.core.error import UsageError

import gpuprof_jupyter as gp
from gpuprof_jupyter.cli import main
from gpuprof_jupyter.runtime.hooks.environ_patch import EnvironPatch
from gpuprof_jupyter.runtime.run_options import RunOptions
from gpuprof_jupyter.runtime.session import ProfileSession
from gpuprof_jupyter.notebook.cell_options import session_options
from gpuprof_jupyter.notebook.magic import parse_line

INTERVAL = "--interval must be between 0.001 and 3600 s"


def test_the_record_checks_and_normalises_every_field(tmp_path):
    options = RunOptions("amp", interval=1, devices="0, 2", source="prometheus=http://h:9090", match='job="t"',
                         store=tmp_path, params=["batch_size=64", "amp=true"], checks=["sm_util > 60 for >=80%"],
                         alerts=["sm_util < 50 for >30%"], trace="steps=2:4")
    assert options.interval == 1.0 and isinstance(options.interval, float) and options.devices == [0, 2]
    assert options.source == 'prometheus=http://h:9090 match=job="t"' and options.store.root == tmp_path
    assert options.params == {"batch_size": 64, "amp": True}
    assert [r.metric for r in options.checks] == ["sm_util"] and str(options.trace) == "steps=2:4"
    assert options.replace(name="again") == RunOptions("again", **{k: getattr(options, k) for k in (
        "interval", "devices", "source", "store", "params", "checks", "alerts", "trace")})


@pytest.mark.parametrize("bad, message", [
    ({"interval": 0}, INTERVAL), ({"interval": 7200}, INTERVAL), ({"interval": "1"}, INTERVAL),
    ({"devices": "0,a"}, "--devices takes visible GPU indices"), ({"devices": [1, 1]}, "distinct indices"),
    ({"devices": [-1]}, "distinct indices"), ({"name": "  "}, "--name must not be empty"),
    ({"source": "sim", "match": "job=x"}, "--match needs --source prometheus="), ({"source": "cuda"}, "cuda"),
    ({"params": ["no-equals"]}, "is not KEY=VALUE"), ({"checks": ["sm_util >> 60"]}, "sm_util >> 60"),
    ({"alerts": ["accuracy >= 0.9"]}, "accuracy"), ({"trace": "steps=4"}, "--trace takes steps=A:B"),
])
def test_a_bad_value_is_a_valueerror_naming_it(bad, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("+", r"\+")):
        RunOptions(**bad)


def test_replace_checks_again_and_never_adds_the_config_twice(monkeypatch):
    monkeypatch.setenv("GPUPROF_CHECKS", "sm_util > 10")
    options = RunOptions.resolve(checks=["sm_util > 60"])
    assert [r.text for r in options.checks] == ["sm_util > 10", "sm_util > 60"]  # the config's first
    trial = options.replace(name="tune-t1", params={"batch_size": 64})
    assert [r.text for r in trial.checks] == ["sm_util > 10", "sm_util > 60"] and trial.name == "tune-t1"
    with pytest.raises(ValueError, match=INTERVAL):
        options.replace(interval=-1)


def test_every_front_end_says_the_same_thing_its_own_way(tmp_path, capsys):
    store = str(tmp_path / "store")
    with pytest.raises(UsageError, match=INTERVAL):
        session_options(parse_line(f"--interval 0 --store {store}"))
    assert main(["run", "--store", store, "--interval", "0", "--", "python", "-c", "pass"]) == 2
    assert INTERVAL in capsys.readouterr().err
    with pytest.raises(ValueError, match=INTERVAL):
        ProfileSession("x", interval=0, store=store)
    with pytest.raises(ValueError, match=INTERVAL):
        with gp.profile(name="x", interval=0, store=store):
            pass
    calls = []
    with pytest.raises(ValueError, match=INTERVAL):  # before any trial runs
        gp.tune(lambda: calls.append(1), interval=0, store=store, budget="5s")
    assert calls == [] and not list((tmp_path / "store").glob("*/meta.json"))


def test_profile_takes_exactly_the_run_options_as_keywords():
    from gpuprof_jupyter.runtime.profile import OPTIONS
    from gpuprof_jupyter.runtime.run_options import FIELDS

    assert set(OPTIONS) == (set(FIELDS) - {"name"}) | {"observers", "child_environ"}
    with pytest.raises(TypeError, match="unknown keyword.*interval_s"):
        gp.profile(interval_s=1)


def test_the_environment_helper_puts_back_only_its_own_keys():
    environ = {"KEPT": "1", "OURS": "before"}
    patch = EnvironPatch(environ)
    patch.set({"OURS": "run", "NEW": "run"})
    environ["USER_SET"] = "in the cell"  # the user's code changed the environment meanwhile
    patch.restore()
    assert environ == {"KEPT": "1", "OURS": "before", "USER_SET": "in the cell"}
    patch.restore()  # twice: nothing more
    assert environ == {"KEPT": "1", "OURS": "before", "USER_SET": "in the cell"}
    assert os.environ is EnvironPatch().environ


@pytest.mark.process
def test_a_start_interrupted_after_the_process_began_ends_the_run_the_one_way(store_dir):
    """Ctrl-C while an observer starts: the sampler process was already recording. The run ends
    as every run does (``ProfileSession._finish``, from runtime/session_end.py), saved as an error; nothing keeps recording."""
    from gpuprof_jupyter.core.store.directory import Store
    from gpuprof_jupyter.runtime.session import current_session

    class Interrupting:
        def started(self, session):
            raise KeyboardInterrupt

    session = ProfileSession("cut", source="sim", store=store_dir, interval=0.05, observers=[Interrupting()])
    with pytest.raises(KeyboardInterrupt):
        session.start()
    assert current_session() is None and session.experiment is not None
    saved = Store(store_dir).load("cut")
    assert saved.status == "error" and saved.meta.error == "the run did not start"
    assert session._link is None or session._link.handover is None
