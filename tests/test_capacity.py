"""Plasticity or capacity: the analyses on tables whose answer is known, and on the paper's Table 6."""

import itertools

import numpy as np
import pandas as pd
import pytest
from scipy import stats as scipy_stats

from paperlib import capacity, components, models, stats

SHARE = {"mha": 0.33, "fc1": 0.33, "fc2": 0.329, "ln2": 0.0002, "ln1": 0.0002}  # ViT-Base's, rounded
DATASETS = [f"d{i}" for i in range(8)]
SEEDS = [0, 1, 2]


def test_parameter_share_counts_what_a_component_trains():
    model = models.architecture("demo")
    share = components.parameter_share(model)
    total = sum(p.numel() for p in model.parameters())
    d, depth = model.embed_dim, len(model.blocks)
    # by hand from the architecture: qkv and proj (4d² + 4d), fc1 (4d² + 4d), fc2 (4d² + d), a LayerNorm (2d)
    expected = {"mha": 4 * d * d + 4 * d, "fc1": 4 * d * d + 4 * d, "fc2": 4 * d * d + d, "ln2": 2 * d, "ln1": 2 * d}
    for component, per_block in expected.items():
        assert share[component] == pytest.approx(depth * per_block / total)
    assert capacity.capacity_groups(share) == [("mha", "fc1", "fc2"), ("ln2", "ln1")]
    assert capacity.capacity_groups(share, tolerance=0.001) == [("mha", "fc1"), ("ln2", "ln1")]  # FC2's bias is d


