"""An experiment's settings written into the text of a ``pipeline.yaml`` of workflow steps.

Runs in the kernel, the Jupyter server and the ``gpuprof`` command.

``render_pipeline`` returns the file's new text; reading the runs and the file, and writing
it, is ``export/pipeline.py``'s (``export_pipeline``).

Layout::

    workflow:
      steps:
        - name: train
          resources:
            gpu: 2
          profiling:
            enabled: true
            metrics: [sm_util, mem_bw, power]
            thresholds:
              - sm_util > 60 for >=80%     # b64-amp: pass (83 %)
            provenance:
              sm_util: gpm.sm_util         # what the thresholds' metric measured when they were set
          params:
            batch_size: 64  # 32 -> 64; alone in b64 against baseline: -25% time, -30% energy

Round trip through ruamel.yaml: other keys, comments, order and indentation are kept. Only what
the user set or changed is written (torch's own defaults are left out unless set explicitly);
each changed line says old -> new and its own evidence (``_evidence``); the run's common
effect goes once on the step's ``name`` line. Written atomically (by the export); a malformed file raises
``PipelineError`` and stays untouched; a missing file is created. Pipelines only: the target
ends in ``.yaml``/``.yml`` and an existing file is already a pipeline (a mapping with
``workflow:``) or empty, else ``PipelineError`` names it (a notebook or ``settings.json`` given
by mistake is never rewritten as YAML). An experiment that failed
one of its rules is refused (``ExportRefused``) unless ``force=True``.

Provenance: ``profiling.provenance`` records which API each threshold's metric came from, so a
gate on a run measured by other APIs warns (``gpuprof check --pipeline``). An export whose
baseline, or whose file, measured a metric by other APIs carries the same loud warnings
(``ExportResult.warnings``; the effect comment says "not comparable").
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from pathlib import Path

from gpuprof_jupyter.core.format import NOT_RECORDED, fmt_figure, fmt_setting
from gpuprof_jupyter.core.torch_defaults import is_descriptive, is_torch_default

DEFAULT_METRICS = ["sm_util", "mem_bw", "power"]
_MISSING = NOT_RECORDED  # a key the file or a run does not have


class PipelineError(ValueError):
    """The pipeline file cannot be read or does not have the ``workflow: steps:`` layout."""


class ExportRefused(RuntimeError):
    """The experiment failed a rule and ``force`` was not given."""


@dataclass
class ExportResult:
    path: Path
    step: str
    experiment: str
    created: bool
    baseline: str | None
    changes: list[tuple[str, object, object, str]] = field(default_factory=list)  # key, old, new, comment
    warnings: list[str] = field(default_factory=list)  # metrics measured by other APIs (analysis.provenance)

    def __str__(self) -> str:
        what = f"{len(self.changes)} change(s)" if self.changes else "no change"
        return f"exported {self.experiment!r} to {self.path} step {self.step!r}: {what}"

    def to_html(self) -> str:
        """What the comparison's export button shows: the line above, the warnings, each change."""
        from gpuprof_jupyter.render.html import PALETTE, coloured, html, join

        changes = join(html("<li><code>{}</code>: {}</li>", k, c) for k, _o, _n, c in self.changes)
        warnings = join(html("<li style='color:{}'>&#9888; {}</li>", PALETTE["bad"], m) for m in self.warnings)
        return str(html("{}<ul>{}{}</ul>", coloured(str(self), "good"), warnings, changes))


def _yaml():
    from ruamel.yaml import YAML

    yaml = YAML()
    yaml.preserve_quotes = True
    yaml.width = 4096
    return yaml


def _set_eol_comment(mapping, key, text: str) -> None:
    """Put ``# text`` at the end of ``key``'s line, keeping comment lines that follow it."""
    text = text.replace("\n", " ")
    entry = mapping.ca.items.get(key)
    token = entry[2] if entry and len(entry) > 2 else None
    if token is not None:
        first, nl, rest = token.value.partition("\n")
        if first.lstrip().startswith("#"):
            token.value = f"# {text}{nl}{rest}"
        else:  # no comment on the line itself, only lines after it
            token.value = f"# {text}{token.value}" if token.value.startswith("\n") else f"# {text}\n{token.value}"
        return
    mapping.yaml_add_eol_comment(text, key)


PIPELINE_SUFFIXES = (".yaml", ".yml")
_NOT_A_PIPELINE = "is not a pipeline (a YAML mapping with a 'workflow:' key, or an empty file); left untouched"


