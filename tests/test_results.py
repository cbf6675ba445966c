"""Results tables and the paper's statistics on a synthetic results tree with known answers."""

import errno
import itertools
import json
import math
import shutil
import statistics
import tempfile
import warnings

import numpy as np
import pandas as pd
import pytest
from conftest import found
from scipy import stats as scipy_stats

from paperlib.analysis import component_tests, plasticity_table, precision_check, ranking, significance, summary, tables
from paperlib.records import paths, storage
from paperlib.records.runs import RECORD, TRAINING
from paperlib.records.runs_table import KEYS, for_spec, histories_of, load
from paperlib.train import finetune, pool
from paperlib.train.config import Config, expected
from paperlib.vit.components import COMPONENTS

DATASETS = [
    "digits",
    "digits_c/contrast",
    "digits_c/gaussian_noise",
    "digits_c/motion_blur",
    "digits_c/snow",
    "digits_c/speckle_noise",
]  # real names: a Config validates its dataset
GRID_COMPONENTS = ["mha", "fc1", "ln1", "linear"]
LRS = [0.01, 0.03]
SEEDS = [0, 1, 2]


def accuracy(dataset, component, lr, seed):
    """Test accuracy (fraction) of a synthetic run: component and lr matter, seeds jitter."""
    base = {"mha": 0.90, "fc1": 0.89, "ln1": 0.85, "linear": 0.70}[component] - 0.01 * DATASETS.index(dataset)
    return base + (0.02 if lr == 0.03 else 0.0) * (1 if component != "ln1" else -1) + 0.003 * seed


def val_accuracy(dataset, component, lr, seed):
    # validation prefers the other learning rate for ln1, so the two selections differ
    return accuracy(dataset, component, lr, seed) + (0.05 if (component == "ln1" and lr == 0.03) else 0.0)


def write_run(root, dataset, component, lr, seed, status="finished"):
    folder = root / "finetune" / "demo" / dataset / component / f"lr={lr:g}" / f"seed={seed}"
    folder.mkdir(parents=True)
    params = Config.defaults() | {
        "training": TRAINING,
        "record": RECORD,
        "model": "demo",
        "dataset": dataset,
        "component": component,
        "lr": lr,
        "seed": seed,
    }
    storage.write_json(folder / "params.json", params)
    if status == "partial":
        return
    test = accuracy(dataset, component, lr, seed) if status == "finished" else float("nan")
    val = val_accuracy(dataset, component, lr, seed) if status == "finished" else float("nan")
    exact = {"test_accuracy_exact": test - 0.01, "best_val_accuracy_exact": val - 0.01}  # another reading: 1 point
    history = pd.DataFrame({"step": [1, 2], "grad_norm": [1.0, 0.5], "val_loss": [None, 0.3]})
    written = storage.write_checked(folder / "history.csv", lambda tmp: history.to_csv(tmp, index=False))
    metrics = {"status": status, "test_accuracy": test, "best_val_accuracy": val, "best_step": 10} | exact
    storage.write_json(folder / "metrics.json", metrics | {"files": {"history.csv": written}})


@pytest.fixture
def tree(tmp_path):
    for dataset, component, lr, seed in itertools.product(DATASETS, GRID_COMPONENTS, LRS, SEEDS):
        write_run(tmp_path, dataset, component, lr, seed)
    write_run(tmp_path, "digits", "fc2", 0.01, 0, status="partial")
    write_run(tmp_path, "digits", "fc2", 0.03, 0, status="diverged")
    return tmp_path


def test_load_lists_every_run_including_partial_and_diverged(tree):
    runs = load(tree)
    histories = histories_of(runs)
    assert len(runs) == len(DATASETS) * len(GRID_COMPONENTS) * len(LRS) * len(SEEDS) + 2
    status = runs.set_index(["component", "lr"]).loc["fc2", "status"]
    assert sorted(status.tolist()) == ["diverged", "partial"]
    assert set(histories.columns) >= {"model", "dataset", "component", "lr", "seed", "step", "grad_norm"}
    assert len(histories) == 2 * (len(runs) - 1)  # the partial run has no history


def test_missing_runs_are_listed(tree, monkeypatch):
    monkeypatch.setenv("VIT_PLASTICITY_RESULTS", str(tree))
    spec = {
        "notebook": "notebooks/05_finetune.ipynb",
        "parameters": {"model": "demo"},
        "grid": {"dataset": ["digits"], "component": ["mha", "fc2", "ln2"], "lr": [0.01], "seed": [0]},
    }
    found, absent = for_spec(spec)
    # fc2 exists (partial): a run of the spec, not missing
    assert absent[["dataset", "component"]].values.tolist() == [["digits", "ln2"]]
    assert found.set_index("component").loc["fc2", "status"] == "partial"


def test_runs_in_another_precision_are_other_runs(tree, monkeypatch):
    folder = tree / "finetune" / "demo" / "digits" / "ln2" / "lr=0.01" / "seed=0+bf16"
    folder.mkdir(parents=True)
    storage.write_json(
        folder / "params.json",
        Config.defaults()
        | {"model": "demo", "dataset": "digits", "component": "ln2", "lr": 0.01, "seed": 0, "precision": "bf16"}
        | {"training": TRAINING, "record": RECORD},
    )
    runs = load(tree)
    assert runs.loc[runs["component"] == "ln2", "precision"].tolist() == ["bf16"]
    assert set(runs["precision"]) == {"fp32", "bf16"}
    spec = {
        "notebook": "notebooks/05_finetune.ipynb",
        "parameters": {"model": "demo"},
        "grid": {"dataset": ["digits"], "component": ["ln2"], "lr": [0.01], "seed": [0]},
    }
    monkeypatch.setenv("VIT_PLASTICITY_RESULTS", str(tree))
    assert for_spec(spec)[1][["component", "precision"]].values.tolist() == [["ln2", "fp32"]]
    spec["parameters"]["precision"] = "bf16"
    assert for_spec(spec)[1].empty


def test_table6_picks_the_best_learning_rate_per_dataset_and_config(tree):
    runs = load(tree)
    table = tables.table6(runs).set_index(["dataset", "component"])
    for dataset, component in itertools.product(DATASETS, GRID_COMPONENTS):
        means = {lr: statistics.mean(100 * accuracy(dataset, component, lr, s) for s in SEEDS) for lr in LRS}
        best = max(means, key=means.get)
        row = table.loc[(dataset, component)]
        assert row["lr"] == best and row["mean"] == pytest.approx(means[best])
        # Table 6's ±: numpy's np.std over the seeds (ddof=0), as the authors' code
        assert row["std"] == pytest.approx(
            statistics.pstdev(100 * accuracy(dataset, component, best, s) for s in SEEDS)
        )
        assert row["seeds"] == 3
    assert table.loc[("digits", "fc2"), "lr"] == 0.03 if ("digits", "fc2") in table.index else True
    by_val = tables.table6(runs, select="val").set_index(["dataset", "component"])
    assert by_val.loc[("digits", "ln1"), "lr"] == 0.03 and table.loc[("digits", "ln1"), "lr"] == 0.01
    with pytest.raises(ValueError, match="valid selections: test, val"):
        tables.table6(runs, select="train")


