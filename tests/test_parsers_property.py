"""Property-based tests (Hypothesis) of every parser that reads what another process or user
wrote: the kernel/sampler protocol's ``check`` (core/protocol.py), ``meta.json`` and the store's
index (core/store/index.py, core/listing.py), ``pipeline.yaml`` (render/pipeline_yaml.py and the
CLI's ``--pipeline`` gate), rule text (core/analysis/rules.py ``parse_rule``) and a request's
store path (server/paths.py; the routes' query arguments: tests/test_server_api.py).

The property each time: only the documented error comes out, and the run's other data is
intact. Examples are few and small, so the module takes seconds in the default test run.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from tests.property_budget import examples

from gpuprof_jupyter.core import protocol
from gpuprof_jupyter.core.protocol import Malformed, check

FAST = settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

# Anything pickle or JSON could carry: scalars, odd floats, nested lists and mappings.
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True, allow_infinity=True),
                    st.text(max_size=12), st.binary(max_size=8))
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4), st.tuples(inner, inner),
                                                       st.dictionaries(st.text(max_size=6), inner, max_size=4)),
                      max_leaves=12)
JSON = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=12)),
                    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                    max_leaves=12)


# -- the kernel/sampler protocol ----------------------------------------------------------------------
MESSAGES = [obj for obj in vars(protocol).values() if isinstance(obj, type) and dataclasses.is_dataclass(obj)]
KERNEL_SENDS = (protocol.Request, protocol.Events, protocol.LiveTarget, protocol.Quit)


def _well_typed(cls, draw, depth=0):
    """An instance of ``cls`` with every field a value of its declared type (a valid message)."""
    import typing

    hints = typing.get_type_hints(cls)
    values = {}
    for f in dataclasses.fields(cls):
        values[f.name] = draw(_of_type(hints[f.name], depth))
    return cls(**values)


def _of_type(hint, depth):
    import types
    import typing

    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return st.one_of([_of_type(arg, depth) for arg in typing.get_args(hint)])
    if hint is type(None):
        return st.none()
    if hint is typing.Any:
        return VALUES
    if origin is list or hint is list:
        return st.lists(SCALARS, max_size=3)
    if origin is dict or hint is dict:
        return st.dictionaries(st.text(max_size=5), SCALARS, max_size=3)
    if origin is tuple or hint is tuple:
        return st.tuples(SCALARS)
    if hint is bool:
        return st.booleans()
    if hint is int:
        return st.integers()
    if hint is float:
        return st.floats()
    if hint is str:
        return st.text(max_size=8)
    if dataclasses.is_dataclass(hint) and depth < 2:
        return st.builds(lambda d: d, st.just(None)).flatmap(lambda _: st.composite(
            lambda draw: _well_typed(hint, draw, depth + 1))())
    return st.just(None)


class Sent:
    """What was unpickled, shown safely (a half-built message cannot be printed field by field)."""

    def __init__(self, value) -> None:
        self.value = value

    def __repr__(self) -> str:
        return f"Sent({protocol._short(self.value)})"


@st.composite
def messages(draw):
    """A message as a peer could pickle it: a protocol class with any fields (some missing),
    a valid one with one field changed, or something else entirely."""
    return Sent(draw(_messages()))


@st.composite
def _messages(draw):
    kind = draw(st.sampled_from(["fields", "one-wrong", "valid", "other"]))
    if kind == "other":
        return draw(VALUES)
    cls = draw(st.sampled_from(MESSAGES))
    if kind == "fields":
        message = object.__new__(cls)
        for f in dataclasses.fields(cls):
            if draw(st.booleans()) or f.name == "body":
                body = draw(st.one_of(VALUES, st.sampled_from(MESSAGES).map(object.__new__)))
                object.__setattr__(message, f.name, body)
        return message
    try:
        message = _well_typed(cls, draw)
    except TypeError:  # a class whose fields need more than this strategy builds
        return draw(VALUES)
    if kind == "one-wrong" and dataclasses.fields(cls):
        name = draw(st.sampled_from([f.name for f in dataclasses.fields(cls)]))
        object.__setattr__(message, name, draw(VALUES))
    return message


@FAST
@given(messages())
def test_the_protocol_check_raises_only_malformed_and_passes_only_well_typed_messages(sent):
    message = sent.value
    before = _state(message)
    try:
        checked = check(message, KERNEL_SENDS)
    except Malformed as exc:
        assert str(exc)  # says what is wrong
    else:
        assert checked is message and isinstance(message, KERNEL_SENDS)
        for f in dataclasses.fields(message):  # every field of its declared type, one level down too
            assert protocol.conforms(getattr(message, f.name), protocol._hints(type(message))[f.name])
    assert _state(message) == before  # check changes nothing


def _state(message):
    if dataclasses.is_dataclass(message) and not isinstance(message, type):
        return {f.name: protocol._short(getattr(message, f.name, "<missing>")) for f in dataclasses.fields(message)}
    return protocol._short(message)


# -- rule text ------------------------------------------------------------------------------------------
RULE_PIECES = st.lists(st.sampled_from(
    ["sm_util", "accuracy", "step_time_p50_s", "data_wait_frac", " ", ">", ">=", "<", "=<", "==", "!=", "=", "60",
     "-1", "1e400", "nan", "inf", "0.5", "%", "for", ">=80%", "<=30%", "per step", "within step", "in phase",
     "train", "'", "\"", "(", ")", "\n", "\x00", "é"]), max_size=10).map("".join)


@FAST
@given(st.one_of(st.text(max_size=40), RULE_PIECES))
def test_rule_text_parses_or_raises_rule_error(text):
    from gpuprof_jupyter.core.analysis.rules import Rule, RuleError, parse_rule

    try:
        rule = parse_rule(text)
    except RuleError as exc:
        assert str(exc)
    else:
        assert isinstance(rule, Rule)
        assert parse_rule(rule.text) == rule if hasattr(rule, "text") else True


# -- meta.json and the store's index ----------------------------------------------------------------------
META_FIELDS = [f.name for f in dataclasses.fields(__import__(
    "gpuprof_jupyter.core.store.experiment", fromlist=["ExperimentMeta"]).ExperimentMeta)]


@st.composite
def meta_documents(draw, experiment_id: str):
    """What a ``meta.json`` may hold after a crash, an older or newer version, or a neighbour's
    edit: any JSON, or the right keys with values of any type."""
    if draw(st.booleans()):
        return draw(JSON)
    doc = {"id": experiment_id, "name": draw(st.one_of(st.text(max_size=8), JSON))}
    for name in draw(st.lists(st.sampled_from(META_FIELDS), max_size=6, unique=True)):
        doc[name] = draw(JSON)
    if draw(st.booleans()):
        doc["id"] = experiment_id
    return doc


@pytest.fixture(scope="module")
def store_with_a_good_run(tmp_path_factory):
    """A store with one finished run (its samples, steps and summary), listed once."""
    from gpuprof_jupyter.core.finish import finish_experiment
    from gpuprof_jupyter.core.store.directory import Store
    from gpuprof_jupyter.core.store.experiment import ExperimentMeta
    from gpuprof_jupyter.core.store.samples_file import SampleStreamWriter, samples_schema

    store = Store(tmp_path_factory.mktemp("prop") / "store")
    meta = ExperimentMeta(id="", name="good", status="running", interval_s=0.5,
                          devices=[{"key": "gpu0", "kind": "gpu", "name": "sim"}])
    directory = store.create(meta)
    schema = samples_schema(["sm_util"])
    writer = SampleStreamWriter(directory, schema)
    writer.write({"t": [0.5 * i for i in range(10)], "wall_time": [0.0] * 10, "device": ["gpu0"] * 10,
                  "sm_util": [40.0] * 10})
    writer.close()
    meta.status = "ok"
    finish_experiment(store, meta, [(0.1 * (i + 1), 0.1, 0.0, 8, 1, False) for i in range(20)], [], [], schema=schema)
    return store, meta


def _good_run_intact(store, meta) -> None:
    import gpuprof_jupyter as gp

    loaded = gp.load(meta.id, store=store.root)
    assert loaded.name == "good" and len(loaded.steps) == 20 and len(loaded.samples) == 10
    assert loaded.meta.summary["steps"]["count"] == 20


@FAST
@given(data=st.data())
def test_a_meta_json_of_any_content_is_listed_or_reported_and_the_other_run_is_intact(store_with_a_good_run, data):
    import warnings

    from gpuprof_jupyter.core.listing import store_listing
    from gpuprof_jupyter.core.store.directory import Store

    store, good = store_with_a_good_run
    experiment_id = "20990101T000000-fuzz00"
    doc = data.draw(meta_documents(experiment_id))
    directory = store.root / experiment_id
    directory.mkdir(exist_ok=True)
    raw = data.draw(st.one_of(st.just(None), st.binary(max_size=40)))
    (directory / "meta.json").write_bytes(json.dumps(doc).encode() if raw is None else raw)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # StoreProblem: the documented report of an unreadable one
            listing = store_listing(Store(store.root))
        names = [r["name"] for r in listing.rows]
        assert "good" in names
        assert len(listing.rows) == 2 or any(experiment_id in p for p in listing.problems), listing.problems
        _good_run_intact(store, good)
    finally:
        shutil.rmtree(directory)


@FAST
@given(st.binary(max_size=200))
def test_a_corrupt_index_file_lists_the_store_the_same(store_with_a_good_run, garbage):
    from gpuprof_jupyter.core.listing import store_listing
    from gpuprof_jupyter.core.store.directory import Store
    from gpuprof_jupyter.core.store.index import INDEX_NAME, forget

    store, good = store_with_a_good_run
    (store.root / INDEX_NAME).write_bytes(garbage)
    forget(store.root)  # a fresh process: the index file is all it has
    rows = store_listing(Store(store.root)).rows
    assert [r["name"] for r in rows] == ["good"]
    _good_run_intact(store, good)


# -- pipeline.yaml --------------------------------------------------------------------------------------
GATE = "workflow:\n  steps:\n    - name: train\n      profiling:\n        {}\n"
YAML_TEXT = st.one_of(
    st.text(max_size=60),
    JSON.map(lambda v: json.dumps(v)),  # JSON is YAML
    st.builds(lambda steps, extra: json.dumps({"workflow": {"steps": steps, **extra}}),
              st.lists(st.one_of(JSON, st.dictionaries(st.sampled_from(["name", "params", "profiling", "resources"]),
                                                       JSON, max_size=4)), max_size=3),
              st.dictionaries(st.text(max_size=5), JSON, max_size=2)),
    st.sampled_from(["workflow:\n  steps:\n    - name: train\n      params: [1]\n",
                     "workflow:\n  steps:\n    - name: train\n      profiling: 3\n",
                     "workflow: !!python/object:os.system {}\n", "a: &x [*x]\n", "workflow:\n\t- x\n"]),
)


@pytest.fixture(scope="module")
def exported_run():
    from tests.simexp import sim_experiment

    passed = {"rule": "sm_util > 60 for >=80%", "passed": True, "measured": 0.83, "detail": "ok", "kind": "time-share"}
    return sim_experiment("compute-bound", name="b64", params={"batch_size": 64}, checks=[passed])


@FAST
@given(YAML_TEXT)
@example(GATE.format("thresholds: 5"))
@example(GATE.format("thresholds: [1, null]"))
@example(GATE.format("thresholds: []\n        provenance: 3"))
@example(GATE.format("thresholds: []\n        provenance: {sm_util: [1]}"))
@example(GATE.format("metrics: 7"))
@example("workflow:\n  steps:\n    - name: train\n      params: [1]\n      resources: 2\n")
@example("#")  # a lone "#": ruamel refused the empty start comment (IndexError)
def test_export_into_any_existing_yaml_writes_a_pipeline_or_raises_pipeline_error_leaving_it(exported_run, text):
    from ruamel.yaml import YAML

    from gpuprof_jupyter.export.pipeline import PipelineError, export_pipeline

    folder = Path(tempfile.mkdtemp(prefix="gpuprof-prop-"))
    try:
        path = folder / "pipeline.yaml"
        path.write_text(text, encoding="utf-8", errors="surrogateescape") if _encodable(text) else path.write_bytes(
            text.encode("utf-8", "surrogatepass"))
        before = path.read_bytes()
        try:
            export_pipeline(exported_run, path, "train")
        except PipelineError as exc:
            assert "pipeline.yaml" in str(exc)
            assert path.read_bytes() == before
        else:
            doc = YAML().load(path.read_text())  # round trip: a tag of the user's stays as it was
            step = next(s for s in doc["workflow"]["steps"] if s["name"] == "train")
            assert step["params"]["batch_size"] == 64
    finally:
        shutil.rmtree(folder)


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


@FAST
@given(text=YAML_TEXT, step=st.sampled_from(["", ":train", ":other"]))
@example(text=GATE.format("thresholds: 5"), step="")
@example(text=GATE.format("thresholds: [1, null, {a: 1}]"), step="")
@example(text=GATE.format("thresholds: 'sm_util > 60 for >=80%'"), step=":train")
@example(text=GATE.format("thresholds: ['accuracy >= 0.5']\n        provenance: 3"), step="")
@example(text=GATE.format("thresholds: ['accuracy >= 0.5']\n        provenance: {sm_util: [1]}"), step="")
@example(text="workflow:\n  steps:\n    - 3\n    - name: train\n", step="")
@example(text="workflow:\n  steps: {name: train}\n", step="")
def test_the_cli_gate_reads_any_pipeline_file_or_exits_2(store_with_a_good_run, text, step, capsys):
    from gpuprof_jupyter.cli import main

    store, good = store_with_a_good_run
    folder = Path(tempfile.mkdtemp(prefix="gpuprof-prop-"))
    try:
        path = folder / "pipeline.yaml"
        path.write_bytes(text.encode("utf-8", "surrogatepass"))
        code = main(["check", good.id, "--store", str(store.root), "--pipeline", f"{path}{step}"])
        err = capsys.readouterr().err
        assert code in (0, 1, 2, 3), err  # 3: a rule that cannot be judged (docs/scripts.md)
        assert "Traceback" not in err
        if code == 2:
            assert err.strip()
    finally:
        shutil.rmtree(folder)
    _good_run_intact(store, good)


# -- a request's store or output path ---------------------------------------------------------------------
PATHS = st.one_of(st.text(max_size=30), st.lists(st.sampled_from(
    ["a", "..", ".", "", "/", "\\", "C:", "~", "\x00", " ", "é", "x" * 300, ".gpuprof", "link"]), max_size=6).map("/".join))


@FAST
@given(PATHS)
def test_a_request_path_resolves_under_the_root_or_is_refused_with_a_status(relpath):
    from gpuprof_jupyter.server.paths import PathRefused, resolve_under_root

    root = Path(tempfile.gettempdir()) / "gpuprof-prop-root"
    root.mkdir(exist_ok=True)
    if not (root / "link").is_symlink():
        os.symlink("/", root / "link")
    try:
        resolved = resolve_under_root(root, relpath, ".gpuprof")
    except PathRefused as exc:
        assert exc.status in (400, 403) and str(exc)
    else:
        real_root = Path(os.path.realpath(root))
        assert resolved == real_root or real_root in resolved.parents
