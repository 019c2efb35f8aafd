"""The scenario matrix (issue 36 part 5): every output of every kind of run, checked mechanically.

Runs across {host-only CPU, simulated GPU, fake-NVML GPU} x {training, serving, training then
serving, --tune, out of memory, two ranks, a two-node job} (tests/scenarios.py, built on a fake clock, no kernel)
are rendered once each, shared by every assertion (module-scoped fixtures): the summary (text and
HTML), the findings, the comparison, the rule verdicts (in process and through ``gpuprof
check``), pipeline.yaml, the report, ``gpuprof list`` and the tune table. The invariants:

* no GPU claim without GPU readings (a host-only run's outputs speak of the host);
* no simulated figure without its label;
* no 0 for unknown;
* no number without its unit;
* one gain per pair (the comparison's throughput change, its gain row and the tune table agree);
* no rule passed on a figure of another kind (CPU tensors, a simulated device).

A new surface adds its output to ``outputs`` below; a new kind of run adds its scenario to
tests/scenarios.py. The matrix holds no xfail: a case it finds failing is a bug, fixed with the
case that found it (issue 36's were).
"""

from __future__ import annotations

import contextlib
import html as html_lib
import io
import re
from types import SimpleNamespace

import pyarrow as pa
import pytest

from gpuprof_jupyter.api import load
from gpuprof_jupyter.cli import main
from gpuprof_jupyter.core.analysis.compare import compare_experiments
from gpuprof_jupyter.core.analysis.diagnosis import diagnose
from gpuprof_jupyter.core.analysis.gain import gain
from gpuprof_jupyter.core.analysis.rules import evaluate_rules
from gpuprof_jupyter.core.analysis.summary import summary_of
from gpuprof_jupyter.core.store.directory import Store
from gpuprof_jupyter.core.store.samples_file import KEY_COLUMNS, SampleStreamWriter, samples_schema, stream_to_parquet
from gpuprof_jupyter.core.plots.spec import plot_spec
from gpuprof_jupyter.render.live_header import current_values_text, step_facts, steps_text
from gpuprof_jupyter.notebook.tune_view import TuneReport
from gpuprof_jupyter.render.comparison import comparison_html, comparison_text
from gpuprof_jupyter.render.findings_html import checks_text, findings_text
from gpuprof_jupyter.render.oom_text import oom_text
from gpuprof_jupyter.export.pipeline import export_pipeline
from gpuprof_jupyter.render.report import render_report
from gpuprof_jupyter.render.summary_html import render_summary_html, render_summary_text
from gpuprof_jupyter.runtime.tune.measure import measure
from gpuprof_jupyter.runtime.tune.search import TuneResult
from gpuprof_jupyter.runtime.tune.spec import make_spec
from gpuprof_jupyter.runtime.tune.trial import Trial
from tests.scenarios import SOURCES, WORKLOADS, workload

RULES = ["sm_util > 60 for >=80%", "peak_memory < 70 GiB", "memory_headroom > 10 %", "latency_p99 < 50 ms",
         "samples_per_s > 1", "data_wait_frac < 90 %"]
CELLS = [(s, w) for s in SOURCES for w in WORKLOADS]


# -- the runs and their outputs, built once ------------------------------------------------------------

@pytest.fixture(scope="module")
def matrix(tmp_path_factory):
    """(source, workload) -> {"runs": [...], "outputs": {name: text}}; every run saved in one store."""
    root = tmp_path_factory.mktemp("matrix")
    store = Store(root / "store")
    cells = {}
    for source, kind in CELLS:
        runs = workload(source, kind)
        for run in runs:
            summary_of(run)  # kept in the metadata, as a finished run's is
            store.create(run.meta)
            if run.steps is not None:
                store.save_steps(run.meta, pa.Table.from_pandas(run.all_steps, preserve_index=False))  # every rank's
            if run.requests is not None:
                store.save_requests(run.meta, pa.Table.from_pandas(run.requests, preserve_index=False))
            run.meta.checks = [r.to_dict() for r in evaluate_rules(run, RULES)]
            store.save_meta(run.meta)
        if kind == "job":  # its two parts, read back as one experiment (core/job.py)
            for part in runs:
                _save_samples(store, part)
            runs = [load(runs[0].meta.context["job"]["key"], store)]
        cell = cells[(source, kind)] = {"runs": runs}
        cell["outputs"] = _outputs(cell, source, kind, runs, root, store)
    listing = _cli(["list", "--store", str(store.root)])
    for (source, kind), cell in cells.items():
        names = {r.name for r in cell["runs"]}
        cell["outputs"]["gpuprof list"] = "\n".join(line for line in listing.splitlines()
                                                     if line.split() and line.split()[0] in names)
    return cells


