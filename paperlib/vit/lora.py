"""LoRA on one component (beyond the paper).

The paper's §7 names "applying LoRa only to the components with high plasticity" as future work.

    from paperlib.records.methods import Lora
    from paperlib.train import finetune
    from paperlib.train.config import Config
    finetune.run(Config(component="mha", method=Lora(rank=8), lr=0.05))   # LoRA on every block's attention

Where component-wise finetuning (``components.set_trainable``) trains a component's weights
themselves, LoRA (Hu et al., 2022) freezes them and trains a low-rank update ``B @ A`` (rank
``r``, scaled by ``alpha / r``) beside each of the component's weight matrices, through the
field's library, peft (``inject_adapter_in_model``: the model stays a timm ViT, its linear layers
wrapped in peft's ``peft.tuners.lora.Linear``, less a multiplication by a scale of 1: ``add_lora``). The rest
of the protocol is the component-wise one: the new head and the final LayerNorm train too,
everything else is frozen. ``B`` starts at zero, so the model starts as the pretrained one.

The weight matrices of each configuration (``TARGETS``): ``mha``, the attention's q/k/v (one
fused matrix, or three) and output projections; ``fc1`` and ``fc2``, the feedforward layers; ``full``, all four
(the usual LoRA of a ViT). LayerNorms have no weight matrix, so ``ln1``, ``ln2`` and ``linear`` take none.
``merge`` folds the updates into the weights and gives back a plain timm ViT (for plasticity,
saving with ``models.save_model``...).
"""

from __future__ import annotations

import functools

import pandas as pd
import torch
from torch import nn

from paperlib.records.methods import Lora
from paperlib.records.names import ADAPTABLE, LABELS
from paperlib.vit import components
from paperlib.vit.methods import Trainer

TARGETS = {
    "mha": ("attn.qkv", "attn.proj"),
    "fc1": ("mlp.fc1",),
    "fc2": ("mlp.fc2",),
    "full": ("attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2"),
}
"""The weight matrices (paths inside a timm ViT block) that LoRA adapts for each configuration (``names.ADAPTABLE``).

Blocks of timm's later ViTs (``components``) name some of them otherwise, and LoRA adapts what
they have in their place (``ALTERNATIVES``): separate query, key and value projections for
``attn.qkv`` (EVA-02, AIMv2's relatives); a SwiGLU's gate and value layers for ``mlp.fc1``."""

ALTERNATIVES = {
    "attn.qkv": ("attn.q_proj", "attn.k_proj", "attn.v_proj"),
    "mlp.fc1": components.SPLIT_FC1,
}


def _block_paths(block: nn.Module, path: str) -> tuple[str, ...]:
    """``path``, or what stands in its place in ``block`` (``ALTERNATIVES``) when it has not it."""
    if _has(block, path) or path not in ALTERNATIVES or not all(_has(block, other) for other in ALTERNATIVES[path]):
        return (path,)
    return ALTERNATIVES[path]


def _has(block: nn.Module, path: str) -> bool:
    try:
        return block.get_submodule(path) is not None
    except AttributeError:
        return False


def target_names(model: nn.Module, component: str) -> list[str]:
    """The full names of the linear layers that LoRA adapts for ``component``, block by block."""
    if component not in TARGETS:
        raise ValueError(f"unknown LoRA configuration {component!r}; valid configurations: {', '.join(ADAPTABLE)}")
    names = []
    for index, block in enumerate(components.blocks(model)):
        for path in (found for target in TARGETS[component] for found in _block_paths(block, target)):
            try:
                layer = block.get_submodule(path)
            except AttributeError as error:
                raise TypeError(f"block {index} has no {path!r}: LoRA here expects a timm ViT block") from error
            if not isinstance(layer, nn.Linear):
                raise TypeError(f"blocks.{index}.{path} is a {type(layer).__name__}, not a linear layer LoRA can adapt")
            parent, _, child = path.rpartition(".")
            owner = block.get_submodule(parent)
            if child in getattr(owner, "READS", ()):
                # a fused op reads this layer's weight itself and would skip the update
                raise ValueError(
                    f"blocks.{index}.{parent} runs one of our fused ops, which reads {child}'s weight itself and would "
                    "bypass LoRA: add LoRA before speed.step.fuse / compile_model (as finetune.train does)"
                )
            if (
                child == "qkv"
                and getattr(owner, "q_bias", None) is not None
                and not getattr(owner, "qkv_bias_separate", True)
            ):
                # timm's EvaAttention with separate q/v biases multiplies by qkv.weight itself (F.linear)
                raise ValueError(
                    f"blocks.{index}.{parent} ({type(owner).__name__} with separate query and value biases) applies "
                    f"{child}'s weight itself, which would bypass LoRA: LoRA on {component!r} is not available "
                    "for this model; finetune the component's weights (method weights), or LoRA on fc1 or fc2"
                )
            names.append(f"blocks.{index}.{path}")
    return names


def add_lora(model: nn.Module, component: str, rank: int, alpha: float = 0.0, dropout: float = 0.0) -> nn.Module:
    """``model`` with a LoRA update of rank ``rank`` beside each weight matrix of ``component``.

    The weight matrices are those of ``TARGETS``; ``model`` is changed in place. ``alpha`` 0 means
    the rank. ``A`` is drawn from torch's generator (peft's Kaiming-uniform), ``B`` is zero: the
    function is unchanged until training."""
    method = Lora(rank, alpha, dropout)  # alpha 0: the rank
    method.check(component)
    return _inject(model, component, method)


