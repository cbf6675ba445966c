"""What each way to train a component does to a model: the trainers of ``records.methods``' methods, by name.

A trainer adds what trains in the component's place (``adapt``: nothing for the component's own weights, a LoRA update,
a subset), folds it back into a plain timm ViT (``merge``) and says what a run's metrics record of it (``summary``).
"""

from __future__ import annotations

import pandas as pd
from torch import nn

from paperlib.records.methods import method_of
from paperlib.records.names import LABELS
from paperlib.vit import components, equal_capacity, lora


class Trainer:
    """The component's own weights train (the paper's way): nothing added, nothing to merge."""

    def adapt(self, model: nn.Module, record: dict) -> list[nn.Module] | None:
        """What trains in the component's place, added to ``model`` in place; None: the component itself."""
        return None

    def merge(self, model: nn.Module) -> nn.Module:
        """``model`` as a plain timm ViT, what ``adapt`` added folded into its weights."""
        return model

    def summary(self, model: nn.Module) -> dict:
        """What a run's ``metrics.json`` records of what trained."""
        return {}

    def parameter_table(self, model: nn.Module, record: dict) -> pd.DataFrame:
        """Tables 3 and 4's row of what the run trains (``components.parameter_table``)."""
        return components.parameter_table(model, configurations=[record["component"]])


class LoraTrainer(Trainer):
    """A LoRA update beside each weight matrix of the component (``lora.add_lora``)."""

    def adapt(self, model: nn.Module, record: dict) -> list[nn.Module] | None:
        """LoRA updates of the record's rank, alpha and dropout on the component; they train."""
        rank, alpha, dropout = record["lora_rank"], record["lora_alpha"], record["lora_dropout"]
        lora.add_lora(model, record["component"], rank, alpha, dropout)
        return lora.updates(model)

    def merge(self, model: nn.Module) -> nn.Module:
        """The updates folded into the weights (``lora.merge``)."""
        return lora.merge(model)

    def parameter_table(self, model: nn.Module, record: dict) -> pd.DataFrame:
        """The LoRA updates' row of ``lora.parameter_table``: their share of the weights they adapt, their memory."""
        table = lora.parameter_table(model, record["lora_rank"])
        return table.loc[[f"{LABELS[record['component']]} (LoRA r={record['lora_rank']})"]]


class SubsetTrainer(Trainer):
    """A seeded random subset of the component's entries, as large as a LayerNorm (``equal_capacity``)."""

    def adapt(self, model: nn.Module, record: dict) -> list[nn.Module] | None:
        """The subset's updates (``equal_capacity.add_subsets``); they train."""
        return equal_capacity.add_subsets(model, record["component"], record["subset_seed"])

    def merge(self, model: nn.Module) -> nn.Module:
        """The updates folded into the weights (``equal_capacity.merge``)."""
        return equal_capacity.merge(model)

    def summary(self, model: nn.Module) -> dict:
        """The subset's digest (``equal_capacity.digest``): the same for every learning rate and seed."""
        return {"subset": equal_capacity.digest(model)}

    def parameter_table(self, model: nn.Module, record: dict) -> pd.DataFrame:
        """The subset's row of ``equal_capacity.parameter_table``: its size per block and over all blocks."""
        return equal_capacity.parameter_table(model).loc[[f"{LABELS[record['component']]} (equal capacity)"]]


TRAINERS: dict[str, Trainer] = {"weights": Trainer(), "lora": LoraTrainer(), "subset": SubsetTrainer()}
"""The trainer of every method of ``records.methods.METHODS``, by its name."""


def trainer_of(record: dict) -> Trainer:
    """The trainer of a run's record's method."""
    return TRAINERS[method_of(record).name]


def adapt(model: nn.Module, record: dict) -> nn.Module:
    """``model`` as the run of ``record`` trains it, in place; returns it.

    What trains beside the component is added (``Trainer.adapt``), then every parameter frozen but what the run
    trains: the component or what trains in its place, the head and the final norm (``components.set_trainable``)."""
    adapters = trainer_of(record).adapt(model, record)
    return components.set_trainable(model, record["component"], adapters)
