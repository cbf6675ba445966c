"""The figures' summaries: the authors' boxes of per-block P(f) (Fig. 2 middle, Fig. 3 left) and band
around P(f) along depth (Fig. 3 middle), beside the package's richer views; the notebooks' whole figures,
each saved at a name made of what it shows."""

import json
from types import SimpleNamespace

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
import torch
from conftest import found
from matplotlib.collections import PolyCollection
from matplotlib.patches import FancyBboxPatch, Rectangle

from paperlib.analysis import plasticity_table, ranking
from paperlib.measure import plasticity
from paperlib.records import measurements, storage
from paperlib.records.names import COMPONENTS, LABELS, POINT_LABELS
from paperlib.reports import plots
from paperlib.train.config import Config

BLOCKS, PAIRS = 3, 4


def _known_table():
    """Rates 1..60 in order: block b, component c (``COMPONENTS`` index), pair p has rate
    1 + p + PAIRS * (c + len(COMPONENTS) * b), with depth 0, 50, 100 for the three blocks."""
    rows = [
        {"block": b, "depth": 50.0 * b, "component": c, "pair": p, "rate": 1.0 + p + PAIRS * (i + len(COMPONENTS) * b)}
        for b in range(BLOCKS)
        for i, c in enumerate(COMPONENTS)
        for p in range(PAIRS)
    ]
    table = pd.DataFrame(rows)
    table["component"] = pd.Categorical(table["component"], categories=COMPONENTS)
    return table


pytestmark = pytest.mark.usefixtures("figures")  # each test's own figures folder, its figures closed after


def _saved(figures) -> list[str]:
    return sorted(path.name for path in figures.iterdir())


def _bars(ax) -> list[Rectangle]:
    return [patch for patch in ax.patches if isinstance(patch, Rectangle)]


def _ticks(ax) -> list[str]:
    return [label.get_text() for label in ax.get_xticklabels()]


def test_layer_means_are_one_mean_per_block_and_component():
    table = _known_table()
    means = ranking.layer_means(table)
    assert len(means) == BLOCKS * len(COMPONENTS)
    fc1 = means[means["component"] == "fc1"]
    # FC1 (index 1) in block b: rates 1 + p + 4 (1 + 5 b), p = 0..3: their mean is 6.5 + 20 b
    assert fc1["plasticity"].tolist() == pytest.approx([6.5, 26.5, 46.5])
    assert fc1["depth"].tolist() == [0.0, 50.0, 100.0] and fc1["block"].tolist() == [0, 1, 2]
    # averaged over blocks: the P(f) of plasticity_table.ranked (mean over pairs and blocks)
    ranked = plasticity_table.ranked(table)
    assert means.groupby("component", observed=True)["plasticity"].mean()["fc1"] == pytest.approx(
        ranked.loc["FC1", "plasticity"]
    )


def test_depth_band_half_width_is_1_96_sd_over_sqrt_n():
    rng = np.random.default_rng(1)
    table = _known_table()
    table["rate"] = rng.gamma(2.0, 1.5, len(table))  # rates of no pattern
    band = ranking.depth_band(table)
    assert len(band) == BLOCKS * len(COMPONENTS)
    row = band[(band["block"] == 1) & (band["component"] == "mha")].iloc[0]
    rates = table.loc[(table["block"] == 1) & (table["component"] == "mha"), "rate"].to_numpy()
    assert len(rates) == PAIRS and row["n"] == PAIRS
    mean = rates.sum() / PAIRS
    sd = np.sqrt(((rates - mean) ** 2).sum() / PAIRS)  # the authors' np.std: divided by n
    assert row["plasticity"] == pytest.approx(mean)
    assert row["sd"] == pytest.approx(sd)
    assert row["half_width"] == pytest.approx(1.96 * sd / np.sqrt(PAIRS))
    assert (row["low"], row["high"]) == pytest.approx((mean - 1.96 * sd / 2, mean + 1.96 * sd / 2))
    unbiased = ranking.depth_band(table, ddof=1)
    sd1 = np.sqrt(((rates - mean) ** 2).sum() / (PAIRS - 1))
    got = unbiased[(unbiased["block"] == 1) & (unbiased["component"] == "mha")]["half_width"].iloc[0]
    assert got == pytest.approx(1.96 * sd1 / 2)


