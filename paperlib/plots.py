"""Figures: a fixed colour per component, components in plasticity order, files as well as screens."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

from . import paths, ranking
from .components import COMPONENTS, LABELS
from .imagesets import ImageDataset

COLORS = {
    "mha": "#d62728",
    "fc1": "#ff7f0e",
    "fc2": "#2ca02c",
    "ln2": "#1f77b4",
    "ln1": "#9467bd",
    "full": "#4d4d4d",
    "linear": "#8c8c8c",
    "probe": "#bdbdbd",
}
"""One colour per configuration, the same in every figure (warm = high plasticity)."""


def save_figure(fig: plt.Figure, path: str | Path, dpi: int = 150) -> Path:
    """Save ``fig`` (PNG, or the suffix's format), creating folders, atomically (runs of a sweep on
    several GPUs never leave half a file); returns the path."""
    path = Path(path)
    file_format = path.suffix.lstrip(".") or "png"
    return paths.atomic_write(path, lambda tmp: fig.savefig(tmp, format=file_format, dpi=dpi, bbox_inches="tight"))


def figure_path(stem: str, *keys) -> Path:
    """``<figures>/<stem>_<key>_<key>....png``: a figure's file named by every parameter that makes
    it differ (model, dataset, lr, seed...), so the runs of a sweep do not overwrite each other's.
    Floats are written as ``{:g}``; a dataset's ``/`` becomes ``_``."""
    words = [format(key, "g") if isinstance(key, float) else str(key).replace("/", "_") for key in keys]
    return paths.figures_dir() / ("_".join([stem, *words]) + ".png")


def block_diagram(ax: plt.Axes | None = None) -> plt.Axes:
    """A pre-norm transformer block with its five components coloured (paper Fig. 2, left)."""
    if ax is None:
        _, ax = plt.subplots(figsize=(3.2, 6.0))
    ax.set_xlim(0, 10)
    ax.set_ylim(0, 21)
    ax.axis("off")
    # (component, label, y centre), bottom to top as the tokens flow
    boxes = [("ln1", "LN1", 3), ("mha", "MHA", 6), ("ln2", "LN2", 11), ("fc1", "FC1", 14), ("fc2", "FC2", 17)]
    for component, label, y in boxes:
        ax.add_patch(
            FancyBboxPatch(
                (2.5, y - 0.9), 5, 1.8, boxstyle="round,pad=0.1", fc=COLORS[component], ec="black", alpha=0.85
            )
        )
        ax.text(5, y, label, ha="center", va="center", fontsize=11, color="white", weight="bold")
    ax.text(5.4, 15.5, "GeLU", ha="left", va="center", fontsize=8, style="italic")
    arrows = [(0.3, 2.0), (3.9, 5.0), (6.9, 8.7), (9.3, 10.0), (11.9, 13.0), (14.9, 16.0), (17.9, 19.3), (19.3, 20.8)]
    for start, end in arrows:
        ax.add_patch(FancyArrowPatch((5, start), (5, end), arrowstyle="-|>", mutation_scale=10, lw=1))
    for y in (9.3, 19.3):
        ax.add_patch(plt.Circle((5, y), 0.55, fc="white", ec="black"))
        ax.text(5, y, "+", ha="center", va="center", fontsize=11)
    for low, high in ((1.0, 9.3), (9.9, 19.3)):  # residual connections
        ax.plot([5, 9, 9, 5.55], [low, low, high, high], color="black", lw=1)
    ax.text(5, 0.0, "tokens $x \\in (\\mathbb{R}^d)^n$", ha="center", va="top", fontsize=9)
    ax.set_title("ViT block (pre-norm)", fontsize=10)
    return ax


