"""The five transformer components of a ViT block and what a finetuning run trains.

Paper §2 (Fig. 2, left) and appendix C.3 (Tables 3 and 4). Components are listed in the
plasticity order of the paper (§5.1): MHA > FC1 > FC2 > LN2 > LN1.

Beyond the paper's ViTs, the blocks of timm's later ViTs have the same five components under the
same names, and are taken as they are: ``Eva`` models (DINOv3, EVA-02, Perception Encoder, the
RoPE ViTs), whose attention takes a rotary position embedding, and ViTs with RMSNorm (AIMv2).
Where the feedforward layer is a SwiGLU with separate gate and value layers (``mlp.fc1_g`` and
``mlp.fc1_x``), FC1 is the two together: one linear map from d to 2h, the first layer of the
feedforward network, as a packed SwiGLU's single ``fc1`` is. Blocks without separate components
(timm's parallel blocks) are refused with the reason (``check_model``).
"""

from __future__ import annotations

from typing import Iterator

import pandas as pd
import torch
from torch import nn

from paperlib.records.names import COMPONENTS, CONFIGURATIONS, check_choice, check_component, check_run_component

MODULE_PATHS = {
    "mha": "attn",
    "fc1": "mlp.fc1",
    "fc2": "mlp.fc2",
    "ln2": "norm2",
    "ln1": "norm1",
}
"""Where each component lives inside a timm ``VisionTransformer`` block."""

OPTIMIZER_STATES = {"sgd": 1, "adam": 2}
"""Buffers per parameter kept by the optimiser: SGD momentum, Adam's two moments (appendix C.3)."""


def blocks(model: nn.Module) -> nn.Module:
    """The transformer blocks of ``model`` (``model.blocks``); a TypeError if it has none."""
    found = getattr(model, "blocks", None)
    if found is None or len(found) == 0:
        raise TypeError(
            f"{type(model).__name__} has no transformer blocks: paperlib expects a timm VisionTransformer "
            "(model.blocks[i] with attn, mlp.fc1, mlp.fc2, norm1, norm2)"
        )
    return found


SPLIT_FC1 = ("mlp.fc1_g", "mlp.fc1_x")
"""FC1 of a SwiGLU feedforward layer with separate gate and value layers (timm's ``SwiGLU``)."""


class JointLinear(nn.Module):
    """Linear layers that read the same input, as one linear map: their outputs side by side.

    FC1 of a SwiGLU block is its gate and value layers (``SPLIT_FC1``); this module holds the two
    (the model's own layers: training it trains them) and computes ``x -> [x W_g^T + b_g, x W_x^T
    + b_x]``, whose weight is the two weights stacked. It is not part of the model.
    """

    def __init__(self, parts: list[nn.Linear]):
        super().__init__()
        self.parts = nn.ModuleList(parts)
        self.in_features = parts[0].in_features
        self.out_features = sum(part.out_features for part in parts)

    @property
    def weight(self) -> torch.Tensor:
        return torch.cat([part.weight for part in self.parts])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([part(x) for part in self.parts], dim=-1)


def _missing(block: nn.Module, path: str) -> TypeError:
    return TypeError(
        f"block {type(block).__name__} has no {path!r}: expected a timm ViT block with attn, mlp.fc1 "
        f"(or SwiGLU's mlp.fc1_g and mlp.fc1_x), mlp.fc2, norm1 and norm2 (timm's VisionTransformer or Eva)"
    )


def block_component(block: nn.Module, component: str) -> nn.Module:
    """The module of ``component`` inside one transformer block.

    FC1 of a SwiGLU block is its gate and value layers as one ``JointLinear``."""
    check_component(component)
    path = MODULE_PATHS[component]
    try:
        return block.get_submodule(path)
    except AttributeError as error:
        if component == "fc1":
            try:
                return JointLinear([block.get_submodule(part) for part in SPLIT_FC1])
            except AttributeError:
                pass
        raise _missing(block, path) from error


def component_parts(module: nn.Module) -> list[nn.Module]:
    """The model's own modules behind ``block_component``'s result: itself, or a ``JointLinear``'s parts."""
    return list(module.parts) if isinstance(module, JointLinear) else [module]


def component_modules(model: nn.Module, component: str) -> list[nn.Module]:
    """The modules of ``component`` in every block, from the first block to the last.

    FC1 of a SwiGLU block is its gate and value layers, one after the other. MHA also owns a rotary position embedding
    with parameters (the learnable per-block frequencies of timm's mixed RoPE ViTs), which acts inside the attention
    only."""
    modules = [part for block in blocks(model) for part in component_parts(block_component(block, component))]
    rope = getattr(model, "rope", None)
    if component == "mha" and isinstance(rope, nn.Module) and any(True for _ in rope.parameters()):
        modules.append(rope)
    return modules


def check_model(model: nn.Module, name: str | None = None) -> nn.Module:
    """``model``, once every block is found to have the five components; otherwise a TypeError.

    The TypeError says which is missing (timm's parallel-branch blocks, ``ParallelScalingBlock``, have no separate
    attention and feedforward layers)."""
    for block in blocks(model):
        for component in COMPONENTS:
            try:
                block_component(block, component)
            except TypeError as error:
                what = f"model {name!r}" if name else type(model).__name__
                raise TypeError(f"{what} does not have the paper's five components in each block: {error}") from None
    return model