def test_pairs_without_any_rate_leave_the_band_and_the_boxes():
    table = _known_table()
    table.loc[table["pair"] == 3, "rate"] = np.nan  # identical embeddings: 0/0 in every block
    with pytest.warns(UserWarning, match="1 pairs without any rate"):
        band = ranking.depth_band(table)
    assert (band["n"] == PAIRS - 1).all()
    with pytest.warns(UserWarning, match="1 pairs without any rate"):
        means = ranking.layer_means(table)
    assert means["plasticity"].iloc[0] == pytest.approx(2.0)  # MHA, block 0: rates 1, 2, 3


def test_the_boxes_hold_the_per_block_means():
    table = _known_table()
    ax = plots.layer_mean_boxes(table)
    assert len(ax.patches) == len(COMPONENTS)
    segments = [(line.get_xdata(), line.get_ydata()) for line in ax.lines if line.get_color() != "grey"]
    # the medians span a whole box (0.6 wide); each is the median of that component's three
    # per-block means, block 1's mean: 2.5 + 4 (i + 5) for the component of index i
    medians = [y[0] for x, y in segments if x[1] - x[0] == pytest.approx(0.6)]
    assert medians == pytest.approx([2.5 + PAIRS * (i + len(COMPONENTS)) for i in range(len(COMPONENTS))])
    # the whiskers reach the per-block means (MHA's lowest 2.5, LN1's highest 58.5), not the
    # per-pair rates (1 and 60)
    values = [v for _, y in segments for v in y]
    assert (min(values), max(values)) == pytest.approx((2.5, 58.5))


def test_pooled_boxes_take_every_dataset_of_one_model():
    table = _known_table()
    means = ranking.layer_means(table)
    pooled = pd.concat([means.assign(model="m", dataset=d) for d in ("a", "b")], ignore_index=True)
    ax = plots.layer_mean_boxes(pooled)
    assert len(ax.patches) == len(COMPONENTS)
    with pytest.raises(ValueError, match="one model"):
        plots.layer_mean_boxes(pd.concat([pooled, pooled.assign(model="other")]))


def test_plasticity_along_depth_draws_a_band_per_component():
    table = _known_table()
    ax = plots.plasticity_along_depth(table)
    bands = [c for c in ax.collections if isinstance(c, PolyCollection)]
    assert len(bands) == len(COMPONENTS)
    curves = [line for line in ax.get_lines() if len(line.get_xdata()) == BLOCKS]
    assert len(curves) == len(COMPONENTS) and list(curves[0].get_xdata()) == [0.0, 50.0, 100.0]
    _, without = plt.subplots()
    plots.plasticity_along_depth(table, without, band=False)
    assert not [c for c in without.collections if isinstance(c, PolyCollection)]
    # without the band, the curves are plasticity_by_block's P(f) per block (notebook 08's figure)
    lines = [x for x in without.get_lines() if len(x.get_xdata()) == BLOCKS]
    by_block = plasticity_table.plasticity_by_block(table)
    drawn = np.array([x.get_ydata() for x in lines], dtype=float)
    assert len(lines) == 5 and drawn == pytest.approx(by_block[list(COMPONENTS)].to_numpy().T)


def test_the_richer_views_still_draw():
    table = _known_table()
    ax = plots.rate_distributions(table)
    assert len(ax.collections) >= len(COMPONENTS)
    summary = pd.DataFrame({"component": list(COMPONENTS) * 2, "plasticity": np.arange(10.0)})
    plots.pooled_plasticity(summary)


