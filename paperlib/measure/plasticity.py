"""Plasticity of the ViT components (paper §3, Definition 1; §5.1; appendix C.4).

For image pairs (x from the pretraining distribution, y from a downstream set, paired by
position), the rate of change of every component of every block on each pair is Definition 1's
(``component_rates``: computed exactly and fast), and the plasticity P(f) is its mean over pairs.
``measure`` runs the rates over two datasets in batches on a device; ``rates`` does one batch.

The same holds for timm's later ViTs (``components``): an ``Eva`` model's embedding
(DINOv3, EVA-02, ...) is its ``_pos_embed`` tokens, and its attention is applied to them with the
rotary position embedding the model gives its blocks; RMSNorm is measured as LayerNorm is; FC1 of
a SwiGLU block is its gate and value layers together.

A ``Measurement`` is one model on one dataset against reference images, validated when it is made, with its result
folder (``folder()``) and whether a result is saved there (``is_saved()``; ``records.measurements``):

    from paperlib.measure.plasticity import Measurement, run
    measurement = Measurement(dataset="digits_c/snow")   # the demo ViT against digits_source, 179 pairs
    table, folder = run(measurement)                     # results/plasticity/demo/digits_c/snow

``run`` measures one and saves it, ``measure_missing`` runs those not saved yet. Saved results are
``plasticity_table``'s, without torch: ``collect`` reads every one as one table of P(f), ``ranked`` ranks
P(f); the statistics of a ranking (its agreement with the paper's, its
bootstrap uncertainty) are in ``paperlib.analysis.ranking``.

Identical pairs (two exactly equal embeddings, x == y) have no rate (0/0): ``rates`` and
``measure`` exclude them with a ``ranking.IdenticalPairsWarning`` naming how many, counted in
``table.attrs["identical_pairs_excluded"]`` and ``run``'s metadata; the other pairs keep their
numbers and exact rates. ``plasticity_table``'s ``ranked`` leaves out, with the same
warning, pairs without any rate in tables made otherwise (``component_rates.to_table``).

The scale of the embeddings (beyond the paper): a linear map's rate does not change when both
embeddings are multiplied by a, a LayerNorm's falls as 1/a, so the ranking depends on the size of
the tokens. Every result records the token RMS norm of its embeddings (``table.attrs["token_rms"]``,
``token_rms`` in ``run``'s metadata and ``collect``): the square root of the mean of
``||token||_2^2`` over every token (class token included) of both images of every measured pair,
the paper's r (Fig. 6: 19.4 for ViT-B/16 in21k on Cifar10; ``bounds.token_radius``'s ``rms``).
``scale_curve`` gives P(f) with the embeddings multiplied by factors (``ranking.paper_order_from``:
from which factor on it follows the paper's ranking).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch
from torch import nn
from torch.utils.data import DataLoader, Subset
from tqdm.auto import tqdm

from paperlib.analysis.plasticity_table import ranked, save
from paperlib.analysis.ranking import paper_agreement
from paperlib.data import datasets
from paperlib.data.corruptions import check_severity
from paperlib.data.loader import decode_workers
from paperlib.measure.component_rates import batch_pair_rates, evaluating, linear_terms, pair_rates, tabulate
from paperlib.records import cli, commands, measurements, paths, storage
from paperlib.records.names import COMPONENTS, check_inputs
from paperlib.speed import devices, threads
from paperlib.vit import models

LOADER_BATCH = 64
"""The batch of the authors' loaders in their analysis (``apps/vit/scripts/analysis.sh``: 64 x 200 steps for
ViT-Base, ``LOADER_BATCHES``' x 400 for ViT-Large and ViT-Huge): with ``sample="first"``, a set is read in whole
batches of it, a last partial batch never used (a set smaller than one batch is used whole)."""

LOADER_BATCHES = {models.PAPER_MODELS["vit_large_in21k"]: 32, models.PAPER_MODELS["vit_huge_in21k"]: 32}
"""The authors' loader batch per model where it is not ``LOADER_BATCH`` (``analysis.sh``: 32 for ViT-Large and
ViT-Huge), by timm name: ``Measurement``'s ``loader_batch=0`` is it for these models, ``LOADER_BATCH`` for every
other."""


def cycled(n_images: int, n_pairs: int, batch: int = LOADER_BATCH) -> list[int]:
    """The image of each of ``n_pairs`` pairs from a set of ``n_images`` read in order, cycled.

    The set is read in whole batches of ``batch`` (the last partial batch dropped): what an unshuffled
    loader with ``drop_last``, made endless, yields (a set smaller than one batch is used whole)."""
    used = n_images - n_images % batch if n_images >= batch else n_images
    return [i % used for i in range(n_pairs)]


def pair_indices(
    n_reference: int, n_target: int, n_pairs: int, sample: str = "first", seed: int = 0, batch: int = LOADER_BATCH
) -> tuple[list[int], list[int]]:
    """Which images make the pairs: pair ``i`` is (reference[r[i]], target[t[i]]) for the returned (r, t).

    ``first``: each set ``cycled`` in whole batches of ``batch`` (any ``n_pairs``). ``once``: both
    ``range(n_pairs)``. ``random``: ``n_pairs`` distinct images of each set, each set drawn by a generator
    of its own (seeded ``2 * seed`` for the reference, ``2 * seed + 1`` for the target), so the same seed
    gives the same images of a set on every machine, whatever the other set, and the two draws are not the
    same permutation. ``once`` and ``random`` need ``n_pairs`` at most the smaller set's size.
    """
    measurements.check_sample(sample)
    if n_pairs < 1 or (sample != "first" and n_pairs > min(n_reference, n_target)):
        most = "" if sample == "first" else f"..{min(n_reference, n_target)}"
        raise ValueError(
            f"n_pairs must be in 1{most} with sample {sample!r} "
            f"(the reference has {n_reference} images and the target {n_target}), got {n_pairs}"
        )
    if sample == "first":
        return cycled(n_reference, n_pairs, batch), cycled(n_target, n_pairs, batch)
    if sample == "once":
        return list(range(n_pairs)), list(range(n_pairs))
    reference = torch.randperm(n_reference, generator=torch.Generator().manual_seed(2 * seed))[:n_pairs]
    target = torch.randperm(n_target, generator=torch.Generator().manual_seed(2 * seed + 1))[:n_pairs]
    return reference.tolist(), target.tolist()


def rates(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, inputs: str = "embedding", scale: float = 1.0
) -> pd.DataFrame:
    """Rates of change of one batch of image pairs: one row per pair, block and component.

    ``x``, ``y``: normalised float images (N, 3, H, W) on the model's device, paired by position.
    Columns: ``block`` (0-based), ``depth`` (percent of depth: first block 0, last 100),
    ``component`` (``COMPONENTS``), ``pair``, ``rate``. Pairs with identical embeddings are
    excluded (an ``IdenticalPairsWarning`` names how many). ``attrs``: ``token_rms`` (the token
    RMS norm of the measured pairs' embeddings) and ``identical_pairs_excluded``. ``scale``
    (beyond the paper): both embeddings multiplied by it before the components
    (``component_rates.pair_rates``).
    """
    return tabulate([pair_rates(model, x, y, inputs, scale=scale)])


def scale_curve(
    model: nn.Module | str, x: torch.Tensor, y: torch.Tensor, factors, batch_size: int = 64, device=None
) -> pd.DataFrame:
    """P(f) when the embedding of both images of every pair is multiplied by each factor (beyond the paper).

    For each factor a, the components see ``a * e(x)`` and ``a * e(y)`` and each rate is Definition
    1's on those (``component_rates.pair_rates(..., scale=a)``): linear maps (FC1, FC2) give the same
    P(f) at every a, LayerNorms ``P(f) / a`` (exactly while their eps is negligible against the
    variance of the scaled tokens), MHA neither. ``model``: a module or a name (``models.create_model``);
    ``x``, ``y``: normalised images (N, 3, H, W), paired by position, measured in batches of
    ``batch_size`` on ``device`` (None: where ``x`` is). Identical pairs are excluded as by ``rates``.
    Returns one row per factor and component: ``factor``, ``component``, ``plasticity`` (mean rate
    over pairs and blocks, as ``ranking``'s) and ``token_rms`` (the token RMS norm of the scaled
    embeddings: the factor times the unscaled one).
    """
    network = models.create_model(model) if isinstance(model, str) else model
    if x.shape != y.shape:
        raise ValueError(f"x and y must have the same shape, got {tuple(x.shape)} and {tuple(y.shape)}")
    factors = [float(factor) for factor in factors]
    if not factors:
        raise ValueError("no factors")
    device = torch.device(device) if device is not None else x.device
    network = network.to(device)
    rows = []
    with evaluating(network, "embedding"):
        terms = linear_terms(network)
        for factor in factors:
            parts = [
                batch_pair_rates(network, xs.to(device), ys.to(device), "embedding", terms, factor)
                for xs, ys in zip(x.split(batch_size), y.split(batch_size))
            ]
            table = tabulate(parts)
            mean = table.groupby("component", observed=True)["rate"].mean()
            rows += [(factor, c, float(mean[c]), table.attrs["token_rms"]) for c in COMPONENTS]
    curve = pd.DataFrame(rows, columns=["factor", "component", "plasticity", "token_rms"])
    curve["component"] = pd.Categorical(curve["component"], categories=COMPONENTS)
    return curve


@dataclass(frozen=True)
class PairDraw:
    """How ``measure`` draws its pairs from the two sets, validated when it is made.

    ``pair_indices`` draws them; ``sample`` ``first`` (the authors': both sets in order, cycled in whole
    batches of ``loader_batch``), ``once`` (each image at most once) or ``random`` (a random subset of each
    set, drawn with ``seed``)."""

    sample: str = "first"
    seed: int = 0
    loader_batch: int = LOADER_BATCH

    def __post_init__(self):
        measurements.check_sample(self.sample)
        if self.loader_batch < 1:
            raise ValueError(f"loader_batch must be at least 1, got {self.loader_batch}")


@dataclass(frozen=True)
class Running:
    """How ``measure`` runs, which changes none of its numbers beyond rounding.

    ``batch_size`` pairs at a time on ``device``, images read by ``num_workers`` DataLoader workers (0: in
    the main process), a progress bar unless ``progress`` is False. A bad ``batch_size`` is a ValueError
    when it is made."""

    batch_size: int = 64
    device: str | torch.device = "cpu"
    num_workers: int = 0
    progress: bool = True

    def __post_init__(self):
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {self.batch_size}")


def measure(
    model: nn.Module,
    reference,
    target,
    n_pairs: int,
    inputs: str = "embedding",
    *,
    draw: PairDraw = PairDraw(),
    running: Running = Running(),
) -> pd.DataFrame:
    """Rates of change over ``n_pairs`` image pairs streamed from two datasets (§5.1).

    The pairs are ``pair_indices``' as ``draw`` (a ``PairDraw``) says (the authors' by default: both
    sets in order, cycled in whole batches); reference = images of the pretraining distribution,
    target = the downstream test split, both yielding (normalised image, label). ``running`` (a
    ``Running``): the batch size, device, DataLoader workers and progress bar.
    Returns the tidy table of ``rates`` for all pairs but those with identical embeddings
    (excluded, with an ``IdenticalPairsWarning`` naming how many); ``table.attrs["token_rms"]``
    is the token RMS norm of the measured pairs' embeddings, ``table.attrs["identical_pairs_excluded"]``
    the count.
    """
    check_inputs(inputs)
    indices = pair_indices(len(reference), len(target), n_pairs, draw.sample, draw.seed, draw.loader_batch)
    device = torch.device(running.device)
    model = model.to(device)
    loaders = [
        DataLoader(
            Subset(dataset, chosen),
            batch_size=running.batch_size,
            num_workers=running.num_workers,
            pin_memory=device.type == "cuda",
        )
        for dataset, chosen in zip((reference, target), indices)
    ]
    parts = []
    with evaluating(model, inputs), tqdm(total=n_pairs, desc="pairs", unit="pair", disable=not running.progress) as bar:
        terms = linear_terms(model) if inputs == "embedding" else None
        for (x, _), (y, _) in zip(*loaders):
            parts.append(
                batch_pair_rates(model, x.to(device, non_blocking=True), y.to(device, non_blocking=True), inputs, terms)
            )
            bar.update(len(x))
    return tabulate(parts)


NOTEBOOK = "02_plasticity"  # the notebook of one measurement: its parameters are a Measurement's fields (and run's)


@dataclass(frozen=True)
class Measurement(measurements.Measurement):
    """One plasticity measurement, checked against the stack when it is made; ``run`` measures it.

    Its fields, folder and record are ``records.measurements.Measurement``'s; here its model and datasets are checked
    too, and ``loader_batch`` 0 becomes the authors' batch for the model."""

    def __post_init__(self):
        datasets.check_dataset(self.dataset)
        timm_name = models.resolve_name(self.model)
        if self.loader_batch == 0:  # the authors' batch written one way, as the reference
            object.__setattr__(self, "loader_batch", LOADER_BATCHES.get(timm_name, LOADER_BATCH))
        check_severity(self.severity)
        super().__post_init__()
        datasets.check_dataset(self.reference)

    def pair_indices(self, n_reference: int, n_target: int) -> tuple[list[int], list[int]]:
        """The images of the pairs it measures on sets of these sizes (``pair_indices``).

        ``n_pairs`` of them with the authors' pair set (``first``), else at most the smaller set's size."""
        pairs = self.n_pairs if self.sample == "first" else min(self.n_pairs, n_reference, n_target)
        return pair_indices(n_reference, n_target, pairs, self.sample, self.seed, self.loader_batch)