def test_diverged_learning_rate_is_never_chosen(tree):
    runs = load(tree)
    table = tables.table6(runs).set_index(["dataset", "component"])
    assert ("digits", "fc2") not in table.index  # its only finished-or-diverged lr diverged


def test_a_learning_rate_missing_seeds_is_not_chosen_and_models_are_never_pooled(tree):
    runs = load(tree)
    # mha's best lr is 0.03 over three seeds; with one seed left it would still win on its mean
    partial = runs[~((runs["component"] == "mha") & (runs["lr"] == 0.03) & (runs["seed"] > 0))]
    row = tables.table6(partial).set_index(["dataset", "component"]).loc[("digits", "mha")]
    assert row["lr"] == 0.01 and row["seeds"] == 3
    other = runs.assign(model="another")
    with pytest.raises(ValueError, match="needs the runs of one model, got another, demo"):
        tables.table6(pd.concat([runs, other]))
    with pytest.raises(ValueError, match="one precision"):
        tables.table6(pd.concat([runs, runs.assign(precision="bf16")]))


def test_table6_printed_as_the_paper_prints_it():
    table = pd.DataFrame(
        {
            "dataset": ["digits", "digits", "digits_c/contrast"],
            "component": ["mha", "fc1", "mha"],
            "lr": [0.01] * 3,
            "mean": [91.234, 90.0, 88.0],
            "std": [0.456, float("nan"), 1.0],
            "seeds": [3, 1, 2],
        }
    )
    text = tables.formatted(table)
    assert list(text.columns) == ["mha", "fc1"]
    assert (
        text.loc["digits", "mha"] == "91.23 ± 0.46 (3)"
        and text.loc["digits", "fc1"] == "90.00 (1)"
        and text.loc["digits_c/contrast", "mha"] == "88.00 ± 1.00 (2)"
    )


def test_table1_matches_scipy_and_the_definition():
    rows = []
    for i, dataset in enumerate(DATASETS):
        for component, offset in (
            ("mha", 0.0),
            ("fc1", 0.1 * (-1) ** i),
            ("fc2", 0.5 + 0.1 * i),
            ("ln2", 1.0 + 0.05 * i),
        ):
            rows.append({"dataset": dataset, "component": component, "accuracy": 90.0 - offset - i})
    accuracies = pd.DataFrame(rows)
    table = component_tests.table1(accuracies).set_index("component")
    assert list(table.index) == ["fc1", "fc2", "ln2"]
    mha = accuracies[accuracies.component == "mha"].set_index("dataset")["accuracy"]
    for component in ("fc1", "fc2", "ln2"):
        other = accuracies[accuracies.component == component].set_index("dataset")["accuracy"]
        assert table.loc[component, "decrease"] == pytest.approx((mha - other).mean())
        assert table.loc[component, "p_value"] == pytest.approx(
            scipy_stats.wilcoxon(mha, other.loc[mha.index], alternative="greater").pvalue
        )
    assert not table.loc["fc1", "significant"] and table.loc["fc2", "significant"] and table.loc["ln2", "significant"]


def test_table1_on_the_papers_table6():
    paper = pd.read_csv(paths.PARAMETERS / "paper" / "table6.csv", comment="#")
    assert len(paper) == 77 and set(paper["component"]) == {"mha", "fc1", "fc2", "ln2", "ln1", "full", "probe"}
    accuracies = paper.rename(columns={"mean": "accuracy"})
    table = component_tests.table1(accuracies).set_index("component")
    # The paper's Table 1: FC1 0.07 (not significant), FC2 0.44, LN1 0.8, LN2 0.9 (significant); by default
    # the authors' one-sided test (MHA better), whose p-values are half the two-sided ones here
    assert table.loc["fc1", "decrease"] == pytest.approx(0.07, abs=0.005) and not table.loc["fc1", "significant"]
    assert table.loc["fc2", "decrease"] == pytest.approx(0.44, abs=0.005) and table.loc["fc2", "significant"]
    assert table.loc[["ln1", "ln2"], "significant"].all()
    wide = tables.wide(accuracies)
    for component in ("fc1", "fc2", "ln2", "ln1"):
        one_sided = scipy_stats.wilcoxon(wide["mha"], wide[component], alternative="greater").pvalue
        assert table.loc[component, "p_value"] == pytest.approx(one_sided)
    two_sided = component_tests.table1(accuracies, alternative="two-sided").set_index("component")
    assert two_sided["p_value"].tolist() == pytest.approx((2 * table["p_value"]).clip(upper=1).tolist())
    # the same bold entries either way (the paper's pattern); only Holm's adjustment tells them apart
    assert two_sided["significant"].tolist() == table["significant"].tolist() == [False, True, True, True]
    assert table["significant_holm"].tolist() == [False, True, True, True]
    assert two_sided["significant_holm"].tolist() == [False, True, False, True]
    averages = paper.groupby("component")["mean"].mean()  # Table 6, last row (printed from unrounded entries)
    printed = {"fc1": 90.7, "fc2": 90.3, "full": 90.9, "probe": 64.2, "ln1": 89.8, "ln2": 89.9, "mha": 90.8}
    assert averages.to_dict() == pytest.approx(printed, abs=0.06)


def test_relative_gain_and_pooled_standard_error(tree):
    runs = load(tree)
    table = tables.table6(runs)
    gain = tables.relative_gain(table.rename(columns={"mean": "accuracy"}), baseline="linear")
    a = table.set_index(["dataset", "component"])["mean"]
    assert gain.loc["digits", "mha"] == pytest.approx(
        100 * (a[("digits", "mha")] - a[("digits", "linear")]) / a[("digits", "linear")]
    )
    assert "linear" not in gain.columns
    with pytest.raises(ValueError, match="with_probing"):  # the paper's baseline is linear probing
        tables.relative_gain(table, value="mean")
    probing = pd.DataFrame({"dataset": ["digits", "elsewhere"], "accuracy": [50.0, 60.0]})
    both = tables.with_probing(table, probing)
    assert both[both.component == "probe"]["dataset"].tolist() == ["digits"]  # the table's datasets only
    assert tables.wide(both, "mean").columns[-1] == "probe" and len(both) == len(table) + 1
    gain = tables.relative_gain(both, value="mean")
    assert gain.loc["digits", "mha"] == pytest.approx(100 * (a[("digits", "mha")] - 50.0) / 50.0)
    assert tables.with_probing(both, probing).equals(both)  # replaced, not added twice
    average = tables.average(table).set_index("component")
    part = table[table.component == "mha"]
    assert average.loc["mha", "mean"] == pytest.approx(part["mean"].mean())
    # the authors': the seeds' deviation pooled over the datasets, over sqrt(3) runs
    assert average.loc["mha", "pooled_se"] == pytest.approx(math.sqrt(np.mean(part["std"] ** 2)) / math.sqrt(3))
    of_average = tables.average(table, standard_error="of_average").set_index("component")
    expected_se = math.sqrt(sum(s**2 / 3 for s in part["std"])) / len(part)
    assert of_average.loc["mha", "pooled_se"] == pytest.approx(expected_se)
    one_seed = tables.table6(runs[runs["seed"] == 0])
    assert math.isnan(tables.average(one_seed).set_index("component").loc["mha", "pooled_se"])