def _save_samples(store: Store, run) -> None:
    """``run``'s samples as its sampler process leaves them (a stream, then Parquet): what a job's
    parts are read back from."""
    metrics = [c for c in run.samples.columns if c not in KEY_COLUMNS]
    schema = samples_schema(metrics)
    writer = SampleStreamWriter(store.directory(run.meta), schema)
    writer.write({c: run.samples[c].astype(object).where(run.samples[c].notna(), None).tolist()
                  for c in (*KEY_COLUMNS, *metrics)})
    writer.close()
    stream_to_parquet(store.directory(run.meta), schema)


def _cli(argv) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        main(argv)
    return out.getvalue()


def visible_text(page: str) -> str:
    """An HTML page's text as a reader sees it: scripts and styles left out, one line per block."""
    page = re.sub(r"(?is)<(script|style)\b.*?</\1>", " ", page)
    page = re.sub(r"(?i)<(br|tr|li|p|div|h\d|details|summary|section|table)\b[^>]*>", "\n", page)
    page = re.sub(r"(?i)</t[dh]>", " | ", page)
    return html_lib.unescape(re.sub(r"<[^>]+>", "", page))


def _outputs(cell: dict, source: str, kind: str, runs, root, store) -> dict[str, str]:
    """Every output of the cell's runs, by name; the comparison and the tune report kept in ``cell``."""
    out = {}
    for run in runs:
        tag = f" [{run.name}]" if len(runs) > 1 else ""
        out["summary text" + tag] = render_summary_text(run)
        out["summary html" + tag] = visible_text(str(render_summary_html(run)))
        out["findings" + tag] = "\n".join(findings_text(diagnose(run)))
        out["verdicts" + tag] = "\n".join(checks_text(evaluate_rules(run, RULES)))
        out["gpuprof check" + tag] = _cli(["check", run.name, "--store", str(store.root), *sum(
            (["--rule", r] for r in RULES), [])])
        out["live header" + tag] = _live_header(run)
        memory = (summary_of(run).get("memory") or {}).get("oom")
        if memory:
            out["oom text" + tag] = oom_text(memory, simulated=bool(run.meta.simulated))
    pipeline = root / f"{source}-{kind}.yaml"
    export_pipeline(runs[-1], pipeline, baseline=runs[0], force=True, store=store.root)
    out["pipeline.yaml"] = pipeline.read_text()
    if len(runs) > 1:
        comparison = cell["comparison"] = compare_experiments(runs)
        out["comparison"] = comparison_text(comparison)
        out["comparison html"] = visible_text(str(comparison_html(comparison, plots=False)))
    if kind == "tune":  # the report is the summaries and the comparison above, with plots: once per source
        out["report"] = visible_text(render_report(runs))
    if kind == "tune":
        cell["tune report"] = _tune_report(runs)
        out["tune table"] = "\n".join(" | ".join(row) for row in cell["tune report"].rows())
    return out


def _live_header(run) -> str:
    """The live header's lines at the run's end: each device's latest reading, the last steps."""
    latest = {device: {k: v for k, v in rows.iloc[-1].items() if k not in ("t", "wall_time", "device")}
              for device, rows in run.samples.groupby("device")}
    lines = current_values_text(plot_spec(run.meta, list(run.samples.columns)), latest)
    if run.steps is not None and len(run.steps):
        steps = [SimpleNamespace(**row) for row in run.steps.to_dict("records")]
        lines.append(steps_text(step_facts(steps, float(run.steps["t_end_s"].iloc[-1]))))
    return "\n".join(lines)


def _tune_report(runs) -> TuneReport:
    """--tune's report over the pair as the search builds it: each trial measured on its steady
    steps (after the warm-up it saved), the kept one's gain by the shared estimator
    (runtime/tune/search.py)."""
    base, kept = runs
    trials = [Trial(1, "baseline", {}, {}, experiment=base, figures=measure(base, "throughput"), verdict="baseline"),
              Trial(2, "batch_size 32 -> 64", {"batch_size": 64}, {"batch_size": (32, 64)}, experiment=kept,
                    figures=measure(kept, "throughput"), verdict="kept", against=base.name)]
    trials[1].gain = gain(trials[1].figures.rate, trials[0].figures.rate)
    return TuneReport(TuneResult(make_spec(), "tune", trials=trials, best_settings={"batch_size": 64}))


def _texts(matrix, source: str, kind: str):
    return matrix[(source, kind)]["outputs"].items()


# -- what the invariants look for ------------------------------------------------------------------------

