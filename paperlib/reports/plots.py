"""Figures: a fixed colour per component, components in plasticity order, files as well as screens."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Patch

from paperlib.analysis import ranking
from paperlib.data.imagesets import ImageDataset
from paperlib.records import paths, storage
from paperlib.records.names import COLOURS, COMPONENTS, LABELS, POINT_LABELS, RUN_COMPONENTS

COLORS = COLOURS
"""One colour per configuration, the same in every figure (``names.CONFIGURATIONS``)."""

REFERENCE_LINE = {"color": "grey", "lw": 0.8, "ls": "--"}
"""The style of a line at a reference value: P(f) = 1, a difference or a tau of 0."""


def save_figure(fig: plt.Figure, path: str | Path) -> Path:
    """Save ``fig`` atomically (PNG, or the suffix's format, at 150 dpi), creating folders; returns the path.

    Atomically, so that runs of a sweep on several GPUs never leave half a file."""
    path = Path(path)
    file_format = path.suffix.lstrip(".") or "png"
    return storage.atomic_write(path, lambda tmp: fig.savefig(tmp, format=file_format, dpi=150, bbox_inches="tight"))


def _saved(fig: plt.Figure, stem: str, *keys) -> plt.Figure:
    """Lay ``fig`` out and save it at ``figure_path(stem, *keys)``; returns it (a notebook shows it)."""
    fig.tight_layout()
    save_figure(fig, figure_path(stem, *keys))
    return fig


def _axes(ax: plt.Axes | None, figsize: tuple[float, float] = (4.5, 3.2)) -> plt.Axes:
    """``ax``, or the axes of a new figure of ``figsize`` (inches)."""
    return plt.subplots(figsize=figsize)[1] if ax is None else ax


def figure_path(stem: str, *keys) -> Path:
    """``<figures>/<stem>_<key>_<key>....png``: a figure's file named by its parameters.

    The name has every parameter that makes the figure differ (model, dataset, lr, seed...), so the runs of a sweep
    do not overwrite each other's. Floats are written as ``{:g}``; a dataset's ``/`` becomes ``_``."""
    words = [format(key, "g") if isinstance(key, float) else str(key).replace("/", "_") for key in keys]
    return paths.figures_dir() / ("_".join([stem, *words]) + ".png")


def block_diagram(ax: plt.Axes | None = None) -> plt.Axes:
    """A pre-norm transformer block with its five components coloured (paper Fig. 2, left)."""
    ax = _axes(ax, (3.2, 6.0))
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
    """The first ``per_dataset`` images of each dataset, one row per dataset, labelled by class.

    Saved as ``00_datasets_<dataset>...``."""
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
    return _saved(fig, "00_datasets", *(dataset.name for dataset in datasets))


def component_bars(values: dict[str, float], ylabel: str, ax: plt.Axes | None = None, log: bool = False) -> plt.Axes:
    """One bar per component in plasticity order, in the component colours."""
    ax = _axes(ax, (4, 3))
    keys = [c for c in RUN_COMPONENTS if c in values]
    ax.bar([LABELS[k] for k in keys], [values[k] for k in keys], color=[COLORS[k] for k in keys])
    if log:
        ax.set_yscale("log")
    ax.set_ylabel(ylabel)
    return ax


def rate_distributions(table, ax: plt.Axes | None = None) -> plt.Axes:
    """Every rate of change per component, over all pairs and blocks, as violins.

    Beyond the paper's summary: the authors' Fig. 3 left is ``layer_mean_boxes``, a box of the
    per-block P(f)."""
    ax = _axes(ax)
    values = [table.loc[table["component"] == c, "rate"].dropna().to_numpy() for c in COMPONENTS]
    parts = ax.violinplot(values, showmedians=True, showextrema=False)
    for body, component in zip(parts["bodies"], COMPONENTS):
        body.set_facecolor(COLORS[component])
        body.set_edgecolor("black")
        body.set_alpha(0.8)
    ax.axhline(1.0, **REFERENCE_LINE)
    ax.set_xticks(range(1, len(COMPONENTS) + 1), [LABELS[c] for c in COMPONENTS])
    ax.set_ylabel("rate of change (ratio)")
    return ax


def layer_mean_boxes(means, ax: plt.Axes | None = None, fliers: bool = False) -> plt.Axes:
    """One box per component of its per-block P(f), in plasticity order.

    The authors' summary of Fig. 3 (left: one dataset, one value per block) and Fig. 2 (middle: the blocks of every
    dataset pooled, for one model).

    ``means``: ``ranking.layer_means`` or ``plasticity_table.collect(by_block=True)`` rows (column
    ``plasticity``, one row per block and component), or a tidy rates table (column ``rate``),
    whose per-block means are taken here. Rows of several models are refused: a box pools the
    datasets of one model. Whiskers reach 1.5 interquartile ranges; points beyond them are hidden,
    as in the authors' figures, unless ``fliers``.
    """
    ax = _axes(ax)
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
    ax.axhline(1.0, **REFERENCE_LINE)
    ax.set_xticks(range(1, len(components) + 1), [LABELS[c] for c in components])
    ax.set_ylabel("plasticity $\\mathcal{P}(f)$ per block")
    return ax


def plasticity_along_depth(data, ax: plt.Axes | None = None, band: bool = True) -> plt.Axes:
    """P(f) per block for each component, against percent of depth (Fig. 3 middle and right).

    With the authors' band P(f) +/- 1.96 sd / sqrt(n) around each curve (sd of the block's per-pair rates, n its number
    of pairs: ``ranking.depth_band``).

    ``data``: a tidy rates table (column ``rate``) or ``ranking.depth_band``'s table; the band is left
    out if not ``band``.
    """
    ax = _axes(ax)
    if "rate" in data:
        data = ranking.depth_band(data)
    for component in COMPONENTS:
        part = data[data["component"] == component].sort_values("block")
        ax.plot(part["depth"], part["plasticity"], marker="o", ms=3, color=COLORS[component], label=LABELS[component])
        if band:
            ax.fill_between(part["depth"], part["low"], part["high"], color=COLORS[component], alpha=0.3, lw=0)
    ax.axhline(1.0, **REFERENCE_LINE)
    ax.set_xlabel("depth (% of blocks)")
    ax.set_ylabel("plasticity $\\mathcal{P}(f)$")
    ax.legend(fontsize=7, ncol=2)
    return ax


def pooled_plasticity(summary, ax: plt.Axes | None = None) -> plt.Axes:
    """P(f) per component across datasets: one dot per dataset, a bar for the mean.

    This goes beyond the paper's summary: the authors' Fig. 2 middle is ``layer_mean_boxes`` of the per-block P(f)."""
    ax = _axes(ax)
    for i, component in enumerate(COMPONENTS):
        values = summary.loc[summary["component"] == component, "plasticity"].to_numpy()
        ax.bar(i, values.mean() if len(values) else 0, color=COLORS[component], alpha=0.6)
        ax.scatter([i] * len(values), values, color=COLORS[component], edgecolor="black", s=14, zorder=3)
    ax.axhline(1.0, **REFERENCE_LINE)
    ax.set_xticks(range(len(COMPONENTS)), [LABELS[c] for c in COMPONENTS])
    ax.set_ylabel("plasticity $\\mathcal{P}(f)$")
    return ax


def plasticity_vs_result(table, value: str, ax: plt.Axes | None = None, ylabel: str | None = None) -> plt.Axes:
    """A finetuning result against P(f): one point per dataset and component.

    Coloured by component, the value taken relative to its dataset's mean over the components (so that datasets of
    different accuracy share an axis) and each dataset's points joined in plasticity order. ``table``: columns
    ``dataset``, ``component``, ``plasticity`` and ``value``."""
    ax = _axes(ax)
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
    ax.axhline(0.0, **REFERENCE_LINE)
    ax.set_xlabel("plasticity $\\mathcal{P}(f)$")
    ax.set_ylabel(ylabel or f"{value} - dataset mean")
    ax.legend(frameon=False, fontsize=7)
    return ax


def bounds_along_depth(
    table, ax: plt.Axes | None = None, label: str = "", linestyle: str = "-", propositions=("1", "2", "3")
) -> plt.Axes:
    """Upper bounds per block for each component on a log scale (paper Fig. 6)."""
    ax = _axes(ax)
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


def training_curves(histories, value: str, ax: plt.Axes | None = None, log: bool = False) -> plt.Axes:
    """One curve per configuration of ``value`` (e.g. grad_norm, val_loss) against step (Fig. 4 middle/right)."""
    ax = _axes(ax)
    for component in (*COMPONENTS, "full"):
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


def config_boxes(runs, ax: plt.Axes | None = None, fliers: bool = False, linear: bool = False) -> plt.Axes:
    """Test accuracy over learning rates and seeds per configuration, for one dataset.

    Fig. 4 left on Sketch, Fig. 18 on each benchmark. ``runs`` are that dataset's, as ``runs_table.load`` lists them. As
    the authors' figure, boxes are over every run with a test accuracy, diverged runs included with their
    best-validation checkpoint's (counted under each box), outliers are not drawn, the five components alone have
    boxes, and full finetuning is a dashed line at its mean. ``fliers``: draw the outliers; ``linear``: a box of the
    ``linear`` configuration's runs too."""
    ax = _axes(ax, (5, 3.2))
    if runs["dataset"].nunique() > 1:
        raise ValueError(
            "config_boxes shows one dataset (Fig. 18 has a panel per benchmark), "
            f"got {', '.join(sorted(runs['dataset'].unique()))}"
        )
    ended = runs[runs["status"].isin(["finished", "diverged"])]
    accuracy = {c: 100 * ended.loc[ended["component"] == c, "test_accuracy"].dropna().to_numpy() for c in COLORS}
    components = [c for c in ((*COMPONENTS, "linear") if linear else COMPONENTS) if len(accuracy[c])]
    parts = ax.boxplot([accuracy[c] for c in components], patch_artist=True, widths=0.6, showfliers=fliers)
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


