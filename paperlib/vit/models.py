"""The paper's vision transformers by short name, any timm ViT, and the demo ViT.

Appendix C.1 (Table 2): ViT-Base/16 and ViT-Huge/14 pretrained on ImageNet-21k; we add ViT-Large/16.
Every model is a timm ``VisionTransformer`` or, beyond the paper, one of timm's ``Eva`` ViTs (DINOv3,
EVA-02, Perception Encoder, the RoPE ViTs: ``VIT_MODULES``), whose blocks have the same five
components (``components``); every weight file, from the hub or from disk, is
loaded by timm's own pretrained-loading code (``pretrained_cfg_overlay=dict(file=...)`` for a
local file), so the two paths share their key remapping, position-embedding resizing and
head handling.

Your own ViT is ``custom/<name>``: a folder ``<models dir>/<name>/`` (``paths.models_dir()``) in
the layout timm writes for the Hugging Face hub (``config.json`` naming the timm architecture and
its arguments, weights in ``model.safetensors`` or ``pytorch_model.bin``). ``save_model`` writes one
from a model in memory; a folder from ``timm.models.save_for_hf`` or downloaded from the hub works
as it is. Every notebook, run and sweep then takes ``custom/<name>`` where it takes a model name.
"""

from __future__ import annotations

import difflib
from pathlib import Path

import timm
import torch
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.models import build_model_with_cfg, generate_default_cfgs, register_model
from timm.models.eva import Eva
from timm.models.vision_transformer import (
    VisionTransformer,
    checkpoint_filter_fn,
)

from paperlib.data.transforms import IMAGENET, as_mean_std
from paperlib.records import paths, storage
from paperlib.records.names import check_normalize
from paperlib.vit import components

PAPER_MODELS = {
    "vit_base_in21k": "vit_base_patch16_224.orig_in21k",
    "vit_large_in21k": "vit_large_patch16_224.orig_in21k",
    "vit_huge_in21k": "vit_huge_patch14_224.orig_in21k",
}
"""The paper's models (appendix C.1): short name -> timm name with its pretrained tag."""

DEMO_ARCH = "vit_demo_patch4_32"
DEMO_TAG = "digits_source"
DEMO_ARGS = dict(img_size=32, patch_size=4, embed_dim=64, depth=6, num_heads=4, mlp_ratio=4.0, num_classes=5)
"""The demo ViT: pre-norm blocks and a class token like ViT-Base, 32x32 inputs, 0.3M parameters."""

SHORT_NAMES = {**PAPER_MODELS, "demo": f"{DEMO_ARCH}.{DEMO_TAG}"}

# timm finds a model's pretrained configurations in the ``default_cfgs`` of the module that
# registers it: the demo weights are then loaded exactly like hub weights, from a local file.
default_cfgs = generate_default_cfgs(
    {
        f"{DEMO_ARCH}.{DEMO_TAG}": {
            "file": str(paths.DEMO_WEIGHTS),
            "num_classes": DEMO_ARGS["num_classes"],
            "input_size": (3, 32, 32),
            "crop_pct": 1.0,
            "interpolation": "bilinear",
            "mean": IMAGENET_DEFAULT_MEAN,
            "std": IMAGENET_DEFAULT_STD,
            "first_conv": "patch_embed.proj",
            "classifier": "head",
            "license": "mit",
        }
    }
)


@register_model
def vit_demo_patch4_32(pretrained: bool = False, **kwargs) -> VisionTransformer:
    """The demo ViT (img 32, patch 4, dim 64, depth 6, 4 heads), pretrained on ``digits_source``."""
    return build_model_with_cfg(
        VisionTransformer,
        DEMO_ARCH,
        pretrained,
        pretrained_filter_fn=checkpoint_filter_fn,
        **{**DEMO_ARGS, **kwargs},
    )


VIT_MODULES = ("vision_transformer", "eva")
"""timm's modules whose architectures paperlib takes: ``VisionTransformer`` and ``Eva``."""

VIT_CLASSES = (VisionTransformer, Eva)


def vit_names() -> list[str]:
    """timm architectures that build a ``VisionTransformer`` or an ``Eva`` ViT.

    Valid ``create_model`` names; the few whose blocks have no separate components are refused when
    built."""
    return sorted(set(timm.list_models(module=list(VIT_MODULES))) | {DEMO_ARCH})


def custom_folder(name: str) -> Path:
    """The folder of model ``custom/<name>``: ``<models dir>/<name>``."""
    return paths.models_dir() / paths.custom_name(name, "model")


def custom_config(name: str) -> tuple[dict, Path] | None:
    """(config.json, weight file) of model ``custom/<name>`` (``paths.saved_model``); None for other names.

    Its architecture must be a timm ViT (``vit_names``); errors say what is missing and how to make it."""
    saved = paths.saved_model(name)
    architecture = None if saved is None else saved[0].get("architecture")
    if saved is not None and architecture not in vit_names():
        raise ValueError(
            f"{custom_folder(name) / 'config.json'} names architecture {architecture!r}, "
            "which is not a timm VisionTransformer or Eva ViT (see paperlib.vit.models.vit_names())"
        )
    return saved


