"""How a finetuning run trains its component (``Run.method``): one ``Method`` per way, in one registry.

The paper trains the component's own weights (``weights``). Beyond the paper, a LoRA update beside each of its weight
matrices trains instead (``lora``, ``vit.lora``), or a seeded random subset of its entries as large as a LayerNorm
(``subset``, ``vit.equal_capacity``). A ``Method`` is what the records need of a way to train, without torch: the
``Run`` fields that are its options, the configurations it can train, the check of its options, the suffix of its
runs' folders and its label in tables and figures. What it does to a model is its trainer (``vit.methods``).

A new way to train is a ``Method`` registered here (``register``) and its trainer registered in ``vit.methods``;
nothing else names it. The options of every other method stay at their defaults in a run, so that one run is written
one way. Each function takes a run's record: its ``Run`` fields by name.
"""

from __future__ import annotations

import math

from paperlib.records.names import ADAPTABLE, COMPONENTS, CONFIGURATIONS


class Method:
    """A way to train a run's component: its name, its options, and what a run of it records and shows."""

    name = "weights"
    options: tuple[str, ...] = ()
    """The ``Run`` fields that are this method's options."""
    configurations: tuple[str, ...] | None = None
    """The configurations (``Run.component``) it can train; None: every one."""

    def check(self, record: dict) -> None:
        """A ValueError, with the valid choices, unless the record's options make a run of this method."""
        component = record["component"]
        if self.configurations is not None and component not in self.configurations:
            raise ValueError(
                f"method {self.name!r} trains {', '.join(self.configurations)}, not {component!r}: "
                + self.why_not(component)
            )

    def why_not(self, component: str) -> str:
        """Why this method cannot train ``component`` (one of ``CONFIGURATIONS``), for ``check``'s message."""
        return "use method 'weights' for it"

    def suffix(self, record: dict) -> str:
        """The method's part of the run's folder name (``runs.run_folder``); the paper's way has none."""
        return ""

    def label(self, record: dict) -> str:
        """How tables and legends name the run's method."""
        return self.name


class Lora(Method):
    """A rank-r LoRA update beside each weight matrix of the component trains in its place (``vit.lora``)."""

    name = "lora"
    options = ("lora_rank", "lora_alpha", "lora_dropout")
    configurations = ADAPTABLE

    def check(self, record: dict) -> None:
        """Rank a positive integer, alpha 0 (the rank: a scale of 1) or positive, dropout in [0, 1)."""
        super().check(record)
        rank = record["lora_rank"]
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
            raise ValueError(f"lora_rank must be a positive integer (e.g. 8), got {rank!r}")
        for name, valid, what in (
            ("lora_alpha", lambda v: v >= 0, ">= 0 (0: the rank)"),
            ("lora_dropout", lambda v: 0 <= v < 1, "in [0, 1)"),
        ):
            value = record[name]
            number = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
            if not (number and valid(value)):
                raise ValueError(f"{name} must be a finite number {what}, got {value!r}")

    def why_not(self, component: str) -> str:
        """LoRA adapts weight matrices, and the LayerNorms and a new head have none to adapt."""
        return "LoRA adapts weight matrices and it has none; use method 'weights' for it"

    def suffix(self, record: dict) -> str:
        """``lora-r<rank>``, with ``-a<alpha>`` unless alpha is the rank and ``-d<dropout>`` unless 0."""
        rank, alpha, dropout = record["lora_rank"], record["lora_alpha"], record["lora_dropout"]
        return f"lora-r{rank}" + (f"-a{alpha:g}" if alpha != rank else "") + (f"-d{dropout:g}" if dropout else "")

    def label(self, record: dict) -> str:
        """``LoRA r=<rank>``, with alpha and dropout where they are not the defaults."""
        rank, alpha, dropout = record["lora_rank"], record["lora_alpha"], record["lora_dropout"]
        extra = ([f"alpha={alpha:g}"] if alpha not in (0, rank) else []) + ([f"dropout={dropout:g}"] if dropout else [])
        return f"LoRA r={int(rank)}" + (f" ({', '.join(extra)})" if extra else "")


class Subset(Method):
    """As many parameters per block as a LayerNorm has: a seeded random subset of the component's entries trains."""

    name = "subset"
    options = ("subset_seed",)
    configurations = ("mha", "fc1", "fc2")

    def check(self, record: dict) -> None:
        """``Method.check``, and no weight decay.

        AdamW's would decay an ordinary run's weight matrices and never the subset (a vector), so the two designs that
        ``capacity`` compares would be regularised differently."""
        super().check(record)
        if record.get("weight_decay"):
            raise ValueError(
                "method 'subset' trains without weight decay (AdamW's never reaches the subset, where it decays an "
                "ordinary run's weight matrices): use weight_decay=0"
            )

    def why_not(self, component: str) -> str:
        """A LayerNorm is the size the subset takes: its ordinary runs are its equal-capacity runs."""
        if component in COMPONENTS:
            return "its ordinary runs are its equal-capacity runs (a LayerNorm trains whole); use method 'weights'"
        return "it is not one component"

    def suffix(self, record: dict) -> str:
        """``equal``, with ``-s<seed>`` for a subset seed other than 0."""
        return "equal" + (f"-s{record['subset_seed']}" if record["subset_seed"] else "")

    def label(self, record: dict) -> str:
        """``equal capacity``."""
        return "equal capacity"


METHODS: dict[str, Method] = {}
"""Every way to train a component, by name (``Run.method``)."""


def register(method: Method) -> Method:
    """Add ``method`` to ``METHODS`` under its name; returns it."""
    METHODS[method.name] = method
    return method


for _method in (Method(), Lora(), Subset()):
    register(_method)


def method_of(record: dict) -> Method:
    """The ``Method`` of a run's record, or a ValueError naming the valid ones."""
    if record["method"] not in METHODS:
        raise ValueError(f"unknown method {record['method']!r}; valid methods: {', '.join(METHODS)}")
    return METHODS[record["method"]]


def options() -> tuple[str, ...]:
    """Every method's options: the ``Run`` fields a method owns."""
    return tuple(name for method in METHODS.values() for name in method.options)


def check(record: dict, defaults: dict) -> None:
    """A ValueError unless the record's method is known, can train its configuration and has valid options.

    The options of the other methods must be at their ``defaults``: a LoRA rank on a run of the component's weights
    would name a run it is not."""
    method = method_of(record)
    stray = [name for name in options() if name not in method.options and record[name] != defaults[name]]
    if stray:
        owners = sorted({other.name for other in METHODS.values() for name in stray if name in other.options})
        raise ValueError(
            f"{', '.join(stray)} {'is' if len(stray) == 1 else 'are'} method {' / '.join(owners)}'s: set method "
            f"{owners[0]!r}, or leave {'it' if len(stray) == 1 else 'them'} at the default"
        )
    if record["component"] in CONFIGURATIONS:  # otherwise the configuration's own check names the valid ones
        method.check(record)
