"""Upper bounds on the plasticity of each component (paper §4, Propositions 1-4, appendix B).

Per block (tokens as rows, PyTorch weights as (out, in) matrices):

- LayerNorm, Prop. 1: ``||gamma||_inf / sigma``, sigma the smallest per-token standard deviation
  over positions (assumption: tokens at one position share their mean and deviation). By default
  over the positions whose token varies between images (``token_sigma``): a class or register
  token, the same in every image, adds nothing to ``||x - y||`` and would only loosen the bound.
- Feedforward, Prop. 2: the spectral norm of the weight (FC1: 4d x d, FC2: d x 4d).
- Attention, Prop. 3: ``sum_h ||O^h||_2 ||V^h||_2 sqrt(3n + (12n + 3) r^4 ||A^h||_2^2)`` for tokens in
  the ball of radius r, with ``A^h = (Q^h)^T K^h / sqrt(k)``. Head h owns rows ``h*k:(h+1)*k`` of
  the query, key and value weights and columns ``h*k:(h+1)*k`` of the output projection.
- Attention, Prop. 4: ``sum_h ||O^h||_2 ||V^h||_2 (sqrt(n) + alpha^2 E ||A^h||_2)`` for tokens
  embedded from images of energy at most E, alpha the spectral norm of the patch embedding as a
  d x (P*P*C) matrix.

The propositions are about bias-free attention and tokens that are linear images of patches;
timm's ViTs add query/key/value biases, a class token and position embeddings, so for them the
bounds are what the paper computes from the weights, not guarantees. The paper's Fig. 6 takes
r = 19.4, the RMS token norm of ViT-Base on Cifar10; a rigorous bound needs the largest token norm.

Beyond the paper's ViTs (``components``), Prop. 2 holds for every feedforward layer (FC1 of a
SwiGLU block: its gate and value weights stacked), but Props. 1, 3 and 4 are about the paper's
LayerNorm and attention: for an RMSNorm, or an attention with rotary position embeddings, q/k
normalisation, a normalisation inside or a gate (DINOv3, EVA-02, AIMv2, ...), the bound is left
empty (NaN) and ``outside_propositions`` says why.
"""

from __future__ import annotations

import math
import warnings

import pandas as pd
import torch
from timm.layers import AttentionRope
from timm.models.eva import EvaAttention
from timm.models.vision_transformer import Attention
from torch import nn

from paperlib.measure.component_rates import check_measurable, embed, evaluating
from paperlib.records.names import check_choice
from paperlib.speed.layers import QkvFusedAttention
from paperlib.vit.components import COMPONENTS, block_component

PAPER_ATTENTION = (Attention, QkvFusedAttention, EvaAttention, AttentionRope)
"""Attention classes that compute the paper's multi-head attention when they have no RoPE, no
q/k or inner normalisation, no gate and as many key/value heads as query heads."""


def spectral_norm(matrix: torch.Tensor) -> float:
    """Largest singular value."""
    return float(torch.linalg.matrix_norm(matrix.detach().double(), ord=2))


def _qkv_weight(attn: nn.Module) -> torch.Tensor | None:
    """The (3d, d) query, key and value rows of ``attn``; None if it has neither form.

    They are its fused ``qkv`` layer's weight, or its three projections' stacked."""
    qkv = getattr(attn, "qkv", None)
    if isinstance(qkv, nn.Linear):
        return qkv.weight
    parts = [getattr(attn, name, None) for name in ("q_proj", "k_proj", "v_proj")]
    if all(isinstance(part, nn.Linear) for part in parts):
        return torch.cat([part.weight for part in parts])
    return None


def head_weights(attn: nn.Module) -> list[tuple[torch.Tensor, ...]]:
    """(Q^h, K^h, V^h, O^h) of every head of a timm attention: k x d, k x d, k x d, d x k."""
    weight = _qkv_weight(attn).detach()
    d = weight.shape[1]
    heads = attn.num_heads
    k = d // heads
    q, key, v = weight.reshape(3, d, d)  # (3d, d): query, key, value rows
    o = attn.proj.weight.detach()
    return [
        (q[h * k : (h + 1) * k], key[h * k : (h + 1) * k], v[h * k : (h + 1) * k], o[:, h * k : (h + 1) * k])
        for h in range(heads)
    ]


def _head_norms(attn: nn.Module) -> list[tuple[float, float, float]]:
    """Per head: ||O^h||_2, ||V^h||_2, ||A^h||_2."""
    out = []
    for q, k, v, o in head_weights(attn):
        a = q.double().T @ k.double() / math.sqrt(q.shape[0])
        out.append((spectral_norm(o), spectral_norm(v), spectral_norm(a)))
    return out