# Whole figures, as the notebooks show them: each is laid out, saved with ``figure_path`` at a name made of
# its notebook's number, what it shows and every parameter of the result it shows, and returned.


def block_figure() -> plt.Figure:
    """Notebook 00's block diagram (paper Fig. 2, left), saved as ``00_block_diagram``."""
    fig, ax = plt.subplots(figsize=(3.2, 6.0))
    block_diagram(ax)
    return _saved(fig, "00_block_diagram")


def parameter_figure(table, model: str) -> plt.Figure:
    """Tables 3 and 4 of ``model`` as bars: trainable parameters and memory load per component.

    ``table``: ``components.parameter_table``'s."""
    fig, axes = plt.subplots(1, 2, figsize=(8, 3))
    for ax, column, ylabel, title in (
        (axes[0], "parameters", "trainable parameters", f"Table 3 ({model})"),
        (axes[1], "memory load (MiB)", "gradients + momentum (MiB)", f"Table 4 ({model}, fp32)"),
    ):
        component_bars({c: table.loc[LABELS[c], column] for c in COMPONENTS}, ylabel, ax=ax, log=True)
        ax.set_title(title)
    return _saved(fig, "00_tables_3_4", model)


def bounds_figure(at_rms, at_max, at_paper, constants: dict, paper_r: float, model: str, normalize: str) -> plt.Figure:
    """Notebook 01's Fig. 6: the bounds at the RMS and at the largest token norm.

    At the RMS token norm with Prop. 4; at the largest token norm beside MHA's at the paper's r
    (``bounds.upper_bounds`` tables, ``constants`` ``bounds.data_constants``')."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), sharey=True)
    bounds_along_depth(at_rms, axes[0])
    bounds_along_depth(at_rms, axes[0], " (Prop. 4)", linestyle=":", propositions=("4",))
    axes[0].set_title(f"{model}: r = RMS token norm = {constants['r_rms']:.2f}")
    bounds_along_depth(at_max, axes[1], " (r max)")
    bounds_along_depth(at_paper[at_paper.component == "mha"], axes[1], f" (r = {paper_r})", linestyle="--")
    axes[1].set_title(f"rigorous r = {constants['r_max']:.2f} and the paper's r = {paper_r}")
    for ax in axes:
        ax.legend(fontsize=7, ncol=2)
    return _saved(fig, "01_bounds", model, normalize)


def measurement_keys(measurement) -> list:
    """The keys of a plasticity measurement's figures.

    Its parameters, with the severity where ``Measurement.folder`` names it (a Cifar10-C corruption at another severity
    than the paper's)."""
    m = measurement
    keys = [m.model, m.dataset, m.reference, m.inputs, m.sample, f"seed{m.seed}", m.normalize]
    return keys + ([f"severity{m.severity}"] if "+severity-" in m.folder().name else [])


def plasticity_figure(table, measurement) -> plt.Figure:
    """Notebook 02's Fig. 3: the boxes of P(f) per block beside P(f) along depth with its band."""
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    layer_mean_boxes(table, axes[0])
    axes[0].set_title(f"{measurement.model} on {measurement.dataset}: P(f) per block")
    plasticity_along_depth(table, axes[1])
    axes[1].set_title("plasticity along depth (± 1.96 sd/√n)")
    return _saved(fig, "02_plasticity", *measurement_keys(measurement))


def rates_figure(table, measurement) -> plt.Figure:
    """Notebook 02's violins of every rate of change per component."""
    fig, ax = plt.subplots(figsize=(4.8, 3.4))
    rate_distributions(table, ax)
    ax.set_title(f"{measurement.model} on {measurement.dataset}: every rate of change")
    return _saved(fig, "02_rates", *measurement_keys(measurement))


def scale_curve_figure(curve, token_rms: float, paper_r: float, measurement) -> plt.Figure:
    """P(f) per component against the factor on the embeddings (``plasticity.scale_curve``'s ``curve``).

    A dotted line at the factor that gives tokens of RMS norm ``token_rms`` the paper's r."""
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    for component, part in curve.groupby("component", observed=True):
        ax.plot(part["factor"], part["plasticity"], marker="o", ms=3, color=COLORS[component], label=LABELS[component])
    ax.axvline(paper_r / token_rms, color="grey", ls=":", lw=1, label=f"token RMS {paper_r} (paper's r)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("factor a on the embedding")
    ax.set_ylabel("P(f)")
    ax.set_title(f"{measurement.model} on {measurement.dataset}: P(f) against the scale of the embedding")
    ax.legend(fontsize=7, ncol=2)
    return _saved(fig, "02_scale_curve", *measurement_keys(measurement))


def pooled_figure(summary, layers) -> plt.Figure:
    """Notebook 03's Fig. 2 middle, a row per model.

    The boxes of every block's P(f) over the datasets pooled (``layers``) beside each dataset's P(f) (``summary``)."""
    models = sorted(summary["model"].unique())
    fig, axes = plt.subplots(len(models), 2, figsize=(9, 3.2 * len(models)), squeeze=False)
    for row, model in zip(axes, models):
        blocks = layers[layers["model"] == model]
        layer_mean_boxes(blocks, row[0])
        row[0].set_title(f"{model}: P(f) per block, {blocks['dataset'].nunique()} datasets pooled")
        pooled_plasticity(summary[summary["model"] == model], row[1])
        row[1].set_title(f"{model}: P(f) per dataset")
    return _saved(fig, "03_plasticity_pooled", *models)


PROBE_STYLES = {"attn_residual": ("#7f7f7f", "--"), "block": ("#000000", "--"), "gelu": ("#e377c2", "-")}
"""Colour and line of the probe points that are not components (the residual stream dashed)."""


def probe_figure(table, profile, model: str, normalize: str, split_seed: int) -> plt.Figure:
    """Notebook 04's probe accuracy along depth per probe point, beside its spread over the datasets.

    ``profile``: ``probe.along_depth``'s; ``table``: ``probe.probe_datasets``', the spread at the last block."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), gridspec_kw={"width_ratios": [3, 2]})
    for name in profile.columns:
        color, line = PROBE_STYLES.get(name, (COLORS.get(name), "-"))
        axes[0].plot(profile.index, profile[name], marker="o", ms=3, color=color, ls=line, label=POINT_LABELS[name])
    axes[0].set_xlabel("block")
    axes[0].set_ylabel("probe test accuracy (%)")
    axes[0].set_title(f"{model}: mean over {table['dataset'].nunique()} datasets")
    axes[0].legend(fontsize=7, ncol=2)
    last = table[table["block"] == table["block"].max()]
    spread = last.pivot_table(index="point", columns="dataset", values="accuracy", observed=True)
    spread = 100 * spread.loc[list(profile.columns)]
    axes[1].boxplot(spread.T.values, tick_labels=[POINT_LABELS[p] for p in spread.index])
    axes[1].tick_params(axis="x", labelrotation=45, labelsize=7)
    axes[1].set_title("last block, over datasets")
    return _saved(fig, "04_probe_along_depth", model, normalize, f"seed{split_seed}")


def dynamics_figure(histories, spec: str, dataset: str, lr: float, seed: int) -> plt.Figure:
    """Notebook 06's Fig. 4 middle and right: gradient norm and validation loss per configuration.

    The ``histories`` of ``spec``'s runs on one dataset at one learning rate and seed."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.4))
    training_curves(histories, "grad_norm", axes[0], log=True)
    axes[0].set_ylabel("gradient norm (before clipping)")
    training_curves(histories, "val_loss", axes[1])
    axes[1].legend(fontsize=7)
    fig.suptitle(f"{dataset}, lr {lr:g}, seed {seed}")
    return _saved(fig, "06_dynamics", Path(spec).stem, dataset, f"lr{lr:g}", f"seed{seed}")


def dynamics_grid_figure(histories, spec: str, dataset: str, seed: int) -> plt.Figure:
    """Notebook 06's Figs. 19-51: ``dynamics_figure``'s two panels as rows, a column per learning rate."""
    lrs = sorted(histories["lr"].unique())
    fig, axes = plt.subplots(2, len(lrs), figsize=(4.5 * len(lrs), 6), squeeze=False)
    for column, value in enumerate(lrs):
        part = histories[histories["lr"] == value]
        training_curves(part, "grad_norm", axes[0, column], log=True)
        training_curves(part, "val_loss", axes[1, column])
        axes[0, column].set_title(f"lr {value:g}")
    axes[1, -1].legend(fontsize=7)
    return _saved(fig, "06_dynamics_grid", Path(spec).stem, dataset, f"seed{seed}")


def rates_along_depth_figure(table, measurement) -> plt.Figure:
    """Notebook 08's plasticity: every rate of change beside P(f) along depth (no band)."""
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    rate_distributions(table, axes[0])
    axes[0].set_title(f"{measurement.model} on {measurement.dataset}: rates of change")
    plasticity_along_depth(table, axes[1], band=False)
    axes[1].set_title("plasticity along depth")
    return _saved(fig, "08_plasticity", *measurement_keys(measurement))


def finetune_figure(histories: dict, config) -> plt.Figure:
    """Notebook 08's runs: gradient norm and validation accuracy against step, a line per component.

    ``histories``: component -> ``runs.history``, the runs of ``config`` but for their component."""
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.2))
    for component, history in histories.items():
        axes[0].plot(history["step"], history["grad_norm"], color=COLORS[component], label=LABELS[component])
        evals = history.dropna(subset=["val_accuracy"])
        kwargs = {"marker": "o", "ms": 3, "color": COLORS[component], "label": LABELS[component]}
        axes[1].plot(evals["step"], evals["val_accuracy"], **kwargs)
    axes[0].set(xlabel="step", ylabel="gradient norm (before clipping)", yscale="log")
    axes[1].set(xlabel="step", ylabel="validation accuracy")
    axes[1].legend(frameon=False)
    c = config
    fig.suptitle(f"{c.model} on {c.dataset}: lr {c.lr:g}, seed {c.seed}")
    keys = (c.model, c.dataset, "+".join(histories), f"lr{c.lr:g}", f"seed{c.seed}", c.normalize)
    return _saved(fig, "08_finetune", *keys)


