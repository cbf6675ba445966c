"""Plasticity of the ViT components (paper §3, Definition 1; §5.1; appendix C.4).

For image pairs (x from the pretraining distribution, y from a downstream set, paired by
position), the rate of change of every component of every block on each pair is Definition 1's
(``component_rates``: computed exactly and fast), and the plasticity P(f) is its mean over pairs.
``measure`` runs the rates over two datasets in batches on a device; ``rates`` does one batch.

The same holds for timm's later ViTs (``components``): an ``Eva`` model's embedding
(DINOv3, EVA-02, ...) is its ``_pos_embed`` tokens, and its attention is applied to them with the
rotary position embedding the model gives its blocks; RMSNorm is measured as LayerNorm is; FC1 of
a SwiGLU block is its gate and value layers together.

``run`` measures one model on one dataset and saves the result in its ``result_folder``;
``has_result`` says whether that folder holds a complete result, ``measure_missing`` runs what is
not there yet, and ``collect`` reads every saved result as one table of P(f).

Identical pairs (two exactly equal embeddings, x == y) have no rate (0/0): ``rates`` and
``measure`` exclude them with an ``IdenticalPairsWarning`` naming how many, counted in
``table.attrs["identical_pairs_excluded"]`` and ``run``'s metadata; the other pairs keep their
numbers and exact rates. ``ranking``, ``plasticity_by_block`` and ``ranking_uncertainty`` leave
out, with the same warning, pairs without any rate in tables made otherwise (``to_table``).

The scale of the embeddings (beyond the paper): a linear map's rate does not change when both
embeddings are multiplied by a, a LayerNorm's falls as 1/a, so the ranking depends on the size of
the tokens. Every result records the token RMS norm of its embeddings (``table.attrs["token_rms"]``,
``token_rms`` in ``run``'s metadata and ``collect``): the square root of the mean of
``||token||_2^2`` over every token (class token included) of both images of every measured pair,
the paper's r (Fig. 6: 19.4 for ViT-B/16 in21k on Cifar10; ``bounds.token_radius``'s ``rms``).
``scale_curve`` gives P(f) with the embeddings multiplied by factors, ``paper_order_from`` from
which factor on it follows the paper's ranking.
"""

from __future__ import annotations

import inspect
import json
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from scipy import stats
from torch import nn
from torch.utils.data import DataLoader, Subset
from tqdm.auto import tqdm

from . import cli, data, models, paths, threads
from .component_rates import (
    IdenticalPairsWarning,
    batch_pair_rates,
    check_inputs,
    evaluating,
    linear_terms,
    pair_rates,
    tabulate,
)
from .components import COMPONENTS, LABELS
from .loader import decode_workers
from .splits import SPLITS_VERSION
from .transforms import check_normalize

SAMPLES = ("first", "random")
"""How the pairs are drawn: ``first``, the first ``n_pairs`` images of each set paired by position
(as the authors' code pairs them); ``random``, a random subset of each set, drawn with a seed (class
folders are sorted by class, so the first images of a large set are its first classes)."""


def check_sample(sample: str) -> str:
    """Return ``sample`` or raise a ValueError naming the valid choices."""
    if sample not in SAMPLES:
        raise ValueError(f"unknown sample {sample!r}; valid samples: {', '.join(SAMPLES)}")
    return sample


def pair_indices(
    n_reference: int, n_target: int, n_pairs: int, sample: str = "first", seed: int = 0
) -> tuple[list[int], list[int]]:
    """Which images make the pairs: pair ``i`` is (reference[r[i]], target[t[i]]) for the returned (r, t).

    ``first``: both ``range(n_pairs)``. ``random``: ``n_pairs`` distinct images of each set, each
    set drawn by a generator of its own (seeded ``2 * seed`` for the reference, ``2 * seed + 1`` for
    the target), so the same seed gives the same images of a set on every machine, whatever the
    other set, and the two draws are not the same permutation.
    """
    check_sample(sample)
    if not 1 <= n_pairs <= min(n_reference, n_target):
        raise ValueError(
            f"n_pairs must be in 1..{min(n_reference, n_target)} "
            f"(the reference has {n_reference} images and the target {n_target}), got {n_pairs}"
        )
    if sample == "first":
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


