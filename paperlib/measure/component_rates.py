"""The rate of change of every component on pairs of images, computed exactly and fast.

Paper §3, Definition 1; appendix C.4: what ``plasticity`` averages into P(f).

For image pairs (x, y), both are embedded once, ``e(x) = model._pos_embed(model.patch_embed(x))``
(patch embedding, class token, position embedding), and every component ``f`` of every block is
applied to that same pair of embeddings: the rate of a pair is
``||f(e(x)) - f(e(y))||_F / ||e(x) - e(y)||_F``. FC2 takes 4d inputs: tokens are lifted to 4d by
zero-padding (appendix C.4). ``inputs="in_situ"`` (beyond the paper) feeds each component its
actual input in the forward pass instead.

``rate_tensor`` is exact but does less work than the definition read literally (``plain_rates``):
a difference through a linear map needs one product, not two, and its bias cancels; better, a
linear map W enters only through its d x d Gram matrix, ``||D W^T||_F^2 = <D^T D, W^T W>``, so
the d x d Gram matrix of each pair's difference D, computed once, serves FC1 and FC2 of every
block (the zero-lifted FC2 only reads the first d columns of its weight); a LayerNorm's
normalisation is the same in every block, only its gain differs, and its bias cancels; MHA runs
once on both sides of every pair. Sums of squares are taken in float64. No component output
leaves the device: only the rates do.

A pair whose two embeddings are equal (``x == y``, or two images the embedding does not tell
apart) has no rate: 0/0, NaN in ``rate_tensor``. "Equal" is exact equality of the two embedded
tensors, every element, pair by pair, on the device (``PairRates.identical``); near-equal pairs
keep their (finite, possibly large) rate, as Definition 1 defines it. ``plasticity.rates`` and
``plasticity.measure`` exclude the identical pairs and count them (``tabulate``); the summaries of a
table made otherwise (``to_table``) leave them out (``ranking.pairs_with_rates``).

``scale`` (beyond the paper) multiplies both embeddings by a factor before the components see
them: a linear map's rate does not change, a LayerNorm's falls as 1/scale (while its eps is
negligible against the tokens' spread), which is why the ranking depends on the scale of the
embeddings (``plasticity.scale_curve``).
"""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass

import pandas as pd
import torch
from timm.layers import RmsNorm
from torch import nn

from paperlib.analysis.ranking import IdenticalPairsWarning
from paperlib.records.names import check_inputs
from paperlib.vit.components import COMPONENTS, block_component, blocks


def _embedded(model: nn.Module, images: torch.Tensor) -> tuple[torch.Tensor, list[dict]]:
    """The embedding's tokens (B, n, d), and per block what its attention takes beside them.

    Nothing for a ``VisionTransformer``; for an ``Eva`` model, whose ``_pos_embed`` also returns the rotary position
    embedding (RoPE), that embedding as its blocks get it (one per block when mixed)."""
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
    """Each token normalised without the gain: what every block's norm with the same eps shares.

    That is the part of a LayerNorm ((x - mean) / std) or of an RMSNorm (x / rms) before its gain."""
    if _norm_kind(norm) == "layer":
        return nn.functional.layer_norm(tokens, norm.normalized_shape, None, None, norm.eps)
    return nn.functional.rms_norm(tokens, norm.normalized_shape, None, norm.eps)