def test_collect_by_block_reads_the_blocks_of_the_results_collect_reads():
    table = _known_table()
    for dataset, shift in (("digits", 0.0), ("digits_c/snow", 100.0)):
        plasticity_table.save(
            table.assign(rate=table["rate"] + shift), plasticity.Measurement(dataset=dataset), found(table)
        )
    # a random draw: not the paper's, left out by default as collect leaves it out
    plasticity_table.save(table, plasticity.Measurement(sample="random", seed=2), found(table))

    layers = plasticity_table.collect(by_block=True)
    assert len(layers) == 2 * BLOCKS * len(COMPONENTS)
    assert set(layers["dataset"]) == {"digits", "digits_c/snow"} and set(layers["model"]) == {"demo"}
    snow = layers[(layers["dataset"] == "digits_c/snow") & (layers["component"] == "fc1")]
    assert snow["plasticity"].tolist() == pytest.approx([106.5, 126.5, 146.5])
    # averaged over blocks: collect's P(f)
    collected = plasticity_table.collect().set_index(["dataset", "component"])["plasticity"]
    averaged = layers.groupby(["dataset", "component"], observed=True)["plasticity"].mean()
    assert averaged.sort_index().to_numpy() == pytest.approx(collected.sort_index().to_numpy())
    random = plasticity_table.collect(sample="random", by_block=True)
    assert len(random) == BLOCKS * len(COMPONENTS) and random["seed"].tolist() == [2] * len(random)
    assert plasticity_table.collect(sample="random", seed=5, by_block=True).empty

    ax = plots.layer_mean_boxes(layers)
    assert len(ax.patches) == len(COMPONENTS)


def test_collect_reads_each_results_p_of_f_per_block_not_its_rates(monkeypatch):
    table = _known_table()
    table.loc[(table["block"] == 0) & (table["component"] == "fc1") & (table["pair"] < 3), "rate"] = np.nan
    measurement = plasticity.Measurement()
    folder = plasticity_table.save(table, measurement, found(table))
    measured = table.dropna()  # block 0 of fc1 has 1 pair with a rate, the others 4: a mean of block means is wrong
    expected = measured.groupby("component", observed=True)["rate"].mean()
    per_block = measured.groupby(["block", "component"], observed=True)["rate"].mean()

    def unread(_folder):
        raise AssertionError("collect read the rates")

    with monkeypatch.context() as patched:
        patched.setattr(plasticity_table, "load", unread)
        collected = plasticity_table.collect().set_index("component")["plasticity"]
        layers = plasticity_table.collect(by_block=True).set_index(["block", "component"])["plasticity"]
    assert collected[list(COMPONENTS)].to_numpy() == pytest.approx(expected[list(COMPONENTS)].to_numpy())
    assert collected["fc1"] != pytest.approx(per_block.xs("fc1", level="component").mean())
    assert layers.sort_index().to_numpy() == pytest.approx(per_block.sort_index().to_numpy())
    # a result saved before the per-block file: outdated, not read from its rates but measured again
    (folder / measurements.BLOCKS).unlink()
    metadata = json.loads((folder / measurements.METADATA).read_text())
    del metadata["files"][measurements.BLOCKS]
    storage.write_json(folder / measurements.METADATA, metadata)
    assert not measurement.is_saved()
    with pytest.warns(UserWarning, match="records left out"), monkeypatch.context() as patched:
        patched.setattr(plasticity_table, "load", unread)
        assert plasticity_table.collect().empty and plasticity_table.collect(by_block=True).empty


def test_the_block_figure_draws_the_five_components(figures):
    fig = plots.block_figure()
    boxes = [p for p in fig.axes[0].patches if isinstance(p, FancyBboxPatch)]
    assert [p.get_facecolor()[:3] for p in boxes] == [
        pytest.approx(plt.matplotlib.colors.to_rgb(plots.COLORS[c])) for c in ("ln1", "mha", "ln2", "fc1", "fc2")
    ]
    assert _saved(figures) == ["00_block_diagram.png"]


def test_the_parameter_figure_has_a_bar_per_component_for_tables_3_and_4(figures):
    table = pd.DataFrame(
        {"parameters": [10.0, 20, 30, 40, 50], "memory load (MiB)": [1.0, 2, 3, 4, 5]},
        index=[LABELS[c] for c in COMPONENTS],
    )
    fig = plots.parameter_figure(table, "vit_base_in21k")
    left, right = fig.axes
    assert [bar.get_height() for bar in _bars(left)] == [10, 20, 30, 40, 50]
    assert [bar.get_height() for bar in _bars(right)] == [1, 2, 3, 4, 5]
    assert _ticks(left) == [LABELS[c] for c in COMPONENTS]
    assert (left.get_title(), right.get_title()) == ("Table 3 (vit_base_in21k)", "Table 4 (vit_base_in21k, fp32)")
    assert _saved(figures) == ["00_tables_3_4_vit_base_in21k.png"]


