"""The names the package's tables and figures share: the five components of a ViT block in the
paper's plasticity order, what a finetuning run trains, and their display names (paper §2, §5); and
the family of a dataset (a corruption counts with the dataset it corrupts).

No torch here, nor anything of the training stack: the analysis of saved results (``stats``,
``precision``, ``capacity``, ``runs``' reading of a spec's runs) imports these alone, so that it reads
a whole grid's results in seconds (``components`` imports them from here beside what finds the
components in a model).
"""

from __future__ import annotations

COMPONENTS = ("mha", "fc1", "fc2", "ln2", "ln1")
"""The five components, in the paper's plasticity order."""

PAPER_SCORES = {component: float(len(COMPONENTS) - i) for i, component in enumerate(COMPONENTS)}
"""The paper's plasticity order (MHA > FC1 > FC2 > LN2 > LN1, on every benchmark: Fig. 2 middle) as scores,
5 for MHA ... 1 for LN1: what a Kendall tau with it takes (it uses only the order)."""

RUN_COMPONENTS = COMPONENTS + ("full", "linear")
"""What a finetuning run trains (``runs.Config.component``), the paper's finetuning configurations:
one component, every parameter (``full``), or the head only (``linear``)."""

LABELS = {
    "mha": "MHA",
    "fc1": "FC1",
    "fc2": "FC2",
    "ln2": "LN2",
    "ln1": "LN1",
    "full": "All",
    "linear": "Linear head (SGD)",
    "probe": "Linear probing",
}
"""Display names, as in the paper's tables and figures (``probe``: Table 6's linear-probing column,
the paper's "Linear"; ``linear``: the configuration that trains a new head, which is not it)."""

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
    if component not in COMPONENTS:
        raise ValueError(f"unknown component {component!r}; valid components: {', '.join(COMPONENTS)}")
    return component


def check_run_component(component: str) -> str:
    """Return ``component`` or raise a ValueError that names what a run can train (``RUN_COMPONENTS``)."""
    if component not in RUN_COMPONENTS:
        raise ValueError(
            f"unknown finetuning configuration {component!r}; valid configurations: {', '.join(RUN_COMPONENTS)}"
        )
    return component


CORRUPTED = {"cifar10c": "cifar10", "digits_c": "digits"}
"""The datasets whose ``<name>/<corruption>`` are corruptions of another (``family``)."""


def family(dataset: str) -> str:
    """The unit a dataset counts as when datasets are not independent.

    A corruption of another dataset (``cifar10c/snow``, ``digits_c/snow``) is of that dataset's family (``cifar10``,
    ``digits``); every other dataset is its own (``domainnet/sketch``)."""
    head, _, tail = dataset.partition("/")
    return CORRUPTED.get(head, dataset) if tail else dataset