def check_target(path: Path) -> None:
    """PipelineError naming ``path`` unless it can be a pipeline file: export writes only
    ``.yaml``/``.yml`` files (a notebook or a settings file is never rewritten as YAML)."""
    if Path(path).suffix.lower() not in PIPELINE_SUFFIXES:
        raise PipelineError(f"{path}: a pipeline file ends in .yaml or .yml; nothing written")


def _parse(text: str | None, path: Path):
    """(document, indent settings, created) of the file's ``text`` (None: no file yet).
    PipelineError for anything malformed, and for an existing file that is not already a
    pipeline (``_NOT_A_PIPELINE``)."""
    from ruamel.yaml import YAMLError
    from ruamel.yaml.comments import CommentedMap, CommentedSeq
    from ruamel.yaml.util import load_yaml_guess_indent

    if text is None:
        doc = CommentedMap()
        doc["workflow"] = CommentedMap(steps=CommentedSeq())
        return doc, (2, 4, 2), True
    try:
        _, indent, offset = load_yaml_guess_indent(text)
        doc = _yaml().load(text)
    except YAMLError as exc:
        raise PipelineError(f"{path} is not valid YAML, left untouched: {exc}") from None
    offset = offset if offset is not None else 2
    sequence = indent or offset + 2
    indent = _mapping_indent(text) or 2
    if doc is None:  # empty, or only comments: they stay above the new workflow
        doc = CommentedMap()
        comments = [line.strip()[1:].removeprefix(" ") for line in text.splitlines() if line.strip().startswith("#")]
        if "".join(comments):  # ruamel refuses an empty comment ("#" alone)
            doc.yaml_set_start_comment("\n".join(comments))
    if not isinstance(doc, CommentedMap) or (doc and "workflow" not in doc):
        raise PipelineError(f"{path} {_NOT_A_PIPELINE}")
    workflow = doc.get("workflow")
    if workflow is None:
        doc["workflow"] = workflow = CommentedMap()
    if not isinstance(workflow, CommentedMap):
        raise PipelineError(f"{path}: 'workflow' must be a mapping (with 'steps:'); left untouched")
    steps = workflow.setdefault("steps", CommentedSeq())
    if steps is None:
        workflow["steps"] = steps = CommentedSeq()
    if not isinstance(steps, CommentedSeq):
        raise PipelineError(f"{path}: 'workflow.steps' must be a list of steps; left untouched")
    for i, s in enumerate(steps):
        if not isinstance(s, CommentedMap) or "name" not in s:
            raise PipelineError(f"{path}: workflow.steps[{i}] must be a mapping with a 'name'; left untouched")
    return doc, (indent, max(sequence, offset + 2), offset), False


def _mapping_indent(text: str) -> int | None:
    """The smallest indentation of a nested mapping key (ruamel guesses the sequence one)."""
    sizes = []
    for line in text.splitlines():
        stripped = line.lstrip(" ")
        if stripped and not stripped.startswith(("#", "-")) and len(stripped) < len(line) and ":" in stripped:
            sizes.append(len(line) - len(stripped))
    return min(sizes) if sizes else None


def _mapping(parent, key, path, where):
    from ruamel.yaml.comments import CommentedMap

    value = parent.get(key)
    if value is None:
        parent[key] = value = CommentedMap()
    if not isinstance(value, CommentedMap):
        raise PipelineError(f"{path}: {where}.{key} must be a mapping; left untouched")
    return value


def _pick_baseline(experiment, old_values: dict, candidates):
    """The latest earlier run whose settings match the file's current values, else the first run."""
    from gpuprof_jupyter.core.analysis.compare import recorded_settings

    earlier = [c for c in candidates if c.id != experiment.id and (c.meta.started_at, c.id) < (experiment.meta.started_at, experiment.id)]
    if not earlier:
        return None
    known = {k: v for k, v in old_values.items() if v is not _MISSING}
    for c in reversed(earlier):
        if known and all(recorded_settings(c).get(k, _MISSING) == v for k, v in known.items()):
            return c
    return earlier[0]


def _exported(experiment, captured) -> dict:
    """The settings written: the params that choose something (not those that only describe
    the run: ``core.torch_defaults.DESCRIPTIVE_KEYS``), and the ``--capture``d keys ``captured``
    names (True: all of them; a variable name takes all its ``name.field`` keys)."""
    values = experiment.meta.captured
    if captured is True:
        chosen = dict(values)
    else:
        names = [captured] if isinstance(captured, str) else list(captured or ())
        chosen = {k: v for k, v in values.items() if any(k == n or k.startswith(n + ".") for n in names)}
    chosen_params = {k: v for k, v in experiment.meta.params.items() if not is_descriptive(k)}
    return {**chosen, **chosen_params}


