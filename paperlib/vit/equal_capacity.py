"""Equal-capacity finetuning (beyond the paper): every component trains the same number of parameters.

On a ViT the paper's plasticity order is nearly the order of the components' sizes (MHA, FC1 and
FC2 hold about 4d² parameters per block, LN2 and LN1 2d), so Table 6 cannot tell "more plastic"
from "larger" (``capacity``). Here a run trains ``k`` parameters per block in its component, ``k``
the same for every component: what the smallest has (``per_block``, a LayerNorm's gain and bias, 2d).
LN1 and LN2 then train as they are (their ordinary runs are their equal-capacity runs, so
``Config`` accepts the option for MHA, FC1 and FC2 only); MHA, FC1 and FC2 each train a fixed
random subset of ``k`` of the entries of their weights and biases in each block (``draw``).

Why a random subset: it is the subset that has nothing in common with a component's function but
its size, so what is left to differ between components is their plasticity. A structured subset
would add a behaviour of its own: the biases alone, for example, shift a layer's output without
changing what it computes, and they cannot make the sizes equal anyway (FC2 has d biases per
block, fewer than a LayerNorm's 2d), so no biases-only reading is offered.

How: a parametrization (``torch.nn.utils.parametrize``, the field's way to reparametrize a weight)
adds a trainable vector ``delta`` of the subset's length at its entries: ``W = W0 + scatter(delta)``.
``W0`` does not train, so the entries outside the subset are bit-identical after any run, whatever the
optimizer, its momentum, clipping or precision; with SGD without weight decay (the paper's), training
``delta`` from 0 is training the subset's entries themselves. Clipping sees what the run trains: the
subset's ``delta``, the head and the final norm (a run records its share of that norm, ``component_grad_share``,
and how often clipping bound, ``clipped_steps``). AdamW's weight decay would never reach ``delta`` (a vector;
``speed.step.decay_groups`` decays weight matrices only) where it decays an ordinary run's component, so a subset run
is refused with weight decay (``records.methods.Subset.check``).
The subset is drawn from its own seed (``records.methods.Subset``'s ``seed``) and the model's shape alone: the same for
every learning rate and seed of one configuration. ``merge`` folds ``delta`` in, leaving a plain timm ViT.
"""

from __future__ import annotations

import hashlib

import pandas as pd
import torch
from torch import nn
from torch.nn.utils import parametrize

from paperlib.records.methods import Subset
from paperlib.records.names import COMPONENTS, LABELS
from paperlib.vit import components
from paperlib.vit.methods import Trainer


def _entries(block: nn.Module, component: str) -> list[tuple[nn.Module, str, nn.Parameter]]:
    """The parameters of ``component`` in one block, in a fixed order: (module, name, parameter)."""
    found = []
    for part in components.component_parts(components.block_component(block, component)):
        for module in part.modules():
            found += [(module, name, p) for name, p in module.named_parameters(recurse=False)]
    return found


def per_block(model: nn.Module) -> int:
    """``k``: the parameters per block of the smallest component (a LayerNorm's gain and bias, 2d)."""
    first = components.blocks(model)[0]
    return min(sum(p.numel() for _, _, p in _entries(first, component)) for component in COMPONENTS)


def draw(model: nn.Module, component: str, seed: int = 0) -> list[torch.Tensor]:
    """Per block, the ``k`` (``per_block``) entries of ``component`` that train.

    Sorted positions in the block's parameters laid end to end (``_entries``' order), uniform without replacement from
    ``seed`` (a generator of its own: torch's global one is not drawn from)."""
    k = per_block(model)
    generator = torch.Generator().manual_seed(seed)
    chosen = []
    for block in components.blocks(model):
        size = sum(p.numel() for _, _, p in _entries(block, component))
        chosen.append(torch.randperm(size, generator=generator)[:k].sort().values)
    return chosen


