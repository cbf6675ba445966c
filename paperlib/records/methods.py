"""How a finetuning run trains its component (``Run.method``): a ``Method`` value that carries its own options.

The paper trains the component's own weights (``Method()``). Beyond the paper, a LoRA update beside each of its weight
matrices trains instead (``Lora(rank=8)``, ``vit.lora``), or a seeded random subset of its entries as large as a
LayerNorm (``Subset()``, ``vit.equal_capacity``). A method's options are its dataclass fields; what a run records of
it is flat, its name under ``method`` and each option under ``<method>_<option>`` (``lora_rank``): the words of
notebook 05's parameters, the sweep specs and ``params.json``. Here, without torch: the configurations it can train,
the check of its options, the suffix of its runs' folders and its label in tables and figures. What it does to a model
is its trainer, named by ``trainer`` ("module:class") and imported by what trains alone (``vit.methods.trainer_of``).

A new way to train is one ``Method`` subclass, registered here (``register``), whose ``trainer`` names its trainer;
nothing else names it. A run records every registered method's options, the other methods' at their defaults, so
that one run is written one way and a record written before a method was added reads as the same run.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, ClassVar

from paperlib.records.names import ADAPTABLE, COMPONENTS, check_choice


@dataclass(frozen=True)
class Method:
    """The paper's way to train a run's component, its own weights; the base of every other way."""

    name: ClassVar[str] = "weights"
    configurations: ClassVar[tuple[str, ...] | None] = None
    """The configurations (``Run.component``) it can train; None: every one."""
    trainer: ClassVar[str] = "paperlib.vit.methods:Trainer"
    """Its trainer, "module:class" (``vit.methods.Trainer``): what it does to a model."""

    def check(self, component: str, weight_decay: float = 0.0) -> None:
        """A ValueError, with the valid choices, unless the method can train ``component`` with its options.

        ``weight_decay``: the run's."""
        if self.configurations is not None and component not in self.configurations:
            raise ValueError(
                f"method {self.name!r} trains {', '.join(self.configurations)}, not {component!r}: "
                + self.why_not(component)
            )

    def why_not(self, component: str) -> str:
        """Why this method cannot train ``component`` (one of ``CONFIGURATIONS``), for ``check``'s message."""
        return "use method 'weights' for it"

    def suffix(self) -> str:
        """The method's part of the run's folder name (``runs.run_folder``); the paper's way has none."""
        return ""

    def label(self) -> str:
        """How tables and legends name the run's method."""
        return self.name

    @classmethod
    def options(cls) -> dict[str, Any]:
        """The method's options as a run records them (``<method>_<option>``), with their defaults."""
        return {f"{cls.name}_{field.name}": field.default for field in dataclasses.fields(cls)}

    def record(self) -> dict:
        """What a run records of the method: its name and its options (``options``' names)."""
        return {"method": self.name} | {
            f"{self.name}_{field.name}": getattr(self, field.name) for field in dataclasses.fields(self)
        }


@dataclass(frozen=True)
class Lora(Method):
    """A rank-r LoRA update beside each weight matrix of the component trains in its place (``vit.lora``)."""

    name = "lora"
    configurations = ADAPTABLE
    trainer = "paperlib.vit.lora:LoraTrainer"

    rank: int = 0  # method lora: the rank r of each update (e.g. 8)
    # method lora: the updates are scaled by lora_alpha / lora_rank; 0 = the rank (a scale of 1; stored as the rank)
    alpha: float = 0.0
    dropout: float = 0.0  # method lora: dropout on the updates' input

    def __post_init__(self):
        """Alpha 0 written as the rank, so that alpha 0 and alpha=rank are one run (one folder, one record, one row)."""
        if self.alpha == 0 and _integer(self.rank) and self.rank > 0:
            object.__setattr__(self, "alpha", float(self.rank))

    def check(self, component: str, weight_decay: float = 0.0) -> None:
        """Rank a positive integer, alpha 0 (the rank: a scale of 1) or positive, dropout in [0, 1)."""
        super().check(component)
        if not _integer(self.rank) or self.rank < 1:
            raise ValueError(f"lora_rank must be a positive integer (e.g. 8), got {self.rank!r}")
        for name, value, valid, what in (
            ("lora_alpha", self.alpha, lambda v: v >= 0, ">= 0 (0: the rank)"),
            ("lora_dropout", self.dropout, lambda v: 0 <= v < 1, "in [0, 1)"),
        ):
            number = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
            if not (number and valid(value)):
                raise ValueError(f"{name} must be a finite number {what}, got {value!r}")

    def why_not(self, component: str) -> str:
        """LoRA adapts weight matrices, and the LayerNorms and a new head have none to adapt."""
        return "LoRA adapts weight matrices and it has none; use method 'weights' for it"

    def suffix(self) -> str:
        """``lora-r<rank>``, with ``-a<alpha>`` unless alpha is the rank and ``-d<dropout>`` unless 0."""
        alpha = f"-a{self.alpha:g}" if self.alpha != self.rank else ""
        return f"lora-r{self.rank}" + alpha + (f"-d{self.dropout:g}" if self.dropout else "")

    def label(self) -> str:
        """``LoRA r=<rank>``, with alpha and dropout where they are not the defaults."""
        extra = [f"alpha={self.alpha:g}"] if self.alpha not in (0, self.rank) else []
        extra += [f"dropout={self.dropout:g}"] if self.dropout else []
        return f"LoRA r={int(self.rank)}" + (f" ({', '.join(extra)})" if extra else "")