def test_ensure_runs_each_spec_run_with_its_own_grid_parameters(tmp_path, monkeypatch, move_results):
    # a list of grids with their own steps (as the paper's spec has per dataset group), a grid key
    # (precision, optimizer) that is not a fixed parameter, notebook names (component,
    # compile) and a learning rate that YAML reads as a string
    move_results(".")
    started = []
    monkeypatch.setattr(
        finetune, "run", lambda config, progress=False: started.append(config) or {"status": "finished"}
    )
    spec = {
        "notebook": "notebooks/05_finetune.ipynb",
        "parameters": {
            "model": "demo",
            "batch_size": 8,
            "warmup": 1,
            "eval_every": 2,
            "compile": False,
            "device": "cpu",
        },
        "grid": [
            {
                "dataset": ["digits"],
                "component": ["ln2"],
                "lr": ["1e-2"],
                "seed": [0],
                "steps": [4],
                "precision": ["autocast", "bf16"],
            },
            {
                "dataset": ["digits_c/snow"],
                "component": ["mha"],
                "lr": [0.03],
                "seed": [1],
                "steps": [6],
                "optimizer": ["adamw"],
                "weight_decay": [0.05],
            },
        ],
    }
    pool.run_spec(spec, workers=1)  # here, where run is replaced
    # in the order of their expected cost, which depends on this CPU (bf16 emulated or not): compared as sorted
    assert sorted(
        (
            c.dataset,
            c.component,
            c.lr,
            c.seed,
            c.steps,
            c.step.precision,
            c.optimizer,
            c.weight_decay,
            c.batch_size,
            c.step.compile,
        )
        for c in started
    ) == [
        ("digits", "ln2", 0.01, 0, 4, "autocast", "sgd", 0.0, 8, False),
        ("digits", "ln2", 0.01, 0, 4, "bf16", "sgd", 0.0, 8, False),
        ("digits_c/snow", "mha", 0.03, 1, 6, "fp32", "adamw", 0.05, 8, False),
    ]
    assert expected(spec)[["precision", "optimizer", "weight_decay"]].values.tolist() == [
        ["autocast", "sgd", 0.0],
        ["bf16", "sgd", 0.0],
        ["fp32", "adamw", 0.05],
    ]


# --------------------------------------------------------------------------------------------
# beyond the paper: Takeaway 2 ("higher plasticity: better and more stable") as a test


def test_grid_spread_is_over_the_grid_every_configuration_shares(tree):
    runs = load(tree)
    spread = tables.grid_spread(runs, components=["mha", "fc1", "ln1"]).set_index(["dataset", "component"])
    values = [100 * accuracy("digits_c/contrast", "fc1", lr, seed) for lr in LRS for seed in SEEDS]
    row = spread.loc[("digits_c/contrast", "fc1")]
    assert row["std"] == pytest.approx(statistics.stdev(values))
    assert row["iqr"] == pytest.approx(
        statistics.quantiles(values, n=4, method="inclusive")[2]
        - statistics.quantiles(values, n=4, method="inclusive")[0]
    )
    assert row["range"] == pytest.approx(max(values) - min(values)) and row["median"] == pytest.approx(
        statistics.median(values)
    )
    assert (row["runs"], row["diverged"], row["cells"]) == (6, 0, 6)
    assert set(spread.index.get_level_values("component")) == {"mha", "fc1", "ln1"}
    # FC2 of digits has one run that diverged before any validation (no test accuracy) and one that did not
    # finish: no cell of digits has every configuration with a test accuracy
    with_fc2 = tables.grid_spread(runs[runs["dataset"] == "digits"], components=["mha", "fc2"]).set_index("component")
    assert with_fc2["cells"].tolist() == [0, 0] and with_fc2.loc["fc2", "diverged"] == 1
    assert with_fc2.loc["mha", "runs"] == 0
    with pytest.raises(ValueError, match="one model"):
        tables.grid_spread(pd.concat([runs, runs.assign(model="other")]))
    with pytest.raises(ValueError, match="valid choices: kept, cell, run"):
        tables.grid_spread(runs, diverged="dropped")


def test_a_diverged_run_counts_with_its_accuracy_as_the_authors_boxes_unless_asked_otherwise():
    rows = []
    for lr, seed in itertools.product([0.01, 0.1, 1.0], [0, 1]):
        rows.append(
            {
                "model": "m",
                "dataset": "d",
                "component": "mha",
                "lr": lr,
                "seed": seed,
                "status": "diverged" if lr == 1.0 else "finished",
                # a run that diverged keeps its best-validation checkpoint's accuracy
                "test_accuracy": {0.01: 0.80, 0.1: 0.90, 1.0: 0.10}[lr] + 0.001 * seed,
            }
        )
        rows.append(
            {
                "model": "m",
                "dataset": "d",
                "component": "ln1",
                "lr": lr,
                "seed": seed,
                "status": "finished",
                "test_accuracy": {0.01: 0.80, 0.1: 0.85, 1.0: 0.60}[lr] + 0.001 * seed,
            }
        )
    runs = pd.DataFrame(rows)
    kept = tables.grid_spread(runs, components=["mha", "ln1"]).set_index("component")
    assert kept["cells"].tolist() == [6, 6] and kept["runs"].tolist() == [6, 6] and kept.loc["mha", "diverged"] == 2
    mha = [80.0, 80.1, 90.0, 90.1, 10.0, 10.1]
    assert kept.loc["mha", "std"] == pytest.approx(statistics.stdev(mha))
    cell = tables.grid_spread(runs, components=["mha", "ln1"], diverged="cell").set_index("component")
    assert cell["runs"].tolist() == [4, 4]  # lr 1.0 left out for LN1 too
    assert cell.loc["ln1", "std"] == pytest.approx(statistics.stdev([80.0, 80.1, 85.0, 85.1]))
    run = tables.grid_spread(runs, components=["mha", "ln1"], diverged="run").set_index("component")
    assert run.loc["ln1", "runs"] == 6 and run.loc["mha", "runs"] == 4


