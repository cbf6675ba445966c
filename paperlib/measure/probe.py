"""Linear probing of a pretrained ViT as the authors compute it (Table 6, last column).

The paper: "The linear probing performance is obtained over the attention hidden representation of
the last layer." The authors' released probing script takes the *pretrained* model and, for every
block and every probe point (the hidden representation after a component), pools the tokens by
their mean (its ``cls_pooling=False``: ``.mean(axis=1)`` over the whole sequence), normalises each
image's vector to unit L2 norm, standardises the features (``StandardScaler`` fitted on the
training features) and fits scikit-learn's multinomial ``LogisticRegression(max_iter=5000)`` on the
80% training split, scored on the test split. ``linear_probe`` does exactly that, for every block
and every point of ``POINTS``, from one forward pass over the images (``probe_features``).

Which images. The authors' script reads the training images through their finetuning loader:
the 80% training split (``train_size=0.8``; Flowers102's official training split), each image
once as one random resized crop and flip, shuffled, in batches of 512 with the last incomplete
batch dropped (on Flowers102, 512 of its 1,020 training images); the test images are the test
split, resized and centre-cropped, in order. ``train_features="augmented"`` (the default) does the same with
``get_dataset(dataset, "train", seed=split_seed)``: crops, flips and order from ``split_seed`` (``data.augmented``).
``train_features="clean"`` (beyond the authors) takes every training image once, resized and centre-cropped.
``train_split="trainval"`` (beyond the paper) fits on the whole training set instead.

Which point is the paper's. "The attention hidden representation of the last layer" most likely
means the output of the last block's MHA (``mha``: the attention module's output, before the
residual addition): it is the hidden representation after the attention component, as every
point of the authors' script is the representation after a component. ``table6_column`` uses that
point by default; ``attn_residual`` (the residual stream after attention) and ``block`` (after the
whole block) are the two other readings, and the point is a parameter everywhere.

A probe is a value, ``Probe``: the model, the dataset, the blocks and points, and how the features
are made and fitted (pool, training split and features, normalisation, split seed), validated when
it is made; ``linear_probe(probe, device=...)`` fits it. Results are cached per model and dataset
under ``Probe.folder()``, ``results/probe/<model>/<dataset>/`` (``probe.csv`` with one row per block
and point, and ``metadata.json`` with the ``Probe.key()`` it was computed from: ``records.probe_tables``), filled in
as points are fitted, so a second call is instant and an interrupted one resumes. The notebooks' entries,
``probe_datasets`` and ``table6_column``, take a model, datasets and keyword options.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Iterable

import numpy as np
import pandas as pd
import torch
from joblib import Parallel, delayed
from threadpoolctl import threadpool_limits
from torch import nn
from tqdm.auto import tqdm

from paperlib.data import datasets
from paperlib.data.transforms import IMAGENET, as_mean_std
from paperlib.measure.probe_features import POOLS, check_points, groups, pooled_features
from paperlib.records import paths, storage
from paperlib.records.names import SPLITS_VERSION, check_choice, check_normalize
from paperlib.records.probe_tables import POINTS, cached, save, tidy
from paperlib.speed import threads
from paperlib.vit import components, models

TRAIN_SPLITS = ("train", "trainval")
"""Images the probe is fitted on: the authors' 80% training split, or the whole training set."""
TRAIN_FEATURES = ("augmented", "clean")
AUGMENTED_CROPS = "full_image"
"""Where ``train_features="augmented"`` cuts its crops: from each image at its full resolution.

As the authors' torchvision transforms do (``augmented_batches``). In every augmented table's ``Probe.key()``
(``crops``): a table whose key does not name these crops is another table, computed again."""

MAX_ITER = 5000  # the authors' LogisticRegression(max_iter=5000)
SMALL_FIT = 2**22  # training features (images x width) up to which a fit runs on one BLAS thread