def head_modules(model: nn.Module) -> list[nn.Module]:
    """The classification head."""
    return [model.get_classifier()]


def final_norm_modules(model: nn.Module) -> list[nn.Module]:
    """The LayerNorm applied after the last block (``norm`` or ``fc_norm`` in timm)."""
    return [
        module
        for name in ("norm", "fc_norm")
        if isinstance(module := getattr(model, name, None), nn.Module) and any(True for _ in module.parameters())
    ]


def trained_modules(model: nn.Module, component: str) -> list[nn.Module]:
    """The modules a run of ``component`` (a configuration of ``names.CONFIGURATIONS``) trains (appendix C.3).

    Its components train in every block, with the classification head and the final LayerNorm (as in the authors'
    code); ``full`` trains everything (``[model]``) and ``linear`` the head only.
    """
    trains = CONFIGURATIONS[check_run_component(component)].components
    if trains is None:
        return [model]
    modules = head_modules(model)
    if trains:
        modules += [module for part in trains for module in component_modules(model, part)] + final_norm_modules(model)
    return modules


def set_trainable(model: nn.Module, component: str, adapters: list[nn.Module] | None = None) -> nn.Module:
    """Freeze every parameter except those a run of ``component`` finetunes; returns the model.

    What trains is ``trained_modules``: the component in every block, the head and the final norm. With
    ``adapters`` (what ``lora.add_lora`` or ``equal_capacity.add_subsets`` added beside the component),
    the adapters train in the component's place, with the same head and final norm.
    """
    modules = trained_modules(model, component)
    if adapters is not None:
        if not adapters:
            raise ValueError(f"no adapter of {component!r} to train: add LoRA or a subset first")
        modules = head_modules(model) + final_norm_modules(model) + list(adapters)
    model.requires_grad_(False)
    for module in modules:
        module.requires_grad_(True)
    return model


def trainable_parameters(model: nn.Module) -> Iterator[tuple[str, nn.Parameter]]:
    """Named parameters that require a gradient."""
    return ((name, p) for name, p in model.named_parameters() if p.requires_grad)


def count_parameters(modules: list[nn.Module]) -> int:
    """Number of scalars in the parameters of ``modules`` (shared tensors counted once)."""
    seen = {id(p): p.numel() for module in modules for p in module.parameters()}
    return sum(seen.values())


def component_parameters(model: nn.Module, component: str) -> int:
    """Parameters of ``component`` summed over all blocks (Table 3)."""
    return count_parameters(component_modules(model, component))


def parameter_share(model: nn.Module) -> pd.Series:
    """Each component's parameters over all blocks as a share of the model's.

    The parameters are what ``set_trainable`` trains of the component; the share is the capacity a
    component brings to finetuning, beside its plasticity (``capacity``)."""
    total = count_parameters([model])
    return pd.Series({c: component_parameters(model, c) / total for c in COMPONENTS}, name="parameter share")


def trained_parameters(model: nn.Module, component: str) -> int:
    """Parameters that ``set_trainable(model, component)`` leaves trainable (head and final norm included)."""
    return count_parameters(trained_modules(model, component))


def memory_load(num_parameters: int, bytes_per_parameter: int = 4, optimizer: str = "sgd") -> int:
    """Bytes for the gradients and optimiser states of ``num_parameters`` (Table 4).

    A gradient per parameter, plus one buffer per parameter for SGD with momentum (two for Adam),
    at ``bytes_per_parameter`` bytes each (4 for fp32).
    """
    check_choice(optimizer, OPTIMIZER_STATES, "optimizer", "optimizers")
    return num_parameters * bytes_per_parameter * (1 + OPTIMIZER_STATES[optimizer])


def parameter_table(
    model: nn.Module, bytes_per_parameter: int = 4, optimizer: str = "sgd", configurations=None
) -> pd.DataFrame:
    """Tables 3 and 4 for ``model``: per configuration, parameters, share and memory load.

    ``configurations``: names of ``names.CONFIGURATIONS`` (None: every one), an unknown one refused by name.
    ``parameters`` counts what the configuration trains in the blocks, over all blocks, as the paper does (the head
    for ``linear``, everything for ``full``); ``% of total`` divides by every parameter of the model; ``memory load
    (MiB)`` is the gradients plus optimiser states of those parameters. ``trainable`` is what ``set_trainable``
    really trains (the components plus the head and the final norm).
    """
    total = count_parameters([model])
    rows = []
    for name in CONFIGURATIONS if configurations is None else configurations:
        configuration = CONFIGURATIONS[check_run_component(name)]
        parts = configuration.components
        if parts is None:
            count = total
        else:
            count = count_parameters(
                [m for part in parts for m in component_modules(model, part)] or head_modules(model)
            )
        rows.append(
            {
                "configuration": configuration.label,
                "parameters": count,
                "% of total": 100.0 * count / total,
                "memory load (MiB)": memory_load(count, bytes_per_parameter, optimizer) / 2**20,
                "trainable": trained_parameters(model, name),
            }
        )
    return pd.DataFrame(rows).set_index("configuration")
