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
import hashlib
import json
from pathlib import Path

import timm
import torch
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.layers import Mlp
from timm.models import build_model_with_cfg, generate_default_cfgs, register_model
from timm.models.eva import Eva
from timm.models.vision_transformer import (
    Attention,
    VisionTransformer,
    checkpoint_filter_fn,
    init_weights_vit_timm,
)

from . import components, kernels, paths
from .transforms import IMAGENET, as_mean_std, check_normalize

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
    """timm architectures that build a ``VisionTransformer`` or an ``Eva`` ViT (valid ``create_model``
    names; the few whose blocks have no separate components are refused when built)."""
    return sorted(set(timm.list_models(module=list(VIT_MODULES))) | {DEMO_ARCH})


CUSTOM_WEIGHTS = ("model.safetensors", "pytorch_model.bin")  # the names timm's save_for_hf writes, in its order of preference


def custom_folder(name: str) -> Path:
    """The folder of model ``custom/<name>``: ``<models dir>/<name>``."""
    return paths.models_dir() / paths.custom_name(name, "model")


def custom_config(name: str) -> tuple[dict, Path]:
    """(config.json, weight file) of model ``custom/<name>``; errors say what is missing and how to make it."""
    folder = custom_folder(name)
    config_file = folder / "config.json"
    if not config_file.is_file():
        found = ", ".join(custom_model_names()) or "none"
        raise FileNotFoundError(
            f"model {name!r} not found: expected {config_file}. Save a model there with "
            f"paperlib.models.save_model(model, {name!r}) (or timm.models.save_for_hf(model, folder)); "
            f"custom models found in {paths.models_dir()}: {found}."
        )
    config = json.loads(config_file.read_text())
    arch = config.get("architecture")
    if arch not in vit_names():
        raise ValueError(f"{config_file} names architecture {arch!r}, which is not a timm VisionTransformer or Eva ViT (see paperlib.models.vit_names())")
    weights = next((folder / f for f in CUSTOM_WEIGHTS if (folder / f).is_file()), None)
    if weights is None:
        raise FileNotFoundError(f"model {name!r} has no weights: expected {' or '.join(str(folder / f) for f in CUSTOM_WEIGHTS)}")
    return config, weights


def content_fingerprint(name: str) -> str | None:
    """A digest of model ``custom/<name>`` as saved now (its ``config.json`` and its weight file's
    size and modification time); None for other names, whose weights do not change under them."""
    if not paths.custom_name(name, "model"):
        return None
    config, weights = custom_config(name)
    stat = weights.stat()
    text = json.dumps(config, sort_keys=True) + f"\n{weights.name}:{stat.st_size}:{stat.st_mtime_ns}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def custom_model_names() -> list[str]:
    """The ``custom/<name>`` models in ``paths.models_dir()`` (folders with a ``config.json``)."""
    base = paths.models_dir()
    if not base.is_dir():
        return []
    return sorted(paths.CUSTOM + p.name for p in base.iterdir() if (p / "config.json").is_file() and paths.CUSTOM_NAME.fullmatch(p.name))