def test_the_sample_grid_has_a_row_per_dataset_saved_under_their_names(figures):
    def dataset(name):
        return SimpleNamespace(
            name=name, images=torch.zeros(3, 3, 4, 4, dtype=torch.uint8), targets=[0, 1, 0], classes=["a", "b"]
        )

    fig = plots.sample_grid([dataset("digits"), dataset("digits_c/snow")], per_dataset=3)
    assert len(fig.axes) == 6 and [ax.get_title() for ax in fig.axes[:3]] == ["a", "b", "a"]
    assert _saved(figures) == ["00_datasets_digits_digits_c_snow.png"]


def _bounds(propositions, scale=1.0):
    rows = [
        {"component": c, "proposition": p, "depth": d, "bound": scale * (i + 1) * (d + 1)}
        for i, c in enumerate(COMPONENTS)
        for p in propositions
        for d in (0.0, 100.0)
    ]
    return pd.DataFrame(rows)


def test_the_bounds_figure_draws_each_reading_of_r(figures):
    at_rms = pd.concat([_bounds(["1"]), _bounds(["4"]).query("component == 'mha'")])
    constants = {"r_rms": 3.2, "r_max": 9.5}
    fig = plots.bounds_figure(at_rms, _bounds(["1"], 2.0), _bounds(["1"], 3.0), constants, 19.4, "demo", "imagenet")
    left, right = fig.axes
    # left: one line per component, and MHA's Prop. 4 dotted; right: the five at r max, MHA's at the paper's r
    assert [line.get_label() for line in left.get_lines()] == [LABELS[c] for c in COMPONENTS] + ["MHA (Prop. 4)"]
    assert [line.get_label() for line in right.get_lines()][-2:] == ["LN1 (r max)", "MHA (r = 19.4)"]
    assert len(right.get_lines()) == 6 and right.get_lines()[-1].get_linestyle() == "--"
    assert left.get_title() == "demo: r = RMS token norm = 3.20"
    assert _saved(figures) == ["01_bounds_demo_imagenet.png"]


def test_the_measurement_keys_name_the_severity_where_its_folder_does():
    keys = ["demo", "cifar10c/snow", "digits_source", "embedding", "first", "seed0", "imagenet"]
    paper = plasticity.Measurement(dataset="cifar10c/snow", reference="digits_source")
    assert plots.measurement_keys(paper) == keys
    milder = plasticity.Measurement(dataset="cifar10c/snow", reference="digits_source", severity=3)
    assert plots.measurement_keys(milder) == [*keys, "severity3"]
    assert "+severity-3" in milder.folder().name


def test_the_plasticity_figures_are_saved_under_the_measurements_keys(figures):
    table = _known_table()
    measurement = plasticity.Measurement(dataset="cifar10c/snow", reference="digits_source", severity=2)
    keys = "demo_cifar10c_snow_digits_source_embedding_first_seed0_imagenet_severity2.png"
    fig = plots.plasticity_figure(table, measurement)
    assert len(fig.axes[0].patches) == len(COMPONENTS)  # the boxes
    assert len([c for c in fig.axes[1].collections if isinstance(c, PolyCollection)]) == len(COMPONENTS)  # bands
    assert fig.axes[0].get_title() == "demo on cifar10c/snow: P(f) per block"
    fig = plots.rates_figure(table, measurement)
    assert len(fig.axes) == 1 and len(fig.axes[0].collections) >= len(COMPONENTS)
    fig = plots.rates_along_depth_figure(table, measurement)
    assert not [c for c in fig.axes[1].collections if isinstance(c, PolyCollection)]  # no band
    assert _saved(figures) == [f"02_plasticity_{keys}", f"02_rates_{keys}", f"08_plasticity_{keys}"]


def test_the_scale_curve_has_a_line_per_component_and_the_papers_r(figures):
    factors = [0.5, 1.0, 2.0]
    curve = pd.DataFrame(
        [{"factor": a, "component": c, "plasticity": a * (i + 1)} for i, c in enumerate(COMPONENTS) for a in factors]
    )
    curve["component"] = pd.Categorical(curve["component"], categories=COMPONENTS)  # as plasticity.scale_curve's
    fig = plots.scale_curve_figure(curve, token_rms=4.0, paper_r=19.4, measurement=plasticity.Measurement())
    lines = fig.axes[0].get_lines()
    labels = [LABELS[c] for c in COMPONENTS] + ["token RMS 19.4 (paper's r)"]
    assert [line.get_label() for line in lines] == labels
    assert list(lines[1].get_ydata()) == [1.0, 2.0, 4.0]  # FC1's: twice the factor
    assert lines[-1].get_xdata()[0] == pytest.approx(19.4 / 4.0)
    assert _saved(figures) == ["02_scale_curve_demo_digits_digits_source_embedding_first_seed0_imagenet.png"]


