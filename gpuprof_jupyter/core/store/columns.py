"""A table as named numpy columns: what the summary reads of samples and steps, without pandas.

Runs in any process (core); it matters in the sampler process.

The sampler process computes each experiment's summary when the run ends, and nothing else
it does needs pandas (``arrow_arrays``): importing it there cost the first profiled cell
0.15-0.35 s of waiting (benchmarks/README.md, "Weight and cost"). So the summary and the
figures it uses (``analysis.series``, ``analysis.step_figures``, ``analysis.ranks``) read
``Columns``: ``len()`` is the number of rows, ``table[name]`` a numpy array, ``name in
table`` whether it is stored, as with a DataFrame; ``Experiment.device_frame`` and
``Experiment.steps`` (the public DataFrames) are made from them.
"""

from __future__ import annotations

import numpy as np


class Columns:
    def __init__(self, arrays: dict[str, np.ndarray]) -> None:
        self.arrays = arrays

    @classmethod
    def of_frame(cls, frame) -> "Columns":
        """A DataFrame's columns (an experiment held in memory)."""
        return cls({name: frame[name].to_numpy() for name in frame.columns})

    @classmethod
    def of_table(cls, table) -> "Columns":
        """A pyarrow Table's columns (nulls as NaN in number columns, as ``to_pandas`` gives them)."""
        from gpuprof_jupyter.core.store.arrow_arrays import to_numpy

        return cls({name: to_numpy(table.column(name)) for name in table.column_names})

    def __len__(self) -> int:
        return len(next(iter(self.arrays.values()))) if self.arrays else 0

    def __contains__(self, name: str) -> bool:
        return name in self.arrays

    def __getitem__(self, name: str) -> np.ndarray:
        return self.arrays[name]

    @property
    def columns(self) -> list[str]:
        return list(self.arrays)

    def rows(self, mask: np.ndarray) -> "Columns":
        """The rows where ``mask`` is true."""
        return Columns({name: values[mask] for name, values in self.arrays.items()})

    def frame(self):
        """As a pandas DataFrame (its columns not copied)."""
        import pandas as pd

        return pd.DataFrame(self.arrays, copy=False)