def save_model(model: torch.nn.Module, name: str, model_args: dict | None = None, overwrite: bool = False,
               mean=None, std=None) -> Path:
    """Save ``model`` as ``custom/<name>`` (returns its folder) with timm's own writer,
    ``timm.models.save_for_hf``: ``config.json`` and ``model.safetensors``.

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
        raise ValueError("save_model needs a model made by timm (timm.create_model or paperlib.models.create_model, "
                         "with its architecture's arguments), which records its architecture; this one has none")
    if (mean is None) != (std is None):
        raise ValueError("give both mean and std (three numbers each), or neither")
    recorded = model.pretrained_cfg
    if mean is not None:
        pair = as_mean_std(mean, std)
        model.pretrained_cfg = {**recorded, "mean": pair[0], "std": pair[1]}
    write = lambda staging: timm.models.save_for_hf(model, str(staging), model_args=model_args, safe_serialization=True)  # noqa: E731
    try:
        return paths.atomic_folder(custom_folder(name), write, overwrite)
    finally:
        model.pretrained_cfg = recorded


def resolve_name(name: str) -> str:
    """The timm name (with pretrained tag, if any) for a short name or a timm ViT name;
    ``custom/<name>`` as it is, once its folder is found (``custom_config``)."""
    if name in SHORT_NAMES:
        return SHORT_NAMES[name]
    if paths.custom_name(name, "model"):
        custom_config(name)
        return name
    architecture, _, tag = name.partition(".")
    if architecture in vit_names() and (not tag or paths.CUSTOM_NAME.fullmatch(tag)):  # a tag is one folder name in result paths
        return name
    suggestions = difflib.get_close_matches(name, list(SHORT_NAMES) + vit_names(), n=3)
    hint = f" Did you mean: {', '.join(suggestions)}?" if suggestions else ""
    raise ValueError(
        f"unknown model {name!r}; valid short names: {', '.join(SHORT_NAMES)}; or any timm ViT name "
        f"(see paperlib.models.vit_names(), e.g. vit_small_patch16_224.augreg_in21k); or custom/<name> "
        f"for your own ViT saved with paperlib.models.save_model.{hint}"
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
    if paths.custom_name(name, "model"):
        config, _ = custom_config(name)
        cfg, where = config.get("pretrained_cfg") or {}, f"{custom_folder(name) / 'config.json'}'s pretrained_cfg"
    else:
        timm_name = resolve_name(name)
        try:
            found = timm.models.get_pretrained_cfg(timm_name)
        except RuntimeError as error:  # a tag timm does not know
            raise ValueError(f"normalize='model': timm has no pretrained configuration for {timm_name!r} ({error}); use normalize='imagenet'") from error
        cfg, where = (found.to_dict() if found is not None else {}), f"timm's pretrained configuration of {timm_name!r}"
    if cfg.get("mean") is None or cfg.get("std") is None:
        raise ValueError(f"normalize='model': {where} records no mean and std; use normalize='imagenet' "
                         "(or save the model with them: its pretrained_cfg's 'mean' and 'std')")
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
    if paths.custom_name(name, "model"):  # the architecture and arguments its config.json records; its head kept unless num_classes
        config, saved = custom_config(name)
        timm_name = config["architecture"]
        kwargs = {**config.get("model_args", {}), **kwargs}
        kwargs.setdefault("num_classes", config.get("num_classes", kwargs.get("num_classes")))
        saved_cfg = config.get("pretrained_cfg") or {}
        overlay = {"num_classes": config.get("num_classes"), "classifier": saved_cfg.get("classifier", "head")}
        overlay |= {key: tuple(saved_cfg[key]) for key in ("mean", "std") if saved_cfg.get(key) is not None}  # model.pretrained_cfg as saved
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
    except (OSError, ValueError) as error:
        if not pretrained or weights is not None or not _is_hub_error(error):
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
        # dataset); the head asked for is new, initialised as timm initialises a ViT's new head
        model.reset_classifier(num_classes)
        model.get_classifier().apply(init_weights_vit_timm)
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


def _is_patching(conv: torch.nn.Module) -> bool:
    """Whether ``conv`` is a convolution that cuts its input into patches: stride = kernel, no
    padding, dilation or groups."""
    return (isinstance(conv, torch.nn.Conv2d) and conv.stride == conv.kernel_size and not isinstance(conv.padding, str)
            and not any(conv.padding) and conv.dilation == (1, 1) and conv.groups == 1)


class PatchLinear(torch.nn.Module):
    """A patch embedding's convolution (kernel = stride, no padding) as one matrix product.

    The same function and the same parameters (``weight`` of shape (E, C, p, p) and ``bias``, so
    state dicts, bounds and components see no difference): the image is cut into its p x p
    patches, flattened in (C, p, p) order, and multiplied by the flattened kernel. The output is
    the convolution's (B, E, H/p, W/p) as a view of a channels-last result, which timm's
    ``PatchEmbed`` flattens to tokens without a copy. On an H100 the bf16 convolution of
    ViT-Base/16 took 4% of a compiled training step (a layout conversion of the images, an
    implicit-GEMM kernel and its weight gradient); as a matrix product it is one of many.
    """

    def __init__(self, conv: torch.nn.Conv2d):
        super().__init__()
        if not _is_patching(conv):
            raise ValueError(f"PatchLinear needs a convolution with stride = kernel and no padding, dilation or groups; got {conv}")
        self.kernel_size = conv.kernel_size
        self.out_channels = conv.out_channels
        self.weight = conv.weight
        self.bias = conv.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, channels, height, width = x.shape
        (ph, pw), (h, w) = self.kernel_size, (height // self.kernel_size[0], width // self.kernel_size[1])
        x = x[:, :, : h * ph, : w * pw]  # the convolution drops what does not fill a patch
        patches = x.reshape(batch, channels, h, ph, w, pw).permute(0, 2, 4, 1, 3, 5).reshape(batch, h * w, channels * ph * pw)
        tokens = torch.nn.functional.linear(patches, self.weight.reshape(self.out_channels, -1), self.bias)
        return tokens.reshape(batch, h, w, self.out_channels).permute(0, 3, 1, 2)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[1]}, {self.out_channels}, kernel_size={self.kernel_size} (as a matrix product)"


def linear_patch_embed(model: torch.nn.Module) -> torch.nn.Module:
    """Replace ``model.patch_embed.proj`` (a convolution) by the same function as a matrix product
    (``PatchLinear``), in place; returns the model. Does nothing if it is done already or the model
    has no such convolution."""
    embed = getattr(model, "patch_embed", None)
    proj = getattr(embed, "proj", None)
    if _is_patching(proj):
        embed.proj = PatchLinear(proj)
    return model


def _is_fusable_mlp(mlp: torch.nn.Module) -> bool:
    """Whether ``mlp`` is a timm ``Mlp`` whose first layer is a linear layer with a bias followed by
    the exact (erf) GELU, the pair ``kernels.bias_gelu`` computes."""
    fc1, act = getattr(mlp, "fc1", None), getattr(mlp, "act", None)
    return (isinstance(mlp, Mlp) and type(fc1) is torch.nn.Linear and fc1.bias is not None
            and type(act) is torch.nn.GELU and act.approximate == "none")


def _is_fusable_attention(attention: torch.nn.Module) -> bool:
    """Whether ``attention`` is a timm ``Attention`` with a biased q/k/v projection and no gate, the
    form ``kernels.QkvHeads`` computes."""
    qkv = getattr(attention, "qkv", None)
    return (isinstance(attention, Attention) and type(qkv) is torch.nn.Linear and qkv.bias is not None
            and getattr(attention, "gate", None) is None)


class _FusedLayer(torch.nn.Module):
    """A timm layer taken over with its submodules (``SUBMODULES``, so the same parameter names:
    state dicts, components and bounds see no difference) and attributes (``ATTRIBUTES``), for a
    forward that runs one of our fused ops. ``FUSABLE`` tells the layers of the form it computes."""

    FUSABLE = staticmethod(lambda layer: False)
    SUBMODULES: tuple[str, ...] = ()
    ATTRIBUTES: tuple[str, ...] = ()
    READS: tuple[str, ...] = ()  # submodules whose weights the fused op reads itself (not called as modules: LoRA there would be skipped)
    NEEDS = ""  # the form, in words, for the error

    def __init__(self, layer: torch.nn.Module):
        super().__init__()
        if not self.FUSABLE(layer):
            raise ValueError(f"{type(self).__name__} needs {self.NEEDS}; got {layer}")
        for name in self.SUBMODULES + self.ATTRIBUTES:
            setattr(self, name, getattr(layer, name))


class BiasGeluMlp(_FusedLayer):
    """A ViT feedforward layer (timm's ``Mlp``) whose first layer's bias and GELU are one fused op,
    ``kernels.bias_gelu``: the matrix product runs without its bias, and the op's backward gives
    the bias gradient from the same pass that gives the product's gradient. The same function."""

    FUSABLE = staticmethod(_is_fusable_mlp)
    SUBMODULES = ("fc1", "act", "drop1", "norm", "fc2", "drop2")
    READS = ("fc1",)
    NEEDS = "a timm Mlp with a biased nn.Linear fc1 and nn.GELU() (exact) act"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = kernels.bias_gelu(torch.nn.functional.linear(x, self.fc1.weight), self.fc1.bias)
        return self.drop2(self.fc2(self.norm(self.drop1(x))))


class QkvFusedAttention(_FusedLayer):
    """A ViT attention layer (timm's ``Attention``) whose q/k/v projection and split into heads run
    through ``kernels.QkvHeads``: the backward stacks the head gradients and sums the projection's
    bias gradient in one pass. The heads go to ``scaled_dot_product_attention`` as in timm's fused
    path. The same function."""

    FUSABLE = staticmethod(_is_fusable_attention)
    SUBMODULES = ("qkv", "q_norm", "k_norm", "attn_drop", "norm", "proj", "proj_drop")
    READS = ("qkv",)
    ATTRIBUTES = ("num_heads", "head_dim", "attn_dim")
    NEEDS = "a timm Attention with a biased nn.Linear qkv and no gate"

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, is_causal: bool = False) -> torch.Tensor:
        batch, tokens, _ = x.shape
        q, k, v = kernels.QkvHeads.apply(x, self.qkv.weight, self.qkv.bias, self.num_heads)
        q, k = self.q_norm(q), self.k_norm(k)
        x = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal,
                                                             dropout_p=self.attn_drop.p if self.training else 0.0)
        x = self.norm(x.transpose(1, 2).reshape(batch, tokens, self.attn_dim))
        return self.proj_drop(self.proj(x))


def _fuse_blocks(model: torch.nn.Module, attribute: str, fused: type[_FusedLayer]) -> torch.nn.Module:
    """Replace ``block.<attribute>`` of every block by ``fused`` where it has the form ``fused``
    computes, in place; returns the model. Blocks done already, and layers of another form, are
    left as they are."""
    for block in getattr(model, "blocks", ()):
        if fused.FUSABLE(getattr(block, attribute, None)):
            setattr(block, attribute, fused(getattr(block, attribute)))
    return model


def fuse_bias_gelu(model: torch.nn.Module) -> torch.nn.Module:
    """Every block's feedforward layer as ``BiasGeluMlp`` (``kernels.bias_gelu``), in place; feedforward
    layers of another form (another activation, no bias) are left as they are."""
    return _fuse_blocks(model, "mlp", BiasGeluMlp)


def fuse_qkv(model: torch.nn.Module) -> torch.nn.Module:
    """Every block's attention as ``QkvFusedAttention`` (``kernels.QkvHeads``), in place; attention
    of another form is left as it is."""
    return _fuse_blocks(model, "attn", QkvFusedAttention)