def run_figure(history, metrics: dict, config) -> plt.Figure:
    """Notebook 05's run: training loss, gradient norm and validation accuracy against step.

    The gradient norm is before clipping and the best-validation checkpoint is marked; ``history`` is
    ``runs.history``'s, ``config`` a ``Config``."""
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.2))
    color = COLORS[config.component]
    axes[0].plot(history["step"], history["train_loss"], color=color)
    axes[0].set(xlabel="step", ylabel="training loss")
    axes[1].plot(history["step"], history["grad_norm"], color=color)
    axes[1].set(xlabel="step", ylabel="gradient norm (before clipping)", yscale="log")
    evals = history.dropna(subset=["val_accuracy"])
    axes[2].plot(evals["step"], evals["val_accuracy"], marker="o", ms=3, color=color)
    if metrics["best_step"]:
        best = ([metrics["best_step"]], [metrics["best_val_accuracy"]])
        axes[2].scatter(*best, s=80, facecolor="none", edgecolor="black", zorder=3)
    axes[2].set(xlabel="step", ylabel="validation accuracy")
    how = "" if config.method.name == "weights" else f" ({config.method.label()})"
    c = config
    fig.suptitle(f"{c.model} on {c.dataset}: {LABELS[c.component]}{how}, lr {c.lr:g}, seed {c.seed}")
    # named as the run's folder (its last part: the seed and the suffixes of Config.folder)
    return _saved(fig, "05_finetune", c.model, c.dataset, c.component, f"lr{c.lr:g}", c.folder().name)


