"""The names the package's tables and figures share.

The five components of a ViT block in the paper's plasticity order, what a finetuning run trains, and their display
names (paper §2, §5); the family of a dataset (a corruption counts with the dataset it corrupts); and the choices a
plasticity result records (its inputs, its normalisation).

No torch here, nor anything of the training stack: the analysis of saved results (``stats``,
``precision``, ``capacity``, ``runs_table``, ``plasticity_table``) imports these alone, so that it reads
a whole grid's results in seconds (``components``, ``component_rates`` and ``transforms`` import them
from here beside what needs torch).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Collection


def check_choice(value, valid: Collection[str], what: str, plural: str = "choices"):
    """``value`` if it is one of ``valid``; else the package's one ValueError for a bad choice, naming the valid ones.

    "unknown <what> <value>; valid <plural>: <valid, ...>"."""
    if value not in valid:
        raise ValueError(f"unknown {what} {value!r}; valid {plural}: {', '.join(valid)}")
    return value


COMPONENTS = ("mha", "fc1", "fc2", "ln2", "ln1")
"""The five components, in the paper's plasticity order."""

PAPER_SCORES = {component: float(len(COMPONENTS) - i) for i, component in enumerate(COMPONENTS)}
"""The paper's plasticity order (MHA > FC1 > FC2 > LN2 > LN1, on every benchmark: Fig. 2 middle) as scores,
5 for MHA ... 1 for LN1: what a Kendall tau with it takes (it uses only the order)."""


@dataclass(frozen=True)
class Configuration:
    """What a finetuning run can train (its ``component``): its label, its colour and what it trains in every block.

    ``components``: the components it trains in every block, beside the head and the final norm; None: every parameter
    of the model; (): the head alone."""

    label: str
    colour: str
    components: tuple[str, ...] | None


CONFIGURATIONS = {
    "mha": Configuration("MHA", "#d62728", ("mha",)),
    "fc1": Configuration("FC1", "#ff7f0e", ("fc1",)),
    "fc2": Configuration("FC2", "#2ca02c", ("fc2",)),
    "ln2": Configuration("LN2", "#1f77b4", ("ln2",)),
    "ln1": Configuration("LN1", "#9467bd", ("ln1",)),
    "full": Configuration("All", "#4d4d4d", None),
    "linear": Configuration("Linear head (SGD)", "#8c8c8c", ()),
}
"""The finetuning configurations by name, the one registry that runs, Tables 3 and 4 and the figures read: one
component (in the paper's plasticity order; warm colours for high plasticity), every parameter (``full``), or a new
head alone (``linear``). A configuration added here is one ``Config.component`` can name."""

RUN_COMPONENTS = tuple(CONFIGURATIONS)
"""What a finetuning run trains (``Config.component``): the paper's finetuning configurations."""

LABELS = {name: configuration.label for name, configuration in CONFIGURATIONS.items()} | {"probe": "Linear probing"}
"""Display names, as in the paper's tables and figures (``probe``: Table 6's linear-probing column,
the paper's "Linear"; ``linear``: the configuration that trains a new head, which is not it)."""

COLOURS = {name: configuration.colour for name, configuration in CONFIGURATIONS.items()} | {"probe": "#bdbdbd"}
"""One colour per configuration, the same in every figure."""

POINT_LABELS = {
    "ln1": "LN1",
    "mha": "MHA",
    "attn_residual": "x + MHA",
    "ln2": "LN2",
    "fc1": "FC1",
    "gelu": "GELU",
    "fc2": "FC2",
    "block": "block output",
}
"""Display names of the probe points (``probe``: each component's output, the activation's and the
residual stream's)."""


def check_component(component: str) -> str:
    """Return ``component`` or raise a ValueError that names the valid components."""
    return check_choice(component, COMPONENTS, "component", "components")


def check_run_component(component: str) -> str:
    """Return ``component`` or raise a ValueError that names what a run can train (``CONFIGURATIONS``)."""
    return check_choice(component, CONFIGURATIONS, "finetuning configuration", "configurations")


CORRUPTED = {"cifar10c": "cifar10", "digits_c": "digits"}
"""The datasets whose ``<name>/<corruption>`` are corruptions of another (``family``)."""


def family(dataset: str) -> str:
    """The unit a dataset counts as when datasets are not independent.

    A corruption of another dataset (``cifar10c/snow``, ``digits_c/snow``) is of that dataset's family (``cifar10``,
    ``digits``); every other dataset is its own (``domainnet/sketch``)."""
    head, _, tail = dataset.partition("/")
    return CORRUPTED.get(head, dataset) if tail else dataset


DEMO_FAMILIES = ("digits_source", "digits")
"""The demo world's datasets by ``family`` (``datasets.DATASETS``' group ``demo``): its reference images and
its downstream digits with their corruptions."""


SELECTIONS = ("test", "val")
"""How Table 6 picks each configuration's learning rate: by test accuracy (the paper's) or validation accuracy."""

ACCURACIES = ("authors", "exact")
"""How the tables read a run's accuracies: as the authors' evaluation computes them (the mean of per-batch
accuracies, ``evaluation.evaluate``: ``test_accuracy``, ``best_val_accuracy``) or exactly (their ``_exact`` columns,
moved into those two by ``runs_table.read_as``). The checkpoint is the one the authors' reading chose, either way."""


INPUTS = ("embedding", "in_situ")
"""What a component's rate is measured on: ``embedding`` (the paper's: every block on the embedding's
tokens) or ``in_situ`` (each component on its actual input; beyond the paper: ``component_rates``)."""


def check_inputs(inputs: str) -> str:
    """Return ``inputs`` or raise a ValueError naming the valid choices."""
    return check_choice(inputs, INPUTS, "inputs", "inputs")


NORMALIZATIONS = ("imagenet", "model")
"""How images are normalised: ``imagenet`` (the paper's statistics, for every model) or ``model``
(the mean and standard deviation the model's pretrained configuration records, e.g. 0.5 for the
original ImageNet-21k ViTs, CLIP's own for CLIP models; beyond the paper)."""


def check_normalize(normalize: str) -> str:
    """Return ``normalize`` or raise a ValueError that names the valid choices."""
    if normalize not in NORMALIZATIONS:
        raise ValueError(
            f"unknown normalize {normalize!r}; valid choices: {', '.join(NORMALIZATIONS)} "
            "(imagenet: the paper's ImageNet mean and std; model: those the model was pretrained with)"
        )
    return normalize


SEVERITY = 5
"""The paper's Cifar10-C corruption severity (of ``corruptions.SEVERITIES``), and the demo's digits_c's one."""


SPLITS_VERSION = 2
"""Which splits ``get_dataset`` draws, recorded with every result made from them (runs, probes,
plasticity), so that results of other splits are not mixed with these: 2, the authors' draws
(``deterministic_split``, ``validation_split``, Flowers102's official validation split); 1, before
(SHA-256 key splits everywhere), recorded by no key."""


ADAPTABLE = ("mha", "fc1", "fc2", "full")
"""The configurations LoRA can adapt (``lora.TARGETS`` names their weight matrices): those with weight matrices."""


PAPER_R = 19.4
"""The radius of the paper's Fig. 6: RMS token norm of ViT-Base on Cifar10 (§4)."""