def check_blocks(selected: int | Iterable[int] | None, depth: int) -> tuple[int, ...]:
    """Block indices (negative ones count from the end) as sorted non-negative ones; None: all."""
    if selected is None:
        return tuple(range(depth))
    chosen = (selected,) if isinstance(selected, (int, np.integer)) else tuple(selected)
    bad = [b for b in chosen if not isinstance(b, (int, np.integer)) or not -depth <= b < depth]
    if bad or not chosen:
        raise ValueError(
            f"block(s) {bad or chosen!r} out of range: the model has {depth} blocks (0..{depth - 1}, or -1..-{depth})"
        )
    return tuple(sorted({int(b) % depth for b in chosen}))


@dataclass(frozen=True)
class Probe:
    """What one probe table is, validated when it is made.

    The linear probes of a pretrained model on a dataset at some blocks and points, and how their features
    are made and fitted. ``linear_probe`` fits it (how: device, batch size, workers...) and caches its table
    in ``folder()`` under ``key()``.

    ``model`` is a name (as ``models.create_model`` takes; its pretrained weights) or a module; a module
    is cached only under a ``name``, which then stands for its weights (another module under the same
    name reads the same table). A model given by name is cached under that name (``name`` is set to it).
    ``points`` and ``blocks`` are stored as the ones they select: the points in forward order, the blocks
    as sorted non-negative indices (``blocks`` None: every block; -1: the last). A bad choice is a
    ValueError naming the valid ones, before any work.
    """

    model: str | nn.Module  # a name (models.create_model's; its pretrained weights) or a module
    dataset: str  # a name of datasets.dataset_names()
    points: str | Iterable[str] = POINTS  # probe points (POINTS), one or several
    blocks: int | Iterable[int] | None = None  # block indices (negative ones count from the end); None: all
    pool: str = "mean"  # POOLS: how tokens become one vector (the authors': mean over every position)
    train_split: str = "train"  # TRAIN_SPLITS: the authors' 80% training split, or trainval (the whole set)
    # TRAIN_FEATURES: augmented (the authors': one random crop of each training image at its full resolution and
    # a random flip, shuffled, batches of 512 without the last incomplete one; drawn from split_seed) or clean
    # (every training image, resized and centre-cropped)
    train_features: str = "augmented"
    normalize: str = "imagenet"  # imagenet (the paper's statistics) or model (the model's own)
    split_seed: int = 0  # seed of the 80/20 split of the training set (the protocol's seeds: 0, 42, 3407)
    root: str | None = None  # data root (None: $VIT_PLASTICITY_DATA or data/)
    name: str | None = None  # what a module is cached under (None: not cached); a model name's own name

    def __post_init__(self):
        datasets.check_dataset(self.dataset)
        for value, valid, what in (self.pool, POOLS, "pool"), (self.train_split, TRAIN_SPLITS, "train_split"):
            check_choice(value, valid, what)
        check_choice(self.train_features, TRAIN_FEATURES, "train_features")
        check_normalize(self.normalize)
        if isinstance(self.model, str):
            if self.name not in (None, self.model):
                raise ValueError(f"name {self.name!r} is for a module: model {self.model!r} is cached under its name")
            object.__setattr__(self, "name", self.model)
        if self.name is not None:
            paths.custom_name(self.name, "model")  # a valid folder name
        object.__setattr__(self, "points", check_points(self.points))
        self.mean_std()  # normalize="model" of a module that records no statistics: an error here, before any work
        # the depth from the architecture alone (meta device: no weights): a cached table needs no model
        network = models.architecture(self.model) if isinstance(self.model, str) else self.model
        object.__setattr__(self, "blocks", check_blocks(self.blocks, len(components.blocks(network))))
        if self.root is not None:
            object.__setattr__(self, "root", str(self.root))

    def wanted(self) -> list[tuple[int, str]]:
        """Its (block, point) pairs: block by block, each block's points in forward order."""
        return [(b, p) for b in self.blocks for p in self.points]

    def mean_std(self) -> tuple:
        """The mean and std its images are normalised with (``model_mean_std``)."""
        return model_mean_std(self.model, self.normalize)

    @property
    def augment_seed(self) -> int | None:
        """The seed of the augmented training features' crops, flips and order (``split_seed``).

        None for clean ones."""
        return self.split_seed if self.train_features == "augmented" else None

    def key(self) -> dict:
        """What its cached table was computed from (``metadata.json``'s ``key``).

        Another key is another table, computed again. Augmented training features record where their crops come from
        (``crops``: ``AUGMENTED_CROPS``), so that tables whose crops were cut otherwise are not taken
        for them. ``points`` and ``blocks`` are not in it: a table holds the rows of every one fitted."""
        crops = {"crops": AUGMENTED_CROPS} if self.train_features == "augmented" else {}
        mean, std = self.mean_std()
        return {
            "model": self.name,
            "dataset": self.dataset,
            "split_seed": self.split_seed,
            "train_split": self.train_split,
            "train_features": self.train_features,
            **crops,
            "splits": SPLITS_VERSION,
            "pool": self.pool,
            "normalize": self.normalize,
            "mean": list(mean),
            "std": list(std),
            "model_fingerprint": paths.model_fingerprint(self.name) if isinstance(self.model, str) else None,
            "data_fingerprint": paths.dataset_fingerprint(self.dataset, self.root),
        }

    def folder(self) -> Path | None:
        """``results/probe/<name>/<dataset>/``, where ``linear_probe`` caches its table; None if it is not cached.

        Suffixes: ``+seed-<s>`` for another split seed than 0 where the seed draws the training images, ``+trainval``
        when fitted on the whole training set, ``+clean`` for centre-cropped training features, ``+pool-<pool>`` for
        another pooling than the authors' mean, ``+norm-model`` for images normalised with the model's own
        statistics (``paths.suffixes``). A module without a ``name`` is not cached (None)."""
        if self.name is None:
            return None
        draws = self.train_split == "train" or self.train_features == "augmented"  # the seed draws training images
        leaf = self.dataset + paths.suffixes(
            ("", self.train_split, "train"),
            ("seed", self.split_seed if draws else 0, 0),
            ("", self.train_features, "augmented"),
            ("pool", self.pool, "mean"),
            ("norm", self.normalize, "imagenet"),
        )
        return paths.results_dir() / "probe" / self.name / leaf