def _configurations(table) -> list[str]:
    """The configurations of ``table`` (column ``component``): in plasticity order, then full."""
    return [c for c in (*COMPONENTS, "full") if c in set(table["component"])]


def _methods(table) -> list[str]:
    """The methods of ``table`` (column ``method``): the weights' first, then the others in the order they come."""
    return sorted(dict.fromkeys(table["method"]), key=lambda method: method != "weights")


def grouped_bars(table, ax: plt.Axes | None = None) -> plt.Axes:
    """One group of bars per configuration, one bar per method in it.

    The configurations in plasticity order, then full (``table``: columns ``component``, ``method``, ``mean``); the
    weights' bars solid, the others hatched."""
    ax = _axes(ax, (5, 3.4))
    methods = _methods(table)
    shown = _configurations(table)
    width = 0.8 / max(len(methods), 1)
    for i, name in enumerate(methods):
        part = table[table["method"] == name].set_index("component").reindex(shown)
        positions = [c + (i - (len(methods) - 1) / 2) * width for c in range(len(shown))]
        weights = name == "weights"
        style = {"alpha": 1.0 if weights else 0.55, "hatch": None if weights else "//", "edgecolor": "black"}
        ax.bar(positions, part["mean"], width, label=name, color=[COLORS[c] for c in shown], **style)
    ax.set_xticks(range(len(shown)), [LABELS[c] for c in shown])
    ax.set(ylabel="test accuracy (%)", ylim=(max(0, table["mean"].min() - 10), None))
    ax.legend(fontsize=8)
    return ax


