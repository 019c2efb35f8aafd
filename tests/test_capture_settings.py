"""Issue 11 part 4: ``--capture`` of structured objects, flattened into keys a comparison diffs
and ``export_pipeline`` can write."""

from __future__ import annotations

import argparse
import enum
import types
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from gpuprof_jupyter.core.analysis.compare import compare_experiments
from gpuprof_jupyter.runtime.record.flatten import MAX_KEYS, flatten
from gpuprof_jupyter.runtime.record.settings import capture
from gpuprof_jupyter.render.comparison import comparison_text
from gpuprof_jupyter.export.pipeline import export_pipeline
from tests.simexp import sim_experiment, steps_frame


class Mode(enum.Enum):
    FAST = "fast"


@dataclass
class TrainingArguments:  # HF's is a dataclass with ~100 fields
    output_dir: Path = Path("/tmp/out")
    per_device_train_batch_size: int = 8
    dataloader_num_workers: int = 0
    bf16: bool = False
    mode: Mode = Mode.FAST
    lr_schedule: list = field(default_factory=lambda: [1e-3, 1e-4])
    optim_args: dict = field(default_factory=lambda: {"betas": (0.9, 0.99), "eps": 1e-8})
    _private: int = 3


class Node:
    """The config-node style: a plain object holding plain values and other nodes."""

    def __init__(self, **values) -> None:
        self.__dict__.update(values)


def test_structures_flatten_into_name_field_keys():
    flat, cut = flatten("args", TrainingArguments())
    assert not cut and flat == {
        "args.output_dir": "/tmp/out", "args.per_device_train_batch_size": 8, "args.dataloader_num_workers": 0,
        "args.bf16": False, "args.mode": "fast", "args.lr_schedule": [1e-3, 1e-4],
        "args.optim_args.betas": [0.9, 0.99], "args.optim_args.eps": 1e-8}
    assert flatten("c", {"num_workers": 2, "nested": {"a": None}})[0] == {"c.num_workers": 2, "c.nested.a": None}
    assert flatten("ns", argparse.Namespace(lr=0.1))[0] == {"ns.lr": 0.1}
    assert flatten("sn", types.SimpleNamespace(data=types.SimpleNamespace(workers=4)))[0] == {"sn.data.workers": 4}
    assert flatten("cfg", Node(batch_size=64, data=Node(num_workers=2)))[0] == {"cfg.batch_size": 64,
                                                                               "cfg.data.num_workers": 2}
    assert flatten("lr", 0.1)[0] == {"lr": 0.1}


def test_tensors_models_and_odd_objects_are_descriptions_never_errors():
    flat, _ = flatten("c", {"t": torch.zeros(2, 3), "a": np.ones(4, dtype=np.float32), "m": torch.nn.Linear(2, 2)})
    assert flat["c.t"] == "Tensor(shape=(2, 3), dtype=torch.float32)"
    assert flat["c.a"] == "ndarray(shape=(4,), dtype=float32)"
    assert flat["c.m"].startswith("Linear(")  # a model is not a config node

    class Raising:
        def __getattr__(self, name):
            raise RuntimeError("no")

        def __repr__(self):
            raise RuntimeError("no repr either")

    assert "repr failed" in flatten("r", Raising())[0]["r"]
    loop = {"a": 1}
    loop["self"] = loop
    assert flatten("l", loop)[0]["l.a"] == 1  # a cycle ends in a description


def test_bounded_depth_and_count():
    deep = {"a": {"b": {"c": {"d": {"e": {"f": 1}}}}}}
    (key, value), = flatten("d", deep)[0].items()
    assert key == "d.a.b.c.d" and value == "{'e': {'f': 1}}"
    flat, cut = flatten("big", {f"k{i}": i for i in range(MAX_KEYS + 50)})
    assert cut and len(flat) == MAX_KEYS
    values, notes = capture({"big": {f"k{i}": i for i in range(MAX_KEYS + 1)}}, ["big"])
    assert len(values) == MAX_KEYS and "kept the first" in notes[0]


def _run(name, captured, params=None):
    exp = sim_experiment("input-bound", seconds=3, name=name, params=params or {},
                         steps=steps_frame(30, 3, 0.5 if "0" in name else 0.1))
    exp.meta.captured.update(captured)
    return exp


def test_comparison_diffs_captured_keys_and_export_writes_them(tmp_path):
    base = _run("workers0", capture({"train_config": Node(num_workers=0, lr=0.1)}, ["train_config"])[0])
    more = _run("workers2", capture({"train_config": Node(num_workers=2, lr=0.1)}, ["train_config"])[0])
    c = compare_experiments([base, more])
    assert c.changed_settings(1) == {"train_config.num_workers": (0, 2)}
    assert "workers2 changed: train_config.num_workers: 0 -> 2" in comparison_text(c)
    path = tmp_path / "pipeline.yaml"
    result = export_pipeline(more, path, baseline=base, captured=["train_config"])
    text = path.read_text()
    assert "train_config.num_workers: 2" in text and "train_config.lr: 0.1" in text
    assert ("params.train_config.num_workers", None, 2) in [c[:3] for c in result.changes]
    plain = export_pipeline(more, tmp_path / "plain.yaml", baseline=base)
    assert not any("train_config" in c[0] for c in plain.changes)  # only when asked