def _check_block(block: nn.Module) -> None:
    # a peft layer, or one of ours built on it (lora.add_lora's)
    if any(cls.__module__.startswith("peft.") for module in block.modules() for cls in type(module).__mro__):
        raise TypeError(
            "the model carries LoRA updates that are not merged into its weights, which the rates of the "
            "linear components would not see: lora.merge(model) first (checkpoints.load_model merges them)"
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
    model: nn.Module,
    ex: torch.Tensor,
    ey: torch.Tensor,
    extras: list[dict],
    terms: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """Every component of every block applied to the embeddings (ex, ey) of the pairs: (blocks, 5, B)."""
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
    """``model``, once every block has the five components in a form the rates are defined for; else a TypeError.

    That form: LayerNorm or RMSNorm, FC2 at least as wide as the tokens, no unmerged LoRA update. The TypeError says
    what is wrong."""
    for block in blocks(model):
        _check_block(block)
    return model


@contextlib.contextmanager
def evaluating(model: nn.Module, inputs: str):
    """Hold the model in eval mode, without gradients, for the ``with`` block, its inputs checked.

    Checks the inputs mode and the blocks once (``check_inputs``, ``check_measurable``), and
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


@dataclass(frozen=True)
class PairRates:
    """One batch's rates and what they were measured on, all on the model's device.

    ``rates``: (blocks, components, pairs) float64, NaN for identical pairs (0/0).
    ``identical``: (pairs,) bool, True where the pair's two embeddings (after ``scale``) are
    exactly equal, element by element. ``token_squares``: (pairs,) float64, per pair the sum of
    ``||token||_2^2`` over every token (class token included) of both embeddings (after
    ``scale``). ``tokens``: the number of tokens of a pair (twice the sequence length), so that
    ``sqrt(token_squares.sum() / (tokens * pairs))`` is the token RMS norm, the paper's r (Fig. 6).
    """

    rates: torch.Tensor
    identical: torch.Tensor
    token_squares: torch.Tensor
    tokens: int


def _check_scale(scale: float, inputs: str) -> float:
    scale = float(scale)
    if not 0.0 < scale < float("inf"):
        raise ValueError(f"scale must be a positive finite number, got {scale}")
    if scale != 1.0 and inputs != "embedding":
        raise ValueError(f"scale applies to the embedding (inputs='embedding'), not to inputs={inputs!r}")
    return scale


def batch_pair_rates(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, inputs: str, terms, scale: float = 1.0
) -> PairRates:
    """``pair_rates`` inside ``evaluating`` (the model checked and in eval mode once for many batches)."""
    if x.shape != y.shape or x.ndim != 4:
        raise ValueError(
            f"x and y must be image batches of the same shape (N, 3, H, W), got {tuple(x.shape)} and {tuple(y.shape)}"
        )
    scale = _check_scale(scale, inputs)
    (ex, extras), (ey, _) = _embedded(model, x), _embedded(model, y)
    if scale != 1.0:
        ex, ey = ex * scale, ey * scale
    identical = ~(ex != ey).flatten(1).any(dim=1)
    token_squares = ex.double().square().sum(dim=(1, 2)) + ey.double().square().sum(dim=(1, 2))
    if inputs == "embedding":
        rates = _embedding_rates(model, ex, ey, extras, terms)
    else:
        rates = _in_situ_rates(model, x, y)
    return PairRates(rates, identical, token_squares, 2 * ex.shape[1])


def pair_rates(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, inputs: str = "embedding", terms=None, scale: float = 1.0
) -> PairRates:
    """Rates of change of a batch of pairs (``PairRates``).

    With the identical pairs and the tokens' sum of squares. ``scale``: both embeddings multiplied by it
    before every component (only with ``inputs="embedding"``; 1, the paper's, leaves them as they are)."""
    with evaluating(model, inputs):
        return batch_pair_rates(model, x, y, inputs, terms, scale)


def rate_tensor(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, inputs: str = "embedding", terms=None, scale: float = 1.0
) -> torch.Tensor:
    """Rates of change as a (blocks, components, pairs) float64 tensor on the model's device.

    ``terms``: ``linear_terms(model)``, when computed once for many batches. Identical pairs give
    NaN (0/0). ``scale``: as ``pair_rates``.
    """
    return pair_rates(model, x, y, inputs, terms, scale).rates


def to_table(rates: torch.Tensor, first_pair: int = 0, pair_ids=None) -> pd.DataFrame:
    """A (blocks, components, pairs) tensor as the tidy table: block, depth, component, pair, rate.

    Pairs are numbered from ``first_pair``, or ``pair_ids`` (one number per pair, e.g. the pairs
    left after excluding identical ones, which keep their numbers)."""
    blocks, components, pairs = rates.shape
    numbers = torch.arange(pairs) + first_pair if pair_ids is None else torch.as_tensor(pair_ids).cpu()
    if len(numbers) != pairs:
        raise ValueError(f"{len(numbers)} pair numbers for {pairs} pairs")
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
            "pair": numbers.repeat(blocks * components).numpy(),
            "rate": values.reshape(-1),
        }
    )


def tabulate(parts: list[PairRates], stacklevel: int = 3) -> pd.DataFrame:
    """The tidy table of measured batches, in order, without the identical pairs.

    The table is ``to_table``'s. The identical pairs are excluded with an ``IdenticalPairsWarning``
    naming how many; the other pairs keep their numbers. ``attrs``: ``token_rms``, the token RMS
    norm of the embeddings of the pairs kept (the square root of the mean of ``||token||_2^2`` over
    every token of both images), and ``identical_pairs_excluded``, the count. A ValueError if no
    pair is left. ``stacklevel``: the frame the warning names, counted from here (3: the caller of
    the function that calls ``tabulate``, e.g. the user of ``plasticity.rates``)."""
    rates = torch.cat([part.rates for part in parts], dim=2)
    identical = torch.cat([part.identical for part in parts])
    keep = (~identical).nonzero().squeeze(1)
    total, excluded = len(identical), len(identical) - len(keep)
    if not len(keep):
        raise ValueError(f"all {total} pairs have identical embeddings (x == y): no pair has a rate")
    squares = torch.cat([part.token_squares for part in parts])[keep].sum()
    token_rms = float((squares / (parts[0].tokens * len(keep))).sqrt())
    if excluded:
        warnings.warn(
            f"{excluded} of {total} pairs excluded: their two images have identical embeddings (x == y), "
            "whose rate is 0/0",
            IdenticalPairsWarning,
            stacklevel=stacklevel,
        )
        table = to_table(rates[:, :, keep], pair_ids=keep)
    else:
        table = to_table(rates)
    table.attrs.update(token_rms=token_rms, identical_pairs_excluded=excluded)
    return table