def model_mean_std(model: nn.Module | str, normalize: str) -> tuple:
    """The normalisation of a model by name or of a module.

    By name: ``models.normalization``. Of a module: ImageNet's, or the mean and std of its
    ``pretrained_cfg`` for ``normalize="model"``."""
    if isinstance(model, str):
        return models.normalization(model, normalize)
    if check_normalize(normalize) == "imagenet":
        return IMAGENET
    cfg = getattr(model, "pretrained_cfg", None) or {}
    if cfg.get("mean") is None or cfg.get("std") is None:
        raise ValueError(
            "normalize='model': the module's pretrained_cfg records no mean and std; use normalize='imagenet'"
        )
    return as_mean_std(cfg["mean"], cfg["std"])


def linear_probe(
    probe: Probe,
    *,
    device: str = "cpu",
    batch_size: int = 256,
    num_workers: int | None = None,
    max_gib: float = 8.0,
    progress: bool = True,
    compute: bool = True,
) -> pd.DataFrame | None:
    """Linear-probe accuracy of ``probe``'s pretrained model on its dataset at its blocks and points.

    ``Probe`` says what is probed; the rest says how it runs.

    Args:
        probe: what is probed (``Probe``).
        device: where the forward pass runs; the classifiers are fitted by scikit-learn on the CPU.
        batch_size: images per forward pass.
        num_workers: DataLoader workers (default: up to 8 on CUDA for images that need decoding
            or resizing, none otherwise).
        max_gib: GiB of pooled features held at once; more points than fit take more passes.
        progress: a progress bar over the probes still to fit.
        compute: fit the probes not cached; False: None unless every one asked for is cached (reading
            results only, as notebook 07 does with ``compute_missing`` False).

    The table is cached in ``probe.folder()`` (a module without a ``name`` is never cached).

    Returns a table with columns ``block`` (0-based), ``point`` and ``accuracy`` (test accuracy,
    a fraction), one row per block and point, in forward order.
    """
    wanted, key = probe.wanted(), probe.key()
    folder = probe.folder()
    table, metadata, missing = cached(folder, key, wanted)
    if not missing:
        return tidy(table, wanted)
    if not compute:
        return None
    # one process fits a model's probes on a dataset: another waits for it, then finds them
    with storage.locked(folder) if folder is not None else contextlib.nullcontext():
        table, metadata, missing = cached(folder, key, wanted)  # fitted meanwhile by the process waited for
        if not missing:
            return tidy(table, wanted)
        threads.apply()  # this process's share of the cores, if it shares them with others of ours
        network = models.create_model(probe.model) if isinstance(probe.model, str) else probe.model
        network = network.to(device)
        size = network.patch_embed.img_size[0]
        loading = {"root": probe.root, "seed": probe.split_seed, "image_size": size, "mean_std": probe.mean_std()}
        train, test = (datasets.get_dataset(probe.dataset, split, **loading) for split in (probe.train_split, "test"))
        record = {"key": key, "depth": len(components.blocks(network)), "image_size": size}
        record |= {"n_classes": len(test.classes), "device": str(device)}
        import sklearn  # imported by a process that fits probes (as in fit_probe), not by each that imports this module

        record |= {"torch": torch.__version__, "sklearn": sklearn.__version__}
        running = {"batch_size": batch_size, "num_workers": num_workers}
        fitting = fit_missing(probe, network, (train, test), missing, running, max_gib)
        bar = tqdm(fitting, total=len(missing), desc=f"probing {probe.dataset}", unit="probe", disable=not progress)
        add_fits(bar, table, folder, record | {"seconds": metadata.get("seconds", 0.0)})
        return tidy(table, wanted)


