"""precision.effect on synthetic runs tables in two precisions, where the answer is known."""

import itertools

import numpy as np
import pandas as pd
import pytest
from scipy import stats as scipy_stats

from paperlib import precision, stats
from paperlib.runs import RUN_COLUMNS

DATASETS = [f"set{i}" for i in range(6)]
GRID_COMPONENTS = ["mha", "fc1", "fc2", "ln2", "ln1", "full", "linear"]
LRS = [0.01, 0.03]
SEEDS = [0, 1, 2]
BASE = {"mha": 90.0, "fc1": 89.0, "fc2": 88.5, "ln2": 87.5, "ln1": 87.0, "full": 89.5, "linear": 70.0}


def accuracy(dataset, component, lr, seed):
    """Test accuracy (%) of a synthetic fp32 run: MHA best on every dataset, the larger learning rate
    better, and seed noise of ±0.2 points (mean 0 over the three seeds)."""
    index = DATASETS.index(dataset)
    return BASE[component] - index + (1.0 if lr == 0.03 else 0.0) + 0.2 * ((7 * seed + index) % 3 - 1)


def fp32_runs():
    rows = [
        {
            "model": "demo",
            "dataset": dataset,
            "component": component,
            "lr": lr,
            "seed": seed,
            "precision": "fp32",
            "optimizer": "sgd",
            "weight_decay": 0.0,
            "lora_rank": 0,
            "lora_alpha": 0.0,
            "lora_dropout": 0.0,
            "normalize": "imagenet",
            "tag": "",
            "status": "finished",
            "best_val_accuracy": accuracy(dataset, component, lr, seed) / 100,
            "best_step": 10,
            "test_accuracy": accuracy(dataset, component, lr, seed) / 100,
        }
        for dataset, component, lr, seed in itertools.product(DATASETS, GRID_COMPONENTS, LRS, SEEDS)
    ]
    return pd.DataFrame(rows, columns=RUN_COLUMNS)


def in_precision(runs, precision, points=0.0):
    """``runs`` as if trained in ``precision``, their test accuracy moved by ``points`` (a number or one per run)."""
    return runs.assign(precision=precision, test_accuracy=runs["test_accuracy"] + np.asarray(points) / 100)


def both(*others):
    return pd.concat([fp32_runs(), *others], ignore_index=True)


def at(runs, dataset, component, lr, seed):
    """The row of ``runs`` of one grid point, as a mask."""
    return (runs["dataset"] == dataset) & (runs["component"] == component) & (runs["lr"] == lr) & (runs["seed"] == seed)


def cell(differences, dataset, component, precision="autocast"):
    rows = differences[
        (differences["precision"] == precision)
        & (differences["dataset"] == dataset)
        & (differences["component"] == component)
    ]
    assert len(rows) == 1
    return rows.iloc[0]


def test_the_synthetic_fp32_runs_have_mha_best_and_every_table1_decrease_significant():
    table = stats.table6(fp32_runs())
    assert (stats.wide(table, "mean").idxmax(axis=1) == "mha").all()
    table1 = stats.table1(table.rename(columns={"mean": "accuracy"}))
    assert (table1["decrease"] > 0).all() and table1["significant"].all()


def test_identical_results_in_another_precision_are_equivalent_everywhere_with_the_same_conclusions():
    effect = precision.effect(both(in_precision(fp32_runs(), "autocast")))
    differences = effect["differences"]
    assert len(differences) == len(DATASETS) * len(GRID_COMPONENTS)
    assert (differences["pairs"] == len(LRS) * len(SEEDS)).all() and (differences["diverged"] == 0).all()
    assert (differences[["mean", "ci_low", "ci_high"]] == 0).all().all()
    assert (differences["p_equivalence"] == 0.0).all() and differences["equivalent"].all()
    overall = effect["overall"].set_index("precision").loc["autocast"]
    assert overall["mean"] == 0 and overall["equivalent"]
    assert overall["pairs"] == len(DATASETS) * len(GRID_COMPONENTS) * len(LRS) * len(SEEDS)
    conclusions = effect["conclusions"].set_index("precision").loc["autocast"]
    assert conclusions[["table1_same", "best_same", "table1_differs", "best_differs"]].tolist() == [True, True, "", ""]