def save_model(
    model: torch.nn.Module, name: str, model_args: dict | None = None, overwrite: bool = False, mean=None, std=None
) -> Path:
    """Save ``model`` as ``custom/<name>`` and return its folder.

    With timm's own writer, ``timm.models.save_for_hf``: ``config.json`` and ``model.safetensors``.

    ``model_args``: the keyword arguments that rebuild the architecture (``img_size``, ``depth``,
    ...), for timm versions that do not record them; recent timm records them itself. The folder
    is written whole or not at all, and an existing one is replaced only with ``overwrite``.
    ``mean``, ``std``: the per-channel statistics the model was trained with, recorded in its
    pretrained configuration (``normalize="model"`` reads them); by default the model's own
    ``pretrained_cfg``'s, which for weights loaded from a file into a timm architecture are the
    architecture's default tag's, not necessarily those the weights were trained with.
    """
    if paths.custom_name(name, "model") is None:
        raise ValueError(f"a saved model is named custom/<name>, got {name!r}")
    if not isinstance(model, VIT_CLASSES):
        raise TypeError(f"save_model saves a timm VisionTransformer or Eva ViT, got {type(model).__name__}")
    if not getattr(model, "pretrained_cfg", None) or "architecture" not in model.pretrained_cfg:
        raise ValueError(
            "save_model needs a model made by timm (timm.create_model or paperlib.vit.models.create_model, "
            "with its architecture's arguments), which records its architecture; this one has none"
        )
    if (mean is None) != (std is None):
        raise ValueError("give both mean and std (three numbers each), or neither")
    recorded = model.pretrained_cfg
    if mean is not None:
        pair = as_mean_std(mean, std)
        model.pretrained_cfg = {**recorded, "mean": pair[0], "std": pair[1]}
    write = lambda staging: timm.models.save_for_hf(model, str(staging), model_args=model_args, safe_serialization=True)  # noqa: E731
    try:
        return storage.atomic_folder(custom_folder(name), write, overwrite)
    finally:
        model.pretrained_cfg = recorded


def resolve_name(name: str) -> str:
    """The timm name (with pretrained tag, if any) of a short or timm ViT name; ``custom/<name>`` as it is.

    A ``custom/<name>`` only once its folder is found (``custom_config``)."""
    if name in SHORT_NAMES:
        return SHORT_NAMES[name]
    if custom_config(name) is not None:
        return name
    architecture, _, tag = name.partition(".")
    # a tag is one folder name in result paths
    if architecture in vit_names() and (not tag or paths.CUSTOM_NAME.fullmatch(tag)):
        return name
    suggestions = difflib.get_close_matches(name, list(SHORT_NAMES) + vit_names(), n=3)
    hint = f" Did you mean: {', '.join(suggestions)}?" if suggestions else ""
    raise ValueError(
        f"unknown model {name!r}; valid short names: {', '.join(SHORT_NAMES)}; or any timm ViT name "
        f"(see paperlib.vit.models.vit_names(), e.g. vit_small_patch16_224.augreg_in21k); or custom/<name> "
        f"for your own ViT saved with paperlib.vit.models.save_model.{hint}"
    )


def normalization(name: str, normalize: str = "imagenet") -> tuple[tuple[float, ...], tuple[float, ...]]:
    """The (mean, std) per RGB channel that images for model ``name`` are normalised with.

    ``normalize="imagenet"``: ImageNet's, for every model, as in the paper (appendix C.2).
    ``"model"`` (beyond the paper): those the model was pretrained with, from its pretrained
    configuration: timm's for a hub name (0.5 and 0.5 for the paper's ImageNet-21k ViTs, CLIP's
    own for a CLIP ViT), the ``pretrained_cfg`` of a ``custom/<name>``'s ``config.json``. Read
    without creating the model or fetching anything.
    """
    check_normalize(normalize)
    if normalize == "imagenet":
        return IMAGENET
    custom = custom_config(name)
    if custom is not None:
        cfg, where = custom[0].get("pretrained_cfg") or {}, f"{custom_folder(name) / 'config.json'}'s pretrained_cfg"
    else:
        timm_name = resolve_name(name)
        try:
            found = timm.models.get_pretrained_cfg(timm_name)
        except RuntimeError as error:  # a tag timm does not know
            raise ValueError(
                f"normalize='model': timm has no pretrained configuration for {timm_name!r} ({error}); "
                "use normalize='imagenet'"
            ) from error
        cfg, where = (found.to_dict() if found is not None else {}), f"timm's pretrained configuration of {timm_name!r}"
    if cfg.get("mean") is None or cfg.get("std") is None:
        raise ValueError(
            f"normalize='model': {where} records no mean and std; use normalize='imagenet' "
            "(or save the model with them: its pretrained_cfg's 'mean' and 'std')"
        )
    return as_mean_std(cfg["mean"], cfg["std"])