def test_a_tie_between_learning_rates_keeps_the_smaller_as_the_authors_strict_comparison():
    rows = [
        {"model": "m", "dataset": "d", "component": "mha", "lr": lr, "seed": seed, "status": "finished"}
        | {"test_accuracy": accuracy, "best_val_accuracy": accuracy}
        for lr, accuracies in ((0.1, [0.8, 0.9]), (0.03, [0.9, 0.8]), (0.01, [0.7, 0.7]), (0.3, [0.85, 0.85]))
        for seed, accuracy in enumerate(accuracies)
    ]
    for order in (rows, rows[::-1]):
        assert tables.table6(pd.DataFrame(order))["lr"].tolist() == [0.03]
        assert tables.table6(pd.DataFrame(order), select="val")["lr"].tolist() == [0.03]


def _their_choice(accuracies: dict) -> tuple:
    """The authors' Table 6 loop: learning rates ascending, numpy means and deviations of fractions over seeds, a
    learning rate kept only when its mean is strictly greater than the kept one's (which starts at 0)."""
    best, kept = 0, (None, 0, 0)
    for lr in sorted(accuracies):
        values = np.asarray(accuracies[lr])
        if values.mean() > best:
            best, kept = values.mean(), (lr, values.mean() * 100, values.std() * 100)
    return kept


def test_table6_picks_as_the_authors_arithmetic_on_exact_ties():
    # accuracies of a 10,000-image test set over few distinct counts: ties in the mean are frequent, and a mean of
    # percentages can differ from 100 x a mean of fractions in its last bit, which is what decides a tie
    rng = np.random.default_rng(0)
    lrs, ties = [0.001, 0.003, 0.01, 0.03], 0
    for trial in range(300):
        accuracies = {lr: list(rng.choice([8123, 8124, 8125, 8127], 3) / 10_000) for lr in lrs}
        rows = [
            {"model": "m", "dataset": "d", "component": "mha", "lr": lr, "seed": seed, "status": "finished"}
            | {"test_accuracy": a, "best_val_accuracy": a}
            for lr in rng.permutation(lrs)
            for seed, a in enumerate(accuracies[lr])
        ]
        table = tables.table6(pd.DataFrame(rows)).iloc[0]
        lr, mean, std = _their_choice(accuracies)
        assert (table["lr"], table["mean"], table["std"]) == (lr, pytest.approx(mean, abs=1e-12), pytest.approx(std))
        means = sorted(np.mean(v) for v in accuracies.values())
        ties += means[-1] == means[-2]
    assert ties > 10  # the case that decides is there


def _plasticity(order_by_dataset):
    return pd.DataFrame(
        [
            {"model": "m", "dataset": d, "component": c, "plasticity": 10.0 - i}
            for d, order in order_by_dataset.items()
            for i, c in enumerate(order)
        ]
    )


def test_plasticity_correlation_is_kendalls_tau_per_dataset():
    components = ["mha", "fc1", "fc2", "ln2", "ln1"]
    plasticity = _plasticity({"same": components, "reversed": components, "one swap": components, "short": components})
    rows = []
    for i, c in enumerate(components + ["full", "linear"]):  # full and linear have no plasticity: left out
        rows += [
            {"dataset": "same", "component": c, "accuracy": 90.0 - i},
            {"dataset": "reversed", "component": c, "accuracy": 80.0 + i},
        ]
    swapped = dict(zip(components, [90.0, 91.0, 89.0, 88.0, 87.0]))  # FC1 above MHA: one discordant pair of ten
    rows += [{"dataset": "one swap", "component": c, "accuracy": a} for c, a in swapped.items()]
    rows += [{"dataset": "short", "component": c, "accuracy": 1.0} for c in ("mha", "fc1")]  # two components: no test
    table = component_tests.plasticity_correlation(plasticity, pd.DataFrame(rows)).set_index("dataset")
    assert list(table.index) == ["one swap", "reversed", "same"]
    assert table.loc["same", "tau"] == pytest.approx(1.0) and table.loc["reversed", "tau"] == pytest.approx(-1.0)
    assert table.loc["one swap", "tau"] == pytest.approx((9 - 1) / 10)
    assert table.loc["same", "p_value"] == pytest.approx(2 / 120)  # exact: 2 of the 5! orders are as extreme
    # orders with at most one discordant pair: 1 + 4
    assert table.loc["one swap", "p_value"] == pytest.approx(2 * 5 / 120)
    assert (table["components"] == 5).all()
    assert table.loc["one swap", "most_plastic"] == "mha" and table.loc["one swap", "highest"] == "fc1"
    with pytest.raises(ValueError, match="one model"):
        component_tests.plasticity_correlation(
            pd.concat([plasticity, plasticity.assign(model="n")]), pd.DataFrame(rows)
        )
    with pytest.raises(ValueError, match="no column 'std'.*accuracy"):
        component_tests.plasticity_correlation(plasticity, pd.DataFrame(rows), value="std")
    with pytest.raises(ValueError, match="more than one row for same/mha"):  # two settings' runs together
        component_tests.plasticity_correlation(plasticity, pd.concat([pd.DataFrame(rows), pd.DataFrame(rows[:1])]))


def test_plasticity_correlation_p_values_are_exact_with_ties():
    components = ["mha", "fc1", "fc2", "ln2", "ln1"]
    plasticity = _plasticity({"tied": components, "flat": components})
    tied = [5.0, 4.0, 4.0, 2.0, 1.0]  # FC1 and FC2 tie
    results_ = pd.DataFrame(
        [{"dataset": "tied", "component": c, "accuracy": a} for c, a in zip(components, tied)]
        + [{"dataset": "flat", "component": c, "accuracy": 3.0} for c in components]
    )
    table = component_tests.plasticity_correlation(plasticity, results_).set_index("dataset")

    def tau_b(x, y):  # by the definition: (concordant - discordant) / sqrt((pairs - ties in x) (pairs - ties in y))
        pairs = list(itertools.combinations(range(len(x)), 2))
        signs = [(x[i] - x[j]) * (y[i] - y[j]) for i, j in pairs]
        tx, ty = sum(x[i] == x[j] for i, j in pairs), sum(y[i] == y[j] for i, j in pairs)
        return (sum(s > 0 for s in signs) - sum(s < 0 for s in signs)) / math.sqrt(
            (len(pairs) - tx) * (len(pairs) - ty)
        )

    scores = [10.0, 9.0, 8.0, 7.0, 6.0]
    observed = tau_b(scores, tied)
    extreme = sum(abs(tau_b(scores, list(order))) >= abs(observed) - 1e-12 for order in itertools.permutations(tied))
    assert table.loc["tied", "tau"] == pytest.approx(observed)
    # every pairing of the accuracies with the plasticities
    assert table.loc["tied", "p_value"] == pytest.approx(extreme / 120)
    assert math.isnan(table.loc["flat", "tau"]) and math.isnan(table.loc["flat", "p_value"])
    summary = component_tests.correlation_summary(table.reset_index())
    assert (summary["datasets"], summary["undefined"]) == (1, 1)


