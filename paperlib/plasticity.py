"""Plasticity of the ViT components (paper §3, Definition 1; §5.1; appendix C.4).

For image pairs (x from the pretraining distribution, y from a downstream set, paired by
position), both are embedded once, ``e(x) = model._pos_embed(model.patch_embed(x))`` (patch
embedding, class token, position embedding), and every component ``f`` of every block is applied
to that same pair of embeddings. The rate of change of a pair is

    ||f(e(x)) - f(e(y))||_F / ||e(x) - e(y)||_F,

and the plasticity P(f) is its mean over pairs. FC2 takes 4d inputs: tokens are lifted to 4d
by zero-padding (appendix C.4). ``inputs="in_situ"`` is an extension the paper does not have:
each component receives its actual input in the forward pass instead of the embedding.

The same holds for timm's later ViTs (``components``): an ``Eva`` model's embedding
(DINOv3, EVA-02, ...) is its ``_pos_embed`` tokens, and its attention is applied to them with the
rotary position embedding the model gives its blocks; RMSNorm is measured as LayerNorm is; FC1 of
a SwiGLU block is its gate and value layers together.

``rates`` is exact but does less work than the definition read literally (``plain_rates``):
a difference through a linear map needs one product, not two, and its bias cancels; better, a
linear map W enters only through its d x d Gram matrix, ``||D W^T||_F^2 = <D^T D, W^T W>``, so
the d x d Gram matrix of each pair's difference D, computed once, serves FC1 and FC2 of every
block (the zero-lifted FC2 only reads the first d columns of its weight); a LayerNorm's
normalisation is the same in every block, only its gain differs, and its bias cancels; MHA runs
once on both sides of every pair. Sums of squares are taken in float64. No component output
leaves the device: only the rates do, once per batch.

``run`` measures one model on one dataset and saves the result in its ``result_folder``;
``has_result`` says whether that folder holds a complete result, ``measure_missing`` runs what is
not there yet, and ``collect`` reads every saved result as one table of P(f).
"""

from __future__ import annotations

import contextlib
import inspect
import json
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from scipy import stats
from timm.layers import RmsNorm
from torch import nn
from torch.utils.data import DataLoader, Subset
from tqdm.auto import tqdm

from . import cli, data, models, paths
from .components import COMPONENTS, LABELS, block_component, blocks
from .loader import decode_workers
from .transforms import check_normalize

INPUTS = ("embedding", "in_situ")


def check_inputs(inputs: str) -> str:
    """Return ``inputs`` or raise a ValueError naming the valid choices."""
    if inputs not in INPUTS:
        raise ValueError(f"unknown inputs {inputs!r}; valid inputs: {', '.join(INPUTS)}")
    return inputs


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
            f"n_pairs must be in 1..{min(n_reference, n_target)} (the reference has {n_reference} images and the target {n_target}), got {n_pairs}"
        )
    if sample == "first":
        return list(range(n_pairs)), list(range(n_pairs))
    reference = torch.randperm(n_reference, generator=torch.Generator().manual_seed(2 * seed))[:n_pairs]
    target = torch.randperm(n_target, generator=torch.Generator().manual_seed(2 * seed + 1))[:n_pairs]
    return reference.tolist(), target.tolist()


def _embedded(model: nn.Module, images: torch.Tensor) -> tuple[torch.Tensor, list[dict]]:
    """The embedding's tokens (B, n, d), and per block what its attention takes beside them: nothing
    for a ``VisionTransformer``; for an ``Eva`` model, whose ``_pos_embed`` also returns the rotary
    position embedding (RoPE), that embedding as its blocks get it (one per block when mixed)."""
    out = model._pos_embed(model.patch_embed(images))
    tokens, rope = out if isinstance(out, tuple) else (out, None)
    if rope is None:
        return tokens, [{} for _ in model.blocks]
    mixed = getattr(model, "rope_mixed", False)
    return tokens, [{"rope": rope[index] if mixed else rope} for index in range(len(model.blocks))]


def embed(model: nn.Module, images: torch.Tensor) -> torch.Tensor:
    """Token sequences (B, n, d) of the embedding layer: patches, class token, positions."""
    return _embedded(model, images)[0]


def _frobenius(difference: torch.Tensor) -> torch.Tensor:
    """Per-pair Frobenius norm of (B, n, k) differences, in float64 for stable ratios."""
    return torch.linalg.vector_norm(difference.double().flatten(1), dim=1)