def test_the_pooled_figure_has_a_row_per_model(figures):
    means = ranking.layer_means(_known_table())
    layers = pd.concat([means.assign(model=m, dataset=d) for m in ("b", "a") for d in ("x", "y")])
    summary = pd.DataFrame(
        [
            {"model": m, "dataset": d, "component": c, "plasticity": 1.0}
            for m in ("b", "a")
            for d in "xy"
            for c in COMPONENTS
        ]
    )
    fig = plots.pooled_figure(summary, layers)
    assert [ax.get_title() for ax in fig.axes] == [
        "a: P(f) per block, 2 datasets pooled",
        "a: P(f) per dataset",
        "b: P(f) per block, 2 datasets pooled",
        "b: P(f) per dataset",
    ]
    assert _saved(figures) == ["03_plasticity_pooled_a_b.png"]


def test_the_probe_figure_has_a_line_and_a_box_per_probe_point(figures):
    points = ["ln1", "mha", "attn_residual", "block"]
    table = pd.DataFrame(
        [{"block": b, "point": p, "dataset": d, "accuracy": 0.5} for b in range(3) for p in points for d in "xyz"]
    )
    profile = pd.DataFrame({p: [50.0, 60.0, 70.0] for p in points})
    fig = plots.probe_figure(table, profile, "demo", "imagenet", 0)
    left, right = fig.axes
    assert [line.get_label() for line in left.get_lines()] == [POINT_LABELS[p] for p in points]
    assert [line.get_linestyle() for line in left.get_lines()] == ["-", "-", "--", "--"]
    assert _ticks(right) == [POINT_LABELS[p] for p in points] and left.get_title() == "demo: mean over 3 datasets"
    assert _saved(figures) == ["04_probe_along_depth_demo_imagenet_seed0.png"]


def _histories(components, lrs=(0.03,)):
    return pd.DataFrame(
        [
            {
                "component": c,
                "lr": lr,
                "step": s,
                "grad_norm": 1.0 + s,
                "val_loss": 2.0 - s / 10,
                "val_accuracy": 0.1 * s,
            }
            for c in components
            for lr in lrs
            for s in range(4)
        ]
    )


def test_the_dynamics_figures_have_a_curve_per_configuration(figures):
    histories = _histories(["mha", "ln1", "full"], lrs=(0.01, 0.03))
    fig = plots.dynamics_figure(histories[histories["lr"] == 0.03], "parameters/sweeps/demo.yaml", "digits", 0.03, 0)
    assert [len(ax.get_lines()) for ax in fig.axes] == [3, 3]
    assert fig.axes[0].get_yscale() == "log" and fig._suptitle.get_text() == "digits, lr 0.03, seed 0"
    fig = plots.dynamics_grid_figure(histories, "parameters/sweeps/demo.yaml", "digits", 0)
    assert len(fig.axes) == 4 and [ax.get_title() for ax in fig.axes[:2]] == ["lr 0.01", "lr 0.03"]
    assert _saved(figures) == ["06_dynamics_demo_digits_lr0.03_seed0.png", "06_dynamics_grid_demo_digits_seed0.png"]


def test_the_finetune_figure_has_a_line_per_run(figures):
    histories = {c: _histories([c]) for c in ("mha", "fc1")}
    config = SimpleNamespace(model="demo", dataset="digits", lr=0.03, seed=0, normalize="imagenet")
    fig = plots.finetune_figure(histories, config)
    assert [[line.get_label() for line in ax.get_lines()] for ax in fig.axes] == [["MHA", "FC1"]] * 2
    assert _saved(figures) == ["08_finetune_demo_digits_mha+fc1_lr0.03_seed0_imagenet.png"]


def _by_method():
    return pd.DataFrame(
        [
            {"component": c, "method": m, "mean": 60.0 + i + 5 * j, "trainable_parameters": 10 ** (i + 2)}
            for j, m in enumerate(("lora r=4", "weights"))
            for i, c in enumerate(("full", "mha", "fc1"))
        ]
    )