def lora_figure(average, models: Sequence[str]) -> plt.Figure:
    """Notebook 09: test accuracy per configuration and method, and against the parameters that train.

    The first as grouped bars, the second beside it (``average``: columns ``component``, ``method``, ``mean``,
    ``trainable_parameters``, over the runs of ``models``)."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.4))
    grouped_bars(average, axes[0])
    for name in _methods(average):
        part = average[average["method"] == name]
        marker = "o" if name == "weights" else "s"
        axes[1].plot(part["trainable_parameters"], part["mean"], marker=marker, ls="none", label=name, color="gray")
        for _, row in part.iterrows():
            axes[1].annotate(
                LABELS[row["component"]],
                (row["trainable_parameters"], row["mean"]),
                fontsize=8,
                xytext=(4, 2),
                textcoords="offset points",
                color=COLORS[row["component"]],
            )
    axes[1].set(xscale="log", xlabel="trainable parameters", ylabel="test accuracy (%)")
    axes[1].legend(fontsize=8)
    return _saved(fig, "09_lora_by_plasticity", *models)


def lora_lr_figure(grid, models: Sequence[str]) -> plt.Figure:
    """Notebook 09's learning-rate grid: test accuracy against the learning rate per configuration.

    A panel per method (``grid``: columns ``component``, ``method``, ``lr``, ``test_accuracy``, over the runs of
    ``models``)."""
    methods = _methods(grid)
    lrs = sorted(grid["lr"].unique())
    fig, axes = plt.subplots(1, len(methods), figsize=(4.2 * len(methods), 3.2), squeeze=False, sharey=True)
    for ax, name in zip(axes[0], methods):
        for c in _configurations(grid):
            part = grid[(grid["method"] == name) & (grid["component"] == c)]
            ax.plot(part["lr"], 100 * part["test_accuracy"], marker="o", color=COLORS[c], label=LABELS[c])
        ax.set(xscale="log", xlabel="learning rate", title=name)
        ax.set_xticks(lrs, [f"{lr:g}" for lr in lrs])
        ax.minorticks_off()
    axes[0][0].set(ylabel="test accuracy (%)")
    axes[0][0].legend(fontsize=8)
    return _saved(fig, "09_lora_by_plasticity_lr", *models)


def gain_figure(gain, average, spec: str, select: str) -> plt.Figure:
    """Notebook 07's Fig. 2 (right) and Fig. 17: gain over linear probing, and mean accuracy over datasets.

    ``gain`` is ``tables.relative_gain``'s (None without a probe); ``average`` is ``tables.average``'s, its
    pooled standard error drawn as error bars."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.4))
    if gain is not None:
        component_bars(gain.mean().to_dict(), "relative gain over linear probing (%)", ax=axes[0])
    else:
        kwargs = {"ha": "center", "va": "center", "transform": axes[0].transAxes}
        axes[0].text(0.5, 0.5, "no linear probing cached\n(notebook 04)", **kwargs)
    axes[0].set_title("Fig. 2 (right):\nmean over datasets")
    finetuned = [c for c in average["component"] if c not in ("linear", "probe")]
    part = average.set_index("component").loc[finetuned]
    colors = [COLORS[c] for c in finetuned]
    axes[1].bar([LABELS[c] for c in finetuned], part["mean"], yerr=part["pooled_se"], color=colors, capsize=3)
    axes[1].set_ylim(part["mean"].min() - 5, part["mean"].max() + 3)
    axes[1].set_ylabel("mean test accuracy (%)")
    none = "" if part["pooled_se"].notna().all() else " (one seed: none)"
    axes[1].set_title("Fig. 17: mean over datasets\n± pooled standard error" + none)
    return _saved(fig, "07_finetune_results", Path(spec).stem, select)


