"""A finetuning run checked against the training stack when it is made: ``Config``.

``records.runs.Run`` is what a run is (its fields, folder and record) with the checks that need no training stack;
``Config`` adds those that do (its dataset, model, normalisation, device and step options), so that a bad run fails
before any work, and resolves its normalisation (``mean_std``) and its step options for its device
(``checked_options``) once.

    from paperlib.train.config import Config
    config = Config(component="mha", lr=0.03)   # validated here, once
    config.folder()   # results/finetune/demo/digits/mha/lr=0.03/seed=0
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from paperlib.data import datasets
from paperlib.records import specs
from paperlib.records.runs import Run, config_values, run_fields
from paperlib.records.runs_table import KEYS
from paperlib.records.step_options import StepOptions
from paperlib.speed import devices, options
from paperlib.vit import models


@dataclass(frozen=True)
class Config(Run):
    """One finetuning run, validated when it is made.

    Defaults: notebook 05's, the demo protocol (the demo ViT on digits 5-9, seconds on a CPU); the paper's per dataset:
    ``parameters/finetune/``. Its fields are ``Run``'s."""

    def validate(self) -> "Config":
        """Fail before any work, with the valid choices: ``Run``'s checks, then the training stack's."""
        super().validate()
        datasets.check_dataset(self.dataset)
        datasets.check_validation(self.validation)
        models.resolve_name(self.model)
        devices.check_device(self.device, here=False)  # a device's name; whether this machine has it: when it trains
        # resolved once, here; not fields: not part of what the run is
        object.__setattr__(self, "_mean_std", models.normalization(self.model, self.normalize))
        object.__setattr__(self, "_checked_options", options.checked(self.step, self.device))
        return self

    @property
    def mean_std(self) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """The (mean, std) the run normalises its images with (``models.normalization``).

        Read once, when the Config was made: a model without recorded statistics fails there."""
        return self._mean_std

    @property
    def checked_options(self) -> StepOptions:
        """``step`` checked for the run's device and resolved there: what the run's steps are built from.

        Checked once (``speed.options.checked``), when the Config was made."""
        return self._checked_options


def config_from_namespace(namespace: dict) -> Config:
    """The ``Config`` of notebook 05's parameters, each taken by its name from ``namespace`` (the notebook's globals).

    Every ``Config`` field and ``speed``; a name the namespace lacks keeps its default. So that the notebook passes
    its parameters cell on whole, without writing its parameters a second time."""
    names = (*Config.defaults(), "speed")
    return config_from({name: namespace[name] for name in names if name in namespace})


def config_from(parameters: dict) -> Config:
    """The ``Config`` of notebook 05's parameters (``config_values``, ``run_fields``), validated."""
    return Config(**run_fields(config_values(parameters)))


def configs(spec: dict) -> list[Config]:
    """Each run of a finetuning sweep spec as the ``Config`` that notebook 05 makes of it.

    The runs: ``specs.cells``, the spec's fixed parameters and its grid's; the ``Config``: ``config_from``."""
    return [config_from(parameters) for _, _, parameters in specs.cells(spec)]


def expected(spec: dict) -> pd.DataFrame:
    """The runs a finetuning sweep spec asks for (``KEYS``)."""
    return pd.DataFrame([config.parameters() for config in configs(spec)]).reindex(columns=KEYS)