def test_grouped_bars_put_each_method_beside_the_others_in_plasticity_order():
    ax = plots.grouped_bars(_by_method())
    bars = _bars(ax)
    assert len(bars) == 6 and _ticks(ax) == ["MHA", "FC1", "All"]
    # the weights' bars first (whatever the table's order), then LoRA's, each over the components in
    # plasticity order, the two side by side
    assert [bar.get_height() for bar in bars] == [66.0, 67.0, 65.0, 61.0, 62.0, 60.0]
    centres = [bar.get_x() + bar.get_width() / 2 for bar in bars]
    assert centres == pytest.approx([-0.2, 0.8, 1.8, 0.2, 1.2, 2.2])
    assert [bar.get_hatch() for bar in bars] == [None] * 3 + ["//"] * 3
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["weights", "lora r=4"]
    assert ax.get_ylim()[0] == pytest.approx(50.0)


def test_the_lora_figures_name_their_models(figures):
    average = _by_method()
    fig = plots.lora_figure(average, ["demo"])
    assert len(_bars(fig.axes[0])) == 6 and len(fig.axes[1].texts) == 6
    assert [t.get_text() for t in fig.axes[1].get_legend().get_texts()] == ["weights", "lora r=4"]
    grid = pd.DataFrame(
        [
            {"component": c, "method": m, "lr": lr, "test_accuracy": 0.5}
            for m in ("lora r=4", "weights")
            for c in ("mha", "fc2")
            for lr in (0.01, 0.1)
        ]
    )
    fig = plots.lora_lr_figure(grid, ["demo"])
    assert [ax.get_title() for ax in fig.axes] == ["weights", "lora r=4"]
    assert [[line.get_label() for line in ax.get_lines()] for ax in fig.axes] == [["MHA", "FC2"]] * 2
    assert _saved(figures) == ["09_lora_by_plasticity_demo.png", "09_lora_by_plasticity_lr_demo.png"]


def test_the_run_figure_marks_the_best_checkpoint_and_is_named_by_the_run(figures):

    history = _histories(["fc1"]).assign(train_loss=lambda t: 2.0 - t["step"] / 10)
    config = Config(dataset="digits_c/snow", component="fc1", method="subset")
    metrics = {"best_step": 2, "best_val_accuracy": 0.5}
    fig = plots.run_figure(history, metrics, config)
    assert [len(ax.get_lines()) for ax in fig.axes] == [1, 1, 1]
    assert [tuple(point) for point in fig.axes[2].collections[0].get_offsets()] == [(2.0, 0.5)]
    assert "FC1 (equal capacity)" in fig._suptitle.get_text()
    assert _saved(figures) == ["05_finetune_demo_digits_c_snow_fc1_lr0.03_seed=0+equal.png"]


def test_the_gain_figure_has_a_bar_per_finetuned_configuration_and_names_the_spec(figures):
    average = pd.DataFrame(
        {"component": ["mha", "fc1", "linear", "probe"], "mean": [80.0, 70.0, 60.0, 50.0], "pooled_se": [1.0] * 4}
    )
    gain = pd.DataFrame({"mha": [10.0, 20.0], "fc1": [5.0, 5.0]})
    fig = plots.gain_figure(gain, average, "parameters/sweeps/finetune_demo.yaml", "test")
    assert [bar.get_height() for bar in _bars(fig.axes[0])] == [15.0, 5.0]
    assert _ticks(fig.axes[1]) == ["MHA", "FC1"] and [bar.get_height() for bar in _bars(fig.axes[1])] == [80.0, 70.0]
    assert _saved(figures) == ["07_finetune_results_finetune_demo_test.png"]
    without = plots.gain_figure(None, average, "x.yaml", "val")  # without a probe: a note where the gain would be
    assert not _bars(without.axes[0]) and "no linear probing" in without.axes[0].texts[0].get_text()


def test_the_robustness_figure_has_a_panel_per_dataset_and_hides_the_rest(figures):
    runs = pd.DataFrame(
        [
            {"dataset": d, "component": c, "test_accuracy": 0.5 + 0.1 * i, "status": "finished", "lr": 0.03, "seed": 0}
            for d in ("a", "b", "c", "d")
            for i, c in enumerate(("mha", "fc1", "full"))
        ]
    )
    fig = plots.robustness_figure(runs, "spec.yaml")
    visible = [ax for ax in fig.axes if ax.axison]
    assert [ax.get_title() for ax in visible] == ["a", "b", "c", "d"] and len(fig.axes) == 6
    assert _saved(figures) == ["07_robustness_spec.png"]