def mha_bound_prop3(attn: nn.Module, n: int, r: float) -> float:
    """Proposition 3 for one attention module."""
    return sum(o * v * math.sqrt(3 * n + (12 * n + 3) * r**4 * a**2) for o, v, a in _head_norms(attn))


def mha_bound_prop4(attn: nn.Module, n: int, alpha: float, energy: float) -> float:
    """Proposition 4 for one attention module."""
    return sum(o * v * (math.sqrt(n) + alpha**2 * energy * a) for o, v, a in _head_norms(attn))


def layer_norm_bound(norm: nn.LayerNorm, sigma: float) -> float:
    """Proposition 1: ``||gamma||_inf / sigma``."""
    gamma = norm.weight if norm.weight is not None else torch.ones(norm.normalized_shape)
    return float(gamma.detach().abs().max()) / sigma


def sequence_length(model: nn.Module) -> int:
    """Tokens per image: patches plus prefix (class, register) tokens."""
    return int(model.patch_embed.num_patches) + int(getattr(model, "num_prefix_tokens", 1))


def patch_embedding_norm(model: nn.Module) -> float:
    """alpha: the spectral norm of the patch embedding as a d x (P*P*C) matrix (Prop. 4)."""
    weight = model.patch_embed.proj.weight
    return spectral_norm(weight.reshape(weight.shape[0], -1))


def _attention_outside(attn: nn.Module, model: nn.Module) -> str | None:
    """Why Props. 3-4 do not bound ``attn``, or None when they do (the paper's attention)."""
    if getattr(model, "rope", None) is not None:
        return "its attention rotates queries and keys by position (RoPE), which Props. 3-4 do not model"
    weight = _qkv_weight(attn)
    if (
        not isinstance(attn, PAPER_ATTENTION)
        or weight is None
        or not isinstance(getattr(attn, "proj", None), nn.Linear)
    ):
        return (
            f"its attention ({type(attn).__name__}) computes another function than the multi-head attention "
            "of Props. 3-4"
        )
    extras = [
        name
        for name in ("q_norm", "k_norm", "norm")
        if not isinstance(getattr(attn, name, None), (nn.Identity, type(None)))
    ]
    extras += ["gate"] if getattr(attn, "gate", None) is not None else []
    extras += ["fewer key/value heads than query heads"] if getattr(attn, "num_kv_groups", 1) != 1 else []
    if extras:
        return f"its attention has {', '.join(extras)}, which Props. 3-4 do not model"
    if weight.shape[0] != 3 * weight.shape[1]:
        return "its attention's heads do not span the embedding width, as Props. 3-4 take them to"
    return None


def outside_propositions(model: nn.Module) -> dict[str, str]:
    """The components of ``model`` that the propositions do not bound, with the reason.

    ``mha`` when its attention is not the paper's, ``ln1``/``ln2`` when the norm is not a LayerNorm
    (Prop. 1)."""
    reasons = {}
    for block in model.blocks:
        if "mha" not in reasons and (why := _attention_outside(block.attn, model)):
            reasons["mha"] = why
        for component in ("ln2", "ln1"):
            norm = block_component(block, component)
            if component not in reasons and not isinstance(norm, nn.LayerNorm):
                reasons[component] = f"it is a {type(norm).__name__}; Prop. 1 bounds a LayerNorm"
    return reasons


def upper_bounds(
    model: nn.Module, *, r: float, sigma: float, energy: float | None = None, n: int | None = None
) -> pd.DataFrame:
    """Bounds per block, component and proposition: columns block, depth, component, proposition, bound.

    A component the propositions do not bound for this model (``outside_propositions``) gets NaN,
    with a warning that says why."""
    if r <= 0 or sigma <= 0:
        raise ValueError(f"r and sigma must be positive, got r={r!r}, sigma={sigma!r}")
    check_measurable(model)  # e.g. unmerged LoRA updates, which the weights read here would miss
    n = n or sequence_length(model)
    alpha = patch_embedding_norm(model) if energy is not None else None
    outside = outside_propositions(model)
    for component, why in outside.items():
        warnings.warn(f"no bound for {component.upper()}: {why}", stacklevel=2)
    within = lambda component, compute: math.nan if component in outside else compute()  # noqa: E731
    blocks = len(model.blocks)
    rows = []
    for index, block in enumerate(model.blocks):
        depth = 100.0 * index / max(blocks - 1, 1)
        values = {
            ("mha", "3"): within("mha", lambda: mha_bound_prop3(block.attn, n, r)),
            ("fc1", "2"): spectral_norm(block_component(block, "fc1").weight),
            ("fc2", "2"): spectral_norm(block_component(block, "fc2").weight),
            ("ln2", "1"): within("ln2", lambda: layer_norm_bound(block.norm2, sigma)),
            ("ln1", "1"): within("ln1", lambda: layer_norm_bound(block.norm1, sigma)),
        }
        if energy is not None:
            values[("mha", "4")] = within("mha", lambda: mha_bound_prop4(block.attn, n, alpha, energy))
        for (component, proposition), bound in values.items():
            rows.append(
                {"block": index, "depth": depth, "component": component, "proposition": proposition, "bound": bound}
            )
    table = pd.DataFrame(rows)
    table["component"] = pd.Categorical(table["component"], categories=COMPONENTS)
    return table.sort_values(["block", "component", "proposition"], ignore_index=True)


