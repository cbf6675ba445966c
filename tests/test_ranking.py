"""Statistics of a plasticity ranking: agreement with the paper's, bootstrap uncertainty, order along
a scale curve."""

import numpy as np
import pandas as pd
import pytest
import torch

from paperlib.analysis import ranking
from paperlib.measure import component_rates
from paperlib.vit.components import COMPONENTS


def _one_pair(values):
    """A tidy table of one pair in one block, with these rates for the components in ``COMPONENTS`` order."""
    return pd.DataFrame({"block": 0, "depth": 0.0, "component": list(COMPONENTS), "pair": 0, "rate": values})


def test_paper_agreement_is_kendalls_tau():
    assert ranking.paper_agreement(_one_pair([5, 4, 3, 2, 1])) == pytest.approx(1.0)
    assert ranking.paper_agreement(_one_pair([1, 2, 3, 4, 5])) == pytest.approx(-1.0)
    # FC2 and LN2 swapped: 9 of the 10 pairs of components concordant, 1 discordant
    assert ranking.paper_agreement(_one_pair([5, 4, 2, 3, 1])) == pytest.approx(0.8)


def _synthetic_table(levels, n_pairs, blocks=3, noise=0.1, seed=0):
    """A tidy table whose rates are ``levels[component]`` plus independent noise."""
    rng = np.random.default_rng(seed)
    rows = [
        {"block": b, "depth": 50.0 * b, "component": c, "pair": p, "rate": levels[c] + noise * rng.standard_normal()}
        for b in range(blocks)
        for c in COMPONENTS
        for p in range(n_pairs)
    ]
    table = pd.DataFrame(rows)
    table["component"] = pd.Categorical(table["component"], categories=COMPONENTS)
    return table


def test_ranking_uncertainty_separated_and_tied_components():
    separated = _synthetic_table(dict(zip(COMPONENTS, [5.0, 4.0, 3.0, 2.0, 1.0])), n_pairs=200)
    sure = ranking.ranking_uncertainty(separated, n_resamples=500)
    assert list(sure.index) == ["MHA", "FC1", "FC2", "LN2", "LN1"] and (sure["rank stable"] == 1.0).all()
    assert sure.attrs["tau"] == pytest.approx((1.0, 1.0)) and sure.attrs["order stable"] == 1.0
    assert ((sure["low"] <= sure["plasticity"]) & (sure["plasticity"] <= sure["high"])).all()
    assert (sure["high"] - sure["low"]).max() < 0.05

    tied = _synthetic_table(dict.fromkeys(COMPONENTS, 1.0), n_pairs=200)
    unsure = ranking.ranking_uncertainty(tied, n_resamples=500)
    assert unsure["rank stable"].max() < 0.9 and unsure.attrs["order stable"] < 0.3
    low, high = unsure.attrs["tau"]
    assert high - low >= 0.6  # the order of tied components is anyone's guess


def test_ranking_uncertainty_is_reproducible_and_shrinks_with_pairs():
    levels = dict(zip(COMPONENTS, [1.0, 1.02, 1.04, 1.06, 1.08]))
    few = ranking.ranking_uncertainty(_synthetic_table(levels, 50), n_resamples=300, seed=3)
    again = ranking.ranking_uncertainty(_synthetic_table(levels, 50), n_resamples=300, seed=3)
    many = ranking.ranking_uncertainty(_synthetic_table(levels, 2000), n_resamples=300, seed=3)
    assert few.equals(again)
    assert ((many["high"] - many["low"]) < (few["high"] - few["low"]).reindex(many.index)).all()
    assert many["rank stable"].mean() > few["rank stable"].mean()