def _inject(model: nn.Module, component: str, method: Lora) -> nn.Module:
    """``add_lora``'s work, with a ``method`` checked for ``component`` (a run's is, when the run is made)."""
    # peft imports transformers: only when LoRA is asked for
    from peft import LoraConfig, inject_adapter_in_model

    settings = LoraConfig(
        r=method.rank,
        lora_alpha=method.alpha,
        lora_dropout=method.dropout,
        bias="none",
        target_modules=target_names(model, component),
    )
    settings._register_custom_module({nn.Linear: _linear_layer()})  # peft's way to choose its layer
    return inject_adapter_in_model(settings, model)


@functools.cache
def _linear_layer() -> type:
    """The layer ``add_lora`` puts in place of each linear layer: peft's, without a multiplication by a scale of 1.

    It is peft's ``peft.tuners.lora.Linear``, without its multiplication of the update ``B @ A x`` by the scale
    ``alpha / r`` when that is 1 (``alpha`` 0, the rank: the default). That multiplication is a pass over the layer's
    output forward and another backward, which on a CPU cost more than the update's small products, and by 1 it changes
    no bit. Any other case (another scale, several adapters, a variant, merged or disabled adapters, extra arguments)
    takes peft's own forward."""
    from peft.tuners.lora import Linear

    class UnitScaleLinear(Linear):
        def forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
            name = self.active_adapters[0] if len(self.active_adapters) == 1 else None
            if (
                args
                or kwargs
                or self.disable_adapters
                or self.merged
                or name not in self.lora_A
                or name in self.lora_variant
                or self.scaling[name] != 1
            ):
                return super().forward(x, *args, **kwargs)
            result = self.base_layer(x)
            x = self._cast_input_dtype(x, self.lora_A[name].weight.dtype)
            return (result + self.lora_B[name](self.lora_A[name](self.lora_dropout[name](x)))).to(result.dtype)

    return UnitScaleLinear


def adapted_layers(model: nn.Module) -> list[nn.Module]:
    """The layers of ``model`` that carry a LoRA update (peft's ``LoraLayer``), in order."""
    from peft.tuners.lora import LoraLayer

    return [module for module in model.modules() if isinstance(module, LoraLayer)]


def updates(model: nn.Module) -> list[nn.Module]:
    """The LoRA updates ``model`` carries (each adapted layer's ``lora_A`` and ``lora_B``).

    What a LoRA run trains in its component's place (``components.set_trainable``'s ``adapters``)."""
    return [part for layer in adapted_layers(model) for part in (layer.lora_A, layer.lora_B)]


def merge(model: nn.Module) -> nn.Module:
    """Fold every LoRA update into its weight matrix and put the plain linear layer back, in place.

    As peft's ``merge``. Returns the model: a timm ViT with its usual parameter names and the same function (to
    rounding)."""
    from peft.tuners.lora import LoraLayer

    for name, layer in [(name, module) for name, module in model.named_modules() if isinstance(module, LoraLayer)]:
        layer.merge()
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, child, layer.get_base_layer())
    return model


def lora_parameters(model: nn.Module, component: str, rank: int) -> int:
    """Parameters of the LoRA updates of rank ``rank`` for ``component`` over all blocks.

    ``rank * (inputs + outputs)`` per adapted matrix (``model`` without LoRA)."""
    return sum(
        rank * (layer.in_features + layer.out_features)
        for layer in (model.get_submodule(name) for name in target_names(model, component))
    )


def parameter_table(model: nn.Module, rank: int, bytes_per_parameter: int = 4, optimizer: str = "sgd") -> pd.DataFrame:
    """Table 3 and 4's columns for LoRA of rank ``rank`` (``model`` without LoRA).

    Per configuration, the updates' parameters over all blocks, as a share of the weights they adapt and of the whole
    model, their memory load (gradients and optimizer states), and ``trainable`` (with the head and the final norm, as
    trained here)."""
    total = components.count_parameters([model])
    shared = components.count_parameters(components.head_modules(model) + components.final_norm_modules(model))
    rows = []
    for component in ADAPTABLE:
        count = lora_parameters(model, component, rank)
        adapted = sum(model.get_submodule(name).weight.numel() for name in target_names(model, component))
        rows.append(
            {
                "configuration": f"{LABELS[component]} (LoRA r={rank})",
                "parameters": count,
                "% of adapted weights": 100.0 * count / adapted,
                "% of total": 100.0 * count / total,
                "memory load (MiB)": components.memory_load(count, bytes_per_parameter, optimizer) / 2**20,
                "trainable": count + shared,
            }
        )
    return pd.DataFrame(rows).set_index("configuration")


class LoraTrainer(Trainer):
    """The trainer of ``records.methods.Lora``: a LoRA update beside each weight matrix of the component."""

    def adapt(self, model: nn.Module, method: Lora, component: str) -> list[nn.Module]:
        """LoRA updates of the method's rank, alpha and dropout on the component (``add_lora``); they train.

        ``method`` is a run's, checked for ``component`` when the run was made (``records.runs.Run.validate``)."""
        _inject(model, component, method)
        return updates(model)

    def merge(self, model: nn.Module) -> nn.Module:
        """The updates folded into the weights (``merge``)."""
        return merge(model)

    def parameter_table(self, model: nn.Module, method: Lora, component: str) -> pd.DataFrame:
        """The updates' row of ``parameter_table``: their share of the weights they adapt, their memory."""
        return parameter_table(model, method.rank).loc[[f"{LABELS[component]} (LoRA r={method.rank})"]]