def create_model(
    name: str,
    pretrained: bool = True,
    num_classes: int | None = None,
    weights: str | Path | None = None,
    **kwargs,
) -> torch.nn.Module:
    """Create a ViT by short name (``demo``, ``vit_base_in21k``, ...) or timm name.

    Args:
        name: a key of ``SHORT_NAMES``, any timm ViT name, optionally with a pretrained tag, or
            ``custom/<name>`` (module docstring).
        pretrained: load pretrained weights (from the hub, or from ``weights`` when given).
        num_classes: a new, randomly initialised classification head with this many classes;
            ``None`` keeps the pretrained head (ImageNet-21k ViTs from timm have none).
        weights: a local weight file (``.safetensors``, ``.pth``, ``.bin`` or big_vision ``.npz``)
            loaded through timm's pretrained-loading path; implies ``pretrained=True``.
        kwargs: passed to ``timm.create_model`` (e.g. ``img_size``, ``drop_path_rate``).

    A timm ViT whose blocks lack one of the five components (timm's parallel blocks) is refused
    with the reason, before any weights are fetched.
    """
    # the architecture and arguments its config.json records; its head kept unless num_classes
    custom = custom_config(name)
    if custom is not None:
        config, saved = custom
        timm_name = config["architecture"]
        kwargs = {**config.get("model_args", {}), **kwargs}
        kwargs.setdefault("num_classes", config.get("num_classes", kwargs.get("num_classes")))
        saved_cfg = config.get("pretrained_cfg") or {}
        overlay = {"num_classes": config.get("num_classes"), "classifier": saved_cfg.get("classifier", "head")}
        overlay |= {
            key: tuple(saved_cfg[key]) for key in ("mean", "std") if saved_cfg.get(key) is not None
        }  # model.pretrained_cfg as saved
        kwargs["pretrained_cfg_overlay"] = {**overlay, **kwargs.get("pretrained_cfg_overlay", {})}
        if pretrained and weights is None:
            weights = saved
    else:
        timm_name = resolve_name(name)
    if num_classes is not None:
        if not isinstance(num_classes, int) or num_classes < 0:
            raise ValueError(f"num_classes must be a non-negative integer or None, got {num_classes!r}")
        kwargs["num_classes"] = num_classes
    if weights is not None:
        weights = Path(weights).expanduser()
        if not weights.is_file():
            raise FileNotFoundError(f"weight file not found: {weights}")
        pretrained = True
        kwargs["pretrained_cfg_overlay"] = {**kwargs.get("pretrained_cfg_overlay", {}), "file": str(weights)}
    if pretrained:  # the architecture alone first (no memory, nothing fetched), to refuse it before any download
        with torch.device("meta"):
            components.check_model(timm.create_model(timm_name, pretrained=False, **kwargs), timm_name)
    try:
        model = timm.create_model(timm_name, pretrained=pretrained, **kwargs)
    except Exception as error:
        if weights is not None:  # a local file that is not weights of this architecture (damaged, another model)
            raise ValueError(f"cannot load {weights} into {timm_name}: {type(error).__name__}: {error}") from error
        if not pretrained or not isinstance(error, (OSError, ValueError)) or not _is_hub_error(error):
            raise
        cfg = timm.models.get_pretrained_cfg(timm_name)
        source = f"https://huggingface.co/{cfg.hf_hub_id}" if cfg is not None and cfg.hf_hub_id else "the hub"
        raise RuntimeError(
            f"could not fetch the pretrained weights of {timm_name!r} ({type(error).__name__}: {error}). "
            f"Without internet, download them once from {source} and pass weights=<local file>."
        ) from error
    if not pretrained:  # a pretrained one was checked on the meta device above
        components.check_model(model, timm_name)
    if pretrained and num_classes:
        # timm keeps a pretrained head whose size matches (the demo ViT's 5 classes and a 5-class
        # dataset); the head asked for is new: an nn.Linear as PyTorch initialises it, as the authors'
        # code makes the new head (docs/fidelity.md)
        model.reset_classifier(num_classes)
    return model


def _is_hub_error(error: BaseException) -> bool:
    """Whether ``error`` (or its cause) comes from fetching files from the Hugging Face hub."""
    while error is not None:
        if type(error).__module__.startswith(("huggingface_hub", "requests", "urllib", "httpx")):
            return True
        error = error.__cause__ or error.__context__
    return False


def architecture(name: str, num_classes: int | None = None, **kwargs) -> torch.nn.Module:
    """The architecture of ``name`` on the meta device: shapes without memory or weights.

    Enough for parameter counts (Tables 3 and 4) of ViT-Huge on a laptop.
    """
    with torch.device("meta"):
        return create_model(name, pretrained=False, num_classes=num_classes, **kwargs)