def _pair_sets(measurement: Measurement, data_root):
    """The model (pretrained weights), its normalisation and the test splits of both datasets at its resolution."""
    mean_std = models.normalization(measurement.model, measurement.normalize)
    network = models.create_model(measurement.model)
    size = network.patch_embed.img_size[0]
    reference_set = datasets.get_dataset(
        measurement.reference, "test", root=data_root, image_size=size, mean_std=mean_std
    )
    target_set = datasets.get_dataset(
        measurement.dataset, "test", root=data_root, image_size=size, severity=measurement.severity, mean_std=mean_std
    )
    return network, mean_std, reference_set, target_set


def pair_ids(measurement: Measurement, data_root=None) -> tuple[list[int], list[int]]:
    """The reference and the target image of each pair ``run`` measures for ``measurement``, by index.

    Indices in the two test splits (``Measurement.pair_indices``): what ``ranking.ranking_uncertainty`` resamples
    where an image repeats."""
    reference = datasets.get_dataset(measurement.reference, "test", root=data_root)
    target = datasets.get_dataset(measurement.dataset, "test", root=data_root, severity=measurement.severity)
    return measurement.pair_indices(len(reference), len(target))


def pair_images(measurement: Measurement, data_root=None) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """The model and the images of the pairs ``run`` measures for ``measurement``, in memory.

    (network, x, y), x the reference images and y the target's, paired by position
    (``Measurement.pair_indices``, as ``run``); for ``scale_curve`` on a notebook's own pairs."""
    network, _, reference_set, target_set = _pair_sets(measurement, data_root)
    chosen = measurement.pair_indices(len(reference_set), len(target_set))
    x, y = ([images[i][0] for i in indices] for images, indices in zip((reference_set, target_set), chosen))
    return network, torch.stack(x), torch.stack(y)