def _lift(tokens: torch.Tensor, width: int) -> torch.Tensor:
    """Zero-pad tokens (B, n, d) to (B, n, width) (appendix C.4)."""
    return nn.functional.pad(tokens, (0, width - tokens.shape[-1]))


def _norm_kind(norm: nn.Module) -> str | None:
    """ "layer" for a LayerNorm, "rms" for an RMSNorm (timm's or torch's), None otherwise."""
    if isinstance(norm, nn.LayerNorm):
        return "layer"
    if isinstance(norm, (RmsNorm, getattr(nn, "RMSNorm", RmsNorm))):
        return "rms"
    return None


def _norm_core(tokens: torch.Tensor, norm: nn.Module) -> torch.Tensor:
    """Each token normalised without the gain: the part of a LayerNorm ((x - mean) / std) or of an
    RMSNorm (x / rms) shared by every block with the same eps."""
    if _norm_kind(norm) == "layer":
        return nn.functional.layer_norm(tokens, norm.normalized_shape, None, None, norm.eps)
    return nn.functional.rms_norm(tokens, norm.normalized_shape, None, norm.eps)


def _check_block(block: nn.Module) -> None:
    if any(type(module).__module__.startswith("peft.") for module in block.modules()):
        raise TypeError(
            "the model carries LoRA updates that are not merged into its weights, which the rates of the "
            "linear components would not see: lora.merge(model) first (finetune.load_model merges them)"
        )
    width = block.norm1.normalized_shape[-1] if hasattr(block, "norm1") else None
    for component in COMPONENTS:
        module = block_component(block, component)
        if component == "fc2" and width is not None and getattr(module, "in_features", width) < width:
            raise TypeError(
                f"FC2's input ({module.in_features}) is narrower than the tokens ({width}): the zero-lifting "
                "of appendix C.4 needs a hidden width of at least the embedding's"
            )
    for name in ("norm1", "norm2"):
        if _norm_kind(getattr(block, name)) is None:
            raise TypeError(
                f"plasticity expects a LayerNorm or an RMSNorm as {name}, got {type(getattr(block, name)).__name__}"
            )


