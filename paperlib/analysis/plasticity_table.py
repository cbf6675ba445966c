"""Saved plasticity results as a table, without torch (paper §5.1).

A measurement's result written (``save``) and read back (``load``, ``blocks``), and every saved result collected as
one table of P(f). What a result is, its folder and its record, is ``records.measurements``'s.

``collect`` is what notebooks 03, 06 and 09 and ``stats`` read, ``ranking`` ranks one result's P(f)
(``plasticity_by_block``: per block), and ``save`` is what ``plasticity.run`` writes through. Like ``runs_table``
for finetuning runs, this module loads none of the training stack: the analysis of a grid reads P(f) without
torch. Measuring is ``plasticity``'s.
"""

from __future__ import annotations

import io
import warnings
from pathlib import Path

import pandas as pd

from paperlib.analysis.ranking import depth_band, pairs_with_rates
from paperlib.records import measurements, paths, storage
from paperlib.records.names import COMPONENTS, LABELS, check_normalize


def plasticity_by_block(table: pd.DataFrame) -> pd.DataFrame:
    """P(f) per block and component (mean rate over pairs): blocks as rows, components as columns."""
    table = pairs_with_rates(table)
    return table.groupby(["block", "component"], observed=True)["rate"].mean().unstack("component")[list(COMPONENTS)]


def ranked(table: pd.DataFrame) -> pd.DataFrame:
    """P(f) per component (mean over pairs and blocks), ranked, with the paper's rank beside it."""
    table = pairs_with_rates(table)
    return _ranked(table.groupby("component", observed=True)["rate"].mean()).rename(index=LABELS)


def _ranked(mean: pd.Series) -> pd.DataFrame:
    """``ranked``'s table of the P(f) in ``mean``, indexed by the components' names (``COMPONENTS``)."""
    out = pd.DataFrame(
        {
            "component": list(COMPONENTS),
            "plasticity": mean.reindex(list(COMPONENTS)).to_numpy(),
            "paper rank": range(1, len(COMPONENTS) + 1),
        }
    )
    out["rank"] = out["plasticity"].rank(ascending=False, method="min").astype(int)
    return out.sort_values("rank").set_index("component")[["plasticity", "rank", "paper rank"]]


def save(table: pd.DataFrame, measurement: measurements.Measurement, found: dict) -> Path:
    """Write ``measurement``'s result in its folder, atomically: its tidy table (``RATES``), its P(f) per ``BLOCKS``.

    Then its record (``METADATA``: ``Measurement.metadata`` of what measuring it ``found``) with the size and checksum
    of the two others (``files``): its presence marks a complete result, and a file damaged since is not taken for
    one."""
    folder = measurement.folder()
    files = {
        measurements.RATES: storage.write_checked(
            folder / measurements.RATES, lambda tmp: table.to_csv(tmp, index=False, compression="gzip")
        ),
        measurements.BLOCKS: storage.write_checked(
            folder / measurements.BLOCKS, lambda tmp: depth_band(table).to_csv(tmp, index=False)
        ),
    }
    storage.write_json(folder / measurements.METADATA, measurement.metadata(found) | {"files": files})
    return folder


def load(folder) -> pd.DataFrame:
    """Read a table written by ``save``; an error naming the file if it is missing or damaged.

    The table has ``component`` as the ordered categorical, and ``attrs`` ``token_rms`` and
    ``identical_pairs_excluded`` from its record. The error is ``storage.read_checked``'s."""
    metadata_file = Path(folder) / measurements.METADATA
    rates = io.BytesIO(storage.read_checked(metadata_file, measurements.RATES))
    table = pd.read_csv(rates, compression="gzip", dtype={"component": pd.CategoricalDtype(COMPONENTS)})
    metadata = storage.read_json(metadata_file)
    table.attrs.update({key: metadata[key] for key in ("token_rms", "identical_pairs_excluded")})
    return table


def blocks(folder) -> pd.DataFrame:
    """P(f) per block of a saved result: ``ranking.depth_band``'s table, read from its ``BLOCKS`` file, checked."""
    read = storage.read_checked(Path(folder) / measurements.METADATA, measurements.BLOCKS)
    return pd.read_csv(io.BytesIO(read), dtype={"component": pd.CategoricalDtype(COMPONENTS)})


COLLECTED = (
    "model",
    "dataset",
    "reference",
    "component",
    "plasticity",
    "rank",
    "n_pairs",
    "distinct_reference",
    "distinct_target",
    "sample",
    "seed",
    "normalize",
    "token_rms",
)
"""The columns of ``collect``'s table."""