def test_a_uniform_two_point_loss_is_not_equivalent_but_keeps_the_conclusions():
    effect = precision.effect(both(in_precision(fp32_runs(), "autocast", -2.0)))
    differences = effect["differences"]
    assert not differences["equivalent"].any()
    assert (differences["p_equivalence"] == 1.0).all()
    assert differences["mean"].to_numpy() == pytest.approx(-2.0, abs=1e-9)
    assert differences["ci_low"].to_numpy() == pytest.approx(-2.0, abs=1e-9)
    assert differences["ci_high"].to_numpy() == pytest.approx(-2.0, abs=1e-9)
    overall = effect["overall"].iloc[0]
    assert overall["mean"] == pytest.approx(-2.0, abs=1e-9) and not overall["equivalent"]
    assert effect["conclusions"][["table1_same", "best_same"]].values.tolist() == [[True, True]]
    table1 = effect["table1"].set_index(["precision", "component"])["decrease"]
    assert table1.loc["autocast"].to_numpy() == pytest.approx(table1.loc["fp32"].to_numpy())


def test_a_precision_that_makes_ln1_best_changes_the_conclusions():
    runs = fp32_runs()
    effect = precision.effect(both(in_precision(runs, "bf16", np.where(runs["component"] == "ln1", 10.0, 0.0))))
    conclusions = effect["conclusions"].set_index("precision").loc["bf16"]
    assert conclusions[["best_same", "table1_same", "table1_differs"]].tolist() == [False, False, "ln1"]
    assert conclusions["best_differs"].split(", ") == DATASETS
    assert (effect["best"]["fp32"] == "mha").all() and (effect["best"]["bf16"] == "ln1").all()
    assert list(effect["best"].columns) == ["fp32", "bf16"]
    assert set(effect["table1"]["precision"]) == {"fp32", "bf16"}
    differences = effect["differences"]
    assert differences.loc[differences["component"] == "ln1", "mean"].to_numpy() == pytest.approx(10.0)
    assert not differences.loc[differences["component"] == "ln1", "equivalent"].any()
    assert differences.loc[differences["component"] != "ln1", "equivalent"].all()


def test_a_precision_that_leaves_fc1_below_mha_on_fewer_datasets_changes_its_significance_only():
    runs = fp32_runs()
    # fc1 0.5 below MHA on set0-set3, 0.2 above on set4 and set5: still below on average, not significantly
    gain = np.where(runs["component"] == "fc1", np.where(runs["dataset"].isin(["set4", "set5"]), 1.2, 0.5), 0.0)
    effect = precision.effect(both(in_precision(runs, "tf32", gain)))
    table1 = effect["table1"].set_index(["precision", "component"])
    assert table1.loc[("tf32", "fc1"), "decrease"] > 0 and not table1.loc[("tf32", "fc1"), "significant"]
    assert table1.loc[("fp32", "fc1"), "significant"]
    conclusions = effect["conclusions"].set_index("precision").loc["tf32"]
    assert conclusions[["table1_same", "table1_differs", "best_same", "best_differs"]].tolist() == [
        False,
        "fc1",
        False,
        "set4, set5",
    ]


def test_small_noise_is_equivalent_at_half_a_point_and_not_at_a_hundredth():
    runs = fp32_runs()
    noisy = in_precision(runs, "autocast", np.random.default_rng(0).normal(0.0, 0.1, len(runs)))
    effect = precision.effect(both(noisy))
    assert effect["differences"]["equivalent"].all() and effect["overall"]["equivalent"].all()
    strict = precision.effect(both(noisy), margin=0.01)
    assert not strict["differences"]["equivalent"].any()
    differences = strict["differences"]
    inside = (differences["ci_low"] < differences["mean"]) & (differences["mean"] < differences["ci_high"])
    assert inside.all()


