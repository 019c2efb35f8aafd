"""The kernel's own views as people see them (the ``--tune`` table, the live header): values
printed as everywhere else (core/format.py), the simulated banner once, every name escaped
(render/html.py)."""

from __future__ import annotations

from gpuprof_jupyter.core.analysis.gain import Gain
from gpuprof_jupyter.runtime.tune.measure import TrialFigures
from gpuprof_jupyter.runtime.tune.search import TuneResult
from gpuprof_jupyter.runtime.tune.spec import TuneSpec
from gpuprof_jupyter.runtime.tune.trial import Trial
from gpuprof_jupyter.notebook.tune_view import TuneReport
from tests.simexp import sim_experiment

EVIL = "<script>alert(1)</script>"


def _report() -> TuneReport:
    base = Trial(0, "baseline", {"num_workers": 0, "pin_memory": None}, {},
                 experiment=sim_experiment("amp", name=f"{EVIL}-t0"),
                 figures=TrialFigures(steps=20, samples_per_s=100.0, score=100.0, sm_util_mean=40.0,
                                      data_wait_frac=0.5, energy_per_sample_j=1.25),
                 verdict="baseline")
    best_settings = {"num_workers": 2, "pin_memory": True}
    tried = Trial(1, "num_workers 0 -> 2", best_settings, {"num_workers": (0, 2), "pin_memory": (None, True)},
                  experiment=sim_experiment("amp", name=f"{EVIL}-t1"),
                  figures=TrialFigures(steps=20, samples_per_s=150.0, score=150.0, score_ci=(140.0, 160.0),
                                       sm_util_mean=70.0, data_wait_frac=0.1),
                  verdict="kept", user_metrics={"converged": False},
                  gain=Gain("throughput", 0.5, 0.4, 0.6), against=f"{EVIL}-t0")
    return TuneReport(TuneResult(TuneSpec(), EVIL, [base, tried], best_settings=best_settings, noise=0.02, threshold=0.02,
                                 elapsed_s=12.0))


def test_the_tune_table_prints_values_as_everywhere_else():
    text = str(_report())
    assert text.count("SIMULATED GPU: these figures are not measurements") == 1
    assert "pin_memory null -> true" in text and "converged=false" in text
    assert "+50 % throughput" in text and "150.0/s (140.0/s..160.0/s)" in text and "1.25 J (simulated)" in text and "n/a" in text
    assert "noise between the two baseline trials: 2.0 %" in text


def test_the_tune_table_html_escapes_names_and_shows_the_banner_once():
    html = _report()._repr_html_()
    assert EVIL not in html and "&lt;script&gt;alert(1)&lt;/script&gt;-t1" in html
    assert html.count("SIMULATED GPU") == 1 and "gpuprof-simulated" in html
    assert "<table class='gpuprof-table gpuprof-tune-table'>" in html and "pin_memory null -&gt; true" in html


def test_the_live_header_escapes_names_and_uses_the_one_badge_and_formats():
    """The live header (render/live_header.py, as notebook/live/dashboard.py shows it) writes through render/html.py too, and
    shows memory as the status bar does (used/total)."""
    from collections import deque
    from types import SimpleNamespace

    from gpuprof_jupyter.core.plots.spec import plot_spec
    from gpuprof_jupyter.notebook.live.dashboard import LiveDashboard

    run = sim_experiment("amp", name=EVIL)
    meta = run.meta
    view = SimpleNamespace(session=SimpleNamespace(meta=meta, activity=None, children=None, alerts_fired=[]),
                           _header_fixed=None, spec=plot_spec(meta, ["sm_util", "power_w", "gpu_mem_used_bytes"]), gaps=deque([(1.0, 3.1)]),
                           latest={"gpu0": {"sm_util": 93.4, "power_w": float("nan"), "gpu_mem_used_bytes": 15569256448,
                                            "gpu_mem_total_bytes": 85899345920}},
                           _failed=f"boom {EVIL}")
    html = LiveDashboard._header_html(view, 12.0)
    assert EVIL not in html and html.count("&lt;script&gt;") == 2
    assert html.count("SIMULATED") == 1 and "gpuprof-simulated" in html
    assert "SM 93 %" in html and "n/a" in html and "14.5 GiB/80.0 GiB" in html and "sampler paused 2.1 s at t=1.0 s" in html