def plain_rates(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Definition 1 read literally: every component applied to both embeddings; (blocks, 5, B).

    The reference that ``rates`` is tested against, and the baseline of the benchmark.
    """
    (ex, extras), (ey, _) = _embedded(model, x), _embedded(model, y)
    denominator = _frobenius(ex - ey)
    out = []
    for block, extra in zip(model.blocks, extras):
        row = []
        for component in COMPONENTS:
            module = block_component(block, component)
            if component == "fc2":
                fx, fy = module(_lift(ex, module.in_features)), module(_lift(ey, module.in_features))
            elif component == "mha":
                fx, fy = module(ex, **extra), module(ey, **extra)
            else:
                fx, fy = module(ex), module(ey)
            row.append(_frobenius(fx - fy) / denominator)
        out.append(torch.stack(row))
    return torch.stack(out)


def linear_terms(model: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """What the linear components contribute to every rate, computed once per model, in float64.

    Returns the (2L, d*d) Gram matrices ``W^T W`` of FC1 and of FC2's first d columns (the
    zero-lifted input reads no others), and the (2L, d) squared gains of LN2 and LN1, block by
    block in that order. ``measure`` computes them once for all batches.
    """
    d = model.blocks[0].norm1.normalized_shape[-1]
    grams, gains = [], []
    for block in model.blocks:
        for weight in (block_component(block, "fc1").weight, block_component(block, "fc2").weight[:, :d]):
            weight = weight.double()
            grams.append((weight.T @ weight).flatten())
        for norm in (block.norm2, block.norm1):
            gamma = norm.weight if norm.weight is not None else torch.ones(d, device=weight.device)
            gains.append(gamma.double() ** 2)
    return torch.stack(grams), torch.stack(gains)


PAIR_CHUNK = 32  # pairs whose d x d difference Gram matrices are held at once (float64)


def _embedding_rates(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, terms: tuple[torch.Tensor, torch.Tensor] | None = None
) -> torch.Tensor:
    (ex, extras), (ey, _) = _embedded(model, x), _embedded(model, y)
    difference = ex - ey
    b, _, d = ex.shape
    denominator = _frobenius(difference)
    grams, gains = terms if terms is not None else linear_terms(model)
    # FC1 and FC2: ||D W^T||_F^2 = <D^T D, W^T W>, so one d x d Gram matrix of each pair's
    # difference serves every block, where D W^T costs n*d*4d per block
    squared = torch.cat(
        [
            (chunk.transpose(1, 2).double() @ chunk.double()).flatten(1) @ grams.T
            for chunk in difference.split(PAIR_CHUNK)
        ]
    ).view(b, -1, 2)
    # LayerNorms (and RMSNorms): the normalisation is the same in every block (per kind and eps),
    # only the gain differs, and the bias cancels: ||C * gamma||_F^2 = sum_j gamma_j^2 sum_t C_tj^2
    both = torch.cat([ex, ey])  # one MHA call for the two sides of every pair
    columns: dict[tuple, torch.Tensor] = {}
    out = []
    for index, (block, extra) in enumerate(zip(model.blocks, extras)):
        rates = {}
        attn = block.attn(both, **extra)
        rates["mha"] = _frobenius(attn[:b] - attn[b:])
        rates["fc1"], rates["fc2"] = squared[:, index].clamp_min(0).sqrt().unbind(dim=1)
        for offset, (component, norm) in enumerate((("ln2", block.norm2), ("ln1", block.norm1))):
            key = (_norm_kind(norm), norm.eps)
            if key not in columns:
                core = _norm_core(both, norm)
                columns[key] = ((core[:b] - core[b:]).double() ** 2).sum(dim=1)  # (B, d)
            rates[component] = (columns[key] @ gains[2 * index + offset]).clamp_min(0).sqrt()
        out.append(torch.stack([rates[c] / denominator for c in COMPONENTS]))
    return torch.stack(out)


def _in_situ_rates(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Each component fed its actual input in the forward pass (an extension of the paper).

    The model runs its own ``forward_features`` on both sides of every pair at once, and a hook on
    each component reads its input and output as they pass, so whatever the block does between
    components (LayerScale, post-norm, RoPE) is what it does. FC1 is read at the feedforward
    layer's input, which is its input, and applied there (both layers of a SwiGLU; also when a
    fused op reads its weight instead of calling it). A component called other than once per
    forward pass (blocks sharing weights) has no in-situ rate, and is refused.
    """
    b = len(x)
    rates: dict[tuple[int, str], list] = {}

    def recorder(key, apply=None):
        def hook(module, args, output):
            inputs = args[0]
            output = apply(inputs) if apply is not None else output
            rate = _frobenius(output[:b] - output[b:]) / _frobenius(inputs[:b] - inputs[b:])
            rates.setdefault(key, []).append(rate)

        return hook

    handles = []
    try:
        for index, block in enumerate(model.blocks):
            for component in COMPONENTS:
                module = block_component(block, component)
                if component == "fc1":
                    handles.append(block.mlp.register_forward_hook(recorder((index, component), module)))
                else:
                    handles.append(module.register_forward_hook(recorder((index, component))))
        model.forward_features(torch.cat([x, y]))
    finally:
        for handle in handles:
            handle.remove()
    for key in ((i, c) for i in range(len(model.blocks)) for c in COMPONENTS):
        calls = len(rates.get(key, ()))
        if calls != 1:
            raise TypeError(
                f"{type(model).__name__}'s forward pass called {key[1]} of block {key[0]} {calls} times "
                "(blocks sharing weights?): in-situ rates need each component called once per block"
            )
    return torch.stack([torch.stack([rates[index, c][0] for c in COMPONENTS]) for index in range(len(model.blocks))])


def check_measurable(model: nn.Module) -> nn.Module:
    """``model``, once every block is found to have the five components in a form the rates are
    defined for (LayerNorm or RMSNorm, FC2 at least as wide as the tokens, no unmerged LoRA
    update); otherwise a TypeError that says what is wrong."""
    for block in blocks(model):
        _check_block(block)
    return model


@contextlib.contextmanager
def evaluating(model: nn.Module, inputs: str):
    """Checks the inputs mode and the blocks once (``check_inputs``, ``check_measurable``), and
    holds the model in eval mode, without gradients, for the ``with`` block; its mode is restored after."""
    check_inputs(inputs)
    check_measurable(model)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        model.train(was_training)


def _rates(model: nn.Module, x: torch.Tensor, y: torch.Tensor, inputs: str, terms) -> torch.Tensor:
    if x.shape != y.shape or x.ndim != 4:
        raise ValueError(
            f"x and y must be image batches of the same shape (N, 3, H, W), got {tuple(x.shape)} and {tuple(y.shape)}"
        )
    return _embedding_rates(model, x, y, terms) if inputs == "embedding" else _in_situ_rates(model, x, y)