_GPU_WORDS = re.compile(r"\bGPUs?\b|sm_util|\bSM\b|CUDA|cuda|pin_?memory|pinned|non_blocking|nvidia-smi|"
                        r"kernel-active|\bpower\b|energy|\bkWh\b", re.I)
# what a host-only run may say of a GPU: that it has none, what its gates need, the rules as the user wrote them.
# Each is a whole phrase, removed before the scan, so a claim beside it in the same line is still found.
# A phrase that says a figure or a run is not a GPU's (findings' and the memory basis's host wording).
_NOT_A_GPU = re.compile(r"no GPU was read in this run \(source host\)|host memory, not a GPU's|"
                        r"counted CPU tensors, not GPU memory")
_NO_GPU_WORDS = [r"GPUs: none \(host only\)", _NOT_A_GPU.pattern,
                 # what kind of run records a gated figure (rules.recorded_by): another run, never this one
                 r"\b\w+ is recorded by a run whose model is on a GPU \(NVML, or --source sim's simulated GPU\) "
                 r"with the CUDA allocator in use", r"totals \(duration, energy, cost\)", r"rates \(throughput, energy per sample\)",
                 r"this run's source \(host\) read no GPU", r"judge it on a GPU runner",
                 r"--source nvml", r"reading dcgm-exporter", r"sm_util is a GPU metric", r"sm_util was not measured",
                 r"no CUDA allocator in use", r"sm_util > 60 for >=80%",
                 r"(?m)^\s*metrics: \[sm_util, mem_bw, power\]$"]  # pipeline.yaml's default of what to profile
_NUMBER = r"(?<![\w.])[-+]?\d[\d,]*(?:\.\d+)?"
_ZERO = re.compile(r"(?<![\w.,+-])0(?:\.0+)? (?:B|KiB|MiB|GiB|W|J|kJ|kWh|%)(?!\w)")
_SIM_FIGURE = re.compile(r"(\bSM\b|sm_util|sm_low|mem BW|mem_bw|\bpower\b|energy|kWh|peak memory|peak GPU|headroom|"
                         r"GPU memory|\bGPUs\b)")
_FIGURE = re.compile(r"\d[\d,]*(?:\.\d+)?\s?(?:%|W|kW|J|kJ|kWh|B|KiB|MiB|GiB|TiB|MHz|s|ms)(?!\w)")
# labels and rules that hold a number without being a figure of the run
_LABELS = re.compile(r"time SM < 50 %|SM < 50 %|sm_util < 50 %|" + "|".join(re.escape(r) for r in RULES))


def _segments(text: str):
    """A text's smallest units that each stand alone: table cells with their row's label, the
    '; '-separated facts of a summary line, else the line."""
    for line in text.splitlines():
        if " | " in line:
            label, *cells = line.split(" | ")
            yield from (f"{label} | {cell}" for cell in cells if cell.strip())
        elif "; " in line and ": " in line:
            yield from line.split("; ")
        else:
            yield line


def gpu_claims(text: str, wrapped: bool = False) -> list[str]:
    """The lines of ``text`` that speak of a GPU, after what a host-only run may say is left out
    (``wrapped``: lines indented under a line continue it, as the comparison's text wraps them)."""
    if wrapped:
        text = re.sub(r"\n {4,}", " ", text)
    for allowed in _NO_GPU_WORDS:
        text = re.sub(allowed, "", text)
    return [line.strip() for line in text.splitlines() if _GPU_WORDS.search(line)]


def unlabelled_simulated(text: str) -> list[str]:
    """Segments showing a GPU figure (a GPU word and a number) without "simulated"."""
    found = []
    for segment in _segments(text):
        if segment.lstrip().startswith("CANNOT JUDGE"):
            continue
        bare = _NOT_A_GPU.sub("", _LABELS.sub("", segment))
        if _SIM_FIGURE.search(bare) and _FIGURE.search(bare) and "simulated" not in segment.lower():
            found.append(segment.strip())
    return found


def zeros(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if _ZERO.search(line)]


_COUNTS = re.compile(r"^(steps|GPUs|requests|entered|batch size|rank|ranks|calls/step)$")