def fit_missing(probe: Probe, network: nn.Module, sets: tuple, missing: list, running: dict, max_gib: float = 8.0):
    """Fit ``probe``'s probes of ``missing`` (block, point) on ``network``, yielding each fit as it ends.

    A group of them per pass over the (train, test) ``sets`` (``groups``: as many as ``max_gib`` of pooled features
    hold); each fit is yielded as ((block, point), test accuracy, training images, test images). ``running``:
    ``pooled_features``'s batch_size and num_workers (on ``network``'s device)."""
    (train, test), pool = sets, probe.pool
    for group in groups(network, missing, len(train) + len(test), max_gib):
        train_x, train_y = pooled_features(network, train, group, pool, **running, augment_seed=probe.augment_seed)
        test_x, test_y = pooled_features(network, test, group, pool, **running)
        # small fits (every demo-scale one) run one per core of this process's share; larger ones
        # one at a time, on BLAS's threads
        jobs = (threads.budget() or threads.cores()) if all(train_x[i].size <= SMALL_FIT for i in group) else 1
        fits = Parallel(n_jobs=min(jobs, len(group)), return_as="generator")(
            delayed(fit_probe)(train_x[item], train_y, test_x[item], test_y, seed=probe.split_seed) for item in group
        )
        for item, accuracy in zip(group, fits):
            yield item, accuracy, len(train_y), len(test_y)


