"""Layers that compute what timm's do, faster on a GPU.

The patch embedding as a matrix product, and the blocks' layers that run our fused ops (``kernels``). The same
parameters (state dicts, components and bounds see no difference) and the same function, to rounding.
"""

from __future__ import annotations

import torch
from timm.layers import Mlp
from timm.models.vision_transformer import Attention

from paperlib.speed.kernels import QkvHeads, bias_gelu


def _is_patching(conv: torch.nn.Module) -> bool:
    """Whether ``conv`` is a convolution that cuts its input into patches.

    That is: stride = kernel, no padding, dilation or groups."""
    return (
        isinstance(conv, torch.nn.Conv2d)
        and conv.stride == conv.kernel_size
        and not isinstance(conv.padding, str)
        and not any(conv.padding)
        and conv.dilation == (1, 1)
        and conv.groups == 1
    )


class PatchLinear(torch.nn.Module):
    """A patch embedding's convolution (kernel = stride, no padding) as one matrix product.

    The same function and the same parameters (``weight`` of shape (E, C, p, p) and ``bias``, so
    state dicts, bounds and components see no difference): the image is cut into its p x p
    patches, flattened in (C, p, p) order, and multiplied by the flattened kernel. The output is
    the convolution's (B, E, H/p, W/p) as a view of a channels-last result, which timm's
    ``PatchEmbed`` flattens to tokens without a copy: on a GPU, one more matrix product instead
    of a layout conversion of the images and an implicit-GEMM kernel.
    """

    def __init__(self, conv: torch.nn.Conv2d):
        super().__init__()
        if not _is_patching(conv):
            raise ValueError(
                f"PatchLinear needs a convolution with stride = kernel and no padding, dilation or groups; got {conv}"
            )
        self.kernel_size = conv.kernel_size
        self.out_channels = conv.out_channels
        self.weight = conv.weight
        self.bias = conv.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, channels, height, width = x.shape
        (ph, pw), (h, w) = self.kernel_size, (height // self.kernel_size[0], width // self.kernel_size[1])
        x = x[:, :, : h * ph, : w * pw]  # the convolution drops what does not fill a patch
        patches = (
            x.reshape(batch, channels, h, ph, w, pw).permute(0, 2, 4, 1, 3, 5).reshape(batch, h * w, channels * ph * pw)
        )
        tokens = torch.nn.functional.linear(patches, self.weight.reshape(self.out_channels, -1), self.bias)
        return tokens.reshape(batch, h, w, self.out_channels).permute(0, 3, 1, 2)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[1]}, {self.out_channels}, kernel_size={self.kernel_size} (as a matrix product)"


def linear_patch_embed(model: torch.nn.Module) -> torch.nn.Module:
    """Replace ``model.patch_embed.proj`` by the same function as a matrix product, in place.

    The convolution becomes a ``PatchLinear``; returns the model. Does nothing if it is done already or the
    model has no such convolution."""
    embed = getattr(model, "patch_embed", None)
    proj = getattr(embed, "proj", None)
    if _is_patching(proj):
        embed.proj = PatchLinear(proj)
    return model


def is_fusable_mlp(mlp: torch.nn.Module) -> bool:
    """Whether ``mlp`` is the bias and GELU pair that ``kernels.bias_gelu`` computes.

    That is, a timm ``Mlp`` whose first layer is a linear layer with a bias followed by the exact
    (erf) GELU."""
    fc1, act = getattr(mlp, "fc1", None), getattr(mlp, "act", None)
    return (
        isinstance(mlp, Mlp)
        and type(fc1) is torch.nn.Linear
        and fc1.bias is not None
        and type(act) is torch.nn.GELU
        and act.approximate == "none"
    )


def is_fusable_attention(attention: torch.nn.Module) -> bool:
    """Whether ``attention`` has the form ``kernels.QkvHeads`` computes.

    Whether ``attention`` is a timm ``Attention`` with a biased q/k/v projection and no gate, the
    form ``kernels.QkvHeads`` computes."""
    qkv = getattr(attention, "qkv", None)
    return (
        isinstance(attention, Attention)
        and type(qkv) is torch.nn.Linear
        and qkv.bias is not None
        and getattr(attention, "gate", None) is None
    )


