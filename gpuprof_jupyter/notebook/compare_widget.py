"""``compare()``: experiments side by side against a baseline, as a widget with a static twin.

Runs in the kernel.

The output carries three forms: the ipywidgets view (one "export" button per experiment), and
the static ``text/html`` and ``text/plain`` that ``render/comparison.py`` makes.
Buttons are only for after a run (docs/facts.md, "Messages to a busy kernel"): exporting is not time-critical.
"""

from __future__ import annotations

from gpuprof_jupyter.api import runs_to_compare
from gpuprof_jupyter.core.analysis.compare import Comparison, compare_experiments
from gpuprof_jupyter.render.comparison import EXPORT_HEADING, comparison_html, comparison_text
from gpuprof_jupyter.render.html import error_html


class ComparisonView:
    """What ``compare()`` returns: displays the static comparison and an export widget."""

    def __init__(self, comparison: Comparison, pipeline_path: str = "pipeline.yaml", step: str = "train") -> None:
        self.comparison = comparison
        self.pipeline_path = pipeline_path
        self.step = step
        self._widget = None
        self.last_export = None

    @property
    def experiments(self):
        return self.comparison.experiments

    def to_html(self) -> str:
        return str(comparison_html(self.comparison))

    def __repr__(self) -> str:
        return comparison_text(self.comparison)

    def export(self, name_or_index, path: str | None = None, step: str | None = None, force: bool = False):
        """Export one of the compared experiments to pipeline.yaml (what the buttons do)."""
        from gpuprof_jupyter.export.pipeline import export_pipeline

        exps = self.comparison.experiments
        if isinstance(name_or_index, int):
            experiment = exps[name_or_index]
        else:
            matches = [e for e in exps if name_or_index in (e.name, e.id)]
            if not matches:
                raise KeyError(f"{name_or_index!r} is not among the compared experiments")
            experiment = matches[-1]
        self.last_export = export_pipeline(experiment, path or self.pipeline_path, step or self.step,
                                           force=force, candidates=exps)
        return self.last_export

    def widget(self):
        if self._widget is not None:
            return self._widget
        import ipywidgets as w

        path = w.Text(value=self.pipeline_path, description="file", layout=w.Layout(width="260px"))
        step = w.Text(value=self.step, description="step", layout=w.Layout(width="200px"))
        force = w.Checkbox(value=False, description="force (failed rules)", indent=False)
        status = w.HTML("")
        buttons = []
        for i, e in enumerate(self.comparison.experiments):
            button = w.Button(description=f"export {e.name}"[:60], tooltip=f"write {e.name}'s settings to the file",
                              layout=w.Layout(width="auto"))

            def on_click(_button, index=i):
                try:
                    status.value = self.export(index, path.value, step.value, force.value).to_html()
                except Exception as exc:  # noqa: BLE001 - shown to the user, not raised into the widget
                    status.value = error_html(exc)

            button.on_click(on_click)
            buttons.append(button)
        controls = w.VBox([w.HBox([path, step, force]), w.HBox(buttons, layout=w.Layout(flex_flow="row wrap")), status])
        self._widget = w.VBox([w.HTML(EXPORT_HEADING), controls])
        return self._widget

    def static_bundle(self) -> dict:
        """The comparison itself, as HTML (tables, static Bokeh curves) and text."""
        return {"text/plain": comparison_text(self.comparison), "text/html": self.to_html()}

    def _ipython_display_(self) -> None:
        """Two outputs: the static comparison (what a saved notebook, nbconvert offline and
        GitHub show; a widget renders empty there, docs/facts.md, "Exported pages") and the export buttons."""
        from IPython.display import display

        display(self.static_bundle(), raw=True)
        try:
            display(self.widget())
        except Exception:  # noqa: BLE001 - no widget support: the static comparison remains
            pass


def compare(*names_or_ids, all: bool = False, baseline=None, store=None, prices=None,  # noqa: A002 - the documented name
            pipeline_path: str = "pipeline.yaml", step: str = "train", directions: dict | None = None,
            all_hint: str = "compare(all=True)") -> ComparisonView:
    """Compare experiments (names, ids or Experiment objects; none: the store's last two runs, and
    the comparison says so; ``all=True``: every run in the store, in run order).

    ``baseline``: a name/id among them (default: the first). ``prices``: see analysis.cost.
    ``all_hint``: how the note tells the reader to compare every run (the magic's ``--all``).
    """
    experiments, notes = runs_to_compare(names_or_ids, store, all_runs=all, all_hint=all_hint)
    comparison = compare_experiments(experiments, baseline if baseline is not None else 0, prices=prices,
                                     directions=directions)
    comparison.notes += notes
    return ComparisonView(comparison, pipeline_path, step)