def fit_probe(train_x: np.ndarray, train_y: np.ndarray, test_x: np.ndarray, test_y: np.ndarray, seed: int = 0) -> float:
    """Test accuracy (fraction) of the authors' classifier fitted on the training features.

    The classifier: ``StandardScaler`` + ``LogisticRegression(max_iter=5000)`` (multinomial, lbfgs). A small
    problem (up to ``SMALL_FIT`` training values) runs on one BLAS thread, a larger one on the library's.

    scikit-learn is imported here, by the process that fits: importing it takes about a second, which every process
    that imports this module (a sweep's, a pool's worker, a notebook's kernel) would pay, fitting or not."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    classifier = make_pipeline(StandardScaler(), LogisticRegression(max_iter=MAX_ITER, random_state=seed))
    limits = threadpool_limits(1, user_api="blas") if train_x.size <= SMALL_FIT else contextlib.nullcontext()
    with limits:
        classifier.fit(train_x, train_y)
        return float(classifier.score(test_x, test_y))


def add_fits(fits, table: pd.DataFrame, folder: Path | None, record: dict) -> None:
    """Add each fit of ``fits`` to ``table``, saving it after each one with a ``folder``.

    ``fits`` are ``fit_missing``'s. Saving after each fit lets an interrupted call resume: its
    metadata is ``record`` with the images fitted on and the seconds spent (``record["seconds"]``:
    those of earlier calls)."""
    start = time.perf_counter()
    for (index, point), accuracy, n_train, n_test in fits:
        table.loc[len(table)] = [index, point, accuracy]
        if folder is not None:
            seconds = round(record["seconds"] + time.perf_counter() - start, 2)
            save(table, folder, record | {"n_train": n_train, "n_test": n_test, "seconds": seconds})


def table6_column(
    model: str | nn.Module, datasets: str | Iterable[str], point: str = "mha", block: int = -1, **options
) -> pd.DataFrame:
    """Table 6's linear-probing column: per dataset, the probe's test accuracy (%).

    At one point of one block: the last block's ``mha`` by default, the paper's "attention hidden
    representation of the last layer". ``options``: the other fields of ``Probe`` and the keywords of ``linear_probe``
    (with ``compute=False``, a dataset whose probe is not cached has no row). Columns: ``dataset``,
    ``accuracy``."""
    datasets = [datasets] if isinstance(datasets, str) else list(datasets)
    check_points(point)
    rows = []
    for dataset in datasets:
        table = probed(model, dataset, {"points": (point,), "blocks": block, **options})
        if table is not None:
            rows.append({"dataset": dataset, "accuracy": 100.0 * float(table["accuracy"].iloc[0])})
    return pd.DataFrame(rows, columns=["dataset", "accuracy"])


def probe_datasets(model: str | nn.Module, datasets: str | Iterable[str], **options) -> pd.DataFrame:
    """``linear_probe`` on each dataset, one table with a ``dataset`` column first.

    ``options``: the other fields of ``Probe`` and the keywords of ``linear_probe``."""
    datasets = [datasets] if isinstance(datasets, str) else list(datasets)
    tables = [probed(model, dataset, options).assign(dataset=dataset) for dataset in datasets]
    table = pd.concat(tables, ignore_index=True)
    return table[["dataset", "block", "point", "accuracy"]]


def probed(model: str | nn.Module, dataset: str, options: dict) -> pd.DataFrame | None:
    """``linear_probe`` of the ``Probe`` of ``model`` on ``dataset``, options split by where they belong.

    The options that are the ``Probe``'s fields make it; the others are ``linear_probe``'s keywords (another name is a
    TypeError)."""
    own = {field.name for field in fields(Probe)}
    value = Probe(model, dataset, **{name: v for name, v in options.items() if name in own})
    return linear_probe(value, **{name: v for name, v in options.items() if name not in own})


def along_depth(table: pd.DataFrame) -> pd.DataFrame:
    """Probe accuracy (%) per block and point, averaged over the datasets.

    Blocks are rows, points columns in forward order; the datasets are those of a ``probe_datasets``
    table (or the one table of ``linear_probe``)."""
    wide = table.pivot_table(index="block", columns="point", values="accuracy", aggfunc="mean", observed=True)
    return 100.0 * wide[[p for p in POINTS if p in wide.columns]]