def test_correlation_summary_tests_the_taus_against_zero():
    summary = component_tests.correlation_summary(pd.DataFrame({"tau": [1.0, 0.8, -0.2, 0.0]}))
    assert (summary["datasets"], summary["positive"], summary["negative"], summary["zero"]) == (4, 2, 1, 1)
    assert summary["mean"] == pytest.approx(0.4) and summary["median"] == pytest.approx(0.4)
    # zeros left out; |taus| ranked 1 (0.2), 2 (0.8), 3 (1.0): W- = 1; of the 8 sign patterns, 2 have W- <= 1
    assert summary["p_value"] == pytest.approx(2 * 2 / 8) and not summary["significant"]
    assert math.isnan(component_tests.correlation_summary(pd.DataFrame({"tau": [0.5, 0.0]}))["p_value"])


def test_on_the_papers_table6_accuracy_follows_the_papers_plasticity_ranking():
    paper = pd.read_csv(paths.PARAMETERS / "paper" / "table6.csv", comment="#")
    order = component_tests.paper_order(sorted(paper["dataset"].unique()))
    assert (
        len(order) == 55
        and order.groupby("dataset")["plasticity"].apply(list).map(lambda s: s == [5.0, 4.0, 3.0, 2.0, 1.0]).all()
    )
    table = component_tests.plasticity_correlation(order, paper.rename(columns={"mean": "accuracy"})).set_index(
        "dataset"
    )
    assert len(table) == 11
    # read off the CSV: motion blur's accuracies fall in the ranking's order exactly; Pets' LN2 and LN1 beat MHA
    assert table.loc["cifar10c/motion_blur", "tau"] == pytest.approx(1.0) and table.loc["pets", "tau"] < 0
    summary = component_tests.correlation_summary(table)
    assert (summary["positive"], summary["negative"], summary["zero"]) == (8, 1, 2)
    assert summary["significant"] and 0.3 < summary["mean"] < 0.45
    # Cifar10 and its five corruptions as one unit: six families, by their mean tau, and a sign test
    family = table.reset_index()["dataset"].str.replace(r"^cifar10c/.*", "cifar10", regex=True)
    by_family = table.reset_index().groupby(family)["tau"].mean()
    assert summary["families"] == 6 == len(by_family)
    assert (summary["family_positive"], summary["family_negative"]) == ((by_family > 0).sum(), (by_family < 0).sum())
    decided = summary["family_positive"] + summary["family_negative"]
    assert summary["family_p_value"] == pytest.approx(scipy_stats.binomtest(summary["family_positive"], decided).pvalue)


def test_early_gradient_norm_is_the_mean_over_the_first_part_of_each_finished_run():
    keys = {key: value for key, value in Config.defaults().items() if key in KEYS} | {
        "model": "m",
        "dataset": "digits",
        "lr": 0.01,
        "seed": 0,
    }
    rows = [
        keys | {"component": c, "step": step, "grad_norm": float(step * scale)}
        for c, scale in (("mha", 2.0), ("ln1", 1.0))
        for step in range(1, 11)
    ]
    rows += [keys | {"component": "fc1", "step": 4, "grad_norm": 7.0}]  # one logged step
    rows += [keys | {"component": "fc2", "step": step, "grad_norm": 1e3} for step in range(1, 4)]  # diverged at step 3
    runs = pd.DataFrame(
        [
            keys | {"component": c, "status": "diverged" if c == "fc2" else "finished"}
            for c in ("mha", "ln1", "fc1", "fc2")
        ]
    )
    norms = tables.early_gradient_norm(pd.DataFrame(rows), runs, 0.2).set_index("component")["grad_norm"]
    # steps 1 and 2 of 10; FC2 left out
    assert norms.to_dict() == pytest.approx({"mha": (2 + 4) / 2, "ln1": (1 + 2) / 2, "fc1": 7.0})
    assert tables.early_gradient_norm(pd.DataFrame(rows), runs, 1.0).set_index("component").loc[
        "ln1", "grad_norm"
    ] == pytest.approx(5.5)
    with pytest.raises(ValueError, match="fraction"):
        tables.early_gradient_norm(pd.DataFrame(rows), runs, 0)


def test_holm_adjusts_step_down_and_keeps_the_order():
    # sorted: 0.005 x 4 = 0.02, 0.01 x 3 = 0.03, 0.03 x 2 = 0.06, 0.04 x 1 = 0.04 -> 0.06 (never below the one before)
    assert significance.holm([0.01, 0.04, 0.03, 0.005]).tolist() == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert significance.holm([0.5, 0.9]).tolist() == [1.0, 1.0]  # capped
    adjusted = significance.holm([0.01, float("nan"), 0.02])
    # m = 2
    assert adjusted[0] == pytest.approx(0.02) and math.isnan(adjusted[1]) and adjusted[2] == pytest.approx(0.02)


def test_table1_and_pairwise_tests_with_holm_on_the_papers_table6():
    paper = pd.read_csv(paths.PARAMETERS / "paper" / "table6.csv", comment="#").rename(columns={"mean": "accuracy"})
    table = component_tests.table1(paper, alternative="two-sided").set_index("component")
    assert table["p_holm"].tolist() == pytest.approx(significance.holm(table["p_value"]).tolist())
    # two-sided, the paper's three significant decreases; LN2's p (0.042) x 2 is no longer below 5% once its four
    # tests are counted (one-sided, as the authors' code, it stays: 0.021 x 2)
    assert (
        table.loc[["fc2", "ln1"], "significant_holm"].all() and not table.loc[["fc1", "ln2"], "significant_holm"].any()
    )
    pairs = component_tests.pairwise(paper)
    assert len(pairs) == 10 and pairs[["first", "second"]].values.tolist()[:2] == [["mha", "fc1"], ["mha", "fc2"]]
    wide = tables.wide(paper)
    row = pairs.set_index(["first", "second"]).loc[("fc1", "fc2")]
    assert row["difference"] == pytest.approx((wide["fc1"] - wide["fc2"]).mean()) and row["wins"] == int(
        (wide["fc1"] > wide["fc2"]).sum()
    )
    # +0.18 on Cifar10 and -0.18 on DomainNet Sketch are a tie at the table's two decimals, not 0.18000000000000682
    # against 0.1799999999999926: scipy on the differences as printed, and the figures (0.00586, Holm 0.053)
    printed = (wide["fc1"] - wide["fc2"]).round(2)
    assert row["p_value"] == pytest.approx(scipy_stats.wilcoxon(printed).pvalue)
    assert row["p_value"] == pytest.approx(0.00586, abs=5e-6) and row["p_holm"] == pytest.approx(0.053, abs=5e-4)
    assert not row["significant_holm"]
    assert significance.wilcoxon_p(np.array([1e-15, -1e-15])) == 1.0  # float noise around 0 is 0
    assert pairs["p_holm"].tolist() == pytest.approx(significance.holm(pairs["p_value"]).tolist())
    assert component_tests.pairwise(paper, components=["mha", "full", "probe"])["first"].tolist() == [
        "mha",
        "mha",
        "full",
    ]
    with pytest.raises(ValueError, match="unknown configuration.*valid configurations: mha"):
        component_tests.pairwise(paper, components=["mha", "attn"])