def rate_tensor(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, inputs: str = "embedding", terms=None
) -> torch.Tensor:
    """Rates of change as a (blocks, components, pairs) float64 tensor on the model's device.

    ``terms``: ``linear_terms(model)``, when computed once for many batches.
    """
    with evaluating(model, inputs):
        return _rates(model, x, y, inputs, terms)


def to_table(rates: torch.Tensor, first_pair: int = 0) -> pd.DataFrame:
    """A (blocks, components, pairs) tensor as the tidy table: block, depth, component, pair, rate."""
    blocks, components, pairs = rates.shape
    values = rates.detach().cpu().numpy()
    block = torch.arange(blocks).repeat_interleave(components * pairs).numpy()
    depth = 100.0 * block / max(blocks - 1, 1)
    return pd.DataFrame(
        {
            "block": block,
            "depth": depth,
            "component": pd.Categorical(
                [COMPONENTS[i] for i in range(components) for _ in range(pairs)] * blocks, categories=COMPONENTS
            ),
            "pair": (torch.arange(pairs).repeat(blocks * components) + first_pair).numpy(),
            "rate": values.reshape(-1),
        }
    )


def rates(model: nn.Module, x: torch.Tensor, y: torch.Tensor, inputs: str = "embedding") -> pd.DataFrame:
    """Rates of change of one batch of image pairs: one row per pair, block and component.

    ``x``, ``y``: normalised float images (N, 3, H, W) on the model's device, paired by position.
    Columns: ``block`` (0-based), ``depth`` (percent of depth: first block 0, last 100),
    ``component`` (``COMPONENTS``), ``pair``, ``rate``.
    """
    return to_table(rate_tensor(model, x, y, inputs))


def plasticity_by_block(table: pd.DataFrame) -> pd.DataFrame:
    """P(f) per block and component (mean rate over pairs): blocks as rows, components as columns."""
    return table.groupby(["block", "component"], observed=True)["rate"].mean().unstack("component")[list(COMPONENTS)]


