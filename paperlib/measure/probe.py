"""Linear probing of a pretrained ViT as the authors compute it (Table 6, last column).

The paper: "The linear probing performance is obtained over the attention hidden representation of
the last layer." The authors' released probing script takes the *pretrained* model and, for every
block and every probe point (the hidden representation after a component), pools the tokens by
their mean (its ``cls_pooling=False``: ``.mean(axis=1)`` over the whole sequence), normalises each
image's vector to unit L2 norm, standardises the features (``StandardScaler`` fitted on the
training features) and fits scikit-learn's multinomial ``LogisticRegression(max_iter=5000)`` on the
80% training split, scored on the test split. ``linear_probe`` does exactly that, for every block
and every point of ``POINTS``, from one forward pass over the images (forward hooks).

Which images. The authors' script reads the training images through their finetuning loader:
the 80% training split (``train_size=0.8``; Flowers102's official training split), each image
once as one random resized crop and flip, shuffled, in batches of 512 with the last incomplete
batch dropped (on Flowers102, 512 of its 1,020 training images); the test images are the test
split, resized and centre-cropped, in order. ``train_features="augmented"`` (the default) does
the same: ``get_dataset(dataset, "train", seed=split_seed)``, each image cropped at its full
resolution by torchvision's ``RandomResizedCrop`` and flipped by ``RandomHorizontalFlip``
(``transforms.paper_transform(augment=True)``), crops, flips and order drawn from ``split_seed``
(``augmented_batches``; a set smaller than ``AUGMENTED_BATCH`` is one batch of all it has).
``train_features="clean"`` (beyond the authors)
takes every training image once, resized and centre-cropped. ``train_split="trainval"`` (beyond
the paper) fits on the whole training set instead.

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
and point, and ``metadata.json`` with the ``Probe.key()`` it was computed from), filled in as points
are fitted, so a second call is instant and an interrupted one resumes. The notebooks' entries,
``probe_datasets`` and ``table6_column``, take a model, datasets and keyword options.
"""

from __future__ import annotations

import contextlib
import copy
import json
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import pandas as pd
import sklearn
import torch
from joblib import Parallel, delayed
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from threadpoolctl import threadpool_limits
from torch import nn
from torch.utils.data import DataLoader, Dataset
from tqdm.auto import tqdm

from paperlib.data import datasets
from paperlib.data.imagesets import FileDataset, ImageDataset
from paperlib.data.loader import DeviceLoader, Transform, decode_workers
from paperlib.data.transforms import IMAGENET, as_mean_std, paper_transform
from paperlib.records import paths, storage
from paperlib.records.names import SPLITS_VERSION, check_normalize
from paperlib.speed import threads
from paperlib.vit import components, models
from paperlib.vit.components import JointLinear, block_component

POINTS = ("ln1", "mha", "attn_residual", "ln2", "fc1", "gelu", "fc2", "block")
"""Probe points of a block, in the order of its forward pass: the output of each component (``ln1``,
``mha``, ``ln2``, ``fc1``, ``fc2``), of the activation (``gelu``), and the residual stream after
attention (``attn_residual``: the input of ``norm2``) and after the block (``block``). ``mha`` is the
attention module's output, before the residual addition and before LayerScale where a block has one
(the paper's ViTs have none); ``gelu`` is the output of ``mlp.act`` (in a SwiGLU block, the gate's
activation); ``fc1`` of a SwiGLU block with separate gate and value layers is the two side by side.
"""

POOLS = ("mean", "patches", "cls")
"""How tokens become one vector: ``mean`` over every position (the authors' ``.mean(axis=1)``, the
class token's position included), ``patches`` (the mean over the patch tokens alone) or ``cls``
(the class token; the authors' ``cls_pooling=True``)."""