SIGMA_POSITIONS = ("varying", "all")
"""The token positions sigma (Prop. 1) is taken over: ``varying``, those whose token is not the same
in every image (the default, ``varying_positions``); ``all``, every position (the paper's literal
reading, which counts the class token's deviation too)."""


def check_positions(positions: str) -> str:
    """Return ``positions`` or raise a ValueError naming the valid choices (``SIGMA_POSITIONS``)."""
    return check_choice(positions, SIGMA_POSITIONS, "positions", "positions")


def _embedded_tokens(model: nn.Module, images: torch.Tensor) -> torch.Tensor:
    """The embedding's tokens (images, n, d) in float64, the model in eval mode."""
    with evaluating(model, "embedding"):  # in eval mode: an Eva model's embedding drops patches when training
        return embed(model, images).double()


def _varying(tokens: torch.Tensor) -> torch.Tensor:
    """(n,) bool: the positions where some image's token differs, exactly, from the first image's."""
    return (tokens != tokens[:1]).any(dim=2).any(dim=0)


@torch.no_grad()
def token_radius(model: nn.Module, images: torch.Tensor, kind: str = "rms") -> float:
    """Norm of the embedded tokens: ``rms`` (root mean square, the paper's r) or ``max`` (rigorous)."""
    norms = torch.linalg.vector_norm(_embedded_tokens(model, images), dim=-1)
    if kind == "rms":
        return float(norms.pow(2).mean().sqrt())
    if kind == "max":
        return float(norms.max())
    raise ValueError(f"unknown kind {kind!r}; valid kinds: rms, max")


@torch.no_grad()
def varying_positions(model: nn.Module, images: torch.Tensor) -> torch.Tensor:
    """(n,) bool mask of the token positions whose embedded token is not the same in every image.

    Decided from the data, by exact comparison: a class token and register tokens (plus their
    position embedding) are the same in every image and are left out; so is a patch position whose
    pixels, and so token, are the same in every image (a constant border)."""
    return _varying(_embedded_tokens(model, images))


@torch.no_grad()
def token_sigma(model: nn.Module, images: torch.Tensor, kind: str = "mean", positions: str = "varying") -> float:
    """sigma of Prop. 1: the smallest per-position standard deviation of the embedded tokens.

    ``kind``: ``mean`` averages each position's token deviation over images (the proposition's
    assumption says it is the same for all images); ``min`` takes the smallest over images too.

    ``positions`` (``SIGMA_POSITIONS``): ``varying`` (the default) takes the minimum over the
    positions whose token varies between ``images`` (``varying_positions``); ``all`` over every
    position, the paper's literal reading, where the class token (the same in every image, and on
    a ViT often of small deviation) can set sigma alone.

    The restricted sigma still bounds Definition 1's rate, by the proof of appendix B.1: it writes
    ``f(x) - f(y)`` row by row as ``gamma * (x_i - y_i) / sigma_i`` and bounds
    ``sum_i ||x_i - y_i||^2 / sigma_i^2`` by ``||x - y||_F^2 / min_i sigma_i^2``. A position whose
    token is the same in both sequences (x_i = y_i) gives a zero row of ``f(x) - f(y)`` (the
    LayerNorm acts token by token) and a zero term of ``||x - y||_F``, so the sum, and the minimum,
    need only run over the positions that vary. For pairs of the images sigma is computed from,
    ``kind="min"`` makes the bound a guarantee even without Prop. 1's assumption of equal
    statistics: on tokens of deviation at least sigma, ``x -> (x - mean) / sqrt(var + eps)`` is
    ``1/sigma``-Lipschitz (a radial projection outside a ball of radius ``sqrt(d) sigma``, eps only
    shrinks it), so each row is bounded as above.
    """
    if kind not in ("mean", "min"):
        raise ValueError(f"unknown kind {kind!r}; valid kinds: mean, min")
    check_positions(positions)
    tokens = _embedded_tokens(model, images)
    std = tokens.std(dim=-1, unbiased=False)  # (images, positions)
    if positions == "varying":
        varying = _varying(tokens)
        if not varying.any():
            raise ValueError(
                "no token position varies between the images (fewer than two distinct images?): sigma over the "
                "varying positions is undefined; pass more images, or positions='all'"
            )
        std = std[:, varying]
    return float(std.mean(dim=0).min() if kind == "mean" else std.min())


