"""What a plasticity measurement is and where it lives (paper §5.1): its fields, folder, record and version.

``Measurement`` is one measurement as its record holds it, checked without torch (``measure.plasticity.Measurement``
checks it against the stack too and measures it). Its record (``Measurement.metadata``) is written by ``run`` and read
back by ``analysis.plasticity_table``; an older one is kept and read as it is, labelled (``lacks``), and measured
again only when the tables cannot read it (``readable``) or when asked (``paths.retrain_older``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from paperlib.records import paths, storage
from paperlib.records.names import (
    DEMO_FAMILIES,
    SEVERITY,
    SPLITS_VERSION,
    check_choice,
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

VERSION = {"splits": SPLITS_VERSION, "pairs": 2, "record": 2}
"""The versions every record holds (``current``): today's test splits (``names.SPLITS_VERSION``), pair set and record.
The pair set's: 2, ``first`` is the authors' cycled pair set; 1 (recorded by no key), each image once. The record's: 2,
it holds the checksums of its files (``storage.write_checked``); 1 (recorded by no key), their sizes alone."""

KEY = ("model", "dataset", "reference", "inputs", "sample", "seed", "normalize", "severity")
"""What a record says the measurement is (``Measurement.key``): another value of one is another result, in another
folder (``n_pairs`` and ``loader_batch`` are not: a saved result stands for the measurement whatever it asked)."""

FOUND = ("n_pairs", "distinct_reference", "distinct_target", "identical_pairs_excluded", "token_rms")
"""What a measurement found that its readers read back (``collect``, ``load``): the pairs measured, the distinct
images of each side among them, the pairs left out for identical embeddings and the token RMS norm."""

RATES, BLOCKS, METADATA = "rates.csv.gz", "blocks.csv", "metadata.json"
"""The files of a saved result: its tidy table, its P(f) per block (``ranking.depth_band`` of the table: what
``collect`` reads, 7 KB for ViT-Base where the table is megabytes), then its record (written last: ``save``)."""

DEMO_PAIRS = 179
"""The demo world's number of plasticity pairs (the paper's is 12,800): every image of the
downstream test splits (179; ``digits_source``'s has 180), each paired with a reference image."""


def check_sample(sample: str) -> str:
    """Return ``sample`` or raise a ValueError naming the valid choices."""
    return check_choice(sample, SAMPLES, "sample", "samples")


def results_root(inputs: str) -> Path:
    """``results/plasticity`` (``results/plasticity_in_situ`` for the extension)."""
    return paths.results_dir() / ("plasticity" if check_inputs(inputs) == "embedding" else "plasticity_in_situ")


def default_reference(dataset: str) -> str:
    """The reference images a dataset is measured against unless asked otherwise.

    The demo world's ``digits_source`` for its datasets (``names.DEMO_FAMILIES``), ImageNet (the paper's) for every
    other, a custom dataset's included."""
    return "digits_source" if family(dataset) in DEMO_FAMILIES else "imagenet"


def readable(metadata: dict) -> bool:
    """Whether a saved record, of any version, holds what the tables read.

    That is every name of ``KEY`` and ``FOUND``, and its ``BLOCKS``."""
    return set(KEY + FOUND) <= metadata.keys() and BLOCKS in metadata.get("files", {})


def lacks(metadata: dict) -> list[str]:
    """What a saved record of an older version differs in from today's ``VERSION``, a phrase each; [] for today's."""
    return [f"{name} {metadata.get(name, 1)}" for name, version in VERSION.items() if metadata.get(name, 1) != version]


def current(metadata: dict) -> bool:
    """Whether a saved record is today's: its ``VERSION``, every name of ``KEY`` and ``FOUND``, and its ``BLOCKS``.

    Another is of an older version: kept and read as it is if ``readable``, else measured again
    (``Measurement.is_saved``)."""
    return readable(metadata) and all(metadata.get(name) == version for name, version in VERSION.items())


@dataclass(frozen=True)
class Measurement:
    """One plasticity measurement as its record holds it: its fields, folder and record, checked without torch.

    A model on a dataset's test images against reference images. Defaults: notebook 02's, the demo world
    (the demo ViT on digits 5-9 against digits 0-4); the paper's: a ViT-Base or -Huge in21k on each
    benchmark against ImageNet, 12,800 pairs (``parameters/sweeps/plasticity_paper.yaml``).

    ``reference`` "" (or None) is the dataset's ``default_reference``, stored by its name. Its result lives in
    ``folder()``; ``is_saved()`` says whether a complete, current one is there. ``n_pairs`` is not part of the
    folder: a saved result stands for the measurement whatever number of pairs it was asked for (``run`` measures
    again and replaces it)."""

    model: str = "demo"  # short name (demo, vit_base_in21k, vit_huge_in21k), any timm ViT name, or custom/<name>
    dataset: str = "digits"  # downstream dataset, whose test split gives the images y (see datasets.dataset_names())
    # pretraining-distribution images x: a dataset name (the paper: imagenet), or "" for the dataset's
    # default_reference (digits_source for the demo's datasets, imagenet for the others)
    reference: str = ""
    # this many (x, y) pairs (the paper: 12,800), a smaller set repeating (sample first); at most a set's size otherwise
    n_pairs: int = DEMO_PAIRS
    inputs: str = "embedding"  # embedding (the paper's definition) or in_situ (each component's actual input)
    # first (the authors': each set in order, paired by position, read in whole batches of loader_batch and cycled
    # until n_pairs), once (each image at most once: the first images of each set) or random (a random subset of
    # each, drawn with seed)
    sample: str = "first"
    seed: int = 0  # seed of the random subset (with sample random)
    # imagenet (the paper: ImageNet's mean and std for every model) or model (the mean and std the model was
    # pretrained with; models.normalization)
    normalize: str = "imagenet"
    # Cifar10-C's corruption severity, 1 to 5 (the paper: 5; the demo's digits_c: 5 only)
    severity: int = SEVERITY
    # with sample first: the batch of the authors' loaders, whose last partial batch is never used; 0 = theirs for the
    # model (32 for vit_huge_in21k, 64 for every other)
    loader_batch: int = 0

    def __post_init__(self):
        if self.reference in ("", None):  # the dataset's default written one way: one measurement, one value
            object.__setattr__(self, "reference", default_reference(self.dataset))
        check_inputs(self.inputs)
        check_sample(self.sample)
        check_normalize(self.normalize)
        for name, least in (("n_pairs", 1), ("seed", 0), ("loader_batch", 0)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise ValueError(f"{name} must be at least {least} (an integer), got {value!r}")

    def key(self) -> dict:
        """What its record says it is (``KEY``): the seed of random pairs alone, the severity of Cifar10-C alone."""
        seed = self.seed if self.sample == "random" else None
        severity = self.severity if self.dataset.startswith("cifar10c/") else None
        return {name: getattr(self, name) for name in KEY} | {"seed": seed, "severity": severity}

    def folder(self) -> Path:
        """``results/plasticity/<model>/<dataset>``, where this measurement's result lives, with its suffixes.

        ``results/plasticity_in_situ/...`` for ``in_situ`` inputs; ``+once`` for each image at most once,
        ``+random-seed=<seed>`` for pairs drawn at random, ``+norm-model`` for images normalised with the model's own
        statistics, ``+ref-<reference>`` against reference images other than the dataset's ``default_reference``,
        ``+severity-<s>`` for a Cifar10-C corruption at another severity than the paper's 5 (``paths.suffixes``): a
        measurement that is not the paper's never replaces one."""
        leaf = self.dataset + paths.suffixes(
            ("", f"random-seed={self.seed}" if self.sample == "random" else self.sample, "first"),
            ("norm", self.normalize, "imagenet"),
            ("ref", self.reference, default_reference(self.dataset)),
            ("severity", self.key()["severity"] or SEVERITY, SEVERITY),
        )
        return results_root(self.inputs) / self.model / leaf

    def metadata(self, found: dict) -> dict:
        """Its record, ``METADATA``: its ``key``, the pairs it asked for, what it ``found`` and today's ``VERSION``.

        ``found``: ``FOUND``, and how it ran. ``loader_batch`` is recorded with the authors' pair set alone."""
        loader_batch = self.loader_batch if self.sample == "first" else None
        return self.key() | {"n_pairs_requested": self.n_pairs, "loader_batch": loader_batch} | found | VERSION

    def is_saved(self) -> bool:
        """Whether ``folder()`` holds a complete result: today's (``current``), or an older one the tables read.

        Complete: its ``METADATA`` (written last) whole, with the files it records, each the one written (their
        checksums, or sizes for a record before them: ``storage.json_or_none``; a damaged one is named in a warning
        and measured again). A result of an older version (``lacks``) is kept and read as it is, measured again
        only if it is not ``readable`` or when asked (``paths.retrain_older``)."""
        record = self.folder() / METADATA
        metadata = storage.json_or_none(record) or {}
        kept = current(metadata) or (readable(metadata) and not paths.retrain_older())
        whole = metadata.get("record") == VERSION["record"]
        return kept and storage.json_or_none(record, whole=whole) is not None