TRAIN_SPLITS = ("train", "trainval")
TRAIN_FEATURES = ("augmented", "clean")
AUGMENTED_BATCH = 512  # the authors' training loader's batch, whose last incomplete one is dropped
"""Images the probe is fitted on: the authors' 80% training split, or the whole training set."""
AUGMENTED_CROPS = "full_image"
"""Where ``train_features="augmented"`` cuts its crops: from each image at its full resolution.

As the authors' torchvision transforms do (``augmented_batches``). In every augmented table's ``Probe.key()``
(``crops``): a table that lacks it, or whose crops were cut otherwise (from the decoded cache, shorter side 256), is
another table, computed again."""

MAX_ITER = 5000  # the authors' LogisticRegression(max_iter=5000)
SMALL_FIT = 2**22  # training features (images x width) up to which a fit runs on one BLAS thread


def check_points(points: str | Iterable[str]) -> tuple[str, ...]:
    """``points`` as a tuple (one name or several), or a ValueError naming the valid points."""
    chosen = (points,) if isinstance(points, str) else tuple(points)
    unknown = [p for p in chosen if p not in POINTS]
    if unknown or not chosen:
        raise ValueError(f"unknown probe point(s) {unknown or chosen!r}; valid points: {', '.join(POINTS)}")
    return tuple(p for p in POINTS if p in chosen)


def check_choice(value: str, valid: Sequence[str], what: str) -> str:
    """``value`` or a ValueError naming the valid choices of ``what``."""
    if value not in valid:
        raise ValueError(f"unknown {what} {value!r}; valid choices: {', '.join(valid)}")
    return value


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


# --------------------------------------------------------------------------------------------
# Features: one forward pass, every point hooked


def point_modules(block: nn.Module, point: str) -> tuple[str, list[nn.Module]]:
    """How ``point`` is read in ``block``: the outputs of some modules or the input of one.

    ``("output", modules)``: the outputs of the modules, side by side (FC1 of a SwiGLU block is its gate and value
    layers); ``("input", [module])``: the input of the module (the residual stream after attention is the input of
    ``norm2``)."""
    check_points(point)
    if point == "block":
        return "output", [block]
    if point == "attn_residual":
        return "input", [block_component(block, "ln2")]
    if point == "gelu":
        try:
            return "output", [block.get_submodule("mlp.act")]
        except AttributeError as error:
            raise TypeError(
                f"block {type(block).__name__} has no 'mlp.act': the gelu point reads its output"
            ) from error
    module = block_component(block, point)  # ln1, mha, ln2, fc1, fc2: the components themselves
    return "output", list(module.parts) if isinstance(module, JointLinear) else [module]


def pool_tokens(tokens: torch.Tensor, pool: str = "mean", prefix: int = 1) -> torch.Tensor:
    """(B, n, k) tokens to (B, k) float32: ``POOLS`` (``prefix``: class and register tokens first)."""
    tokens = tokens[0] if isinstance(tokens, (tuple, list)) else tokens
    if pool == "cls":
        return tokens[:, 0].float()
    return (tokens[:, prefix:] if pool == "patches" else tokens).float().mean(dim=1)


@contextlib.contextmanager
def hooked(model: nn.Module, wanted: Sequence[tuple[int, str]], pool: str = "mean"):
    """Forward hooks that pool every (block, point) of ``wanted``; removed on exit.

    They pool into a dict of lists of CPU tensors, ``store[(block, point, part)]``, one tensor per batch."""
    store: dict[tuple[int, str, int], list[torch.Tensor]] = {}
    prefix = int(getattr(model, "num_prefix_tokens", 1))
    handles = []
    try:
        for index, point in wanted:
            kind, modules = point_modules(components.blocks(model)[index], point)
            for part, module in enumerate(modules):
                key = (index, point, part)
                store[key] = []

                def keep(tokens, key=key):
                    store[key].append(pool_tokens(tokens, pool, prefix).cpu())

                if kind == "input":
                    handles.append(module.register_forward_pre_hook(lambda _m, args, keep=keep: keep(args[0])))
                else:
                    handles.append(module.register_forward_hook(lambda _m, _args, out, keep=keep: keep(out)))
        yield store
    finally:
        for handle in handles:
            handle.remove()


def unit_rows(features: np.ndarray) -> np.ndarray:
    """Each row divided by its L2 norm (the authors' ``value /= np.linalg.norm(value, axis=-1)``)."""
    return features / np.linalg.norm(features, axis=-1, keepdims=True)


