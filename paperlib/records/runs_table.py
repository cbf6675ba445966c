"""Every finetuning run as a table.

A results root's runs (``load``), a sweep spec's (``for_spec``), with what is missing, and their histories
(``histories_of``).

A row per run folder (``RUN_COLUMNS``: the ``KEYS`` that tell runs apart, then what the run reported), read
from its ``params.json`` and ``metrics.json`` alone: no ``Config`` and no torch, so that an analysis of a whole
grid reads what it uses in seconds (``stats``, ``precision``, ``capacity``, the notebooks through
``sweeps.spec_runs``). What one run is and where it lives is ``runs``.
"""

from __future__ import annotations

import io
import warnings
from collections import Counter
from pathlib import Path

import pandas as pd

from paperlib.records import methods, paths, specs, storage
from paperlib.records.names import ACCURACIES, check_choice
from paperlib.records.runs import (
    COUNTS,
    HISTORY,
    METRICS,
    PARAMS,
    Run,
    config_values,
    differing,
    finetune_root,
    lacks,
    read_metrics,
    read_params,
    run_folder,
    run_record,
    written_one_way,
)

KEYS = ["model", "dataset", "component", "lr", "seed", "precision", "optimizer", "weight_decay"]
KEYS += ["method", *methods.options(), "normalize", "validation", "tag"]
"""What tells runs apart in the results tables: the ``Config`` fields in a run's folder name."""

RUN_COLUMNS = KEYS + ["status", "best_val_accuracy", "best_step", "test_accuracy", "test_images"]
RUN_COLUMNS += ["trainable_parameters", "wall_seconds", "images_per_second", "folder"]
RUN_COLUMNS += ["best_val_accuracy_exact", "test_accuracy_exact", "clipped_steps", "component_grad_share", "lacks"]
"""The columns of ``load``'s runs table: the keys, then what the run reported, then what it lacks ("" for a run of
today's version; ``runs.lacks``: a run written by an older one, read as it is)."""


def read_as(runs: pd.DataFrame, accuracy: str) -> pd.DataFrame:
    """``runs`` (``load``'s or ``for_spec``'s) with their accuracies read as ``accuracy`` (one of ``ACCURACIES``)."""
    check_choice(accuracy, ACCURACIES, "accuracy")
    if accuracy == "authors":
        return runs
    return runs.assign(test_accuracy=runs["test_accuracy_exact"], best_val_accuracy=runs["best_val_accuracy_exact"])


def load(root: str | Path | None = None) -> pd.DataFrame:
    """One row per run folder under the results root (``RUN_COLUMNS``).

    From its ``params.json`` and ``metrics.json`` (histories: ``histories_of``). A run whose files are damaged counts as
    partial, and one whose ``params.json`` is damaged is left out (``runs.read_metrics``, ``runs.read_params``: each
    with a warning that names the file). A run written by an older version is read as it is, what it lacks in
    ``lacks``. Folders whose name starts with a dot (a run training beside the result it replaces: ``runs.start``) are
    not runs."""
    rows = []
    root = finetune_root(root)
    for params_file in sorted(root.rglob(PARAMS)):
        if any(part.startswith(".") for part in params_file.relative_to(root).parts):
            continue
        params = read_params(params_file.parent)
        if params is not None:
            rows.append(_run_row(params_file.parent, params))
    return pd.DataFrame(rows).reindex(columns=RUN_COLUMNS)


def _run_row(folder: Path, params: dict) -> dict:
    """The runs table's row of the run in ``folder`` whose ``params.json`` holds ``params``."""
    asked = Run.defaults() | params  # a field added since: its default, what the run did
    row = {key: asked.get(key) for key in KEYS} | {"folder": str(folder)}
    metrics = read_metrics(folder, params)
    row |= metrics if metrics is not None else {"status": "partial"}
    return row | {"lacks": "; ".join(lacks(params))}