def _record_provenance(profiling, experiment, results, result: ExportResult, where_file: str, where: str) -> None:
    """``profiling.provenance``: the API each rule's metric came from in ``experiment``; a file
    that recorded other APIs warns (its thresholds were set on a different quantity)."""
    from ruamel.yaml.comments import CommentedMap

    from gpuprof_jupyter.core.analysis.provenance import base_metric, recorded_provenance, recorded_provenance_warnings
    from gpuprof_jupyter.core.analysis.rules import RuleError, parse_rule

    metrics = []
    for r in results:
        try:
            metric = base_metric(parse_rule(r.rule).metric)
        except RuleError:
            continue
        if metric and metric not in metrics:
            metrics.append(metric)
    now = recorded_provenance(experiment.meta, metrics)
    if not now:
        return
    recorded = profiling.get("provenance")
    if recorded is None:
        profiling["provenance"] = recorded = CommentedMap()
    if not isinstance(recorded, CommentedMap):
        raise PipelineError(f"{where_file}: {where}.profiling.provenance must be a mapping of metric: API; left untouched")
    result.warnings += recorded_provenance_warnings(experiment.meta, {m: recorded[m] for m in now if m in recorded},
                                                    where_file)
    for metric, tags in now.items():
        if recorded.get(metric) != tags:
            old = recorded.get(metric)
            recorded[metric] = tags
            comment = f"what {metric} measured when the thresholds were set ({experiment.name})"
            _set_eol_comment(recorded, metric, comment)
            result.changes.append((f"profiling.provenance.{metric}", old, tags, comment))


def _run_chain(experiment, base, candidates) -> list:
    """The runs up to ``experiment``, in run order: where a setting's change is looked for."""
    runs = {c.id: c for c in [*(candidates or ()), *([base] if base is not None else []), experiment]}
    order = sorted(runs.values(), key=lambda c: (c.meta.started_at, c.id))
    return order[:order.index(runs[experiment.id]) + 1]


def _other_changes(key: str, before, value, a, b) -> list[str]:
    """The settings (descriptive ones left out) the user changed from ``a`` to ``b`` besides
    ``key``, counted as the comparison counts them (``compare.setting_changes``): a captured
    duplicate of ``key`` is ``key``, a value torch filled in is nobody's change."""
    from gpuprof_jupyter.core.analysis.compare import same_change, setting_changes

    return sorted(k for k, old, new in setting_changes(a, b)
                  if not is_descriptive(k) and k != key and not same_change((k, old, new), (key, before, value)))


def _evidence(key: str, value, chain: list, prices) -> str:
    """Where ``key`` became ``value``: the measured effect when a pair of consecutive runs
    changed it alone, else which run changed it and with what (not measured alone)."""
    from gpuprof_jupyter.core.analysis.compare import compare_experiments, effect_text, recorded_settings

    for a, b in reversed(list(zip(chain, chain[1:]))):
        before = recorded_settings(a).get(key, _MISSING)
        if recorded_settings(b).get(key, _MISSING) != value or before is _MISSING or before == value:
            continue  # a run that did not record the key changed nothing (as in the comparison)
        others = _other_changes(key, before, value, a, b)
        if not others:
            effect = effect_text(compare_experiments([a, b], 0, prices=prices), 1)
            return f"alone in {b.name} against {a.name}" + (f": {effect}" if effect else "")
        listed = ", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
        return f"changed in {b.name} with {listed} (not measured alone)"
    since = len(chain) - 1  # the runs at the end of the chain that recorded this value
    while since > 0 and recorded_settings(chain[since - 1]).get(key, _MISSING) == value:
        since -= 1
    first = chain[since]
    return f"recorded in {first.name}" if first is chain[-1] else f"the same in every run since {first.name}"