class SubsetUpdate(nn.Module):
    """The parametrization of one tensor: ``W0 + delta`` at ``index`` (flat positions), ``W0`` elsewhere."""

    def __init__(self, index: torch.Tensor, like: torch.Tensor):
        super().__init__()
        self.register_buffer("index", index.to(like.device))
        self.delta = nn.Parameter(torch.zeros(len(index), dtype=like.dtype, device=like.device))

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        flat = weight.flatten()
        return flat.index_put((self.index,), flat[self.index] + self.delta.to(weight.dtype)).view_as(weight)


def add_subsets(model: nn.Module, component: str, seed: int = 0) -> list[nn.Module]:
    """``model`` with a ``SubsetUpdate`` on each parameter of ``component`` that holds drawn entries.

    The entries are ``draw``'s; ``model`` is changed in place. Returns the updates, what a run
    trains of its component (``components.set_trainable``'s ``adapters``)."""
    Subset(seed).check(component)
    return _add(model, component, seed)


def _add(model: nn.Module, component: str, seed: int) -> list[nn.Module]:
    """``add_subsets``' work, with a ``seed`` and ``component`` checked (a run's are, when the run is made)."""
    updates = []
    for block, chosen in zip(components.blocks(model), draw(model, component, seed)):
        start = 0
        for module, name, p in _entries(block, component):
            mine = chosen[(chosen >= start) & (chosen < start + p.numel())] - start
            start += p.numel()
            if len(mine):
                update = SubsetUpdate(mine, p)
                parametrize.register_parametrization(module, name, update)
                updates.append(update)
    return updates


def subset_updates(model: nn.Module) -> list[SubsetUpdate]:
    """The ``SubsetUpdate``s ``model`` carries (``add_subsets``), in order."""
    return [module for module in model.modules() if isinstance(module, SubsetUpdate)]


def digest(model: nn.Module) -> str:
    """A short fingerprint of the subset ``model`` trains (its ``SubsetUpdate``s' positions), recorded with the run."""
    positions = torch.cat([update.index.cpu() for update in subset_updates(model)])
    return hashlib.sha256(positions.numpy().tobytes()).hexdigest()[:16]


def merge(model: nn.Module) -> nn.Module:
    """Fold every ``SubsetUpdate`` into its tensor, in place: a plain timm ViT again. Returns the model."""
    for module in list(model.modules()):
        if parametrize.is_parametrized(module):
            for name in list(module.parametrizations):
                parametrize.remove_parametrizations(module, name, leave_parametrized=True)
    return model


def parameter_table(model: nn.Module) -> pd.DataFrame:
    """Table 3's layout for equal-capacity runs (``model`` without updates).

    Per component, the parameters it trains per block and over all blocks, as a share of the component's, and
    ``trainable`` with the head and the final norm, which train in every run."""
    k, depth = per_block(model), len(components.blocks(model))
    shared = components.count_parameters(components.head_modules(model) + components.final_norm_modules(model))
    rows = []
    for component in COMPONENTS:
        whole = components.component_parameters(model, component)
        rows.append(
            {
                "configuration": f"{LABELS[component]} (equal capacity)",
                "per block": k,
                "parameters": k * depth,
                "% of the component": 100.0 * k * depth / whole,
                "trainable": k * depth + shared,
            }
        )
    return pd.DataFrame(rows).set_index("configuration")


class SubsetTrainer(Trainer):
    """The trainer of ``records.methods.Subset``: a seeded random subset of the component's entries."""

    def adapt(self, model: nn.Module, method: Subset, component: str) -> list[nn.Module]:
        """The subset's updates (``add_subsets``); they train.

        ``method`` is a run's, checked for ``component`` when the run was made (``records.runs.Run.validate``)."""
        return _add(model, component, method.seed)

    def merge(self, model: nn.Module) -> nn.Module:
        """The updates folded into the weights (``merge``)."""
        return merge(model)

    def summary(self, model: nn.Module) -> dict:
        """The subset's digest (``digest``): the same for every learning rate and seed."""
        return {"subset": digest(model)}

    def parameter_table(self, model: nn.Module, method: Subset, component: str) -> pd.DataFrame:
        """The subset's row of ``parameter_table``: its size per block and over all blocks."""
        return parameter_table(model).loc[[f"{LABELS[component]} (equal capacity)"]]