def collect(
    inputs: str = "embedding",
    sample: str | None = "first",
    seed: int | None = None,
    normalize: str | None = "imagenet",
    reference: str | None = "default",
    severity: int | None = 5,
    by_block: bool = False,
) -> pd.DataFrame:
    """P(f) of every saved result, one row per model, dataset (and draw of pairs) and component.

    ``by_block``: a row per block as well (``ranking.layer_means``), with ``block`` and ``depth`` for ``rank``: the
    values the boxes of Fig. 2 middle pool over datasets. Both read each result's ``blocks``, not its rates.

    Columns (``COLLECTED``) ``model``, ``dataset``, ``reference``, ``component``, ``plasticity`` (mean
    rate over pairs and blocks), ``rank`` (1 = most plastic for that model and dataset), ``n_pairs``,
    ``distinct_reference``, ``distinct_target`` (the distinct images of each side in the pairs), ``sample``,
    ``seed``, ``normalize``, ``token_rms`` (the token RMS norm of the measured embeddings). Only results whose pairs
    were drawn by ``sample`` (the paper's ``first`` by default; None: all) and, if given, ``seed``, whose images were
    normalised as ``normalize`` says (the paper's ``imagenet`` by default; None: all), and whose
    reference images were ``reference`` (``"default"``: each dataset's ``default_reference``; a
    name; None: all), and, for Cifar10-C, whose corruption had ``severity`` (the paper's 5; None:
    all): a model and dataset measured several ways would otherwise count twice. Results of an older version
    (``measurements.lacks``: earlier test splits, pair sets or records) are read as they are, named in a warning;
    those the tables cannot read (``measurements.readable``) are left out, named too. The results read are
    those of ``inputs`` (``measurements.results_root``).
    """
    if sample is not None:
        measurements.check_sample(sample)
    if normalize is not None:
        check_normalize(normalize)
    rows, outdated, older = [], [], []
    for metadata_file in sorted(measurements.results_root(inputs).rglob(measurements.METADATA)):
        try:  # a damaged result: left out, named in a warning (and measured again: Measurement.is_saved)
            metadata = storage.read_json(metadata_file)
            if not measurements.readable(metadata):
                outdated.append(paths.display(metadata_file.parent))
                continue
            if not measurements.current(metadata):  # kept and read as it is: named once below
                older.append(f"{paths.display(metadata_file.parent)} ({', '.join(measurements.lacks(metadata))})")
            if not _asked_for(metadata, sample, seed, normalize, reference, severity):
                continue
            per_block = blocks(metadata_file.parent)
        except ValueError as error:
            warnings.warn(f"{error}: left out")
            continue
        keys = {column: metadata[column] for column in COLLECTED if column in measurements.KEY + measurements.FOUND}
        if by_block:
            layers = per_block[["block", "depth", "component", "plasticity"]]  # ranking.layer_means' columns
            rows += [{**keys, **row} for row in layers.to_dict("records")]
            continue
        # the mean over pairs and blocks, from the blocks' means and counts of pairs
        sums = per_block.assign(total=per_block["plasticity"] * per_block["n"])
        sums = sums.groupby("component", observed=True)[["total", "n"]].sum()
        for component, row in _ranked(sums["total"] / sums["n"]).iterrows():
            rows.append({**keys, "component": component, "plasticity": row["plasticity"], "rank": int(row["rank"])})
    columns = [c for c in COLLECTED if c != "rank"] + ["block", "depth"] if by_block else list(COLLECTED)
    table = pd.DataFrame(rows, columns=columns)
    table["component"] = pd.Categorical(table["component"], categories=COMPONENTS)
    # None (the paper's draw has no seed) stays missing, not NaN in a float column
    table["seed"] = table["seed"].astype("Int64")
    table["token_rms"] = table["token_rms"].astype(float)
    if outdated:
        warnings.warn(f"results of earlier records left out, which the tables cannot read: {', '.join(outdated)}")
    if older:
        warnings.warn(f"results written by an older version, read as they are: {', '.join(older)}")
    return table


def _asked_for(metadata: dict, sample, seed, normalize, reference, severity) -> bool:
    """Whether the saved result of ``metadata`` is one ``collect``'s filters (None: any) ask for."""
    if reference == "default":
        reference = measurements.default_reference(metadata["dataset"])
    asked = {"sample": sample, "seed": seed, "normalize": normalize, "reference": reference}
    if any(value is not None and metadata[name] != value for name, value in asked.items()):
        return False
    return severity is None or metadata["severity"] in (None, severity)  # None: not Cifar10-C