def batches(dataset, batch_size: int, device: torch.device, num_workers: int | None = None):
    """(images, labels) batches of ``dataset`` in order, images on ``device``."""
    if num_workers is None:
        decodes = isinstance(dataset, FileDataset) or getattr(dataset, "transform", None) is not None
        num_workers = decode_workers() if device.type == "cuda" and decodes else 0
    loader = DataLoader(dataset, batch_size=batch_size, num_workers=num_workers, pin_memory=device.type == "cuda")
    for images, labels in loader:
        yield images.to(device, non_blocking=True), labels


def image_seed(seed: int, index: int) -> int:
    """The seed of image ``index``'s crop and flip under the probe's ``seed``.

    A function of the pair alone (``numpy.random.SeedSequence``), so that neither the order nor the worker
    that transforms an image changes its crop."""
    return int(np.random.SeedSequence((seed % 2**64, index)).generate_state(1, np.uint64)[0])


def augmented_order(n: int, seed: int) -> list[int]:
    """The images of one shuffled epoch of the authors' training loader over ``n`` images.

    A permutation drawn from ``seed``, cut to whole batches of ``AUGMENTED_BATCH`` (the last incomplete one
    dropped; all ``n`` when they are fewer than a batch)."""
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    return order if n < AUGMENTED_BATCH else order[: n // AUGMENTED_BATCH * AUGMENTED_BATCH]


class SeededCrops(Dataset):
    """Items (normalised crop, label) of ``dataset``, each crop seeded by its image.

    Image ``index`` at its full resolution goes through ``transforms.paper_transform(augment=True)`` (the
    authors' ``build_transform(mode="train")``) inside ``torch.random.fork_rng``, seeded by
    ``image_seed(seed, index)``: the caller's random state is left as it was.
    """

    def __init__(self, dataset: ImageDataset | FileDataset, image_size: int, seed: int):
        self.dataset = copy.copy(dataset)  # the same images and labels, with the training transform
        self.dataset.transform = paper_transform(True, image_size, getattr(dataset, "mean_std", IMAGENET))
        self.seed = seed

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(image_seed(self.seed, index))
            return self.dataset[index]


def crops_on_device(dataset, image_size: int) -> bool:
    """Whether ``augmented_batches`` draws the crops of ``dataset`` on the device (``DeviceLoader``).

    So for images held whole in one array (the demo's digits, Cifar, Cifar10-C) no larger than the model's
    input: every crop is then an upsampling of the very pixels torchvision would read, where its
    antialiasing does nothing (the same crops within 1/255, ``transforms.resized_crops``)."""
    if not isinstance(dataset, ImageDataset) or not isinstance(dataset.images, torch.Tensor):
        return False  # image files, or decoded images of different sizes
    return max(dataset.images.shape[-2:]) <= image_size


def augmented_batches(dataset, image_size: int, device: torch.device, seed: int, num_workers: int | None = None):
    """(images, labels) batches of ``dataset`` as the authors' training loader gives them.

    Each image once, as one random resized crop of its full-resolution image and a random flip, shuffled, in
    batches of ``AUGMENTED_BATCH`` with the last incomplete one dropped (all in one batch if there are
    fewer); crops, flips and order drawn from ``seed``. Labels on the CPU.

    Image files and arrays larger than the model's input go through torchvision image by image
    (``SeededCrops``, ``augmented_order``) in a DataLoader of ``num_workers``; the others are cropped on
    the device (``crops_on_device``). docs/fidelity.md, "Training crops", compares them with the authors'."""
    batch = min(AUGMENTED_BATCH, len(dataset))
    if crops_on_device(dataset, image_size):
        loader = DeviceLoader(
            dataset, batch, Transform(True, image_size), device, shuffle=True, drop_last=True, seed=seed
        )
        for images, labels in loader:
            yield images, labels.cpu()
        return
    if num_workers is None:
        num_workers = decode_workers() if device.type == "cuda" else 0
    crops = SeededCrops(dataset, image_size, seed)
    order = augmented_order(len(dataset), seed)
    loader = DataLoader(
        crops,
        batch_size=batch,
        sampler=order,
        num_workers=num_workers,
        pin_memory=device.type == "cuda",
        generator=torch.Generator().manual_seed(seed),  # its workers' seeds: not from the global generator
    )
    for images, labels in loader:
        yield images.to(device, non_blocking=True), labels


def pooled_features(
    model: nn.Module,
    dataset,
    wanted: Sequence[tuple[int, str]],
    pool: str = "mean",
    batch_size: int = 256,
    device: str | torch.device = "cpu",
    num_workers: int | None = None,
    augment_seed: int | None = None,
) -> tuple[dict[tuple[int, str], np.ndarray], np.ndarray]:
    """The pooled, L2-normalised features of every (block, point) of ``wanted`` over ``dataset``, and the labels.

    Float32, one row per image, in the dataset's order (with ``augment_seed``, as ``augmented_batches``
    gives them), from one forward pass per batch in eval mode, without gradients (the mode restored after)."""
    check_choice(pool, POOLS, "pool")
    device = torch.device(device)
    model = model.to(device)
    training = model.training
    labels = []
    try:
        model.eval()
        with torch.inference_mode(), hooked(model, wanted, pool) as store:
            if augment_seed is None:
                inputs = batches(dataset, batch_size, device, num_workers)
            else:
                size = model.patch_embed.img_size[0]
                inputs = augmented_batches(dataset, size, device, augment_seed, num_workers)
            for images, targets in inputs:
                model(images)
                labels.append(targets.numpy())
    finally:
        model.train(training)
    out = {}
    for index, point in wanted:
        parts = [torch.cat(store[key]).numpy() for key in sorted(k for k in store if k[:2] == (index, point))]
        out[index, point] = unit_rows(np.concatenate(parts, axis=1))
    return out, np.concatenate(labels)


def fit_probe(train_x: np.ndarray, train_y: np.ndarray, test_x: np.ndarray, test_y: np.ndarray, seed: int = 0) -> float:
    """Test accuracy (fraction) of the authors' classifier fitted on the training features.

    The classifier: ``StandardScaler`` + ``LogisticRegression(max_iter=5000)`` (multinomial, lbfgs). A small
    problem (up to ``SMALL_FIT`` training values) runs on one BLAS thread, a larger one on the library's."""
    classifier = make_pipeline(StandardScaler(), LogisticRegression(max_iter=MAX_ITER, random_state=seed))
    limits = threadpool_limits(1, user_api="blas") if train_x.size <= SMALL_FIT else contextlib.nullcontext()
    with limits:
        classifier.fit(train_x, train_y)
        return float(classifier.score(test_x, test_y))


def point_width(block: nn.Module, point: str) -> int:
    """Features per image of ``point`` (for the memory budget).

    The hidden width for FC1 and the activation, the embedding width otherwise."""
    if point == "fc1":
        return int(block_component(block, "fc1").out_features)
    if point == "gelu":
        return int(block_component(block, "fc2").in_features)
    return int(block_component(block, "ln1").normalized_shape[-1])


def groups(model: nn.Module, wanted: Sequence[tuple[int, str]], n_images: int, max_gib: float) -> list[list]:
    """``wanted`` in consecutive groups whose pooled features fit in ``max_gib`` GiB.

    The features are float32. One forward pass per group; one group unless all points of a large
    model on a large set."""
    out, size = [[]], 0
    for index, point in wanted:
        need = n_images * point_width(components.blocks(model)[index], point) * 4
        if out[-1] and size + need > max_gib * 2**30:
            out.append([])
            size = 0
        out[-1].append((index, point))
        size += need
    return out


# --------------------------------------------------------------------------------------------
# The probe table, cached


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


def load(folder: str | Path) -> tuple[pd.DataFrame, dict]:
    """The cached table (``probe.csv``) and ``metadata.json`` of a result folder.

    Empty if none, or if damaged (``storage.json_or_none`` warns, and the probes are fitted
    again)."""
    metadata = storage.json_or_none(Path(folder) / "metadata.json")
    return (empty(), {}) if metadata is None else (pd.read_csv(Path(folder) / "probe.csv"), metadata)


def empty() -> pd.DataFrame:
    """A probe table without rows."""
    return pd.DataFrame(
        {"block": pd.Series(dtype=int), "point": pd.Series(dtype=str), "accuracy": pd.Series(dtype=float)}
    )


def save(table: pd.DataFrame, folder: str | Path, metadata: dict) -> Path:
    """Write ``probe.csv`` then ``metadata.json`` into ``folder``, each atomically.

    The metadata, written last with the table's size (``files``), says the table is whole."""
    folder = Path(folder)
    storage.atomic_write(folder / "probe.csv", lambda tmp: table.to_csv(tmp, index=False))
    metadata = {**metadata, "files": storage.file_sizes(folder, ["probe.csv"])}
    storage.atomic_write_text(folder / "metadata.json", json.dumps(metadata, indent=2, default=str) + "\n")
    return folder


def tidy(table: pd.DataFrame, wanted: Sequence[tuple[int, str]]) -> pd.DataFrame:
    """The rows of ``wanted`` in block then point order, ``point`` an ordered categorical."""
    rows = table.set_index(["block", "point"]).loc[list(wanted)].reset_index()
    rows["block"] = rows["block"].astype(int)
    rows["accuracy"] = rows["accuracy"].astype(float)
    rows["point"] = pd.Categorical(rows["point"], categories=POINTS, ordered=True)
    return rows[["block", "point", "accuracy"]].reset_index(drop=True)


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
    cache: bool = True,
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
        cache: read and write ``probe.folder()`` (a module without a ``name`` is never cached).

    Returns a table with columns ``block`` (0-based), ``point`` and ``accuracy`` (test accuracy,
    a fraction), one row per block and point, in forward order.
    """
    wanted, key = probe.wanted(), probe.key()
    folder = probe.folder() if cache else None
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
        size = network.patch_embed.img_size[0]
        loading = {"root": probe.root, "seed": probe.split_seed, "image_size": size, "mean_std": probe.mean_std()}
        train, test = (datasets.get_dataset(probe.dataset, split, **loading) for split in (probe.train_split, "test"))
        record = {"key": key, "depth": len(components.blocks(network)), "image_size": size}
        record |= {"n_classes": len(test.classes), "device": str(device)}
        record |= {"torch": torch.__version__, "sklearn": sklearn.__version__}
        running = {"batch_size": batch_size, "device": device, "num_workers": num_workers}
        fitting = fit_missing(probe, network, (train, test), missing, running, max_gib)
        bar = tqdm(fitting, total=len(missing), desc=f"probing {probe.dataset}", unit="probe", disable=not progress)
        add_fits(bar, table, folder, record | {"seconds": metadata.get("seconds", 0.0)})
        return tidy(table, wanted)


def fit_missing(probe: Probe, network: nn.Module, sets: tuple, missing: list, running: dict, max_gib: float = 8.0):
    """Fit ``probe``'s probes of ``missing`` (block, point) on ``network``, yielding each fit as it ends.

    A group of them per pass over the (train, test) ``sets`` (``groups``: as many as ``max_gib`` of pooled features
    hold); each fit is yielded as ((block, point), test accuracy, training images, test images). ``running``:
    ``pooled_features``'s batch_size, device and num_workers."""
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


def cached(folder: Path | None, key: dict, wanted: list) -> tuple[pd.DataFrame, dict, list]:
    """The probe table and metadata cached in ``folder``, and the (block, point) not in it.

    The cache counts only if it is of this ``key`` (empty otherwise); the (block, point) are those
    of ``wanted``."""
    table, metadata = load(folder) if folder is not None else (empty(), {})
    if metadata.get("key") != key:  # another model or dataset under the name (custom ones change): not this
        table, metadata = empty(), {}
    done = set(zip(table["block"].astype(int), table["point"]))
    return table, metadata, [item for item in wanted if item not in done]


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