class _FusedLayer(torch.nn.Module):
    """A timm layer taken over for a forward that runs one of our fused ops.

    It takes over the layer's submodules (``SUBMODULES``, so the same parameter names: state dicts, components and
    bounds see no difference) and attributes (``ATTRIBUTES``). ``FUSABLE`` tells the layers of the form it computes."""

    FUSABLE = staticmethod(lambda layer: False)
    SUBMODULES: tuple[str, ...] = ()
    ATTRIBUTES: tuple[str, ...] = ()
    # submodules whose weights the fused op reads itself (not called as modules: LoRA there would be skipped)
    READS: tuple[str, ...] = ()
    NEEDS = ""  # the form, in words, for the error

    def __init__(self, layer: torch.nn.Module):
        super().__init__()
        if not self.FUSABLE(layer):
            raise ValueError(f"{type(self).__name__} needs {self.NEEDS}; got {layer}")
        for name in self.SUBMODULES + self.ATTRIBUTES:
            setattr(self, name, getattr(layer, name))


class BiasGeluMlp(_FusedLayer):
    """A ViT feedforward layer whose first layer's bias and GELU are one fused op.

    The layer is timm's ``Mlp``, the op ``kernels.bias_gelu``: the matrix product runs without its
    bias, and the op's backward gives the bias gradient from the same pass that gives the product's
    gradient. The same function."""

    FUSABLE = staticmethod(is_fusable_mlp)
    SUBMODULES = ("fc1", "act", "drop1", "norm", "fc2", "drop2")
    READS = ("fc1",)
    NEEDS = "a timm Mlp with a biased nn.Linear fc1 and nn.GELU() (exact) act"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = bias_gelu(torch.nn.functional.linear(x, self.fc1.weight), self.fc1.bias)
        return self.drop2(self.fc2(self.norm(self.drop1(x))))


class QkvFusedAttention(_FusedLayer):
    """A ViT attention layer whose q/k/v projection and split into heads run through ``kernels.QkvHeads``.

    The layer is timm's ``Attention``. The backward stacks the head gradients and sums the
    projection's bias gradient in one pass. The heads go to ``scaled_dot_product_attention`` as in
    timm's fused path. The same function."""

    FUSABLE = staticmethod(is_fusable_attention)
    SUBMODULES = ("qkv", "q_norm", "k_norm", "attn_drop", "norm", "proj", "proj_drop")
    READS = ("qkv",)
    ATTRIBUTES = ("num_heads", "head_dim", "attn_dim")
    NEEDS = "a timm Attention with a biased nn.Linear qkv and no gate"

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, is_causal: bool = False) -> torch.Tensor:
        batch, tokens, _ = x.shape
        q, k, v = QkvHeads.apply(x, self.qkv.weight, self.qkv.bias, self.num_heads)
        q, k = self.q_norm(q), self.k_norm(k)
        x = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, is_causal=is_causal, dropout_p=self.attn_drop.p if self.training else 0.0
        )
        x = self.norm(x.transpose(1, 2).reshape(batch, tokens, self.attn_dim))
        return self.proj_drop(self.proj(x))


def _fuse_blocks(model: torch.nn.Module, attribute: str, fused: type[_FusedLayer]) -> torch.nn.Module:
    """Replace ``block.<attribute>`` of every block by ``fused`` where it has the form ``fused`` computes, in place.

    Returns the model. Blocks done already, and layers of another form, are left as they are."""
    for block in getattr(model, "blocks", ()):
        if fused.FUSABLE(getattr(block, attribute, None)):
            setattr(block, attribute, fused(getattr(block, attribute)))
    return model


def fuse_bias_gelu(model: torch.nn.Module) -> torch.nn.Module:
    """Every block's feedforward layer as ``BiasGeluMlp`` (``kernels.bias_gelu``), in place.

    Feedforward layers of another form (another activation, no bias) are left as they are."""
    return _fuse_blocks(model, "mlp", BiasGeluMlp)


def fuse_qkv(model: torch.nn.Module) -> torch.nn.Module:
    """Every block's attention as ``QkvFusedAttention`` (``kernels.QkvHeads``), in place.

    Attention of another form is left as it is."""
    return _fuse_blocks(model, "attn", QkvFusedAttention)