@pytest.mark.parametrize("alternative", ["greater", "two-sided"])
def test_table1_and_pairwise_give_one_p_for_one_pair_on_unrounded_means(alternative):
    # Table 6 means of runs are not rounded; both tests read them at two decimals, so MHA's pairs agree: here MHA
    # leads every component by 0.004 on d0 (0 at two decimals: left out), then by -0.3, 0.5, 0.7... points
    lead = np.array([0.004, -0.3, 0.5, 0.7, 0.9, 1.1, 1.3, 1.5])
    base = np.round(np.random.default_rng(4).normal(80, 3, 8), 2)
    under = {"mha": 0.0, "fc1": 0.0, "fc2": 0.25, "ln2": 0.5, "ln1": 0.75}
    accuracies = pd.DataFrame(
        [
            {"dataset": f"d{i}", "component": c, "accuracy": base[i] - under[c] + (lead[i] if c == "mha" else 0.0)}
            for i in range(8)
            for c in COMPONENTS
        ]
    )
    unrounded = component_tests.pairwise(accuracies, alternative=alternative, decimals=None)
    one = component_tests.table1(accuracies, alternative=alternative).set_index("component")["p_value"]
    every = component_tests.pairwise(accuracies, alternative=alternative).set_index(["first", "second"])["p_value"]
    for component in COMPONENTS[1:]:
        assert every[("mha", component)] == one[component]
    assert unrounded.set_index(["first", "second"])["p_value"][("mha", "fc1")] != one["fc1"]  # d0 counts unrounded
    by_hand = (tables.wide(accuracies).round(2)["mha"] - tables.wide(accuracies).round(2)["fc2"]).to_numpy()
    assert one["fc2"] == pytest.approx(scipy_stats.wilcoxon(by_hand, alternative=alternative).pvalue)


def test_the_pairs_below_5_percent_are_named_with_their_test():
    paper = pd.read_csv(paths.PARAMETERS / "paper" / "table6.csv", comment="#").rename(columns={"mean": "accuracy"})
    # the figures: one-sided with Holm, four pairs; two-sided, MHA over LN1 alone
    one_sided = component_tests.below(component_tests.pairwise(paper, alternative="greater"), "greater")
    assert one_sided.startswith("Wilcoxon signed-rank, one-sided, Holm over the 10 pairs: 4 pairs below 5%")
    for named in ("MHA over LN1 (0.015)", "FC1 over FC2 (0.026)", "FC1 over LN1 (0.027)", "MHA over FC2 (0.034)"):
        assert named in one_sided
    two_sided = component_tests.below(component_tests.pairwise(paper), "two-sided")
    assert two_sided.endswith("two-sided, Holm over the 10 pairs: 1 pair below 5%: MHA over LN1 (0.029)")


def test_pairwise_printed_as_a_matrix():
    pairs = pd.DataFrame(
        {
            "first": ["mha", "mha", "fc1"],
            "second": ["fc1", "ln1", "ln1"],
            "difference": [0.071, 0.9346, 0.86],
            "p_holm": [1.0, 0.0293, 0.0547],
            "significant_holm": [False, True, False],
        }
    )
    matrix = component_tests.formatted_pairs(pairs)
    assert list(matrix.index) == ["mha", "fc1"] and list(matrix.columns) == ["fc1", "ln1"]
    assert (
        matrix.loc["mha", "ln1"] == "+0.93 (0.029)*"
        and matrix.loc["fc1", "ln1"] == "+0.86 (0.055)"
        and matrix.loc["fc1", "fc1"] == ""
    )


def test_no_common_dataset_is_no_test_and_a_finished_run_without_accuracy_is_no_cell():
    accuracies = pd.DataFrame(
        {
            "dataset": ["digits", "digits_c/contrast", "digits", "digits_c/contrast"],
            "component": ["mha", "mha", "fc1", "ln1"],
            "accuracy": [1.0, 2.0, 0.5, 1.5],
        }
    )
    pairs = component_tests.pairwise(accuracies).set_index(["first", "second"])
    assert pairs.loc[("fc1", "ln1"), "datasets"] == 0 and math.isnan(pairs.loc[("fc1", "ln1"), "p_value"])
    assert pairs["p_holm"].notna().sum() == 2  # Holm over the two pairs that have a test
    rows = [
        {
            "model": "m",
            "dataset": "d",
            "component": c,
            "lr": 0.1,
            "seed": seed,
            "status": "finished",
            "test_accuracy": float("nan") if (c, seed) == ("mha", 2) else 0.8 + 0.01 * seed,
        }
        for c in ("mha", "ln1")
        for seed in range(3)
    ]
    spread = tables.grid_spread(pd.DataFrame(rows), components=["mha", "ln1"]).set_index("component")
    assert spread["cells"].tolist() == [2, 2] and spread["runs"].tolist() == [2, 2]
    assert spread.loc["ln1", "std"] == pytest.approx(statistics.stdev([80.0, 81.0]))