def sample_grid(datasets: Sequence[ImageDataset], per_dataset: int = 8) -> plt.Figure:
    """The first ``per_dataset`` images of each dataset, one row per dataset, labelled by class."""
    fig, axes = plt.subplots(
        len(datasets), per_dataset, figsize=(per_dataset * 0.9, len(datasets) * 1.0 + 0.2), squeeze=False
    )
    for row, dataset in zip(axes, datasets):
        for ax, index in zip(row, range(per_dataset)):
            ax.imshow(dataset.images[index].permute(1, 2, 0).numpy(), interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
            ax.set_title(dataset.classes[int(dataset.targets[index])], fontsize=7, pad=2)
        row[0].set_ylabel(dataset.name.replace("digits_c/", "c/"), rotation=0, ha="right", va="center", fontsize=8)
    fig.tight_layout()
    return fig


def component_bars(values: dict[str, float], ylabel: str, ax: plt.Axes | None = None, log: bool = False) -> plt.Axes:
    """One bar per component in plasticity order, in the component colours."""
    if ax is None:
        _, ax = plt.subplots(figsize=(4, 3))
    keys = [c for c in (*COMPONENTS, "full", "linear") if c in values]
    ax.bar([LABELS[k] for k in keys], [values[k] for k in keys], color=[COLORS[k] for k in keys])
    if log:
        ax.set_yscale("log")
    ax.set_ylabel(ylabel)
    return ax


__all__ = ["COLORS", "block_diagram", "component_bars", "sample_grid", "save_figure"]


def rate_distributions(table, ax: plt.Axes | None = None) -> plt.Axes:
    """Every rate of change per component, over all pairs and blocks, as violins (beyond the paper's
    summary: the authors' Fig. 3 left is ``layer_mean_boxes``, a box of the per-block P(f))."""
    if ax is None:
        _, ax = plt.subplots(figsize=(4.5, 3.2))
    values = [table.loc[table["component"] == c, "rate"].dropna().to_numpy() for c in COMPONENTS]
    parts = ax.violinplot(values, showmedians=True, showextrema=False)
    for body, component in zip(parts["bodies"], COMPONENTS):
        body.set_facecolor(COLORS[component])
        body.set_edgecolor("black")
        body.set_alpha(0.8)
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xticks(range(1, len(COMPONENTS) + 1), [LABELS[c] for c in COMPONENTS])
    ax.set_ylabel("rate of change (ratio)")
    return ax


def layer_mean_boxes(means, ax: plt.Axes | None = None, fliers: bool = False) -> plt.Axes:
    """One box per component of its per-block P(f), in plasticity order: the authors' summary of
    Fig. 3 (left: one dataset, one value per block) and Fig. 2 (middle: the blocks of every dataset
    pooled, for one model).

    ``means``: ``ranking.layer_means`` or ``plasticity.collect(by_block=True)`` rows (column
    ``plasticity``, one row per block and component), or a tidy rates table (column ``rate``),
    whose per-block means are taken here. Rows of several models are refused: a box pools the
    datasets of one model. Whiskers reach 1.5 interquartile ranges; points beyond them are hidden,
    as in the authors' figures, unless ``fliers``.
    """
    if ax is None:
        _, ax = plt.subplots(figsize=(4.5, 3.2))
    if "rate" in means:
        means = ranking.layer_means(means)
    if "model" in means and means["model"].nunique() > 1:
        raise ValueError(
            "layer_mean_boxes pools the blocks of one model (a panel per model), "
            f"got {', '.join(sorted(map(str, means['model'].unique())))}"
        )
    components = [c for c in COMPONENTS if (means["component"] == c).any()]
    values = [means.loc[means["component"] == c, "plasticity"].to_numpy() for c in components]
    parts = ax.boxplot(values, patch_artist=True, widths=0.6, showfliers=fliers, medianprops={"color": "black"})
    for box, component in zip(parts["boxes"], components):
        box.set_facecolor(COLORS[component])
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xticks(range(1, len(components) + 1), [LABELS[c] for c in components])
    ax.set_ylabel("plasticity $\\mathcal{P}(f)$ per block")
    return ax


def plasticity_along_depth(data, ax: plt.Axes | None = None, band: bool = True) -> plt.Axes:
    """P(f) per block for each component, against percent of depth (Fig. 3 middle and right), with
    the authors' band P(f) +/- 1.96 sd / sqrt(n) around each curve (sd of the block's per-pair rates,
    n its number of pairs: ``ranking.depth_band``).

    ``data``: a tidy rates table (column ``rate``) or ``ranking.depth_band``'s table; the band is left
    out if not ``band``.
    """
    if ax is None:
        _, ax = plt.subplots(figsize=(4.5, 3.2))
    if "rate" in data:
        data = ranking.depth_band(data)
    for component in COMPONENTS:
        part = data[data["component"] == component].sort_values("block")
        ax.plot(part["depth"], part["plasticity"], marker="o", ms=3, color=COLORS[component], label=LABELS[component])
        if band:
            ax.fill_between(part["depth"], part["low"], part["high"], color=COLORS[component], alpha=0.3, lw=0)
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xlabel("depth (% of blocks)")
    ax.set_ylabel("plasticity $\\mathcal{P}(f)$")
    ax.legend(fontsize=7, ncol=2)
    return ax


def pooled_plasticity(summary, ax: plt.Axes | None = None) -> plt.Axes:
    """P(f) per component across datasets: one dot per dataset, a bar for the mean (beyond the
    paper's summary: the authors' Fig. 2 middle is ``layer_mean_boxes`` of the per-block P(f))."""
    if ax is None:
        _, ax = plt.subplots(figsize=(4.5, 3.2))
    for i, component in enumerate(COMPONENTS):
        values = summary.loc[summary["component"] == component, "plasticity"].to_numpy()
        ax.bar(i, values.mean() if len(values) else 0, color=COLORS[component], alpha=0.6)
        ax.scatter([i] * len(values), values, color=COLORS[component], edgecolor="black", s=14, zorder=3)
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xticks(range(len(COMPONENTS)), [LABELS[c] for c in COMPONENTS])
    ax.set_ylabel("plasticity $\\mathcal{P}(f)$")
    return ax


def plasticity_vs_result(table, value: str, ax: plt.Axes | None = None, ylabel: str | None = None) -> plt.Axes:
    """A finetuning result against P(f): one point per dataset and component, coloured by component,
    the value taken relative to its dataset's mean over the components (so that datasets of
    different accuracy share an axis) and each dataset's points joined in plasticity order.
    ``table``: columns ``dataset``, ``component``, ``plasticity`` and ``value``."""
    if ax is None:
        _, ax = plt.subplots(figsize=(4.5, 3.2))
    for _, part in table.groupby("dataset"):
        part = part.sort_values("plasticity")
        relative = part[value] - part[value].mean()
        ax.plot(part["plasticity"], relative, color="grey", lw=0.7, alpha=0.6, zorder=1)
        ax.scatter(
            part["plasticity"],
            relative,
            c=[COLORS[str(c)] for c in part["component"]],
            edgecolor="black",
            s=18,
            zorder=3,
        )
    for component in COMPONENTS:
        ax.scatter([], [], color=COLORS[component], edgecolor="black", s=18, label=LABELS[component])
    ax.axhline(0.0, color="grey", lw=0.8, ls="--")
    ax.set_xlabel("plasticity $\\mathcal{P}(f)$")
    ax.set_ylabel(ylabel or f"{value} - dataset mean")
    ax.legend(frameon=False, fontsize=7)
    return ax


def bounds_along_depth(
    table, ax: plt.Axes | None = None, label: str = "", linestyle: str = "-", propositions=("1", "2", "3")
) -> plt.Axes:
    """Upper bounds per block for each component on a log scale (paper Fig. 6)."""
    if ax is None:
        _, ax = plt.subplots(figsize=(4.5, 3.2))
    for component in COMPONENTS:
        part = table[(table["component"] == component) & table["proposition"].isin(propositions)]
        if len(part):
            ax.plot(
                part["depth"],
                part["bound"],
                marker="o",
                ms=3,
                ls=linestyle,
                color=COLORS[component],
                label=f"{LABELS[component]}{label}",
            )
    ax.set_yscale("log")
    ax.set_xlabel("depth (% of blocks)")
    ax.set_ylabel("upper bound on $\\mathcal{P}(f)$")
    return ax


def training_curves(
    histories, value: str, ax: plt.Axes | None = None, components=COMPONENTS + ("full",), log: bool = False
) -> plt.Axes:
    """One curve per configuration of ``value`` (e.g. grad_norm, val_loss) against step (Fig. 4 middle/right)."""
    if ax is None:
        _, ax = plt.subplots(figsize=(4.5, 3.2))
    for component in components:
        part = histories[histories["component"] == component].dropna(subset=[value])
        if len(part):
            ax.plot(
                part["step"],
                part[value],
                color=COLORS[component],
                ls="--" if component == "full" else "-",
                label=LABELS[component],
            )
    if log:
        ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel(value.replace("_", " "))
    return ax


def config_boxes(runs, ax: plt.Axes | None = None) -> plt.Axes:
    """Test accuracy over learning rates and seeds per configuration, for one dataset (Fig. 4 left
    on Sketch, Fig. 18 on each benchmark): ``runs`` of that dataset, as ``runs.load`` lists them.
    As the authors' figure, boxes are over every run with a test accuracy, diverged runs included with
    their best-validation checkpoint's (counted under each box), and full finetuning is a dashed line at
    its mean."""
    if ax is None:
        _, ax = plt.subplots(figsize=(5, 3.2))
    if runs["dataset"].nunique() > 1:
        raise ValueError(
            "config_boxes shows one dataset (Fig. 18 has a panel per benchmark), "
            f"got {', '.join(sorted(runs['dataset'].unique()))}"
        )
    ended = runs[runs["status"].isin(["finished", "diverged"])]
    accuracy = {c: 100 * ended.loc[ended["component"] == c, "test_accuracy"].dropna().to_numpy() for c in COLORS}
    components = [c for c in (*COMPONENTS, "linear") if len(accuracy[c])]
    parts = ax.boxplot([accuracy[c] for c in components], patch_artist=True, widths=0.6)
    for box, component in zip(parts["boxes"], components):
        box.set_facecolor(COLORS[component])
    if len(accuracy["full"]):
        ax.axhline(accuracy["full"].mean(), color=COLORS["full"], linestyle="--", label="full finetuning (mean)")
        ax.legend(frameon=False, fontsize=7)
    diverged = [int(((runs["component"] == c) & (runs["status"] == "diverged")).sum()) for c in components]
    labels = [LABELS[c] + (f"\n{n} diverged" if n else "") for c, n in zip(components, diverged)]
    ax.set_xticks(range(1, len(components) + 1), labels)
    ax.set_ylabel("test accuracy (%)")
    return ax