def render_pipeline(experiment, text: str | None, path, step: str = "train", *, baseline=None,
                    candidates=(), prices=None, captured=False, evidence=None) -> tuple[str, ExportResult]:
    """The new text of the pipeline file whose current ``text`` is given (None: no file yet),
    with ``experiment``'s settings in step ``step``, and what changed. ``path`` only names the
    file in errors and the result.

    ``baseline`` (an Experiment) is what the measured effect in each comment is against; None:
    the latest earlier run of ``candidates`` whose settings match the file's current values
    (else their first run). ``captured`` and ``evidence`` as ``export_pipeline`` says.
    """
    from ruamel.yaml.comments import CommentedMap, CommentedSeq

    from gpuprof_jupyter.core.analysis.compare import compare_experiments, effect_text, recorded_settings
    from gpuprof_jupyter.core.analysis.rules import rule_figure, stored_results

    results = stored_results(experiment)
    path = Path(path)
    doc, (indent, sequence, offset), created = _parse(text, path)
    steps = doc["workflow"]["steps"]
    target = next((s for s in steps if s.get("name") == step), None)
    if target is None:
        target = CommentedMap()
        target["name"] = step
        for key in ("resources", "profiling", "params"):
            target[key] = CommentedMap()
        steps.append(target)
    where = f"workflow.steps[{step}]"

    params = _mapping(target, "params", path, where)
    settings = _exported(experiment, captured)
    old_values = {k: params.get(k, _MISSING) for k in settings}
    base = baseline if baseline is not None else _pick_baseline(experiment, old_values, candidates)
    effect, warnings = "", []
    if base is not None and base.id != experiment.id:
        comparison = compare_experiments([base, experiment], 0, prices=prices)
        effect = effect_text(comparison, 1)
        warnings = [w.message for w in comparison.warnings if w.kind == "provenance"]
    result = ExportResult(path, step, experiment.name, created, base.name if base is not None else None,
                          warnings=warnings)

    gpus = len(experiment.meta.gpu_devices)
    resources = _mapping(target, "resources", path, where)
    if gpus and resources.get("gpu") != gpus:
        old = resources.get("gpu", _MISSING)
        resources["gpu"] = gpus
        # a key the file lacked is new there (not "not recorded": that is said of runs)
        comment = f"{'new' if old is _MISSING else f'{fmt_setting(old)} -> {gpus}'}; {experiment.name}"
        _set_eol_comment(resources, "gpu", comment)
        result.changes.append(("resources.gpu", None if old is _MISSING else old, gpus, comment))

    profiling = _mapping(target, "profiling", path, where)
    if profiling.get("enabled") is not True:
        profiling["enabled"] = True
    if "metrics" not in profiling:
        metrics = CommentedSeq(DEFAULT_METRICS)
        metrics.fa.set_flow_style()
        profiling["metrics"] = metrics
    if results:
        thresholds = profiling.get("thresholds")
        if thresholds is None:
            profiling["thresholds"] = thresholds = CommentedSeq()
        if not isinstance(thresholds, CommentedSeq):
            raise PipelineError(f"{path}: {where}.profiling.thresholds must be a list of rules; left untouched")
        for r in results:
            figure = rule_figure(r)  # in the rule's unit; "(simulated)" is on the verdict
            measured = f" ({fmt_figure(figure, labelled=False)})" if figure.known else ""
            verdict = "pass" if r.passed else f"{'FAILED' if r.judged else 'CANNOT JUDGE'}, exported with force"
            note = f"{experiment.name}: {verdict}{' (simulated)' if r.simulated else ''}{measured}"
            if r.rule not in thresholds:
                thresholds.append(r.rule)
                result.changes.append(("profiling.thresholds", None, r.rule, note))
            thresholds.yaml_add_eol_comment(note, list(thresholds).index(r.rule))
        _record_provenance(profiling, experiment, results, result, f"{path}:{step}", where)

    explicit = set(experiment.meta.context.get("params_given") or ()) | (set(settings) - set(experiment.meta.params))
    chain = _run_chain(experiment, base, candidates)
    for key, new in settings.items():
        old = old_values[key]
        if old is not _MISSING and old == new and isinstance(old, bool) == isinstance(new, bool):
            continue  # unchanged: the line and its comment stay as they are
        if old is _MISSING and key not in explicit and is_torch_default(key, new):
            continue  # torch's own default, which nobody set: not a setting to keep
        if old is _MISSING and base is not None and base.id != experiment.id:
            old = recorded_settings(base).get(key, _MISSING)
        params[key] = new
        reason = ((evidence or {}).get(key) or (evidence or {}).get(key.rsplit(".", 1)[-1])  # --tune's trials
                  or _evidence(key, new, chain, prices))
        comment = reason if old == new else f"{fmt_setting(old)} -> {fmt_setting(new)}; {reason}"
        _set_eol_comment(params, key, comment)
        result.changes.append((f"params.{key}", old_values[key] if old_values[key] is not _MISSING else None,
                               new, comment))
    if effect and base is not None:  # the winning run's common effect, said once, on the step
        _set_eol_comment(target, "name", f"{experiment.name} against {base.name}: {effect}")

    yaml = _yaml()
    yaml.indent(mapping=indent, sequence=sequence, offset=offset)
    buffer = io.StringIO()
    yaml.dump(doc, buffer)
    return buffer.getvalue(), result