@dataclass(frozen=True)
class Subset(Method):
    """As many parameters per block as a LayerNorm has: a seeded random subset of the component's entries trains."""

    name = "subset"
    configurations = ("mha", "fc1", "fc2")
    trainer = "paperlib.vit.equal_capacity:SubsetTrainer"

    seed: int = 0  # method subset: the seed of the subset, the same for every lr and seed

    def check(self, component: str, weight_decay: float = 0.0) -> None:
        """``Method.check``, a non-negative seed, and no weight decay.

        AdamW's would decay an ordinary run's weight matrices and never the subset (a vector), so the two designs that
        ``capacity`` compares would be regularised differently."""
        super().check(component)
        if not _integer(self.seed) or self.seed < 0:
            raise ValueError(f"subset_seed must be a non-negative integer, got {self.seed!r}")
        if weight_decay:
            raise ValueError(
                "method 'subset' trains without weight decay (AdamW's never reaches the subset, where it decays an "
                "ordinary run's weight matrices): use weight_decay=0"
            )

    def why_not(self, component: str) -> str:
        """A LayerNorm is the size the subset takes: its ordinary runs are its equal-capacity runs."""
        if component in COMPONENTS:
            return "its ordinary runs are its equal-capacity runs (a LayerNorm trains whole); use method 'weights'"
        return "it is not one component"

    def suffix(self) -> str:
        """``equal``, with ``-s<seed>`` for a subset seed other than 0."""
        return "equal" + (f"-s{self.seed}" if self.seed else "")

    def label(self) -> str:
        """``equal capacity``."""
        return "equal capacity"


def _integer(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


METHODS: dict[str, type[Method]] = {}
"""Every way to train a component, by name (``Run.method``): the one registry."""


def register(method: type[Method]) -> type[Method]:
    """Add the ``Method`` subclass ``method`` to ``METHODS`` under its name; returns it (a class decorator)."""
    METHODS[method.name] = method
    return method


for _method in (Method, Lora, Subset):
    register(_method)


def options() -> dict[str, Any]:
    """Every registered method's options as a run records them (``Method.options``), with their defaults."""
    return {name: default for method in METHODS.values() for name, default in method.options().items()}


def method_of(values: dict) -> Method:
    """The ``Method`` of a run's parameters or record: its name under ``method``, its options by their recorded names.

    A name not registered is a ValueError naming the valid ones; so are options of another method set away from their
    defaults (a LoRA rank on a run of the component's weights would name a run it is not). An option the values lack
    is its default (a record written before it was added)."""
    name = values.get("method", Method.name)
    if isinstance(name, Method):
        return name
    check_choice(name, METHODS, "method", "methods")
    method, defaults = METHODS[name], options()
    stray = [key for key in defaults if key not in method.options() and values.get(key, defaults[key]) != defaults[key]]
    if stray:
        owners = sorted({other.name for other in METHODS.values() for key in stray if key in other.options()})
        one = len(stray) == 1
        raise ValueError(
            f"{', '.join(stray)} {'is' if one else 'are'} method {' / '.join(owners)}'s: set method "
            f"{owners[0]!r}, or leave {'it' if one else 'them'} at the default"
        )
    prefix = f"{method.name}_"
    return method(**{key.removeprefix(prefix): values[key] for key in method.options() if key in values})


def record(method: Method) -> dict:
    """What a run records of ``method``: its name and every registered method's options, the others' at defaults."""
    return options() | method.record()