def _with_rates(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` without the pairs that have no rate at all (identical embeddings, 0/0), with a warning."""
    if "pair" not in table:
        return table
    unmeasured = set(table["pair"].unique()) - set(table.loc[table["rate"].notna(), "pair"].unique())
    if not unmeasured:
        return table
    warnings.warn(
        f"{len(unmeasured)} pairs without any rate left out (identical embeddings, x == y: 0/0)",
        IdenticalPairsWarning,
        stacklevel=3,
    )
    return table[~table["pair"].isin(unmeasured)]


def plasticity_by_block(table: pd.DataFrame) -> pd.DataFrame:
    """P(f) per block and component (mean rate over pairs): blocks as rows, components as columns."""
    table = _with_rates(table)
    return table.groupby(["block", "component"], observed=True)["rate"].mean().unstack("component")[list(COMPONENTS)]


def ranking(table: pd.DataFrame) -> pd.DataFrame:
    """P(f) per component (mean over pairs and blocks), ranked, with the paper's rank beside it."""
    table = _with_rates(table)
    mean = table.groupby("component", observed=True)["rate"].mean().reindex(list(COMPONENTS))
    out = pd.DataFrame(
        {
            "component": [LABELS[c] for c in mean.index],
            "plasticity": mean.to_numpy(),
            "paper rank": range(1, len(COMPONENTS) + 1),
        }
    )
    out["rank"] = out["plasticity"].rank(ascending=False, method="min").astype(int)
    return out.sort_values("rank").set_index("component")[["plasticity", "rank", "paper rank"]]


def paper_agreement(table: pd.DataFrame) -> float:
    """Kendall's tau between this model's ranking and the paper's (MHA > FC1 > FC2 > LN2 > LN1).

    1 means the same order, -1 the reverse.
    """
    ranked = ranking(table)
    return float(stats.kendalltau(ranked["rank"], ranked["paper rank"]).statistic)


def ranking_uncertainty(
    table: pd.DataFrame, n_resamples: int = 2000, confidence: float = 0.95, seed: int = 0
) -> pd.DataFrame:
    """How sure the ranking is: a bootstrap over pairs (an extension; the paper reports P(f) alone).

    Each pair's rates, averaged over blocks, are resampled jointly for the five components
    (``scipy.stats.bootstrap``, percentile intervals). Returns, per component in rank order:
    ``plasticity`` and its ``low``/``high`` interval, ``rank``, and ``rank stable`` (the fraction
    of resamples that give the component the same rank). The attribute ``attrs["tau"]`` holds the
    interval of Kendall's tau with the paper's ranking, ``attrs["order stable"]`` the fraction of
    resamples with the whole order unchanged. Pairs without any rate (identical embeddings) are
    left out, with a warning, so they make no NaN interval.
    """
    table = _with_rates(table)
    per_pair = table.groupby(["pair", "component"], observed=True)["rate"].mean().unstack("component")[list(COMPONENTS)]
    result = stats.bootstrap(
        (per_pair.to_numpy(),),
        np.mean,
        axis=0,
        n_resamples=n_resamples,
        confidence_level=confidence,
        method="percentile",
        batch=200,
        rng=np.random.default_rng(seed),
    )
    means = per_pair.to_numpy().mean(axis=0)
    ranks = stats.rankdata(-means, method="min")
    resampled = stats.rankdata(-result.bootstrap_distribution.T, method="min", axis=1)  # (resamples, components)
    taus = np.array([stats.kendalltau(row, np.arange(1, len(COMPONENTS) + 1)).statistic for row in resampled])
    out = (
        pd.DataFrame(
            {
                "component": [LABELS[c] for c in COMPONENTS],
                "plasticity": means,
                "low": result.confidence_interval.low,
                "high": result.confidence_interval.high,
                "rank": ranks,
                "rank stable": (resampled == ranks).mean(axis=0),
            }
        )
        .sort_values("rank")
        .set_index("component")
    )
    tail = (1 - confidence) / 2
    out.attrs["tau"] = (float(np.quantile(taus, tail)), float(np.quantile(taus, 1 - tail)))
    out.attrs["order stable"] = float((resampled == ranks).all(axis=1).mean())
    return out


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


def scale_ranking(curve: pd.DataFrame) -> pd.DataFrame:
    """Per factor of ``scale_curve``'s table (ascending): ``order``, the components by decreasing
    P(f) ("FC1 > MHA > ..."), and ``follows paper``, whether that is strictly the paper's ranking
    MHA > FC1 > FC2 > LN2 > LN1."""
    wide = curve.pivot_table(index="factor", columns="component", values="plasticity", observed=True)
    wide = wide[list(COMPONENTS)].sort_index()
    values = wide.to_numpy()
    order = [" > ".join(LABELS[COMPONENTS[i]] for i in np.argsort(-row, kind="stable")) for row in values]
    return pd.DataFrame({"order": order, "follows paper": (np.diff(values, axis=1) < 0).all(axis=1)}, wide.index)


def paper_order_from(curve: pd.DataFrame) -> float | None:
    """The smallest factor of ``scale_curve``'s table from which on (at it and at every larger
    factor of the table) P(f) follows the paper's ranking (``scale_ranking``); None if it does not
    at the largest factor."""
    follows = scale_ranking(curve)["follows paper"]
    onset = None
    for factor, holds in zip(follows.index[::-1], follows.to_numpy()[::-1]):
        if not holds:
            break
        onset = float(factor)
    return onset


def measure(
    model: nn.Module,
    reference,
    target,
    n_pairs: int,
    batch_size: int = 64,
    device: str | torch.device = "cpu",
    inputs: str = "embedding",
    num_workers: int = 0,
    progress: bool = True,
    sample: str = "first",
    seed: int = 0,
) -> pd.DataFrame:
    """Rates of change over ``n_pairs`` image pairs streamed from two datasets (§5.1).

    Pair ``i`` is (``reference[i]``, ``target[i]``) (``sample="first"``, the paper's; or a seeded
    random subset of each set, ``pair_indices``): reference = images of the pretraining
    distribution, target = the downstream test split, both yielding (normalised image, label).
    Returns the tidy table of ``rates`` for all pairs but those with identical embeddings
    (excluded, with an ``IdenticalPairsWarning`` naming how many); ``table.attrs["token_rms"]``
    is the token RMS norm of the measured pairs' embeddings, ``table.attrs["identical_pairs_excluded"]``
    the count.
    """
    check_inputs(inputs)
    if n_pairs < 1:
        raise ValueError(f"n_pairs must be at least 1, got {n_pairs}")
    available = min(len(reference), len(target))
    if n_pairs > available:
        raise ValueError(
            f"n_pairs={n_pairs} but only {available} pairs: "
            f"the reference has {len(reference)} images and the target {len(target)}"
        )
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    indices = pair_indices(len(reference), len(target), n_pairs, sample, seed)
    device = torch.device(device)
    model = model.to(device)
    loaders = [
        DataLoader(
            Subset(dataset, chosen), batch_size=batch_size, num_workers=num_workers, pin_memory=device.type == "cuda"
        )
        for dataset, chosen in zip((reference, target), indices)
    ]
    parts = []
    with evaluating(model, inputs), tqdm(total=n_pairs, desc="pairs", unit="pair", disable=not progress) as bar:
        terms = linear_terms(model) if inputs == "embedding" else None
        for (x, _), (y, _) in zip(*loaders):
            parts.append(
                batch_pair_rates(model, x.to(device, non_blocking=True), y.to(device, non_blocking=True), inputs, terms)
            )
            bar.update(len(x))
    return tabulate(parts)


def results_root(inputs: str = "embedding"):
    """``results/plasticity`` (``results/plasticity_in_situ`` for the extension)."""
    return paths.results_dir() / ("plasticity" if check_inputs(inputs) == "embedding" else "plasticity_in_situ")


def default_reference(dataset: str) -> str:
    """The reference images a dataset is measured against unless asked otherwise: the demo
    world's ``digits_source`` for its datasets, ImageNet (the paper's) for every other."""
    source = data.DATASETS.get(dataset)  # a custom dataset need not be there any more for its results to be read
    return "digits_source" if source is not None and source.group == "demo" else "imagenet"


def result_folder(
    model: str,
    dataset: str,
    inputs: str = "embedding",
    sample: str = "first",
    seed: int = 0,
    normalize: str = "imagenet",
    reference: str | None = None,
    severity: int = 5,
):
    """``results/plasticity/<model>/<dataset>/``: where ``run`` saves one result
    (``<dataset>+random-seed=<seed>`` for pairs drawn at random, ``+norm-model`` for images
    normalised with the model's own statistics, ``+ref-<reference>`` against reference images
    other than the dataset's ``default_reference`` (None: the default), ``+severity-<s>`` for a
    Cifar10-C corruption at another severity than the paper's 5)."""
    leaf = dataset if check_sample(sample) == "first" else f"{dataset}+random-seed={seed}"
    leaf += "" if check_normalize(normalize) == "imagenet" else f"+norm-{normalize}"
    if reference is not None and reference != default_reference(dataset):
        leaf += f"+ref-{reference.replace('/', '_')}"
    if dataset.startswith("cifar10c/") and severity != 5:
        leaf += f"+severity-{severity}"
    return results_root(inputs) / model / leaf


def has_result(
    model: str,
    dataset: str,
    inputs: str = "embedding",
    sample: str = "first",
    seed: int = 0,
    normalize: str = "imagenet",
    reference: str | None = None,
    severity: int = 5,
) -> bool:
    """Whether ``result_folder`` for these arguments holds a complete result of today's test splits: its
    ``metadata.json`` (which ``save`` writes last) whole, and ``rates.csv.gz`` of the size it records
    (``paths.json_or_none``: a damaged result is reported in a warning and not taken for one), measured on
    the splits of ``SPLITS_VERSION`` (pairs are the first test images: other splits, other pairs)."""
    folder = result_folder(model, dataset, inputs, sample, seed, normalize, reference, severity)
    metadata = paths.json_or_none(folder / "metadata.json")
    return metadata is not None and metadata.get("splits", 1) == SPLITS_VERSION


def save(table: pd.DataFrame, folder, metadata: dict | None = None) -> Path:
    """Write the tidy table (``rates.csv.gz``) and ``metadata.json`` into ``folder``, atomically.

    ``metadata.json`` is written last, with the table's size (``files``) and today's splits
    (``SPLITS_VERSION``): its presence marks a complete result, and a table damaged since is not taken for one.
    """
    folder = Path(folder)
    paths.atomic_write(folder / "rates.csv.gz", lambda tmp: table.to_csv(tmp, index=False, compression="gzip"))
    metadata = {"splits": SPLITS_VERSION, **(metadata or {}), "files": paths.file_sizes(folder, ["rates.csv.gz"])}
    paths.atomic_write_text(folder / "metadata.json", json.dumps(metadata, indent=2, default=str) + "\n")
    return folder


def load(folder) -> pd.DataFrame:
    """Read a table written by ``save`` (with ``component`` as the ordered categorical, and
    ``attrs`` ``token_rms`` and ``identical_pairs_excluded`` from its metadata where recorded); an
    error naming the file if the result is missing or damaged (``paths.read_json``)."""
    folder = Path(folder)
    metadata = paths.read_json(folder / "metadata.json")
    table = pd.read_csv(folder / "rates.csv.gz")
    table["component"] = pd.Categorical(table["component"], categories=COMPONENTS)
    table.attrs.update({key: metadata[key] for key in ("token_rms", "identical_pairs_excluded") if key in metadata})
    return table


def _pair_sets(model: str, dataset: str, reference: str, root, severity: int, normalize: str):
    """The model (pretrained weights), its normalisation and the test splits of both datasets at its resolution."""
    mean_std = models.normalization(model, normalize)
    network = models.create_model(model)
    size = network.patch_embed.img_size[0]
    reference_set = data.get_dataset(reference, "test", root=root, image_size=size, mean_std=mean_std)
    target_set = data.get_dataset(dataset, "test", root=root, image_size=size, severity=severity, mean_std=mean_std)
    return network, mean_std, reference_set, target_set


def pair_images(
    model: str,
    dataset: str,
    reference: str,
    n_pairs: int,
    root=None,
    severity: int = 5,
    sample: str = "first",
    seed: int = 0,
    normalize: str = "imagenet",
) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """The model and the images of the pairs ``run`` measures with these arguments, in memory:
    (network, x, y), x the reference images and y the target's, paired by position (at most
    ``n_pairs``, as ``run``); for ``scale_curve`` on a notebook's own pairs."""
    network, _, reference_set, target_set = _pair_sets(model, dataset, reference, root, severity, normalize)
    pairs = min(n_pairs, len(reference_set), len(target_set))
    chosen = pair_indices(len(reference_set), len(target_set), pairs, sample, seed)
    x, y = ([images[i][0] for i in indices] for images, indices in zip((reference_set, target_set), chosen))
    return network, torch.stack(x), torch.stack(y)


def run(
    model: str,
    dataset: str,
    reference: str,
    n_pairs: int,
    batch_size: int = 64,
    device: str = "cpu",
    inputs: str = "embedding",
    root=None,
    severity: int = 5,
    progress: bool = True,
    num_workers: int | None = None,
    sample: str = "first",
    seed: int = 0,
    normalize: str = "imagenet",
) -> tuple[pd.DataFrame, Path]:
    """Measure one model on one downstream dataset against reference images, and save the result.

    The model's pretrained weights; the test splits of both datasets at the model's resolution.
    ``n_pairs`` is at most that many pairs: a test split with fewer images (Cifar10-C's 2,000,
    Pets' 3,669 against the paper's 12,800) gives as many pairs as it has, and the metadata record
    both (``n_pairs`` used, ``n_pairs_requested``). ``sample``/``seed``: which images make the pairs
    (``SAMPLES``; the paper's ``first``, or ``random`` with its seed, saved in a folder of its own).
    ``normalize``: ``imagenet`` (the paper's ImageNet mean and std) or ``model`` (the statistics the
    model was pretrained with, ``models.normalization``; a folder of its own). ``num_workers``: DataLoader
    workers decoding images (default: up to 8 on CUDA, where decoding JPEGs in the main process would leave
    the GPU waiting; none on a CPU). Returns the tidy table and the folder it was saved in (``result_folder``).
    The metadata also record ``token_rms`` (the token RMS norm of the measured embeddings) and
    ``identical_pairs_excluded`` (pairs left out for identical embeddings; ``n_pairs`` includes them).
    """
    check_inputs(inputs)
    check_sample(sample)
    if n_pairs < 1:
        raise ValueError(f"n_pairs must be at least 1, got {n_pairs}")
    device = cli.check_device(device)  # before any data is read: a device this machine has
    network, mean_std, reference_set, target_set = _pair_sets(model, dataset, reference, root, severity, normalize)
    size = network.patch_embed.img_size[0]
    start = time.perf_counter()
    if num_workers is None:
        num_workers = decode_workers() if device.type == "cuda" else 0
    pairs = min(n_pairs, len(reference_set), len(target_set))
    if pairs < n_pairs and progress:
        print(
            f"{dataset}: {pairs} pairs, not {n_pairs}: "
            f"{reference} has {len(reference_set)} test images and {dataset} {len(target_set)}"
        )
    folder = result_folder(model, dataset, inputs, sample, seed, normalize, reference, severity)
    threads_used = threads.apply()  # this process's share of the cores, if it shares them with others of ours
    with paths.locked(folder):  # one writer: a process measuring the same result beside this one is waited for
        table = measure(
            network,
            reference_set,
            target_set,
            pairs,
            batch_size,
            device,
            inputs,
            num_workers=num_workers,
            progress=progress,
            sample=sample,
            seed=seed,
        )
        metadata = {
            "model": model,
            "dataset": dataset,
            "reference": reference,
            "n_pairs": pairs,
            "n_pairs_requested": n_pairs,
            "identical_pairs_excluded": table.attrs["identical_pairs_excluded"],
            "token_rms": table.attrs["token_rms"],
            "sample": sample,
            "seed": seed if sample == "random" else None,
            "inputs": inputs,
            "normalize": normalize,
            "mean": list(mean_std[0]),
            "std": list(mean_std[1]),
            "image_size": size,
            "severity": severity if dataset.startswith("cifar10c/") else None,
            "device": str(device),
            "threads": threads_used,
            "seconds": round(time.perf_counter() - start, 2),
            "torch": torch.__version__,
        }
        return table, save(table, folder, metadata)


def measure_missing(
    models: str | list[str],
    datasets: str | list[str],
    reference: str | None = None,
    n_pairs: int = 179,
    batch_size: int = 64,
    device: str = "cpu",
    inputs: str = "embedding",
    sample: str = "first",
    seed: int = 0,
    normalize: str = "imagenet",
    root=None,
    progress: bool = False,
) -> list[tuple[str, str]]:
    """Measure every model on every dataset that has no result yet, as the notebooks do before ``collect``.

    ``models``, ``datasets``: a name or a list of names. For each (model, dataset), models outer,
    without ``has_result`` for these arguments, ``run`` measures it against ``reference`` (None:
    the dataset's ``default_reference``) with the other arguments as they are given. ``n_pairs``:
    notebook 02's 179 unless given (``run`` has no default; the paper's is 12,800). Returns the
    (model, dataset) pairs measured, in that order.
    """
    models = [models] if isinstance(models, str) else list(models)
    datasets = [datasets] if isinstance(datasets, str) else list(datasets)
    measured = []
    for model in models:
        for dataset in datasets:
            if has_result(model, dataset, inputs, sample, seed, normalize, reference):
                continue
            # one measures, others wait for it and then find its result
            with paths.locked(result_folder(model, dataset, inputs, sample, seed, normalize, reference)):
                if has_result(model, dataset, inputs, sample, seed, normalize, reference):
                    continue
                against = reference if reference is not None else default_reference(dataset)
                run(
                    model,
                    dataset,
                    against,
                    n_pairs,
                    batch_size,
                    device,
                    inputs,
                    root=root,
                    progress=progress,
                    sample=sample,
                    seed=seed,
                    normalize=normalize,
                )
            measured.append((model, dataset))
    return measured


def collect(
    inputs: str = "embedding",
    root=None,
    sample: str | None = "first",
    seed: int | None = None,
    normalize: str | None = "imagenet",
    reference: str | None = "default",
    severity: int | None = 5,
) -> pd.DataFrame:
    """P(f) of every saved result: one row per model, dataset (and draw of pairs) and component.

    Columns ``model``, ``dataset``, ``reference``, ``component``, ``plasticity`` (mean rate over
    pairs and blocks), ``rank`` (1 = most plastic for that model and dataset), ``n_pairs``,
    ``sample``, ``seed``, ``normalize``, ``token_rms`` (the token RMS norm of the measured
    embeddings; missing for results saved before it was recorded). Only results whose pairs were
    drawn by ``sample`` (the paper's ``first`` by default; None: all) and, if given, ``seed``, whose images were
    normalised as ``normalize`` says (the paper's ``imagenet`` by default; None: all), and whose
    reference images were ``reference`` (``"default"``: each dataset's ``default_reference``; a
    name; None: all), and, for Cifar10-C, whose corruption had ``severity`` (the paper's 5; None:
    all): a model and dataset measured several ways would otherwise count twice. Results measured on
    earlier test splits (``SPLITS_VERSION``) are left out with a warning that names them.
    """
    if sample is not None:
        check_sample(sample)
    if normalize is not None:
        check_normalize(normalize)
    base = Path(root) if root is not None else results_root(inputs)
    rows, outdated = [], []
    for metadata_file in sorted(base.rglob("metadata.json")):
        metadata = paths.read_json(metadata_file)  # a damaged result: an error that names the file
        # results from before the option: first
        drawn, drawn_seed = (metadata.get("sample", "first"), metadata.get("seed"))
        normalized = metadata.get("normalize", "imagenet")  # results from before the option: the paper's
        if (
            (sample is not None and drawn != sample)
            or (seed is not None and drawn_seed != seed)
            or (normalize is not None and normalized != normalize)
        ):
            continue
        against = metadata.get("reference")
        if (
            reference is not None
            and against is not None
            and against != (default_reference(metadata["dataset"]) if reference == "default" else reference)
        ):
            continue
        if severity is not None and (metadata.get("severity") or severity) != severity:
            continue
        if metadata.get("splits", 1) != SPLITS_VERSION:
            outdated.append(paths.display(metadata_file.parent))
            continue
        ranked = ranking(load(metadata_file.parent))
        for label, row in ranked.iterrows():
            component = next(c for c in COMPONENTS if LABELS[c] == label)
            rows.append(
                {
                    "model": metadata.get("model"),
                    "dataset": metadata.get("dataset"),
                    "reference": metadata.get("reference"),
                    "component": component,
                    "plasticity": row["plasticity"],
                    "rank": int(row["rank"]),
                    "n_pairs": metadata.get("n_pairs"),
                    "sample": drawn,
                    "seed": drawn_seed,
                    "normalize": normalized,
                    "token_rms": metadata.get("token_rms"),
                }
            )
    columns = [
        "model",
        "dataset",
        "reference",
        "component",
        "plasticity",
        "rank",
        "n_pairs",
        "sample",
        "seed",
        "normalize",
        "token_rms",
    ]
    table = pd.DataFrame(rows, columns=columns)
    table["component"] = pd.Categorical(table["component"], categories=COMPONENTS)
    # None (the paper's draw has no seed) stays missing, not NaN in a float column
    table["seed"] = table["seed"].astype("Int64")
    table["token_rms"] = table["token_rms"].astype(float)
    if outdated:
        warnings.warn(f"results of earlier test splits left out (measure them again): {', '.join(outdated)}")
    return table


CLI_DEFAULTS = {"model": "demo", "dataset": "digits", "reference": "digits_source", "n_pairs": 179}
"""``python -m paperlib.plasticity``'s defaults for ``run``'s required arguments: notebook 02's (the demo world)."""


def main(argv: list[str] | None = None) -> int:
    """``python -m paperlib.plasticity [-f FILE] [--model M --dataset D --reference R --n-pairs N ...]``:
    one measurement, as notebook 02 makes it, without the notebook; prints P(f) and the ranking."""
    signature = inspect.signature(run).parameters
    defaults = {name: CLI_DEFAULTS.get(name, p.default) for name, p in signature.items()}
    defaults["num_workers"] = 0  # run's None (automatic) as a number a command line can give; None stays automatic
    try:
        values = cli.parameters(
            argv,
            defaults,
            {"data_root": "root"},
            "Plasticity of every component (paper §5.1); notebook 02's parameters.",
            "python -m paperlib.plasticity",
        )
        values.setdefault("num_workers", None)
        table, folder = run(**{**CLI_DEFAULTS, **values})
    except cli.BAD_INPUT as error:
        return cli.fail(error)
    ranked = ranking(table)
    print(ranked.round(4).to_string())
    print(f"Kendall's tau with the paper's ranking: {paper_agreement(table):.2f}; saved in {paths.display(folder)}")
    return 0


# the package's module, not this __main__ copy of it, so its classes are the ones imported elsewhere
if __name__ == "__main__":
    from paperlib.plasticity import main as _main

    raise SystemExit(_main())