def robustness_figure(runs, spec: str, fliers: bool = False, linear: bool = False) -> plt.Figure:
    """Notebook 07's Fig. 4 (left) and Fig. 18: ``config_boxes`` of every run of the grid, a panel per dataset.

    ``fliers`` and ``linear``: ``config_boxes``'."""
    datasets = sorted(runs["dataset"].unique())
    columns = min(3, len(datasets))
    rows = -(-len(datasets) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(5 * columns, 3.4 * rows), squeeze=False)
    for ax, name in zip(axes.flat, datasets):
        config_boxes(runs[runs["dataset"] == name], ax, fliers, linear)
        ax.set_title(name)
    for ax in axes.flat[len(datasets) :]:
        ax.axis("off")
    return _saved(fig, "07_robustness", Path(spec).stem)


def accuracy_tau_figure(table, taus, model: str, spec: str, select: str) -> plt.Figure:
    """Notebook 07's Takeaway 2: accuracy against P(f), and each dataset's Kendall tau of the two.

    ``table`` has ``dataset``, ``component``, ``plasticity`` and ``mean``; ``taus`` has ``dataset``, ``tau``
    and ``source``, one marker set per source."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.4))
    plasticity_vs_result(table, "mean", axes[0], "test accuracy (%) - dataset mean")
    axes[0].set_title(f"{model}: accuracy against plasticity")
    rows = {name: i for i, name in enumerate(sorted(taus["dataset"].unique()))}
    for offset, (source, part) in zip((-0.15, 0.15), taus.groupby("source", sort=False)):
        axes[1].scatter(part["tau"], [rows[d] + offset for d in part["dataset"]], label=source, s=18)
    axes[1].set_yticks(range(len(rows)), list(rows), fontsize=7)
    axes[1].axvline(0.0, **REFERENCE_LINE)
    axes[1].set(xlabel="Kendall's tau: P(f) and accuracy", xlim=(-1.1, 1.1))
    axes[1].legend(frameon=False, fontsize=7)
    axes[1].set_title("per dataset")
    return _saved(fig, "07_plasticity_vs_accuracy", Path(spec).stem, select)


def precision_figure(runs, spec: str, reference: str = "fp32") -> plt.Figure:
    """Notebook 11: test accuracy per configuration in each precision of ``runs``, a panel per dataset.

    ``runs``: ``runs_table``'s runs of a precision spec. Per configuration and precision (``reference`` first, one
    marker each, side by side), a point per learning rate: the mean test accuracy (%) over seeds of its runs that ended
    (finished or diverged), their standard deviation (ddof=0, as Table 6's) as an error bar."""
    ended = runs[runs["status"].isin(["finished", "diverged"])].dropna(subset=["test_accuracy"])
    precisions = sorted(ended["precision"].unique(), key=lambda precision: (precision != reference, precision))
    keys = ["dataset", "component", "precision", "lr"]
    table = ended.groupby(keys)["test_accuracy"].agg(mean="mean", std=lambda values: values.std(ddof=0)).reset_index()
    datasets = sorted(table["dataset"].unique())
    fig, axes = plt.subplots(1, len(datasets), figsize=(4.5 * len(datasets), 3.4), squeeze=False)
    width, markers = 0.6 / len(precisions), "osD^v"
    for ax, (name, part) in zip(axes[0], table.groupby("dataset")):
        shown = [c for c in RUN_COMPONENTS if c in set(part["component"])]
        for row in part.itertuples():
            i = precisions.index(row.precision)
            x = shown.index(row.component) + (i - (len(precisions) - 1) / 2) * width
            style = {"fmt": markers[i % len(markers)], "color": COLORS[row.component], "mec": "black", "capsize": 3}
            ax.errorbar(x, 100 * row.mean, yerr=100 * row.std, **style)
        ax.set_xticks(range(len(shown)), [LABELS[c] for c in shown])
        ax.set(title=name, ylabel="test accuracy (%)")
    for i, precision in enumerate(precisions):
        axes[0][-1].plot([], [], markers[i % len(markers)], color="white", mec="black", label=precision)
    axes[0][-1].legend(frameon=False, fontsize=7, title="precision", title_fontsize=7)
    return _saved(fig, "11_precision", Path(spec).stem, reference)


def equal_capacity_figure(accuracies, plasticity, model: str, spec: str, select: str) -> plt.Figure:
    """Notebook 10: accuracy against P(f) per component, a panel per design (ordinary, equal capacity).

    ``accuracies``: ``capacity.at_equal_capacity``'s (dataset x design and component label, %); ``plasticity``: P(f)
    per ``dataset`` and ``component``. Each panel is ``plasticity_vs_result``'s: relative to the dataset's mean."""
    by_label = {LABELS[c]: c for c in COMPONENTS}
    designs = list(accuracies.columns.unique(0))
    fig, axes = plt.subplots(
        1, len(designs), figsize=(4.5 * len(designs), 3.4), sharex=True, sharey=True, squeeze=False
    )
    for ax, design in zip(axes[0], designs):
        part = accuracies[design].rename(columns=by_label).rename_axis(index="dataset", columns="component")
        table = part.stack().rename("accuracy").reset_index()
        table = table.merge(plasticity[["dataset", "component", "plasticity"]], on=["dataset", "component"])
        plasticity_vs_result(table, "accuracy", ax, "test accuracy (%) - dataset mean")
        ax.set_title(f"{model}: {design}")
    return _saved(fig, "10_equal_capacity", model, Path(spec).stem, select)


ABLATION_BOXES = {"adamw": ("Adam", None, 1.0), "sgd": ("SGD", "////", 0.6)}
"""``adam_ablation_figure``'s boxes by optimizer: label, hatch and alpha (Adam plain, SGD hatched, as the authors')."""


def adam_ablation_figure(
    adam_runs, sgd_runs, histories, spec: str, dataset: str = "domainnet/sketch", lr: float = 1e-4, seed: int = 0
) -> plt.Figure:
    """Notebook 07's Adam ablation figure, the authors' for DomainNet Sketch (their ``ablation.py``, not in the paper).

    Left: per component in plasticity order, the test accuracy (%) of ``seed``'s runs on ``dataset`` over their
    learning rates (every run that ended, diverged ones with their best-validation checkpoint's), an Adam box beside
    an SGD one (whiskers at 1.5 interquartile ranges, no outliers drawn, as theirs). Middle and right: the gradient norm
    (before clipping) and the validation loss against the step of the Adam runs at ``lr`` and ``seed`` (theirs:
    1e-4, Table 5's 1e-2 divided by 100), a line per component.

    ``adam_runs`` and ``sgd_runs``: runs tables (``runs_table.for_spec``) of ``parameters/sweeps/ablation_adam.yaml``
    and of the SGD grid (None or empty: Adam boxes alone); ``histories``: ``runs_table.histories_of``'s of the Adam
    runs (None, or none of those runs: the left panel alone). Saved as ``07_adam_ablation_<spec>_<dataset>...``."""
    datasets = sorted(adam_runs["dataset"].unique())
    if dataset not in datasets:
        raise ValueError(f"no Adam run on {dataset!r}; valid datasets (those of adam_runs): {', '.join(datasets)}")
    sides = {"adamw": adam_runs}
    if sgd_runs is not None and len(sgd_runs):
        sides["sgd"] = sgd_runs
    curves = None
    if histories is not None and len(histories):
        at = (
            (histories["dataset"] == dataset)
            & (histories["seed"] == seed)
            & np.isclose(histories["lr"].astype(float), lr, rtol=1e-9, atol=0.0)
            & histories["component"].isin(COMPONENTS)
        )
        if "optimizer" in histories:
            at &= histories["optimizer"] == "adamw"
        curves = histories[at] if at.any() else None
    fig, axes = plt.subplots(1, 3 if curves is not None else 1, figsize=(13.5 if curves is not None else 5, 3.4))
    axes = np.atleast_1d(axes)
    width = 0.8 / len(sides)
    for k, (optimizer, runs) in enumerate(sides.items()):
        ended = runs[
            (runs["dataset"] == dataset) & (runs["seed"] == seed) & runs["status"].isin(["finished", "diverged"])
        ]
        _, hatch, alpha = ABLATION_BOXES[optimizer]
        shown = [c for c in COMPONENTS if ended.loc[ended["component"] == c, "test_accuracy"].notna().any()]
        values = [100 * ended.loc[ended["component"] == c, "test_accuracy"].dropna().to_numpy() for c in shown]
        positions = [COMPONENTS.index(c) + (k - (len(sides) - 1) / 2) * width for c in shown]
        if shown:
            parts = axes[0].boxplot(
                values,
                positions=positions,
                widths=0.9 * width,
                patch_artist=True,
                showfliers=False,
                medianprops={"color": "black"},
            )
            for box, component in zip(parts["boxes"], shown):
                box.set(facecolor=COLORS[component], hatch=hatch, alpha=alpha)
    handles = [
        Patch(facecolor="lightgrey", edgecolor="black", hatch=ABLATION_BOXES[o][1], alpha=ABLATION_BOXES[o][2])
        for o in sides
    ]
    axes[0].legend(handles, [ABLATION_BOXES[o][0] for o in sides], frameon=False, fontsize=7)
    axes[0].set_xticks(range(len(COMPONENTS)), [LABELS[c] for c in COMPONENTS])
    axes[0].set_xlim(-0.6, len(COMPONENTS) - 0.4)
    axes[0].set(ylabel="test accuracy (%)", title=f"{dataset}, seed {seed}: over the learning rates")
    if curves is not None:
        training_curves(curves, "grad_norm", axes[1])
        axes[1].set(ylabel="gradient norm (before clipping)", title=f"Adam, lr {lr:g}")
        training_curves(curves, "val_loss", axes[2])
        axes[2].set(ylabel="validation loss", title=f"Adam, lr {lr:g}")
        axes[2].legend(frameon=False, fontsize=7)
    return _saved(fig, "07_adam_ablation", Path(spec).stem, dataset, f"lr{lr:g}", f"seed{seed}")