def test_the_accuracy_tau_figure_has_a_row_per_dataset_and_a_marker_set_per_source(figures):
    table = pd.DataFrame(
        {"dataset": "a", "component": ["mha", "fc1", "ln1"], "plasticity": [3.0, 2.0, 1.0], "mean": [70.0, 60.0, 50.0]}
    )
    taus = pd.DataFrame({"dataset": ["a", "b", "a"], "tau": [1.0, -0.5, 0.2], "source": ["ours", "ours", "paper"]})
    fig = plots.accuracy_tau_figure(table, taus, "demo", "spec.yaml", "val")
    assert [label.get_text() for label in fig.axes[1].get_yticklabels()] == ["a", "b"]
    assert [len(c.get_offsets()) for c in fig.axes[1].collections] == [2, 1]
    assert _saved(figures) == ["07_plasticity_vs_accuracy_spec_val.png"]


def test_the_precision_figure_draws_each_precisions_seed_mean_and_spread_per_dataset(figures):
    runs = pd.DataFrame(
        [
            {
                "dataset": d,
                "component": c,
                "precision": p,
                "lr": 0.03,
                "seed": s,
                "status": "finished",
                "test_accuracy": 0.4 + 0.1 * k + 0.2 * s + (0.05 if p == "autocast" else 0.0),
            }
            for d in ("b", "a")
            for k, c in enumerate(("ln1", "mha"))
            for p in ("autocast", "fp32")
            for s in (0, 1)
        ]
        + [
            {
                "dataset": "a",
                "component": "fc1",
                "precision": "fp32",
                "lr": 0.03,
                "seed": 0,
                "status": "partial",
                "test_accuracy": None,
            }
        ]
    )
    fig = plots.precision_figure(runs, "parameters/sweeps/precision_demo.yaml")
    assert [ax.get_title() for ax in fig.axes] == ["a", "b"] and _ticks(fig.axes[0]) == ["MHA", "LN1"]
    points = {}
    for container in fig.axes[0].containers:  # one errorbar per configuration and precision
        (x,), (y,) = container.lines[0].get_data()
        (segment,) = container.lines[2][0].get_segments()
        points[round(float(x), 2)] = (round(float(y), 6), round(float(segment[1][1] - segment[0][1]) / 2, 6))
    # MHA (k=1) at x=0, LN1 (k=0) at x=1; fp32, the reference, left of autocast; seeds 0.2 apart: std 10 points
    assert points == {-0.15: (60.0, 10.0), 0.15: (65.0, 10.0), 0.85: (50.0, 10.0), 1.15: (55.0, 10.0)}
    assert [text.get_text() for text in fig.axes[-1].get_legend().get_texts()] == ["fp32", "autocast"]
    assert _saved(figures) == ["11_precision_precision_demo_fp32.png"]


def test_the_equal_capacity_figure_draws_accuracy_against_plasticity_in_each_design(figures):
    columns = pd.MultiIndex.from_product([["ordinary", "equal capacity"], ["MHA", "LN1"]])
    accuracies = pd.DataFrame([[70.0, 50.0, 40.0, 60.0]], index=pd.Index(["a"], name="dataset"), columns=columns)
    plasticity = pd.DataFrame({"dataset": "a", "component": ["mha", "ln1"], "plasticity": [2.0, 1.0]})
    fig = plots.equal_capacity_figure(
        accuracies, plasticity, "demo", "parameters/sweeps/equal_capacity_demo.yaml", "val"
    )
    assert [ax.get_title() for ax in fig.axes] == ["demo: ordinary", "demo: equal capacity"]
    for ax, expected in zip(fig.axes, ([[1.0, -10.0], [2.0, 10.0]], [[1.0, 10.0], [2.0, -10.0]])):
        assert ax.collections[0].get_offsets().tolist() == expected  # P(f), accuracy minus the dataset's mean
    assert _saved(figures) == ["10_equal_capacity_demo_equal_capacity_demo_val.png"]