def max_energy(images: torch.Tensor) -> float:
    """The largest image energy: sum of squared (preprocessed) pixel values (Prop. 4)."""
    return float(images.double().pow(2).flatten(1).sum(dim=1).max())


def data_constants(model: nn.Module, images: torch.Tensor, positions: str = "varying") -> dict:
    """What the bounds need from the data.

    r (RMS and max token norm), sigma (``mean`` and ``min`` kinds, over ``positions``: ``token_sigma``) and
    the number of positions it is taken over, alpha, E, n."""
    n = sequence_length(model)
    counted = int(varying_positions(model, images).sum()) if check_positions(positions) == "varying" else n
    return {
        "r_rms": token_radius(model, images, "rms"),
        "r_max": token_radius(model, images, "max"),
        "sigma": token_sigma(model, images, "mean", positions),
        "sigma_min": token_sigma(model, images, "min", positions),
        "sigma_positions": counted,
        "alpha": patch_embedding_norm(model),
        "energy": max_energy(images),
        "n": n,
    }


def sigma_readings(
    model: nn.Module, images: torch.Tensor, rates_table: pd.DataFrame, kind: str = "mean"
) -> pd.DataFrame:
    """Prop. 1 under each reading of sigma (``SIGMA_POSITIONS``), against measured rates.

    One row per reading and LayerNorm (LN2, LN1): ``sigma`` (``token_sigma`` of ``images``), the
    ``bound`` (median over blocks), the ``largest rate`` measured (over blocks and pairs of
    ``rates_table``), ``bound / rate``, the smallest over blocks of the block's bound over its
    largest rate (at least 1 where the bound holds for every pair; the larger, the looser), and
    ``above bound``, the share of rates above their block's bound."""
    outside = outside_propositions(model)
    measured = rates_table[rates_table["component"].isin(["ln2", "ln1"])]
    largest = measured.groupby(["block", "component"], observed=True)["rate"].max()
    rows = []
    for positions in SIGMA_POSITIONS:
        sigma = token_sigma(model, images, kind, positions)
        for component, name in (("ln2", "norm2"), ("ln1", "norm1")):
            per_block = pd.Series(
                [
                    math.nan if component in outside else layer_norm_bound(getattr(block, name), sigma)
                    for block in model.blocks
                ]
            )
            top = largest.xs(component, level="component").reindex(per_block.index)
            rates = measured.loc[measured["component"] == component]
            above = rates["rate"].to_numpy() > per_block.loc[rates["block"].to_numpy()].to_numpy()
            rows.append(
                {
                    "positions": positions,
                    "component": component,
                    "sigma": sigma,
                    "bound": float(per_block.median()),
                    "largest rate": float(top.max()),
                    "bound / rate": float((per_block / top).min()),
                    "above bound": float(above.mean()) if component not in outside else math.nan,
                }
            )
    return pd.DataFrame(rows)


def _one_bound_per_component(bounds_table: pd.DataFrame, mha_proposition: str) -> pd.DataFrame:
    keep = (bounds_table["component"] != "mha") | (bounds_table["proposition"] == mha_proposition)
    return bounds_table.loc[keep, ["block", "component", "bound"]]


def tightness(bounds_table: pd.DataFrame, rates_table: pd.DataFrame, mha_proposition: str = "3") -> pd.DataFrame:
    """Bound next to measured plasticity per block and component, and their ratio (>= 1 when the bound holds)."""
    measured = (
        rates_table.groupby(["block", "component"], observed=True)["rate"].mean().rename("plasticity").reset_index()
    )
    out = _one_bound_per_component(bounds_table, mha_proposition).merge(measured, on=["block", "component"])
    out["bound / plasticity"] = out["bound"] / out["plasticity"]
    return out


def violations(bounds_table: pd.DataFrame, rates_table: pd.DataFrame, mha_proposition: str = "3") -> pd.Series:
    """Share of measured rates of change above their block's bound, per component.

    NaN where there is no bound (``outside_propositions``)."""
    merged = rates_table.merge(_one_bound_per_component(bounds_table, mha_proposition), on=["block", "component"])
    above = (merged["rate"] > merged["bound"]).where(merged["bound"].notna())
    return above.groupby(merged["component"], observed=True).mean().reindex(list(COMPONENTS))