def _world(accuracy_from: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """P(f) in the demo ViT's order (LN1 > LN2 > FC1 > FC2 > MHA: against capacity), and per run an
    accuracy built from capacity alone or plasticity alone, plus dataset offsets and small noise."""
    rng = np.random.default_rng(0)
    plastic = {"ln1": 5.0, "ln2": 4.0, "fc1": 3.0, "fc2": 2.0, "mha": 1.0}
    plasticity = pd.DataFrame(
        [
            {"dataset": d, "component": c, "plasticity": p + 0.01 * i}
            for i, d in enumerate(DATASETS)
            for c, p in plastic.items()
        ]
    )
    source = SHARE if accuracy_from == "capacity" else plastic
    rows = [
        {
            "dataset": d,
            "seed": s,
            "component": c,
            "accuracy": 60 + 3 * i + 20 * source[c] / max(source.values()) + rng.normal(0, 0.01),
        }
        for i, d in enumerate(DATASETS)
        for s in SEEDS
        for c in plastic
    ]
    return plasticity, pd.DataFrame(rows)


@pytest.mark.parametrize("accuracy_from", ["capacity", "plasticity"])
def test_discordant_pairs_follow_what_the_accuracy_was_built_from(accuracy_from):
    plasticity, runs = _world(accuracy_from)
    pairs = capacity.discordant_pairs(plasticity, runs, SHARE)
    # the six pairs of a LayerNorm (more plastic) against a large component, over 8 datasets x 3 seeds each
    assert len(pairs) == 7 and set(pairs["more_plastic"][:-1]) == {"LN1", "LN2"}
    assert set(pairs["larger"][:-1]) == {"MHA", "FC1", "FC2"} and (pairs["cases"][:-1] == 24).all()
    followed = pairs[f"followed_{accuracy_from}"]
    assert (followed == pairs["cases"]).all() and (pairs["verdict"] == accuracy_from).all()
    assert pairs["p_value"].iloc[-1] == pytest.approx(scipy_stats.binomtest(0, 144).pvalue)
    # per dataset (Table 6's means) the same, over datasets only
    means = runs.groupby(["dataset", "component"], as_index=False)["accuracy"].mean()
    assert (capacity.discordant_pairs(plasticity, means, SHARE)["cases"][:-1] == 8).all()


def test_within_capacity_reads_plasticity_inside_groups_of_equal_size():
    plasticity, runs = _world("plasticity")
    means = runs.groupby(["dataset", "component"], as_index=False)["accuracy"].mean()
    per_dataset, pooled = capacity.within_capacity(plasticity, means, SHARE)
    assert set(per_dataset["group"]) == {"MHA / FC1 / FC2", "LN2 / LN1"} and (per_dataset["tau"] == 1).all()
    assert pooled.loc["all groups", "positive"] == 16 and pooled.loc["all groups", "significant"]
    plasticity, runs = _world("capacity")  # inside a group capacity is (nearly) flat: no plasticity signal built in
    means = runs.groupby(["dataset", "component"], as_index=False)["accuracy"].mean()
    per_dataset, _ = capacity.within_capacity(plasticity, means, SHARE)
    assert (per_dataset.loc[per_dataset["group"] == "MHA / FC1 / FC2", "tau"] < 1).all()


def test_within_capacity_on_the_papers_table6_equals_an_independent_count():
    paper = pd.read_csv(stats.PAPER_TABLE6, comment="#")
    share = components.parameter_share(models.architecture("vit_base_in21k"))
    order = stats.paper_order(sorted(paper["dataset"].unique()))
    per_dataset, pooled = capacity.within_capacity(order, paper.rename(columns={"mean": "accuracy"}), share)
    wide = paper.pivot(index="dataset", columns="component", values="mean")
    large = [scipy_stats.kendalltau([3, 2, 1], wide.loc[d, ["mha", "fc1", "fc2"]]).statistic for d in wide.index]
    small = np.sign(wide["ln2"] - wide["ln1"])  # the paper's LN2 > LN1, as a tau of two
    got = per_dataset.set_index(["group", "dataset"])["tau"]
    assert got["MHA / FC1 / FC2"].tolist() == pytest.approx(large) and got["LN2 / LN1"].tolist() == small.tolist()
    assert np.mean(large) == pytest.approx(0.4242, abs=1e-4) and sum(t > 0 for t in large) == 9
    assert (small > 0).sum() == 6 and len(small) == 11
    assert pooled.loc["MHA / FC1 / FC2", "p_value"] == pytest.approx(
        scipy_stats.wilcoxon([t for t in large if t != 0]).pvalue
    )
    assert capacity.discordant_pairs(order, paper.rename(columns={"mean": "accuracy"}), share).empty


def test_the_takeaway_2_test_takes_any_predictor():
    paper = pd.read_csv(stats.PAPER_TABLE6, comment="#").rename(columns={"mean": "accuracy"})
    share = components.parameter_share(models.architecture("vit_base_in21k"))
    table = capacity.predictor_table(share, sorted(paper["dataset"].unique()))
    by_capacity = stats.plasticity_correlation(table, paper, predictor="capacity")
    for dataset, row in by_capacity.set_index("dataset").iterrows():
        part = paper[(paper["dataset"] == dataset) & paper["component"].isin(list(share.index))].set_index("component")
        expected = scipy_stats.kendalltau(share[part.index], part["accuracy"]).statistic
        assert row["tau"] == pytest.approx(expected)
    assert list(itertools.islice(table["component"], 5)) == list(components.COMPONENTS)


def test_the_verdict_says_which_predictor_the_runs_followed():
    share = pd.Series(SHARE)
    reversed_plasticity = pd.Series({"mha": 0.1, "fc1": 0.4, "ln1": 2.4})
    followed_capacity = pd.Series({"mha": 0.54, "fc1": 0.55, "ln1": 0.47})
    table, said = capacity.verdict(reversed_plasticity, share, followed_capacity)
    assert list(table.index) == ["MHA", "FC1", "LN1"] and list(table.columns) == ["P(f)", "parameter share", "accuracy"]
    assert said.startswith(
        "plasticity and capacity disagree on 2 pair(s) of components: finetuning followed capacity in 2"
    )
    assert "here it followed capacity" in said
    _, said = capacity.verdict(reversed_plasticity, share, pd.Series({"mha": 0.4, "fc1": 0.45, "ln1": 0.6}))
    assert "here it followed plasticity" in said
    agreeing = pd.Series({"mha": 2.0, "fc1": 1.5, "ln1": 0.1})  # the paper's kind of model: nothing to tell apart
    _, said = capacity.verdict(agreeing, share, followed_capacity)
    assert said.startswith("plasticity and capacity order these components alike")


def test_one_model_of_a_spec_of_several():
    runs = pd.DataFrame({"model": ["a", "b", "a"]})
    assert stats.one_model(runs, "b") == "b" and stats.one_model(runs.iloc[[0, 2]]) == "a"
    for model in ("", "c"):
        with pytest.raises(ValueError, match="choose one model with -p model <name>; runs of: a, b"):
            stats.one_model(runs, model)