def test_the_results_command_prints_notebook_07s_tables(tree, monkeypatch, capsys, tmp_path, move_results):
    move_results(".")  # the tree
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        "notebook: notebooks/05_finetune.ipynb\nname: '{dataset}/{component}/{lr}/{seed}'\nparameters:\n  model: demo\n"
        f"grid:\n  dataset: {DATASETS}\n  component: {GRID_COMPONENTS + ['fc2']}\n  lr: {LRS}\n  seed: {SEEDS}\n"
    )
    assert summary.main([str(spec), "--csv", str(tmp_path / "tables")]) == 0
    out = capsys.readouterr().out
    grid = len(DATASETS) * len(LRS) * len(SEEDS)
    # every run of the tree's configurations, and of FC2 a partial and a diverged run on a; the other FC2 runs missing
    assert (
        f"{grid * len(GRID_COMPONENTS) + 2} runs of" in out
        and f"{grid * len(GRID_COMPONENTS)} finished, 1 partial, 1 diverged; {grid - 2} missing" in out
    )
    assert "Table 6" in out and "p_holm" in out and "no P(f)" not in out
    written = {p.stem for p in (tmp_path / "tables").iterdir()}
    assert written == {"table6", "table1", "pairwise", "accuracy_tau", "spread_tau", "takeaway2"}
    takeaway = pd.read_csv(tmp_path / "tables" / "takeaway2.csv", index_col=0)
    assert takeaway["plasticity"].tolist() == ["paper", "paper"]  # nothing measured in this tree: the paper's ranking
    # the synthetic accuracies put MHA > FC1 > LN1 on every dataset, the paper's order: tau 1 on each
    tau = pd.read_csv(tmp_path / "tables" / "accuracy_tau.csv")
    assert len(tau) == len(DATASETS) and (tau["tau"] == 1.0).all()
    assert summary.main([str(tmp_path / "absent.yaml")]) == 2
    # the exact accuracies, one option away: every cell of Table 6 one point lower in this tree
    assert summary.main([str(spec), "--accuracy", "exact", "--csv", str(tmp_path / "exact")]) == 0
    authors, exact = (pd.read_csv(tmp_path / folder / "table6.csv") for folder in ("tables", "exact"))
    assert exact["lr"].tolist() == authors["lr"].tolist()
    assert (exact["mean"] - authors["mean"]).to_numpy() == pytest.approx(-1.0)
    with pytest.raises(SystemExit) as exit_:
        summary.main([str(spec), "--accuracy", "rounded"])
    assert exit_.value.code == 2
    assert "invalid choice: 'rounded' (choose from 'authors', 'exact')" in capsys.readouterr().err


def test_plasticity_for_reads_the_runs_models_saved_plasticity(tree, monkeypatch, move_results):
    from paperlib.measure import plasticity

    move_results(".")  # the tree
    runs = load(tree)
    # a saved P(f) of the runs' model on dataset a, in the reverse of the paper's order, and one of another model
    reverse = {"mha": 1.0, "fc1": 2.0, "fc2": 3.0, "ln2": 4.0, "ln1": 5.0}
    rates = pd.DataFrame(
        [{"block": 0, "depth": 0, "component": c, "pair": p, "rate": r} for c, r in reverse.items() for p in range(2)]
    )
    for model in ("demo", "vit_base_in21k"):
        plasticity_table.save(rates, plasticity.Measurement(model), found(rates))
    measured, source = component_tests.plasticity_for(runs)
    assert source == "measured" and set(measured["model"]) == {"demo"} and set(measured["dataset"]) == {"digits"}
    assert measured.set_index("component")["plasticity"].to_dict() == pytest.approx(reverse)
    tau = summary.summary(runs)["accuracy_tau"]
    # MHA > FC1 > LN1 in accuracy: the reverse
    assert tau["dataset"].tolist() == ["digits"] and tau["tau"].iloc[0] == pytest.approx(-1.0)
    with pytest.raises(ValueError, match="one model"):
        component_tests.plasticity_for(pd.concat([runs, runs.assign(model="other")]))


def test_pooled_order_and_paper_accuracy():
    rows = []
    for dataset, values in {"a": [5, 4, 3, 2, 1], "b": [1, 2, 3, 4, 9]}.items():  # b's LN1 is large
        rows += [
            {"model": "m", "dataset": dataset, "component": c, "plasticity": v} for c, v in zip(COMPONENTS, values)
        ]
    order = ranking.pooled_order(pd.DataFrame(rows)).set_index("model")
    # means: MHA 3, FC1 3, FC2 3, LN2 3, LN1 5 -> LN1 first, then the four ties
    assert order.loc["m", "order"].startswith("LN1 > ") and order.loc["m", "tau"] < 0
    same = pd.DataFrame(
        [{"model": "p", "dataset": "a", "component": c, "plasticity": 5 - i} for i, c in enumerate(COMPONENTS)]
    )
    row = ranking.pooled_order(same).iloc[0]
    assert row["order"] == "MHA > FC1 > FC2 > LN2 > LN1" and row["tau"] == pytest.approx(1.0)
    assert tables.paper_accuracy("cifar10", "mha") == 98.91 and tables.paper_accuracy("digits", "mha") is None
    assert tables.paper_accuracy("pets", "probe") == pytest.approx(88.33)


def tf32_twins(tmp_path, points: float = 1.0) -> None:
    """Beside each finished run of the tree under ``tmp_path``, its tf32 twin, ``points`` lower."""
    for metrics_file in list((tmp_path / "finetune").rglob("metrics.json")):
        metrics = json.loads(metrics_file.read_text())
        if metrics["status"] != "finished":
            continue
        twin = metrics_file.parent.with_name(metrics_file.parent.name + "+tf32")
        twin.mkdir()
        shutil.copy(metrics_file.parent / "history.csv", twin / "history.csv")  # the file its metrics record
        params = json.loads((metrics_file.parent / "params.json").read_text()) | {"precision": "tf32"}
        storage.write_json(twin / "params.json", params)
        test = metrics["test_accuracy"] - points / 100
        storage.write_json(twin / "metrics.json", metrics | {"test_accuracy": test})