def run(
    measurement: Measurement,
    *,
    batch_size: int = 64,
    device: str = "cpu",
    data_root=None,
    progress: bool = True,
    num_workers: int | None = None,
) -> tuple[pd.DataFrame, Path]:
    """Make one measurement and save it in its folder (``Measurement.folder``), replacing what was there.

    The model's pretrained weights; the test splits of both datasets at the model's resolution, read
    from ``data_root`` (None: ``$VIT_PLASTICITY_DATA`` or ``data/``). With the authors' pair set
    (``sample="first"``) ``n_pairs`` pairs are measured whatever the test split's size: a smaller
    one repeats (Cifar10-C's 2,000 images against the paper's 12,800 pairs); with ``once`` or
    ``random``, at most as many as the smaller set has. ``batch_size`` pairs at a time on ``device``; ``num_workers``:
    DataLoader workers decoding images (default: up to 8 on CUDA, where decoding JPEGs in the main
    process would leave the GPU waiting; none on a CPU). Returns the tidy table and its folder. Its record
    (``Measurement.metadata``) holds what it found: the pairs used (``n_pairs``, identical ones included), the distinct
    images of each side, ``token_rms``, ``identical_pairs_excluded``, and how it ran.
    """
    device = devices.check_device(device)  # before any data is read: a device this machine has
    network, mean_std, reference_set, target_set = _pair_sets(measurement, data_root)
    start = time.perf_counter()
    if num_workers is None:
        num_workers = decode_workers() if device.type == "cuda" else 0
    indices = measurement.pair_indices(len(reference_set), len(target_set))
    pairs, distinct = len(indices[0]), [len(set(chosen)) for chosen in indices]
    if progress and (pairs < measurement.n_pairs or min(distinct) < pairs):
        print(
            f"{measurement.dataset}: {pairs} pairs of {distinct[0]} distinct {measurement.reference} images "
            f"(of {len(reference_set)}) and {distinct[1]} distinct {measurement.dataset} images (of {len(target_set)})"
        )
    threads_used = threads.apply()  # this process's share of the cores, if it shares them with others of ours
    with storage.locked(measurement.folder()):  # one writer: another process measuring the same result is waited for
        table = measure(
            network,
            reference_set,
            target_set,
            pairs,
            measurement.inputs,
            draw=PairDraw(measurement.sample, measurement.seed, measurement.loader_batch),
            running=Running(batch_size, device, num_workers, progress),
        )
        # what it found (the table's attrs: token_rms, identical_pairs_excluded) and how it ran
        found = {"n_pairs": pairs, "distinct_reference": distinct[0], "distinct_target": distinct[1], **table.attrs}
        found |= {"mean": list(mean_std[0]), "std": list(mean_std[1]), "image_size": network.patch_embed.img_size[0]}
        found |= {"device": str(device), "threads": threads_used, "seconds": round(time.perf_counter() - start, 2)}
        return table, save(table, measurement, found | {"torch": torch.__version__})


