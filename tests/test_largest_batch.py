"""Headroom and the largest batch that fits (docs/memory.md): memory = fixed + per-sample x
batch, fitted over runs at two or more batch sizes, with its basis and warnings."""

from __future__ import annotations

import math

import pyarrow as pa
import pytest

import gpuprof_jupyter as gp
from gpuprof_jupyter.core.analysis.diagnosis import diagnose
from gpuprof_jupyter.core.analysis.headroom import largest_batch
from gpuprof_jupyter.core.analysis.summary import summary_of
from tests.memexp import GIB, MIB, PARAMS, PER_SAMPLE, STATE, memory_run

DEVICE = 40 * GIB
FIXED = 2 * PARAMS + STATE


def test_three_batch_sizes_give_the_line_and_the_answer():
    fit = gp.largest_batch(memory_run(8), memory_run(16), memory_run(32))
    assert fit.fixed_bytes == pytest.approx(FIXED)
    assert fit.per_sample_bytes == pytest.approx(PER_SAMPLE)
    assert fit.device_bytes == DEVICE
    assert fit.batch == math.floor((0.9 * DEVICE - FIXED) / PER_SAMPLE)  # 327
    assert fit.predicted_bytes(fit.batch) <= 0.9 * DEVICE < fit.predicted_bytes(fit.batch + 1)
    assert "3 runs at 3 batch sizes" in fit.basis and "batch 8" in fit.basis
    assert fit.warnings == [] and fit.simulated and "SIMULATED" in str(fit)


def test_the_margin_is_kept_and_checked():
    runs = [memory_run(8), memory_run(16), memory_run(32)]
    assert gp.largest_batch(*runs, margin=0.0).batch == math.floor((DEVICE - FIXED) / PER_SAMPLE)
    assert gp.largest_batch(*runs, margin=0.5).batch == math.floor((0.5 * DEVICE - FIXED) / PER_SAMPLE)
    for bad in (-0.1, 1.0, float("nan"), "10%"):
        with pytest.raises(ValueError, match="margin"):
            gp.largest_batch(*runs, margin=bad)


def test_two_points_fit_but_warn_that_linearity_is_unchecked():
    fit = gp.largest_batch(memory_run(8), memory_run(32))
    assert fit.per_sample_bytes == pytest.approx(PER_SAMPLE)
    assert any("only two batch sizes" in w for w in fit.warnings)


def test_points_off_the_line_warn():
    runs = [memory_run(b, curve=8 * MIB) for b in (8, 16, 32, 64)]
    fit = gp.largest_batch(*runs)
    assert any("not linear" in w for w in fit.warnings), fit.warnings


def test_one_batch_size_falls_back_to_the_breakdown_with_a_warning():
    fit = gp.largest_batch(memory_run(16, name="a"), memory_run(16, name="b"))
    assert fit.fixed_bytes == FIXED
    assert fit.per_sample_bytes == pytest.approx(PER_SAMPLE)  # the rest of the peak, per sample
    assert any("too few points" in w for w in fit.warnings)
    with pytest.raises(ValueError, match="two or more batch sizes"):
        gp.largest_batch(memory_run(16, breakdown=False))


def test_runs_without_what_a_fit_needs_are_named():
    empty = memory_run(8)
    empty.meta.summary = {}
    empty._steps = empty.steps.drop(columns=["peak_memory_bytes"])
    empty._step_columns = None
    empty.meta.context.pop("memory")
    fit = gp.largest_batch(memory_run(8), memory_run(32), empty)
    assert any("left out" in w and "no memory peak" in w for w in fit.warnings)
    with pytest.raises(ValueError, match="at least one run"):
        largest_batch([])
    with pytest.raises(ValueError, match="none of these runs recorded"):
        largest_batch([empty])


def test_saved_runs_by_name_and_the_store_default(store_dir):
    store = gp.Store(store_dir)
    for b in (8, 16, 32):
        run = memory_run(b, name="cell")
        summary_of(run)  # kept in the metadata, as a finished run's is
        store.create(run.meta)
        store.save_steps(run.meta, pa.Table.from_pandas(run.steps, preserve_index=False))
        store.save_meta(run.meta)
    fit = gp.largest_batch(store=store_dir)  # the last run and its namesakes
    assert fit.per_sample_bytes == pytest.approx(PER_SAMPLE) and len(fit.points) == 3


def test_diagnosis_names_the_largest_batch_and_what_to_do_when_it_does_not_fit():
    roomy = {f.id: f for f in diagnose(memory_run(16))}["largest-batch"]
    assert roomy.numbers["largest_batch"] == math.floor((0.9 * DEVICE - FIXED) / PER_SAMPLE)
    assert "largest_batch" in roomy.next_step
    tight = {f.id: f for f in diagnose(memory_run(400))}["memory-does-not-fit"]  # 43 GiB of 40
    largest = tight.numbers["largest_batch"]
    micro, steps = tight.numbers["micro_batch"], tight.numbers["accumulation_steps"]
    assert micro <= largest and micro * steps >= 400 and steps == math.ceil(400 / largest)
    assert f"gradient accumulation over {steps} steps" in tight.next_step
    assert "checkpointing" in tight.next_step and "AMP" in tight.next_step
    assert tight.numbers["activations_share"] == pytest.approx(0.9 * 400 * PER_SAMPLE / (FIXED + 400 * PER_SAMPLE))
