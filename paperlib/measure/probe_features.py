"""The features a linear probe is fitted on: every probe point of the chosen blocks, pooled, from one forward pass.

Forward hooks (``hooked``) read each point of ``records.probe_tables.POINTS`` (``point_modules``) and pool its tokens
(``POOLS``); ``pooled_features`` gives them per (block, point), each image's vector of unit L2 norm, over a dataset in
order or as the authors' training loader gives it (``data.augmented``); ``groups`` splits the points into passes whose
features fit a memory budget.
"""

from __future__ import annotations

import contextlib
from typing import Iterable, Sequence

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader

from paperlib.data.augmented import augmented_batches
from paperlib.data.imagesets import FileDataset
from paperlib.data.loader import decode_workers
from paperlib.records.names import check_choice
from paperlib.records.probe_tables import POINTS
from paperlib.vit import components
from paperlib.vit.components import JointLinear, block_component

POOLS = ("mean", "patches", "cls")
"""How tokens become one vector: ``mean`` over every position (the authors' ``.mean(axis=1)``, the
class token's position included), ``patches`` (the mean over the patch tokens alone) or ``cls``
(the class token; the authors' ``cls_pooling=True``)."""


def check_points(points: str | Iterable[str]) -> tuple[str, ...]:
    """``points`` as a tuple (one name or several), or a ValueError naming the valid points."""
    chosen = (points,) if isinstance(points, str) else tuple(points)
    unknown = [p for p in chosen if p not in POINTS]
    if unknown or not chosen:
        raise ValueError(f"unknown probe point(s) {unknown or chosen!r}; valid points: {', '.join(POINTS)}")
    return tuple(p for p in POINTS if p in chosen)


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


def pooled_features(
    model: nn.Module,
    dataset,
    wanted: Sequence[tuple[int, str]],
    pool: str = "mean",
    batch_size: int = 256,
    num_workers: int | None = None,
    augment_seed: int | None = None,
) -> tuple[dict[tuple[int, str], np.ndarray], np.ndarray]:
    """The pooled, L2-normalised features of every (block, point) of ``wanted`` over ``dataset``, and the labels.

    Float32, one row per image, in the dataset's order (with ``augment_seed``, as ``augmented_batches``
    gives them), from one forward pass per batch on the model's device in eval mode, without gradients (the mode
    restored after)."""
    check_choice(pool, POOLS, "pool")
    device = next(model.parameters()).device
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
