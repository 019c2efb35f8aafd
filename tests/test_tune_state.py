"""``--tune``'s snapshot of the user's state, restored directly (no kernel, no session).

What a new user's notebook holds before a tuning cell: a model in ``eval()`` with a frozen
layer, its optimizer, history dicts and lists, environment variables. The trial changes them
all; ``Snapshot.restore()`` must put back the very objects, in place.
"""

from __future__ import annotations

import os

import pytest
import torch

from gpuprof_jupyter.runtime.tune.state import Snapshot
from gpuprof_jupyter.runtime.tune.state_containers import MAX_ITEMS


def _model():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.5), torch.nn.Linear(8, 8),
                                torch.nn.Linear(8, 2))
    model.eval()
    model[0].requires_grad_(False)  # a frozen layer
    return model, torch.optim.SGD(model.parameters(), lr=0.5)


def _mess_up_the_model(model, opt):
    """What a tuning cell may do: train mode, unfreeze, replace and add submodules."""
    model.train()
    model[0].requires_grad_(True)
    model[3] = torch.nn.Linear(8, 2)  # the optimizer still holds the old layer's parameters
    model.add_module("head", torch.nn.Linear(2, 2))
    model[2].register_buffer("scale", torch.ones(1))
    model[2].bias = torch.nn.Parameter(torch.zeros(8))
    opt.add_param_group({"params": list(model.head.parameters())})
    model(torch.randn(3, 4)).sum().backward()
    opt.step()


def test_training_mode_frozen_layers_and_a_replaced_submodule_come_back_so_the_optimizer_trains_the_model():
    model, opt = _model()
    ns = {"model": model, "opt": opt}
    children = list(model)
    params = list(model.parameters())
    snap = Snapshot(ns)
    _mess_up_the_model(model, opt)
    snap.restore()

    assert list(model) == children and all(a is b for a, b in zip(model, children)) and "head" not in model._modules
    assert not model.training and not any(m.training for m in model.modules())
    assert [p.requires_grad for p in model.parameters()] == [False, False, True, True, True, True]
    assert all(a is b for a, b in zip(model.parameters(), params)) and len(list(model.parameters())) == len(params)
    assert "scale" not in model[2]._buffers
    assert len(opt.param_groups) == 1 and all(a is b for a, b in zip(opt.param_groups[0]["params"], params))
    assert snap.not_restored() == []

    # the optimizer's parameters are the model's again: a step trains the restored layer, not the frozen one
    frozen, last = model[0].weight.clone(), model[3].weight.clone()
    model(torch.randn(3, 4)).sum().backward()
    opt.step()
    assert torch.equal(model[0].weight, frozen) and model[0].weight.grad is None
    assert not torch.equal(model[3].weight, last)


def test_a_module_inside_a_dict_is_restored_like_one_bound_directly():
    model, opt = _model()
    ns = {"parts": {"model": model, "opt": opt}}
    weight = model[3].weight.clone()
    snap = Snapshot(ns)
    _mess_up_the_model(model, opt)
    snap.restore()
    assert not model.training and torch.equal(model[3].weight, weight) and "head" not in model._modules


def test_lists_dicts_and_sets_in_the_namespace_come_back_in_place_nested_and_cyclic():
    history = {"loss": [1.0], "acc": []}
    loss = history["loss"]
    seen, items, pair = {1, 2}, [1, 2, 3], ([0], {"k": 1})
    items.append(items)  # a cycle
    ns = {"history": history, "seen": seen, "items": items, "pair": pair, "n": 3}
    snap = Snapshot(ns)
    history["loss"].append(2.0)
    history["acc"] = [0.5]
    history["new"] = 1
    seen.add(3)
    items.clear()
    pair[0].append(1)
    pair[1]["k"] = 2
    snap.restore()
    assert ns["history"] is history and history == {"loss": [1.0], "acc": []} and history["loss"] is loss
    assert seen == {1, 2} and items[:3] == [1, 2, 3] and items[3] is items and len(items) == 4
    assert pair == ([0], {"k": 1})
    assert snap.not_restored() == []