def ranking(table: pd.DataFrame) -> pd.DataFrame:
    """P(f) per component (mean over pairs and blocks), ranked, with the paper's rank beside it."""
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
    resamples with the whole order unchanged.
    """
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
    Returns the tidy table of ``rates`` for all pairs.
    """
    check_inputs(inputs)
    if n_pairs < 1:
        raise ValueError(f"n_pairs must be at least 1, got {n_pairs}")
    available = min(len(reference), len(target))
    if n_pairs > available:
        raise ValueError(
            f"n_pairs={n_pairs} but only {available} pairs: the reference has {len(reference)} images and the target {len(target)}"
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
    chunks = []
    with evaluating(model, inputs), tqdm(total=n_pairs, desc="pairs", unit="pair", disable=not progress) as bar:
        terms = linear_terms(model) if inputs == "embedding" else None
        for (x, _), (y, _) in zip(*loaders):
            chunks.append(
                _rates(model, x.to(device, non_blocking=True), y.to(device, non_blocking=True), inputs, terms)
            )
            bar.update(len(x))
    return to_table(torch.cat(chunks, dim=2))


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
    """Whether ``result_folder`` for these arguments holds a complete result (its ``metadata.json``,
    which ``save`` writes last)."""
    return (
        result_folder(model, dataset, inputs, sample, seed, normalize, reference, severity) / "metadata.json"
    ).is_file()


def save(table: pd.DataFrame, folder, metadata: dict | None = None) -> Path:
    """Write the tidy table (``rates.csv.gz``) and ``metadata.json`` into ``folder``, atomically.

    ``metadata.json`` is written last: its presence marks a complete result.
    """
    folder = Path(folder)
    paths.atomic_write(folder / "rates.csv.gz", lambda tmp: table.to_csv(tmp, index=False, compression="gzip"))
    paths.atomic_write_text(folder / "metadata.json", json.dumps(metadata or {}, indent=2, default=str) + "\n")
    return folder


def load(folder) -> pd.DataFrame:
    """Read a table written by ``save`` (with ``component`` as the ordered categorical)."""
    folder = Path(folder)
    if not (folder / "metadata.json").is_file():
        raise FileNotFoundError(f"no complete plasticity result in {folder} (metadata.json missing)")
    table = pd.read_csv(folder / "rates.csv.gz")
    table["component"] = pd.Categorical(table["component"], categories=COMPONENTS)
    return table


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
    model was pretrained with, ``models.normalization``; a folder of its own).
    ``num_workers``: DataLoader workers decoding
    images (default: up to 8 on CUDA, where decoding JPEGs in the main process would leave the GPU
    waiting; none on a CPU). Returns the tidy table and the folder it was saved in (``result_folder``).
    """
    check_inputs(inputs)
    check_sample(sample)
    mean_std = models.normalization(model, normalize)
    network = models.create_model(model)
    size = network.patch_embed.img_size[0]
    reference_set = data.get_dataset(reference, "test", root=root, image_size=size, mean_std=mean_std)
    target_set = data.get_dataset(dataset, "test", root=root, image_size=size, severity=severity, mean_std=mean_std)
    start = time.perf_counter()
    if num_workers is None:
        num_workers = decode_workers() if torch.device(device).type == "cuda" else 0
    if n_pairs < 1:
        raise ValueError(f"n_pairs must be at least 1, got {n_pairs}")
    pairs = min(n_pairs, len(reference_set), len(target_set))
    if pairs < n_pairs and progress:
        print(
            f"{dataset}: {pairs} pairs, not {n_pairs}: {reference} has {len(reference_set)} test images and {dataset} {len(target_set)}"
        )
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
        "sample": sample,
        "seed": seed if sample == "random" else None,
        "inputs": inputs,
        "normalize": normalize,
        "mean": list(mean_std[0]),
        "std": list(mean_std[1]),
        "image_size": size,
        "severity": severity if dataset.startswith("cifar10c/") else None,
        "device": str(device),
        "seconds": round(time.perf_counter() - start, 2),
        "torch": torch.__version__,
    }
    return table, save(
        table, result_folder(model, dataset, inputs, sample, seed, normalize, reference, severity), metadata
    )


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
    ``sample``, ``seed``, ``normalize``. Only results whose pairs were drawn by ``sample`` (the
    paper's ``first`` by default; None: all) and, if given, ``seed``, whose images were
    normalised as ``normalize`` says (the paper's ``imagenet`` by default; None: all), and whose
    reference images were ``reference`` (``"default"``: each dataset's ``default_reference``; a
    name; None: all), and, for Cifar10-C, whose corruption had ``severity`` (the paper's 5; None:
    all): a model and dataset measured several ways would otherwise count twice.
    """
    if sample is not None:
        check_sample(sample)
    if normalize is not None:
        check_normalize(normalize)
    base = Path(root) if root is not None else results_root(inputs)
    rows = []
    for metadata_file in sorted(base.rglob("metadata.json")):
        metadata = json.loads(metadata_file.read_text())
        drawn, drawn_seed = (
            metadata.get("sample", "first"),
            metadata.get("seed"),
        )  # results from before the option: first
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
    ]
    table = pd.DataFrame(rows, columns=columns)
    table["component"] = pd.Categorical(table["component"], categories=COMPONENTS)
    table["seed"] = table["seed"].astype(
        "Int64"
    )  # None (the paper's draw has no seed) stays missing, not NaN in a float column
    return table


CLI_DEFAULTS = {"model": "demo", "dataset": "digits", "reference": "digits_source", "n_pairs": 179}
"""``python -m paperlib.plasticity``'s defaults for ``run``'s required arguments: notebook 02's (the demo world)."""


def main(argv: list[str] | None = None) -> int:
    """``python -m paperlib.plasticity [-f FILE] [--model M --dataset D --reference R --n-pairs N ...]``:
    one measurement, as notebook 02 makes it, without the notebook; prints P(f) and the ranking."""
    signature = inspect.signature(run).parameters
    defaults = {name: CLI_DEFAULTS.get(name, p.default) for name, p in signature.items()}
    defaults["num_workers"] = 0  # run's None (automatic) as a number a command line can give; None stays automatic
    values = cli.parameters(
        argv,
        defaults,
        {"data_root": "root"},
        "Plasticity of every component (paper §5.1); notebook 02's parameters.",
        "python -m paperlib.plasticity",
    )
    values.setdefault("num_workers", None)
    try:
        table, folder = run(**{**CLI_DEFAULTS, **values})
    except (ValueError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    ranked = ranking(table)
    print(ranked.round(4).to_string())
    print(f"Kendall's tau with the paper's ranking: {paper_agreement(table):.2f}; saved in {paths.display(folder)}")
    return 0


if (
    __name__ == "__main__"
):  # the package's module, not this __main__ copy of it, so its classes are the ones imported elsewhere
    from paperlib.plasticity import main as _main

    raise SystemExit(_main())
