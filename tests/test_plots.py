"""The figures' summaries: the authors' boxes of per-block P(f) (Fig. 2 middle, Fig. 3 left) and band
around P(f) along depth (Fig. 3 middle), beside the package's richer views."""

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from matplotlib.collections import PolyCollection

from paperlib import plasticity, plots, ranking
from paperlib.components import COMPONENTS

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


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def test_layer_means_are_one_mean_per_block_and_component():
    table = _known_table()
    means = ranking.layer_means(table)
    assert len(means) == BLOCKS * len(COMPONENTS)
    fc1 = means[means["component"] == "fc1"]
    # FC1 (index 1) in block b: rates 1 + p + 4 (1 + 5 b), p = 0..3: their mean is 6.5 + 20 b
    assert fc1["plasticity"].tolist() == pytest.approx([6.5, 26.5, 46.5])
    assert fc1["depth"].tolist() == [0.0, 50.0, 100.0] and fc1["block"].tolist() == [0, 1, 2]
    # averaged over blocks: the P(f) of plasticity.ranking (mean over pairs and blocks)
    ranked = plasticity.ranking(table)
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
    by_block = plasticity.plasticity_by_block(table)
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
        measurement = plasticity.Measurement(dataset=dataset)
        metadata = {"model": "demo", "dataset": dataset, "reference": measurement.reference, "n_pairs": PAIRS}
        plasticity.save(table.assign(rate=table["rate"] + shift), measurement.folder(), metadata)
    # a random draw: not the paper's, left out by default as collect leaves it out
    drawn = plasticity.Measurement(sample="random", seed=2)
    plasticity.save(table, drawn.folder(), {"model": "demo", "dataset": "digits", "sample": "random", "seed": 2})

    layers = plasticity.collect(by_block=True)
    assert len(layers) == 2 * BLOCKS * len(COMPONENTS)
    assert set(layers["dataset"]) == {"digits", "digits_c/snow"} and set(layers["model"]) == {"demo"}
    snow = layers[(layers["dataset"] == "digits_c/snow") & (layers["component"] == "fc1")]
    assert snow["plasticity"].tolist() == pytest.approx([106.5, 126.5, 146.5])
    # averaged over blocks: collect's P(f)
    collected = plasticity.collect().set_index(["dataset", "component"])["plasticity"]
    averaged = layers.groupby(["dataset", "component"], observed=True)["plasticity"].mean()
    assert averaged.sort_index().to_numpy() == pytest.approx(collected.sort_index().to_numpy())
    random = plasticity.collect(sample="random", by_block=True)
    assert len(random) == BLOCKS * len(COMPONENTS) and random["seed"].tolist() == [2] * len(random)
    assert plasticity.collect(sample="random", seed=5, by_block=True).empty

    ax = plots.layer_mean_boxes(layers)
    assert len(ax.patches) == len(COMPONENTS)
