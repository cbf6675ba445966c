"""The runs of finetuning sweep specs, as a notebook reads them: computed where missing when asked, read, checked."""

from __future__ import annotations

import pandas as pd

from paperlib.analysis import tables
from paperlib.records import paths, runs_table, specs
from paperlib.train import pool


def spec_runs(
    *spec_list: str | dict,
    compute_missing: bool = False,
    only: dict | None = None,
    model: str | None = None,
    required: bool = True,
    accuracy: str = "authors",
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(runs, missing) of finetuning sweep specs (``runs_table.for_spec``), for a notebook.

    A spec is a path under the project (``parameters/sweeps/...``; "" is left out) or a spec itself. With
    ``compute_missing``, the runs not finished run first (``pool.run_spec``: demo scale), only those whose
    parameters take the values of ``only`` (``specs.restrict``: ``{"dataset": ["digits"]}``) if given. ``required``:
    a one-line ValueError when none of the specs' runs is there (``runs_table.at_least_one``). ``model``: the runs of
    that model only, "" of the runs' one model (``tables.one_model``: a ValueError naming the models found).
    ``accuracy``: how their accuracies are read (``names.ACCURACIES``: the authors' reading, or exact)."""
    loaded = [specs.load_spec(paths.ROOT / spec) if isinstance(spec, str) else spec for spec in spec_list if spec]
    if compute_missing:
        pool.run_spec(*(specs.restrict(spec, **only) if only else spec for spec in loaded))
    runs, missing = runs_table.for_spec(*loaded, accuracy=accuracy)
    if required:
        names = [spec for spec in spec_list if isinstance(spec, str) and spec]
        runs_table.at_least_one(runs, " and ".join(names) or "the spec", missing)
    if model is not None:
        model = tables.one_model(runs, model)
        runs, missing = runs[runs["model"] == model], missing[missing["model"] == model]
    return runs, missing
