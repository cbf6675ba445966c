"""Beyond the paper: LoRA against the components' own weights, Table 6 for each way of training (notebook 09)."""

from __future__ import annotations

import pandas as pd

from paperlib.analysis.tables import table6
from paperlib.records.methods import METHODS, method_of
from paperlib.records.names import ADAPTABLE
from paperlib.records.runs_table import KEYS


def with_method(runs: pd.DataFrame) -> pd.DataFrame:
    """``runs_table.load``'s runs of the components LoRA adapts (``ADAPTABLE``), their ``method`` as tables name it.

    The label of each run's method (``records.methods``: "weights", "LoRA r=8"...); a label already there is kept, so
    that a labelled table can be passed on (``comparison``)."""
    runs = runs[runs["component"].isin(ADAPTABLE)]
    records = runs[KEYS].to_dict("records")
    labelled = [method_of(r).label() if r["method"] in METHODS else r["method"] for r in records]
    return runs.assign(method=labelled)


def comparison(runs: pd.DataFrame, select: str = "test") -> pd.DataFrame:
    """Table 6 for each method of ``runs`` (one model and precision; ``with_method``).

    One row per dataset, configuration and method with the learning rate chosen by ``select``, the mean and standard
    deviation (%) over seeds, the seeds, and the trainable parameters."""
    runs = with_method(runs)
    tables = []
    for name, group in runs.groupby("method", sort=False):
        table = table6(group.drop(columns="method"), select=select)
        trainable = group.groupby(["dataset", "component"], as_index=False)["trainable_parameters"].max()
        tables.append(table.merge(trainable, on=["dataset", "component"], how="left").assign(method=name))
    columns = ["dataset", "component", "method", "lr", "mean", "std", "seeds", "trainable_parameters"]
    if not tables:
        return pd.DataFrame(columns=columns)
    order = {component: i for i, component in enumerate(ADAPTABLE)}
    table = pd.concat(tables, ignore_index=True)[columns]
    table["_order"] = table["component"].map(order)
    table["_lora"] = table["method"] != "weights"
    return (
        table.sort_values(["dataset", "_order", "_lora", "method"])
        .drop(columns=["_order", "_lora"])
        .reset_index(drop=True)
    )