def histories_of(runs: pd.DataFrame, columns: list[str] | None = None) -> pd.DataFrame:
    """The histories (``history.csv``) of the ``runs`` that ended, with their ``KEYS``.

    ``runs`` is a table of ``load`` or ``for_spec``; ended means finished or diverged. ``columns``: the history's
    columns to read (None: all; ``step`` always). Only the figures of training read histories (notebooks 06 and 09):
    give them the runs they draw. A damaged history is left out, named in a warning (``storage.read_checked``)."""
    columns = None if columns is None else ["step"] + [column for column in columns if column != "step"]
    parts = []
    for row in runs[runs["status"].isin(["finished", "diverged"])].to_dict("records"):
        try:
            read = storage.read_checked(Path(row["folder"]) / METRICS, HISTORY)
        except (ValueError, FileNotFoundError) as error:  # FileNotFoundError: the run started again since
            warnings.warn(f"{error}: left out")
            continue
        parts.append(pd.read_csv(io.BytesIO(read), usecols=columns).assign(**{key: row[key] for key in KEYS}))
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=(columns or ["step"]) + KEYS)


def spec_records(*spec_list: dict) -> dict[str, dict]:
    """Each run that finetuning sweep specs ask for, by folder: the record its ``params.json`` holds.

    A run has that record once it ran (``run_record``). It is made without a ``Config``, so without the training stack
    and unchecked (the sweep checks a spec before it runs it; a run no spec could make is simply not found)."""
    records = {}
    for spec in spec_list:
        for _, _, parameters in specs.cells(spec):
            record = run_record(written_one_way(Run.defaults() | config_values(parameters)))
            records[str(run_folder(record, methods.method_of(record)))] = record
    return records


def for_spec(*spec_list: dict, accuracy: str = "authors") -> tuple[pd.DataFrame, pd.DataFrame]:
    """(runs, missing) of one or several finetuning sweep specs, their accuracies read as ``accuracy`` (``read_as``).

    The runs the specs ask for (``load``'s columns, a row per run whatever its status) with every parameter the spec
    sets but how they ran (``HOW_IT_RAN``), and the runs they ask for that are not there (``KEYS`` and ``reason``: "no
    run", or "different parameters: <names>" for a folder that holds a run of other parameters). It reads the
    ``params.json`` and ``metrics.json`` of the specs' folders alone, so its cost grows with the specs, not with the
    results root, and it loads no torch (``spec_records``); histories: ``histories_of(runs)``. ``stats`` and the
    notebooks (``sweeps.spec_runs``, which first runs what is missing when asked) read their runs through it."""
    rows, absent = [], []
    for folder, record in spec_records(*spec_list).items():
        params = read_params(Path(folder))
        difference = None if params is None else differing(params, record, how_it_ran=False)
        if difference == []:
            rows.append(_run_row(Path(folder), params))
            continue
        reason = f"different parameters: {', '.join(difference)}" if difference else "no run"
        absent.append({key: record[key] for key in KEYS} | {"reason": reason})
    runs = pd.DataFrame(sorted(rows, key=lambda row: row["folder"])).reindex(columns=RUN_COLUMNS)
    # counts stay whole numbers whatever else the results root holds (a run still being written elsewhere)
    runs = runs.astype({column: "int64" for column in COUNTS if len(runs) and runs[column].notna().all()})
    _say_older(runs)
    return read_as(runs, accuracy), pd.DataFrame(absent, columns=KEYS + ["reason"])


def _say_older(runs: pd.DataFrame) -> None:
    """A one-line warning naming how many of ``runs`` an older version wrote, read as they are, and what they lack."""
    older = runs.loc[runs["lacks"].fillna("") != "", "lacks"]
    if len(older):
        kinds = "; ".join(f"{count} {what}" for what, count in older.value_counts().items())
        warnings.warn(
            f"{len(older)} of these runs were written by an older version of the package and are read as they are "
            f"({kinds}); sweep --retrain-older trains them again (docs/reliability.md)",
            stacklevel=3,
        )


def at_least_one(found: pd.DataFrame, what: str, missing: pd.DataFrame | None = None) -> pd.DataFrame:
    """``found`` if it holds a run; otherwise a one-line ValueError.

    ``found``: ``for_spec``'s runs of ``what``, a spec's name. The ValueError says where none was found (``stats``,
    ``precision`` and the notebooks that read runs) and, from ``missing`` (``for_spec``'s), how many of the spec's
    folders hold runs of other parameters, and the parameters that differ most often."""
    if found.empty:
        message = f"no run of {what} under {paths.display(finetune_root())}"
        other = [] if missing is None else [reason for reason in missing["reason"] if reason != "no run"]
        if other:
            common = Counter(other).most_common(1)[0][0].removeprefix("different parameters: ")
            message += (
                f"; {len(other)} of its folders hold runs of other parameters, which its sweep replaces, each once its "
                f"new run is whole (most often {common})"
            )
        raise ValueError(message)
    return found