def precision_spec(tmp_path):
    """A spec of the tree's grid in fp32 and tf32."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        "notebook: notebooks/05_finetune.ipynb\nname: '{dataset}/{component}/{lr}/{seed}/{precision}'\n"
        "parameters:\n  model: demo\n  device: cuda\n"  # tf32 is CUDA's; nothing runs here
        f"grid:\n  dataset: {DATASETS}\n  component: {GRID_COMPONENTS}\n  lr: {LRS}\n  seed: {SEEDS}\n"
        "  precision: [fp32, tf32]\n"
    )
    return spec


def test_the_results_command_of_a_precision_check_prints_its_fp32_tables_and_the_precisions_command(
    tree, capsys, tmp_path, move_results
):
    move_results(".")  # the tree, and its tf32 twins
    tf32_twins(tmp_path)
    spec = precision_spec(tmp_path)
    assert summary.main([str(spec), "--csv", str(tmp_path / "tables")]) == 0
    out = capsys.readouterr().out
    grid = len(DATASETS) * len(LRS) * len(SEEDS) * len(GRID_COMPONENTS)
    assert f"{grid} fp32 runs of" in out and "Table 6" in out
    assert f"python -m paperlib precision {spec}" in out
    table6 = pd.read_csv(tmp_path / "tables" / "table6.csv")  # the paper's tables of the fp32 runs
    assert len(table6) == len(DATASETS) * len(GRID_COMPONENTS)


def test_the_precision_command_prints_a_precisions_effect(tree, capsys, tmp_path, move_results):
    move_results(".")
    tf32_twins(tmp_path, points=1.0)
    spec = precision_spec(tmp_path)
    assert precision_check.main([str(spec), "--csv", str(tmp_path / "tables")]) == 0
    out = capsys.readouterr().out
    grid = len(DATASETS) * len(LRS) * len(SEEDS) * len(GRID_COMPONENTS)
    assert "Test accuracy difference from fp32" in out and "conclusions" in out
    overall = pd.read_csv(tmp_path / "tables" / "overall.csv")
    assert overall["precision"].tolist() == ["tf32"] and overall["pairs"].tolist() == [grid]
    assert overall["mean"].iloc[0] == pytest.approx(-1.0) and overall["verdict"].iloc[0] == "not shown"  # margin 0.5
    assert overall["datasets"].tolist() == [len(DATASETS)]
    assert precision_check.main([str(spec), "--margin", "2", "--csv", str(tmp_path / "wide")]) == 0
    assert pd.read_csv(tmp_path / "wide" / "overall.csv")["verdict"].tolist() == ["equivalent"]
    # a uniform 1-point loss keeps every pattern, and the overall level differs, at a 0.5 margin and at 2: a
    # difference the data show is never "same", whatever the margin
    level = "overall level (mean accuracy change, every configuration)"
    for folder in ("tables", "wide"):
        conclusions = pd.read_csv(tmp_path / folder / "conclusions.csv").set_index("conclusion")["verdict"]
        assert conclusions.pop(level) == "differs" and (conclusions == "same").all()
    assert pd.read_csv(tmp_path / "tables" / "verdicts.csv")["verdict"].tolist() == ["differs"]

    assert "pairs a cell" in out  # the power statement
    assert precision_check.main([str(tmp_path / "absent.yaml")]) == 2


def test_wilcoxon_p_is_scipys_p_value_with_ties_and_zeros():
    # the vectorised permutation test where scipy runs its own, scipy's test elsewhere: scipy's p-values, each
    rng = np.random.default_rng(0)
    routes = set()
    for trial in range(60):
        # n = 13 once: the largest permutation route, with ties (scipy takes 1.5 s a test there, 0.2 s at 10)
        n = 13 if trial == 1 else int(rng.choice([*range(2, 10), 14, 15]))
        values = rng.choice([-2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0], n) if trial % 2 else rng.normal(size=n).round(1)
        if not values.any():
            continue
        routes.add(n <= 13 and len(set(np.abs(values[values != 0]))) < n)  # ties or zeros: the permutation route
        for alternative in ("two-sided", "less", "greater"):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # scipy's note on ties at large n
                want = scipy_stats.wilcoxon(values, alternative=alternative).pvalue
            assert significance.wilcoxon_p(values, alternative) == pytest.approx(want, rel=1e-12), (values, alternative)
    assert routes == {True, False}


def test_stats_reads_runs_recorded_before_a_field_as_its_default_and_says_so(tree, capsys, tmp_path, move_results):
    move_results(".")  # the tree
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        "notebook: notebooks/05_finetune.ipynb\nname: '{dataset}/{component}/{lr}/{seed}'\nparameters:\n  model: demo\n"
        f"grid:\n  dataset: {DATASETS}\n  component: [mha]\n  lr: {LRS}\n  seed: {SEEDS}\n"
    )
    for file in (tree / "finetune").rglob("params.json"):  # as if written before Run had these two fields
        params = json.loads(file.read_text())
        del params["method"], params["subset_seed"]
        storage.write_json(file, params)
    runs = len(DATASETS) * len(LRS) * len(SEEDS)  # the spec's, each in its folder
    with pytest.warns(
        UserWarning,
        match=f"{runs} of these runs were written by an older version .*"
        r"\(read as their default\)",
    ):
        assert summary.main([str(spec)]) == 0
    said = capsys.readouterr()
    assert f"{runs} runs of {spec}: {runs} finished; 0 missing" in said.out


def test_stats_and_precision_on_a_fresh_results_root_say_so_in_one_line(capsys):
    (paths.results_dir() / "finetune").mkdir(parents=True)  # an empty finetune/ folder, as nothing there at all
    for main, spec in ((summary.main, "finetune_demo.yaml"), (precision_check.main, "precision_demo.yaml")):
        assert main([str(paths.ROOT / "parameters" / "sweeps" / spec)]) == 2
        said = capsys.readouterr()
        assert said.out == "" and said.err.count("\n") == 1 and f"no run of {paths.ROOT}" in said.err, said


@pytest.mark.parametrize("main", [summary.main, precision_check.main], ids=["stats", "precision"])
def test_csv_onto_a_file_existing_tables_or_a_read_only_folder_ends_in_one_line(
    main, tree, capsys, tmp_path, move_results, monkeypatch
):
    move_results(".")
    tf32_twins(tmp_path)
    spec = str(precision_spec(tmp_path))

    def refused(folder) -> str:
        assert main([spec, "--csv", str(folder)]) == 2
        out, err = capsys.readouterr()
        assert out == "" and len(err.strip().splitlines()) == 1 and err.startswith("error: "), err
        return err.strip()

    a_file = tmp_path / "tables.csv"
    a_file.write_text("mine\n")
    assert refused(a_file) == f"error: --csv takes a folder for the tables; {a_file} is a file"
    assert a_file.read_text() == "mine\n"
    folder = tmp_path / "tables"
    assert main([spec, "--csv", str(folder)]) == 0 and f"tables written to {folder}" in capsys.readouterr().out
    written = {path.name: path.read_bytes() for path in folder.iterdir()}
    (folder / next(iter(written))).write_bytes(b"edited")
    assert "pass --overwrite to replace them" in refused(folder)
    assert (folder / next(iter(written))).read_bytes() == b"edited"  # nothing replaced
    assert main([spec, "--csv", str(folder), "--overwrite"]) == 0
    assert {path.name: path.read_bytes() for path in folder.iterdir()} == written
    capsys.readouterr()
    # a read-only folder on a disk with little room left: read-only, as the disk says, not a full disk's guess
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage._replace(free=4096))
    read_only = tmp_path / "read-only"
    read_only.mkdir()

    def no_file_here(*args, dir=None, **kwargs):  # as root, chmod is no test
        raise OSError(errno.EROFS, "Read-only file system", str(dir))

    monkeypatch.setattr(tempfile, "mkstemp", no_file_here)
    assert refused(read_only) == f"error: cannot write in {read_only}: read-only file system"
    assert storage.FULL_DISK > 4096 and not list(read_only.iterdir())