def test_containers_over_the_bound_are_left_as_they_are_and_named():
    big = list(range(MAX_ITEMS + 1))
    nested = {"rows": [[0] * 1000 for _ in range(MAX_ITEMS // 1000 + 1)]}
    ns = {"big": big, "nested": nested, "small": [1]}
    snap = Snapshot(ns)
    big.append(-1)
    ns["small"].append(2)
    snap.restore()
    assert big[-1] == -1 and ns["small"] == [1]
    notes = " ".join(snap.not_restored())
    assert "big (list" in notes and "nested (dict" in notes and f"{MAX_ITEMS:,}" in notes
    assert "changed by the trials" in notes.split("nested")[0]  # big grew; nested did not change size


def test_environment_variables_the_trial_set_changed_or_removed_come_back(monkeypatch):
    monkeypatch.setenv("GPUPROF_TEST_KEEP", "a")
    monkeypatch.setenv("GPUPROF_TEST_GONE", "b")
    monkeypatch.delenv("GPUPROF_TEST_NEW", raising=False)
    snap = Snapshot({})
    os.environ["GPUPROF_TEST_KEEP"] = "changed"
    del os.environ["GPUPROF_TEST_GONE"]
    os.environ["GPUPROF_TEST_NEW"] = "c"
    snap.restore()
    assert os.environ["GPUPROF_TEST_KEEP"] == "a" and os.environ["GPUPROF_TEST_GONE"] == "b"
    assert "GPUPROF_TEST_NEW" not in os.environ


class _Stubborn(list):
    def __setitem__(self, key, value):
        raise TypeError("read-only list")


def test_what_cannot_be_put_back_is_named_and_the_rest_is_restored():
    stubborn, plain = _Stubborn([1]), [1]
    ns = {"stubborn": stubborn, "plain": plain}
    snap = Snapshot(ns)
    stubborn.append(2)
    plain.append(2)
    snap.restore()  # does not raise: the note says what stayed changed
    assert plain == [1] and stubborn == [1, 2]
    notes = snap.not_restored()
    assert len(notes) == 1 and "stubborn" in notes[0] and "read-only list" in notes[0]


@pytest.mark.parametrize("frozen", [True, False])
def test_requires_grad_is_restored_both_ways(frozen):
    model, _ = _model()
    model[2].requires_grad_(not frozen)
    snap = Snapshot({"model": model})
    model.requires_grad_(frozen)
    snap.restore()
    assert model[2].weight.requires_grad is (not frozen) and model[0].weight.requires_grad is False


def test_hooks_the_trial_registers_on_a_module_are_removed():
    model, _ = _model()
    calls = []
    model.register_forward_hook(lambda *a: calls.append("kept"))
    snap = Snapshot({"model": model})
    for _ in range(3):  # a cell that registers its hook on every run
        model[0].register_forward_hook(lambda *a: calls.append("trial"))
        model.register_forward_pre_hook(lambda *a: calls.append("trial"))
        model[2].register_full_backward_hook(lambda *a: calls.append("trial"))
    snap.restore()
    model(torch.randn(2, 4)).sum().backward()
    assert calls == ["kept"]


def test_a_tensor_changed_in_place_is_named_and_a_models_own_is_not():
    model, _ = _model()
    data, untouched = torch.zeros(3), torch.ones(3)
    with torch.inference_mode():
        frozen_data = torch.zeros(2)  # no version counter: not watched, and no error
    ns = {"model": model, "data": data, "untouched": untouched, "weight": model[2].weight, "batch": [torch.zeros(2)],
          "frozen_data": frozen_data}
    snap = Snapshot(ns)
    data.add_(1)
    ns["batch"][0].mul_(2)
    with torch.no_grad():
        model[2].weight.add_(1)  # restored with the model: not named
    snap.restore()
    notes = snap.not_restored()
    assert len(notes) == 2 and "data (a tensor) was changed in place" in notes[0] and "batch" in notes[1], notes
    assert data.tolist() == [1, 1, 1]  # named, not restored: tensors outside a model are never copied


# -- what the snapshot costs: refused when it cannot fit ---------------------------------------------
def _trained(width: int = 256):
    """A model with gradients and SGD momentum: the snapshot copies three tensors a parameter."""
    model = torch.nn.Linear(width, width)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(2, width)).sum().backward()
    opt.step()
    return model, opt, 3 * sum(p.numel() * p.element_size() for p in model.parameters())


def _available(monkeypatch, available: int) -> None:
    """This machine's available memory, as psutil would say it."""
    import collections

    import psutil

    memory = collections.namedtuple("svmem", "total available percent used free")
    monkeypatch.setattr(psutil, "virtual_memory", lambda: memory(2 * available, available, 50.0, available, available))


def test_the_snapshot_counts_every_tensor_it_copies_by_device(monkeypatch):
    model, opt, expected = _trained()
    _available(monkeypatch, expected)  # exactly enough
    snap = Snapshot({"model": model, "opt": opt, "twice": [model]})  # one module bound twice is copied once
    assert snap.copied_bytes == {"cpu": expected} and snap.size_bytes() == expected


def test_a_snapshot_larger_than_the_available_memory_is_refused_before_any_copy(monkeypatch):
    from gpuprof_jupyter.runtime.tune.state import SnapshotTooLarge

    model, opt, expected = _trained()
    _available(monkeypatch, expected // 2)
    clones = []
    real_clone = torch.Tensor.clone
    monkeypatch.setattr(torch.Tensor, "clone", lambda self, *a, **k: clones.append(1) or real_clone(self, *a, **k))
    with pytest.raises(SnapshotTooLarge, match=r"771\.0 KiB of tensors in host memory .* only 385\.5 KiB is "
                                               r"available; nothing was run") as refused:
        Snapshot({"model": model, "opt": opt})
    assert isinstance(refused.value, ValueError)  # the magic shows it as a usage error, tune() raises it
    assert clones == []


def test_tune_refuses_a_snapshot_that_cannot_fit_before_any_trial(monkeypatch, store_dir):
    import gpuprof_jupyter as gp

    model, opt, expected = _trained()
    _available(monkeypatch, expected // 2)
    ran = []

    def train():
        ran.append(1)

    with pytest.raises(ValueError, match="nothing was run"):
        gp.tune(train, namespace={"model": model, "opt": opt}, source="sim", store=store_dir, trial_steps=10)
    assert ran == []
    assert not store_dir.exists() or not any(store_dir.rglob("meta.json"))  # no trial, no experiment