def bare_numbers(name: str, text: str) -> list[str]:
    """Figures printed without a unit: a summary fact 'label: 3.5', a verdict 'x = 320 (', a
    pipeline.yaml comment '(0.000682509)', a comparison cell that is only a number. (Tables with
    a header, the HTML ones and the tune table, are checked by their columns instead.)"""
    found = []
    for segment in (() if "html" in name or name in ("report", "tune table") else _segments(text)):
        fact = re.fullmatch(r"\s*([^:|]+):\s*(" + _NUMBER + r")\s*", segment)
        if fact and not _COUNTS.match(fact.group(1).strip()):
            found.append(segment.strip())
        cell = re.fullmatch(r"([^|]+)\|\s*(" + _NUMBER + r")\s*(\*)?\s*", segment)
        if cell and not re.search(r"batch_size|num_workers|steps|setting|#\d", segment):
            found.append(segment.strip())
    found += re.findall(r"= " + _NUMBER + r" \(", text)
    found += re.findall(r"#[^\n]*\(" + _NUMBER + r"\)", text)
    return found


# -- the invariants ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", WORKLOADS)
def test_no_gpu_claim_without_gpu_readings(matrix, kind):
    claims = {name: gpu_claims(text, wrapped=name == "comparison") for name, text in _texts(matrix, "host", kind)}
    assert {k: v for k, v in claims.items() if v} == {}


@pytest.mark.parametrize("kind", WORKLOADS)
def test_no_simulated_figure_without_its_label(matrix, kind):
    found = {name: unlabelled_simulated(text) for name, text in _texts(matrix, "sim", kind)
             if name not in ("pipeline.yaml",)}
    assert {k: v for k, v in found.items() if v} == {}


def test_the_simulated_label_reaches_pipeline_yaml_and_the_listing(matrix):
    """Where a simulated figure is written in a comment or a listing row, it says so."""
    for kind in WORKLOADS:
        outputs = matrix[("sim", kind)]["outputs"]
        for line in outputs["pipeline.yaml"].splitlines():
            if "#" in line and re.search(r"sm_util \d|power|energy", line.split("#", 1)[1]):
                assert "simulated" in line, line
        for row in outputs["gpuprof list"].splitlines():
            assert "(simulated)" in row, row


@pytest.mark.parametrize("source,kind", CELLS)
def test_no_zero_for_unknown(matrix, source, kind):
    found = {name: zeros(text) for name, text in _texts(matrix, source, kind)}
    assert {k: v for k, v in found.items() if v} == {}


@pytest.mark.parametrize("source,kind", CELLS)
def test_no_number_without_its_unit(matrix, source, kind):
    found = {name: bare_numbers(name, text) for name, text in _texts(matrix, source, kind)}
    assert {k: v for k, v in found.items() if v} == {}


@pytest.mark.parametrize("source", SOURCES)
def test_the_tune_table_gives_each_figure_its_unit(matrix, source):
    for row in matrix[(source, "tune")]["outputs"]["tune table"].splitlines():
        name, changed, steps, rate, gain_, energy, sm, wait, verdict = row.split(" | ")
        assert steps.isdigit() and rate.split(" (")[0].endswith("/s") and wait.endswith("%"), row
        assert (energy == sm == "n/a") if source == "host" else (energy.endswith(("J", "J (simulated)"))
                                                                  and re.search(r"% ?(\(simulated\))?$", sm)), row
        if source == "sim":
            assert "(simulated)" in energy and "(simulated)" in sm, row


@pytest.mark.parametrize("source", SOURCES)
def test_one_gain_per_pair(matrix, source):
    """The comparison's throughput change, its gain row, the tune table's gain and pipeline.yaml's
    measured effect: one figure over the trials' steady steps (each trial's slow first step is
    in its saved warm-up), printed the same in the comparison, the tune table and the export."""
    cell = matrix[(source, "tune")]
    comparison, report = cell["comparison"], cell["tune report"]
    changes = {"throughput row": 100 * comparison.metric("samples_per_s").rel[1],
               "gain row": 100 * comparison.gains[1].value, "tune table": 100 * report.result.trials[1].gain.value}
    assert len({round(v) for v in changes.values()}) == 1, changes
    printed = report.result.trials[1].gain.text()
    assert printed in " ".join(cell["outputs"]["comparison"].split()), printed
    assert printed.split(" (95 %")[0] in cell["outputs"]["pipeline.yaml"], cell["outputs"]["pipeline.yaml"]


@pytest.mark.parametrize("source,kind", CELLS)
def test_no_rule_passed_on_a_figure_of_another_kind(matrix, source, kind):
    """A memory rule judged on tensor sizes counted on the CPU says so (or cannot judge); one judged
    against a simulated device is labelled simulated."""
    wrong = []
    for name, text in _texts(matrix, source, kind):
        if not name.startswith(("verdicts", "gpuprof check")):
            continue
        for line in text.splitlines():
            if not re.match(r"(PASS|FAIL)\b", line) or not re.search(r"peak_memory|memory_headroom", line):
                continue
            counted_on_cpu = source in ("host", "sim")
            if counted_on_cpu and not re.search(r"tensor|CPU", line):
                wrong.append(line)
            if source == "sim" and "memory_headroom" in line and "simulated" not in line:
                wrong.append(line)
    assert wrong == []