def measure_missing(
    measurements: Iterable[Measurement],
    *,
    batch_size: int = 64,
    device: str = "cpu",
    data_root=None,
    progress: bool = False,
) -> list[Measurement]:
    """Make every measurement of ``measurements`` not saved yet; returns those it made.

    ``measurements``: an iterable of ``Measurement``, made in order, with ``run``'s options as given, as the notebooks
    do before ``collect``. A measurement that another process is making is waited for, then found saved."""
    made = []
    for measurement in measurements:
        if measurement.is_saved():
            continue
        with storage.locked(measurement.folder()):  # one measures, others wait for it and then find its result
            if measurement.is_saved():
                continue
            run(measurement, batch_size=batch_size, device=device, data_root=data_root, progress=progress)
        made.append(measurement)
    return made


def main(argv: list[str] | None = None) -> int:
    """One plasticity measurement from the command line, as notebook 02 makes it.

    ``python -m paperlib plasticity [-f FILE] [--model M --dataset D --reference R --n-pairs N ...]``:
    one measurement, as notebook 02 makes it, without the notebook; prints P(f) and the ranking."""
    try:
        values = cli.parse_parameters(argv, commands.plasticity(), commands.PLASTICITY)
        given = {name: values.pop(name) for name in commands.MEASURING if name in values}
        table, folder = run(Measurement(**values), **given)
    except cli.BAD_INPUT as error:
        return cli.fail(error)
    print(ranked(table).round(4).to_string())
    print(f"Kendall's tau with the paper's ranking: {paper_agreement(table):.2f}; saved in {paths.display(folder)}")
    return 0