def test_pairs_without_rates_are_left_out_and_intervals_stay_finite():
    # a table made from the raw tensor still has the identical pairs' NaN rates (0/0)
    rates = 1 + torch.rand(3, 5, 6, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    rates[:, :, [1, 4]] = float("nan")
    raw = component_rates.to_table(rates)
    clean = component_rates.to_table(rates[:, :, [0, 2, 3, 5]], pair_ids=[0, 2, 3, 5])
    with pytest.warns(ranking.IdenticalPairsWarning, match="2 pairs without any rate"):
        uncertainty = ranking.ranking_uncertainty(raw, n_resamples=200)
    assert uncertainty[["plasticity", "low", "high"]].notna().all().all()
    assert not np.isnan(uncertainty.attrs["tau"]).any()
    pd.testing.assert_frame_equal(uncertainty, ranking.ranking_uncertainty(clean, n_resamples=200))
    with pytest.warns(ranking.IdenticalPairsWarning):
        assert ranking.paper_agreement(raw) == ranking.paper_agreement(clean)


def test_paper_order_from_finds_where_the_papers_ranking_holds_on():
    def curve(orders):
        rows = [(f, c, v) for f, values in orders.items() for c, v in zip(COMPONENTS, values)]
        return pd.DataFrame(rows, columns=["factor", "component", "plasticity"])

    paper, reverse = [5, 4, 3, 2, 1], [1, 2, 3, 4, 5]
    assert ranking.paper_order_from(curve({1: reverse, 2: paper, 4: paper})) == 2
    assert ranking.paper_order_from(curve({1: paper, 2: reverse, 4: paper})) == 4  # from, and on
    assert ranking.paper_order_from(curve({1: paper, 2: reverse})) is None
    assert ranking.paper_order_from(curve({4: paper, 1: paper})) == 1  # any order of rows
    ranked = ranking.scale_ranking(curve({2: paper, 1: [5, 4, 3, 2, 2], 4: reverse}))
    assert ranked["follows paper"].tolist() == [False, True, False]  # strict, by ascending factor
    assert ranked["order"].tolist()[1:] == ["MHA > FC1 > FC2 > LN2 > LN1", "LN1 > LN2 > FC2 > FC1 > MHA"]


def test_ranking_uncertainty_resamples_repeated_images_and_is_at_least_as_wide_as_the_pair_bootstrap():
    # 60 target images each in 5 pairs (a small test split cycled), each reference image in one: every image moves
    # its pairs' rates together, so the pairs of one image are not independent
    rng = np.random.default_rng(1)
    targets, references = np.tile(np.arange(60), 5), np.arange(300)
    image = rng.normal(0, 0.3, (60, 5))[targets]  # per pair and component
    levels = np.array([1.5, 1.4, 1.3, 0.6, 0.5])
    rates = levels + image + rng.normal(0, 0.05, (300, 5))
    table = pd.DataFrame(
        {"block": 0, "depth": 0.0, "component": np.tile(list(COMPONENTS), 300), "pair": np.repeat(range(300), 5)}
    ).assign(rate=rates.ravel())
    pairs = ranking.ranking_uncertainty(table, n_resamples=1000)
    images = ranking.ranking_uncertainty(table, n_resamples=1000, images=(references, targets))
    assert pairs.attrs["resampled"] == "pairs" and images.attrs["resampled"] == "target images"
    width = {name: (t["high"] - t["low"]) for name, t in (("pairs", pairs), ("images", images))}
    assert (width["images"] >= width["pairs"]).all()
    # a cluster of 5 nearly identical pairs: about sqrt(5) wider
    assert (width["images"] / width["pairs"]).to_numpy() == pytest.approx(np.sqrt(5), rel=0.25)
    # each target image always with the same reference image (the demo's cycled sets of one size): the pair repeats
    again = ranking.ranking_uncertainty(table, n_resamples=1000, images=(targets + 100, targets))
    assert again.attrs["resampled"] == "pairs of images"
    pd.testing.assert_frame_equal(again[["low", "high"]], images[["low", "high"]])  # the same clusters and draws
    # no image repeated: the pairs are resampled, the same draws as without images
    unique = ranking.ranking_uncertainty(table, n_resamples=1000, images=(references, references))
    pd.testing.assert_frame_equal(unique, pairs)


def test_clustered_weights_draw_each_sides_images_and_multiply():
    rng = np.random.default_rng(0)
    one = ranking.clustered_weights([np.array([0, 0, 1, 1, 2])], 400, rng)
    assert (one[:, 0] == one[:, 1]).all() and (one[:, 2] == one[:, 3]).all()  # one draw for each image's pairs
    assert set(np.unique(one[:, [0, 2, 4]].sum(axis=1))) == {3}  # 3 images drawn, with replacement
    two = ranking.clustered_weights([np.array([0, 0, 1]), np.array([0, 1, 1])], 400, np.random.default_rng(0))
    assert two.shape == (400, 3) and (two >= 0).all()
