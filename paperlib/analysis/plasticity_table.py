"""Saved plasticity results as a table, without torch (paper §5.1).

Where a measurement's result lives, its files and their record, reading one back, and every saved result collected
as one table of P(f).

``collect`` is what notebooks 03, 06 and 09 and ``stats`` read, ``ranking`` ranks one result's P(f)
(``plasticity_by_block``: per block), and ``save`` is what ``plasticity.run`` writes through. Like ``runs_table``
for finetuning runs, this module loads none of the training stack: the analysis of a grid reads P(f) without
torch. Measuring is ``plasticity``'s.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pandas as pd

from paperlib.analysis.ranking import depth_band, pairs_with_rates
from paperlib.records import paths, storage
from paperlib.records.names import (
    COMPONENTS,
    DEMO_FAMILIES,
    LABELS,
    SPLITS_VERSION,
    check_inputs,
    check_normalize,
    family,
)

SAMPLES = ("first", "once", "random")
"""How the pairs are drawn: ``first`` (the authors' pair set), the images of each set in order, paired by
position, each set read in whole batches of ``plasticity.LOADER_BATCH`` and cycled as the authors' loaders are
(``drop_last``, made endless), so ``n_pairs`` pairs whatever the sets' sizes: a smaller test split repeats
(Cifar10-C's 2,000 images give 1,984 distinct ones, 6.45 times each, for the paper's 12,800 pairs);
``once``, each image at most once: the first ``min(n_pairs, len(reference), len(target))`` of each set;
``random``, a random subset of each set, drawn with a seed (class folders are sorted by class, so the first
images of a large set are its first classes)."""


PAIRS = 2
"""The version of the pair set, recorded in a result's metadata and checked with the splits' (``current``):
2, ``first`` is the authors' cycled pair set; 1 (recorded by no key), each image once. A result of
another version is measured again and left out of ``collect``, never mixed with these."""


def check_sample(sample: str) -> str:
    """Return ``sample`` or raise a ValueError naming the valid choices."""
    if sample not in SAMPLES:
        raise ValueError(f"unknown sample {sample!r}; valid samples: {', '.join(SAMPLES)}")
    return sample


def plasticity_by_block(table: pd.DataFrame) -> pd.DataFrame:
    """P(f) per block and component (mean rate over pairs): blocks as rows, components as columns."""
    table = pairs_with_rates(table)
    return table.groupby(["block", "component"], observed=True)["rate"].mean().unstack("component")[list(COMPONENTS)]


def ranking(table: pd.DataFrame) -> pd.DataFrame:
    """P(f) per component (mean over pairs and blocks), ranked, with the paper's rank beside it."""
    table = pairs_with_rates(table)
    return _ranked(table.groupby("component", observed=True)["rate"].mean())


def _ranked(mean: pd.Series) -> pd.DataFrame:
    """``ranking``'s table of the P(f) of each component (``mean``, indexed by component)."""
    mean = mean.reindex(list(COMPONENTS))
    out = pd.DataFrame(
        {
            "component": [LABELS[c] for c in mean.index],
            "plasticity": mean.to_numpy(),
            "paper rank": range(1, len(COMPONENTS) + 1),
        }
    )
    out["rank"] = out["plasticity"].rank(ascending=False, method="min").astype(int)
    return out.sort_values("rank").set_index("component")[["plasticity", "rank", "paper rank"]]


def results_root(inputs: str = "embedding"):
    """``results/plasticity`` (``results/plasticity_in_situ`` for the extension)."""
    return paths.results_dir() / ("plasticity" if check_inputs(inputs) == "embedding" else "plasticity_in_situ")


def default_reference(dataset: str) -> str:
    """The reference images a dataset is measured against unless asked otherwise.

    The demo world's ``digits_source`` for its datasets (``names.DEMO_FAMILIES``), ImageNet (the paper's) for every
    other, a custom dataset's included."""
    return "digits_source" if family(dataset) in DEMO_FAMILIES else "imagenet"


RATES, BLOCKS, METADATA = "rates.csv.gz", "blocks.csv", "metadata.json"
"""The files of a saved result: its tidy table, its P(f) per block (``ranking.depth_band`` of the table: what
``collect`` reads, 7 KB for ViT-Base where the table is megabytes), then its metadata (written last: ``save``)."""


def current(metadata: dict) -> bool:
    """Whether a saved result was measured on today's test splits with today's pair set.

    Today's splits are ``SPLITS_VERSION``, today's pair set ``PAIRS``: other splits or another pair
    set, other pairs."""
    return metadata.get("splits", 1) == SPLITS_VERSION and metadata.get("pairs", 1) == PAIRS


def save(table: pd.DataFrame, folder, metadata: dict | None = None) -> Path:
    """Write the tidy table (``RATES``), its P(f) per block (``BLOCKS``) and ``METADATA`` into ``folder``, atomically.

    ``METADATA`` is written last, with the sizes of the two others (``files``), today's splits (``SPLITS_VERSION``)
    and pair set (``PAIRS``): its presence marks a complete result, and a file damaged since is not taken
    for one.
    """
    folder = Path(folder)
    storage.atomic_write(folder / RATES, lambda tmp: table.to_csv(tmp, index=False, compression="gzip"))
    storage.atomic_write(folder / BLOCKS, lambda tmp: depth_band(table).to_csv(tmp, index=False))
    versions = {"splits": SPLITS_VERSION, "pairs": PAIRS}
    metadata = {**versions, **(metadata or {}), "files": storage.file_sizes(folder, [RATES, BLOCKS])}
    storage.atomic_write_text(folder / METADATA, json.dumps(metadata, indent=2, default=str) + "\n")
    return folder


def load(folder) -> pd.DataFrame:
    """Read a table written by ``save``; an error naming the file if it is missing or damaged.

    The table has ``component`` as the ordered categorical, and ``attrs`` ``token_rms`` and
    ``identical_pairs_excluded`` from its metadata where recorded. The error is ``storage.read_json``'s."""
    folder = Path(folder)
    metadata = storage.read_json(folder / METADATA)
    table = pd.read_csv(folder / RATES)
    table["component"] = pd.Categorical(table["component"], categories=COMPONENTS)
    table.attrs.update({key: metadata[key] for key in ("token_rms", "identical_pairs_excluded") if key in metadata})
    return table


def blocks(folder) -> pd.DataFrame:
    """P(f) per block of a saved result: ``ranking.depth_band``'s table, read from its ``BLOCKS`` file.

    A result saved before the file was written has it computed from its rates (``load``)."""
    folder = Path(folder)
    if not (folder / BLOCKS).exists():
        return depth_band(load(folder))
    table = pd.read_csv(folder / BLOCKS)
    table["component"] = pd.Categorical(table["component"], categories=COMPONENTS)
    return table


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
    root=None,
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
    ``seed``, ``normalize``, ``token_rms`` (the token RMS norm of the measured
    embeddings; missing for results that do not record it). Only results whose pairs were
    drawn by ``sample`` (the paper's ``first`` by default; None: all) and, if given, ``seed``, whose images were
    normalised as ``normalize`` says (the paper's ``imagenet`` by default; None: all), and whose
    reference images were ``reference`` (``"default"``: each dataset's ``default_reference``; a
    name; None: all), and, for Cifar10-C, whose corruption had ``severity`` (the paper's 5; None:
    all): a model and dataset measured several ways would otherwise count twice. Results measured on
    earlier test splits or pair sets (``current``) are left out with a warning that names them. ``root``:
    the results folder to read (None: ``results_root(inputs)``).
    """
    if sample is not None:
        check_sample(sample)
    if normalize is not None:
        check_normalize(normalize)
    base = Path(root) if root is not None else results_root(inputs)
    rows, outdated = [], []
    for metadata_file in sorted(base.rglob(METADATA)):
        # a damaged result: an error that names the file; results from before an option: the paper's choice
        metadata = {"sample": "first", "seed": None, "normalize": "imagenet", **storage.read_json(metadata_file)}
        if not _asked_for(metadata, sample, seed, normalize, reference, severity):
            continue
        if not current(metadata):
            outdated.append(paths.display(metadata_file.parent))
            continue
        keys = {column: metadata.get(column) for column in COLLECTED}
        per_block = blocks(metadata_file.parent)
        if by_block:
            layers = per_block[["block", "depth", "component", "plasticity"]]  # ranking.layer_means' columns
            rows += [{**keys, **row} for row in layers.to_dict("records")]
            continue
        # the mean over pairs and blocks, from the blocks' means and counts of pairs
        sums = per_block.assign(total=per_block["plasticity"] * per_block["n"])
        sums = sums.groupby("component", observed=True)[["total", "n"]].sum()
        for label, row in _ranked(sums["total"] / sums["n"]).iterrows():
            component = next(c for c in COMPONENTS if LABELS[c] == label)
            rows.append({**keys, "component": component, "plasticity": row["plasticity"], "rank": int(row["rank"])})
    columns = [c for c in COLLECTED if c != "rank"] + ["block", "depth"] if by_block else list(COLLECTED)
    table = pd.DataFrame(rows, columns=columns)
    table["component"] = pd.Categorical(table["component"], categories=COMPONENTS)
    # None (the paper's draw has no seed) stays missing, not NaN in a float column
    table["seed"] = table["seed"].astype("Int64")
    table["token_rms"] = table["token_rms"].astype(float)
    if outdated:
        warnings.warn(
            f"results of earlier test splits or pair sets left out (measure them again): {', '.join(outdated)}"
        )
    return table


def _asked_for(metadata: dict, sample, seed, normalize, reference, severity) -> bool:
    """Whether the saved result of ``metadata`` is one ``collect``'s filters (None: any) ask for."""
    if (
        (sample is not None and metadata["sample"] != sample)
        or (seed is not None and metadata["seed"] != seed)
        or (normalize is not None and metadata["normalize"] != normalize)
    ):
        return False
    against = metadata.get("reference")  # None: a result saved without a record of it
    if reference is not None and against is not None:
        wanted = default_reference(metadata["dataset"]) if reference == "default" else reference
        if against != wanted:
            return False
    return severity is None or (metadata.get("severity") or severity) == severity