@pytest.mark.parametrize("source,kind", [(s, w) for s, w in CELLS if w in ("training", "oom")])
def test_no_memory_figure_set_against_a_device_of_another_kind(matrix, source, kind):
    """Tensors counted on the CPU are no share of a GPU's memory (simulated or real)."""
    for name, text in _texts(matrix, source, kind):
        for line in text.splitlines():
            if "tensor sizes" in line and re.search(r"peak [\d.]+ \w+ of ", line):
                pytest.fail(f"{name}: {line.strip()}")


def test_the_matrix_can_fail():
    """Each detector finds what it looks for (an invariant that cannot fail checks nothing)."""
    assert gpu_claims("[high] Host-bound serving: the GPU waits for the host") != []
    assert gpu_claims("GPUs: none (host only); host CPU (process tree): 25 %") == []
    # a sentence that says there is no GPU passes; a claim beside it in the same line is still found
    assert gpu_claims("waited for data 45 %; no GPU was read in this run (source host) -> more workers") == []
    assert gpu_claims("no GPU was read in this run (source host); the GPU idles -> use pin_memory") != []
    assert gpu_claims("no GPU was read in this run (source nvml)") != []
    assert gpu_claims("CANNOT JUDGE memory_headroom > 10 %: to judge it: memory_headroom_frac is recorded by a run "
                      "whose model is on a GPU (NVML, or --source sim's simulated GPU) with the CUDA allocator in use: "
                      "its peak against the device's total") == []
    assert gpu_claims("memory_headroom_frac is recorded by a run whose model is on a GPU; the GPU is 90 % full") != []
    assert unlabelled_simulated("SM util mean: 38 %; host CPU (process tree): 20 %") == ["SM util mean: 38 %"]
    assert unlabelled_simulated("SM util mean: 38 % (simulated)") == []
    assert unlabelled_simulated("PASS | peak 2.8 GiB (figure); counted CPU tensors, not GPU memory") == []
    assert unlabelled_simulated("PASS | GPU memory 2.8 GiB; counted CPU tensors, not GPU memory") != []
    assert zeros("memory breakdown: parameters 1.0 MiB, other 0 B") != [] and zeros("+0.0 pts") == []
    assert bare_numbers("x", "duration: 6.0") == ["duration: 6.0"]
    assert bare_numbers("x", "steps: 60; throughput: 320.0 samples/s") == []
    assert bare_numbers("x", "latency_p99 < 50 ms  # serve-b8: pass (0.000682509)") != []
    assert bare_numbers("x", "PASS samples_per_s > 1: samples_per_s = 320 (figure; needs > 1)") != []


def test_every_output_of_every_cell_was_rendered(matrix):
    """The matrix covers every surface for every cell (a renderer that raised would leave a hole)."""
    for (source, kind), cell in matrix.items():
        names = set(cell["outputs"])
        expected = {"pipeline.yaml", "gpuprof list"} | {
            f"{what}{tag}" for run in cell["runs"] for tag in ([f" [{run.name}]"] if len(cell["runs"]) > 1 else [""])
            for what in ("summary text", "summary html", "findings", "verdicts", "gpuprof check", "live header")}
        if kind == "tune":
            expected |= {"comparison", "comparison html", "tune table", "report"}
        if kind == "oom":
            expected.add("oom text")
        assert expected <= names, (source, kind, expected - names)
        assert all(cell["outputs"][n].strip() for n in expected if not n.startswith("findings")), (source, kind)


@pytest.mark.parametrize("source", SOURCES)
def test_a_two_node_job_is_read_back_as_one_experiment(matrix, source):
    """The job's cell is its two parts read back from the store (core/job.py): every rank with its
    host, node-b's planted clock skew found, the host's figures from both nodes, one listing row."""
    [job] = matrix[(source, "job")]["runs"]
    outputs = matrix[(source, "job")]["outputs"]
    assert {r: f["host"] for r, f in job.summary["ranks"].items()} == {
        "0": "node-a", "1": "node-a", "2": "node-b", "3": "node-b"}
    assert "node-b +1.5 s ± " in outputs["summary text"] and "rank 3 on node-b" in outputs["summary text"]
    assert "host CPU (process tree): n/a" not in outputs["summary text"]
    assert len(outputs["gpuprof list"].splitlines()) == 1 and outputs["gpuprof list"].rstrip().endswith("2/2")
    assert "share GPU" not in outputs["findings"]  # GPU 0 of node-a is not GPU 0 of node-b