def test_p_equivalence_is_the_larger_of_the_two_one_sided_t_tests_on_the_paired_differences():
    runs = fp32_runs()
    noisy = in_precision(runs, "autocast", np.random.default_rng(1).normal(0.0, 0.3, len(runs)))
    row = cell(precision.effect(both(noisy))["differences"], "set2", "fc2")
    keys = ["lr", "seed"]
    mine = noisy[(noisy["dataset"] == "set2") & (noisy["component"] == "fc2")].set_index(keys)["test_accuracy"]
    theirs = runs[(runs["dataset"] == "set2") & (runs["component"] == "fc2")].set_index(keys)["test_accuracy"]
    d = ((mine - theirs.reindex(mine.index)) * 100).to_numpy()
    p_value = max(
        scipy_stats.ttest_1samp(d, -0.5, alternative="greater").pvalue,
        scipy_stats.ttest_1samp(d, 0.5, alternative="less").pvalue,
    )
    assert 0 < p_value < 1
    assert row["pairs"] == len(d) and row["mean"] == pytest.approx(d.mean())
    assert row["p_equivalence"] == pytest.approx(p_value, rel=1e-9)
    low, high = scipy_stats.t.interval(0.95, len(d) - 1, loc=d.mean(), scale=scipy_stats.sem(d))
    assert (row["ci_low"], row["ci_high"]) == pytest.approx((low, high), rel=1e-9)


def test_a_single_pair_has_no_interval_nor_equivalence():
    runs = fp32_runs()
    runs = runs[(runs["lr"] == 0.01) & (runs["seed"] == 0)]
    differences = precision.effect(pd.concat([runs, in_precision(runs, "autocast")]))["differences"]
    assert (differences["pairs"] == 1).all()
    assert differences[["ci_low", "ci_high", "p_equivalence"]].isna().all().all()
    assert not differences["equivalent"].any()


def test_table1_is_not_compared_on_a_single_dataset():
    runs = fp32_runs()
    runs = runs[runs["dataset"] == "set0"]
    effect = precision.effect(pd.concat([runs, in_precision(runs, "autocast")]))
    conclusions = effect["conclusions"].iloc[0]
    assert conclusions[["table1_same", "table1_differs", "best_same"]].tolist() == [None, None, True]
    assert effect["table1"].empty


def test_diverged_runs_are_counted_and_left_out_of_the_pairs():
    runs = fp32_runs()
    other = in_precision(runs, "autocast")
    other.loc[at(other, "set0", "mha", 0.01, 0), ["status", "test_accuracy"]] = ["diverged", 0.0]  # 0 would count
    other.loc[at(other, "set2", "ln2", 0.03, 1), "status"] = "partial"
    runs.loc[at(runs, "set1", "fc1", 0.03, 2), ["status", "test_accuracy"]] = ["diverged", np.nan]
    effect = precision.effect(pd.concat([runs, other], ignore_index=True))
    differences = effect["differences"]
    for dataset, component, diverged_pairs in (("set0", "mha", 1), ("set1", "fc1", 1), ("set2", "ln2", 0)):
        row = cell(differences, dataset, component)
        assert row["pairs"] == 5 and row["diverged"] == diverged_pairs and row["mean"] == 0 and row["equivalent"]
    assert differences["diverged"].sum() == 2 and differences["pairs"].sum() == len(runs) - 3
    overall = effect["overall"].iloc[0]
    assert overall["diverged"] == 2 and overall["pairs"] == len(runs) - 3 and overall["mean"] == 0


def test_formatted_precision_shows_the_interval_equivalence_and_divergences():
    runs = fp32_runs()
    other = in_precision(runs, "autocast")
    other.loc[(other["component"] == "fc1") & (other["seed"] == 0) & (other["lr"] == 0.01), "status"] = "diverged"
    text = precision.formatted(precision.effect(pd.concat([runs, other]))["differences"])
    assert list(text.columns) == GRID_COMPONENTS
    assert text.loc[("autocast", "set0"), "mha"] == "+0.00 [+0.00, +0.00] ="
    assert text.loc[("autocast", "set0"), "fc1"] == "+0.00 [+0.00, +0.00] = (1 diverged)"


def test_runs_in_a_single_precision_are_refused_naming_the_precisions_found():
    with pytest.raises(ValueError, match="found: fp32"):
        precision.effect(fp32_runs())
    with pytest.raises(ValueError, match="'fp32'.*found: autocast"):
        precision.effect(in_precision(fp32_runs(), "autocast"))


def test_runs_of_two_models_are_refused_naming_the_model_key():
    other = in_precision(fp32_runs(), "autocast")
    other.loc[other["dataset"] == "set0", "model"] = "other"
    with pytest.raises(ValueError, match="one model, got demo, other"):
        precision.effect(both(other))


def test_an_unknown_selection_is_refused():
    with pytest.raises(ValueError, match="unknown selection 'best'"):
        precision.effect(both(in_precision(fp32_runs(), "autocast")), select="best")
