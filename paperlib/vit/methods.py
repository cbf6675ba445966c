"""What each way to train a component does to a model: the trainer of a ``records.methods.Method``.

A trainer adds what trains in the component's place (``adapt``: nothing for the component's own weights, a LoRA update,
a subset), folds it back into a plain timm ViT (``merge``) and says what a run's metrics record of it (``summary``).
A method names its trainer ("module:class", ``Method.trainer``): ``trainer_of`` imports it, so that a method is
registered once, in ``records.methods``, and what reads results never imports torch to know it.
"""

from __future__ import annotations

import importlib

import pandas as pd
from torch import nn

from paperlib.records.methods import Method
from paperlib.vit import components


class Trainer:
    """The component's own weights train (the paper's way): nothing added, nothing to merge."""

    def adapt(self, model: nn.Module, method: Method, component: str) -> list[nn.Module] | None:
        """What trains in the component's place, added to ``model`` in place; None: the component itself."""
        return None

    def merge(self, model: nn.Module) -> nn.Module:
        """``model`` as a plain timm ViT, what ``adapt`` added folded into its weights."""
        return model

    def summary(self, model: nn.Module) -> dict:
        """What a run's ``metrics.json`` records of what trained."""
        return {}

    def parameter_table(self, model: nn.Module, method: Method, component: str) -> pd.DataFrame:
        """Tables 3 and 4's row of what the run trains (``components.parameter_table``)."""
        return components.parameter_table(model, configurations=[component])


def trainer_of(method: Method) -> Trainer:
    """The trainer ``method`` names (``Method.trainer``, "module:class"), imported here."""
    module, name = method.trainer.split(":")
    return getattr(importlib.import_module(module), name)()


def adapt(model: nn.Module, method: Method, component: str) -> nn.Module:
    """``model`` as a run of ``method`` on ``component`` trains it, in place; returns it.

    What trains beside the component is added (``Trainer.adapt``), then every parameter frozen but what the run
    trains: the component or what trains in its place, the head and the final norm (``components.set_trainable``)."""
    adapters = trainer_of(method).adapt(model, method, component)
    return components.set_trainable(model, component, adapters)
