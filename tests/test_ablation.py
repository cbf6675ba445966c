"""The authors' Adam ablation as their ``ablation.py`` reports it (seed 0, mean ± std over the learning rates, SGD
beside AdamW), on synthesised runs tables: its numbers against a test-side emulation of their arithmetic, what a
missing learning rate does, and its figure."""

import numpy as np
import pandas as pd
import pytest

from paperlib.analysis import tables
from paperlib.records.runs_table import RUN_COLUMNS
from paperlib.reports import plots

ADAM_DATASETS = ["cifar100", "cifar10c/motion_blur", "domainnet/clipart", "domainnet/sketch"]
SGD_LRS = {"cifar100": [0.001, 0.003, 0.01, 0.03], "cifar10c/motion_blur": [0.001, 0.003, 0.01, 0.03]}
SGD_LRS |= {"domainnet/clipart": [0.003, 0.01, 0.03, 0.06], "domainnet/sketch": [0.003, 0.01, 0.03, 0.06]}
ADAM_LRS = {dataset: [lr / 100 for lr in lrs] for dataset, lrs in SGD_LRS.items()}
SEEDS = [0, 42, 3407]
# their configurations by the names of their runs, and the order their table prints them (ablation.py)
THEIR_CONFIGURATIONS = {"all": "full", "attn_norm": "ln1", "mha": "mha", "ffn_norm": "ln2", "ffn_fc1": "fc1"}
THEIR_CONFIGURATIONS |= {"ffn_fc2": "fc2"}
THEIR_PRINT_ORDER = [0, 1, 3, 5, 4, 2]


pytestmark = pytest.mark.usefixtures("figures")  # each test's own figures folder, its figures closed after


def _runs(optimizer: str, grids: dict, seed: int = 0, configurations=tuple(THEIR_CONFIGURATIONS.values())):
    """A runs table (``runs_table``'s columns) of ``optimizer``: every dataset of ``grids`` x configuration x its
    learning rates x ``SEEDS``, test accuracies drawn at random (fractions); one run in seven diverged (it keeps a
    test accuracy, as a diverged run's best-validation checkpoint does)."""
    rng = np.random.default_rng(seed)
    rows = []
    for dataset, lrs in grids.items():
        for component in configurations:
            for lr in lrs:
                for run_seed in SEEDS:
                    rows.append(
                        {
                            "model": "vit_base_in21k",
                            "dataset": dataset,
                            "component": component,
                            "lr": lr,
                            "seed": run_seed,
                            "precision": "fp32",
                            "optimizer": optimizer,
                            "weight_decay": 0.0,
                            "method": "weights",
                            "normalize": "imagenet",
                            "tag": "",
                            "status": "diverged" if len(rows) % 7 == 3 else "finished",
                            "test_accuracy": float(rng.uniform(0.2, 0.95)),
                            "best_val_accuracy": float(rng.uniform(0.2, 0.95)),
                        }
                    )
    return pd.DataFrame(rows).reindex(columns=RUN_COLUMNS)


def _adam():
    return _runs("adamw", ADAM_LRS, seed=1)


def _sgd():
    """The main grid's SGD runs: the ablation's datasets, another (cifar10) and the linear configuration too."""
    grids = SGD_LRS | {"cifar10": [0.001, 0.003, 0.01, 0.03]}
    return _runs("sgd", grids, seed=2, configurations=(*THEIR_CONFIGURATIONS.values(), "linear"))


def _theirs(runs: pd.DataFrame, lrs: dict, seeds=(0,)):
    """Their ``table_results`` for one optimizer, written again here: per dataset and configuration a list of the test
    accuracies (fractions) over their learning rates and seeds, numpy's mean and std of it; then the mean over the
    datasets of those (unrounded) means and stds. Returns ({(dataset, configuration): (mean, std)}, {configuration:
    (mean, std)}) as they print them: times 100, ``np.round``-ed to one decimal."""
    data = runs.rename(columns={"test_accuracy": "test_acc", "component": "trainable_components"})
    acc_mean, acc_std = {}, {}
    for dataset_name in ADAM_DATASETS:
        acc_mean[dataset_name], acc_std[dataset_name] = {}, {}
        part = data[data["dataset"] == dataset_name]
        for i, trainable_component in enumerate(THEIR_CONFIGURATIONS.values()):
            values = []
            for lr in lrs[dataset_name]:
                for seed in seeds:
                    root_ind = (part["lr"] == lr) & (part["seed"] == seed)
                    root_ind &= part["trainable_components"] == trainable_component
                    values.append(np.asarray(part[root_ind]["test_acc"]))
            acc_mean[dataset_name][i] = np.asarray(values).mean()
            acc_std[dataset_name][i] = np.asarray(values).std()
    cells = {}
    for dataset_name in ADAM_DATASETS:
        for i in THEIR_PRINT_ORDER:
            configuration = list(THEIR_CONFIGURATIONS.values())[i]
            mean, std = acc_mean[dataset_name][i], acc_std[dataset_name][i]
            cells[dataset_name, configuration] = (np.round(mean * 100, 1), np.round(std * 100, 1))
    averages = {}
    for i, configuration in enumerate(THEIR_CONFIGURATIONS.values()):
        means = [acc_mean[dataset_name][i] for dataset_name in ADAM_DATASETS]
        stds = [acc_std[dataset_name][i] for dataset_name in ADAM_DATASETS]
        averages[configuration] = (np.round(np.mean(means) * 100, 1), np.round(np.mean(stds) * 100, 1))
    return cells, averages


def _numbers(numbers: pd.DataFrame, side: str) -> dict:
    part = numbers[numbers["side"] == side]
    return {(row.dataset, row.component): (row.mean, row.std) for row in part.itertuples()}


def test_the_ablation_is_their_arithmetic_seed_0_over_every_learning_rate():
    adam, sgd = _adam(), _sgd()
    numbers = tables.authors_ablation_numbers(adam, sgd)
    told_apart = []
    for side, runs, lrs in (("SGD", sgd, SGD_LRS), ("Adam", adam, ADAM_LRS)):
        cells, averages = _theirs(runs, lrs)
        expected = cells | {(tables.AVERAGE, c): value for c, value in averages.items()}
        assert _numbers(numbers, side) == expected, side
        # the data tells seed 0 from every seed, and their average from an average of the rounded cells
        assert _theirs(runs, lrs, seeds=SEEDS)[0] != cells
        for k in (0, 1):  # mean, std
            told_apart += [
                np.round(np.mean([cells[d, c][k] for d in ADAM_DATASETS]), 1) != averages[c][k] for c in averages
            ]
    assert any(told_apart), "the data does not test the average"
    part = numbers[numbers["dataset"] != tables.AVERAGE]
    assert (part["runs"] == 4).all() and (part["grid"] == 4).all()
    assert part["diverged"].sum() > 0  # diverged runs are counted in, as theirs read every run's evaluation
    assert list(numbers["dataset"].unique()) == [*ADAM_DATASETS, tables.AVERAGE]  # cifar10 (SGD alone) is left out
    assert set(numbers["component"]) == set(tables.ABLATION_ORDER)  # no linear


def test_the_printed_table_is_theirs_side_by_side_in_their_order():
    adam, sgd = _adam(), _sgd()
    table = tables.authors_ablation(adam, sgd)
    assert list(table.columns) == ["SGD", "Adam"]
    labels = ["All", "LN1", "LN2", "FC2", "FC1", "MHA"]  # their print order: all, attn_norm, ffn_norm, fc2, fc1, mha
    assert list(table.index) == [(d, label) for d in [*ADAM_DATASETS, tables.AVERAGE] for label in labels]
    cells, averages = _theirs(adam, ADAM_LRS)
    mean, std = cells["domainnet/sketch", "fc2"]
    assert table.loc[("domainnet/sketch", "FC2"), "Adam"] == f"{mean} ± {std}"  # as their f"{np.round(...)}"
    mean, std = averages["mha"]
    assert table.loc[(tables.AVERAGE, "MHA"), "Adam"] == f"{mean} ± {std}"
    alone = tables.authors_ablation(adam, None)
    assert list(alone.columns) == ["Adam"] and alone["Adam"].equals(table["Adam"])
    assert tables.authors_ablation(adam, sgd.iloc[:0]).columns.tolist() == ["Adam"]


def test_a_missing_learning_rate_is_never_averaged_over_fewer():
    adam, sgd = _adam(), _sgd()
    lost = (adam["dataset"] == "domainnet/sketch") & (adam["component"] == "fc1") & (adam["seed"] == 0)
    lost &= adam["lr"] == 1e-4
    unfinished = (adam["dataset"] == "cifar100") & (adam["component"] == "ln2") & (adam["seed"] == 0)
    unfinished &= adam["lr"] == 1e-5
    adam = adam[~lost].copy()
    adam.loc[unfinished, ["status", "test_accuracy"]] = ["partial", np.nan]
    numbers = tables.authors_ablation_numbers(adam, sgd).set_index(["side", "dataset", "component"])
    for cell in (("Adam", "domainnet/sketch", "fc1"), ("Adam", "cifar100", "ln2")):
        assert np.isnan(numbers.loc[cell, "mean"]) and np.isnan(numbers.loc[cell, "std"]), cell
        assert (numbers.loc[cell, "runs"], numbers.loc[cell, "grid"]) == (3, 4)
    for component in ("fc1", "ln2"):  # nor is the average of a configuration with such a cell
        assert np.isnan(numbers.loc[("Adam", tables.AVERAGE, component), "mean"])
    whole = _theirs(_adam(), ADAM_LRS)[0]
    assert numbers.loc[("Adam", "domainnet/sketch", "fc2"), ["mean", "std"]].tolist() == list(
        whole["domainnet/sketch", "fc2"]
    )
    table = tables.authors_ablation(adam, sgd)
    assert table.loc[("domainnet/sketch", "FC1"), "Adam"] == "3 of 4 lrs"
    assert table.loc[(tables.AVERAGE, "FC1"), "Adam"] == "3 of 4 datasets whole"
    assert "±" in table.loc[(tables.AVERAGE, "FC1"), "SGD"]


def test_a_learning_rate_no_run_has_yet_counts_through_the_missing_runs():
    adam = _adam()
    absent = adam[(adam["dataset"] == "cifar100") & (adam["lr"] == 3e-4)]
    adam = adam.drop(absent.index)  # no run of that learning rate at all: the runs alone cannot know it
    assert tables.authors_ablation_numbers(adam).query("dataset == 'cifar100'")["grid"].eq(3).all()
    missing = absent.assign(reason="no run")
    numbers = tables.authors_ablation_numbers(adam, missing=missing)
    cifar = numbers[numbers["dataset"] == "cifar100"]
    assert cifar["grid"].eq(4).all() and cifar["runs"].eq(3).all() and cifar["mean"].isna().all()
    assert numbers[numbers["dataset"] == tables.AVERAGE]["mean"].isna().all()


def test_a_dataset_one_side_lacks_says_so():
    adam, sgd = _adam(), _sgd()
    table = tables.authors_ablation(adam, sgd[sgd["dataset"] != "domainnet/sketch"])
    assert (table.loc["domainnet/sketch", "SGD"] == "no run").all()
    assert (table.loc[tables.AVERAGE, "SGD"] == "3 of 4 datasets whole").all()
    assert table.loc["domainnet/sketch", "Adam"].str.contains("±").all()


def test_bad_input_is_a_clear_error():
    adam, sgd = _adam(), _sgd()
    with pytest.raises(ValueError, match=r"no Adam run of seed 5; valid seeds .*: 0, 42, 3407"):
        tables.authors_ablation(adam, sgd, seed=5)
    with pytest.raises(ValueError, match="adam_runs holds runs of optimizer sgd; valid: adam_runs of optimizer adamw"):
        tables.authors_ablation(sgd, adam)
    with pytest.raises(ValueError, match="sgd_runs holds runs of optimizer adamw"):
        tables.authors_ablation(adam, adam)
    with pytest.raises(ValueError, match="lacks the column.*test_accuracy"):
        tables.authors_ablation(adam.drop(columns="test_accuracy"))
    with pytest.raises(ValueError, match="holds no run"):
        tables.authors_ablation(adam.iloc[:0])
    with pytest.raises(ValueError, match="one precision, got bf16, fp32"):
        tables.authors_ablation(pd.concat([adam, adam.assign(precision="bf16")]))
    with pytest.raises(ValueError, match="differ in model"):
        tables.authors_ablation(adam, sgd.assign(model="vit_large_in21k"))
    with pytest.raises(ValueError, match="whole number"):
        tables.authors_ablation(adam, sgd, seed="0")


def _histories(runs: pd.DataFrame) -> pd.DataFrame:
    """A history per run: 4 training steps with a gradient norm, validation at two of them."""
    rows = []
    for run in runs.itertuples():
        for step in range(4):
            rows.append(
                {
                    "step": step,
                    "grad_norm": 1.0 + step + run.lr,
                    "val_loss": 2.0 - step / 10 if step % 2 else np.nan,
                    "dataset": run.dataset,
                    "component": run.component,
                    "lr": run.lr,
                    "seed": run.seed,
                    "optimizer": run.optimizer,
                }
            )
    return pd.DataFrame(rows)


def test_the_figure_has_their_three_panels_and_boxes_of_seed_0(figures):
    adam, sgd = _adam(), _sgd()
    histories = _histories(adam[(adam["dataset"] == "domainnet/sketch") & (adam["seed"] == 0)])
    fig = plots.adam_ablation_figure(adam, sgd, histories, "parameters/sweeps/ablation_adam.yaml")
    boxes, grad, loss = fig.axes
    assert [label.get_text() for label in boxes.get_xticklabels()] == ["MHA", "FC1", "FC2", "LN2", "LN1"]
    assert len(boxes.patches) == 10  # a box per component and optimizer
    assert [text.get_text() for text in boxes.get_legend().get_texts()] == ["Adam", "SGD"]
    # the first box: MHA's Adam runs of seed 0 over the four learning rates, its quartiles
    mha = adam[(adam["dataset"] == "domainnet/sketch") & (adam["component"] == "mha") & (adam["seed"] == 0)]
    y = boxes.patches[0].get_path().vertices[:, 1]
    q1, q3 = np.percentile(100 * mha["test_accuracy"], [25, 75])
    assert (y.min(), y.max()) == pytest.approx((q1, q3))
    assert len(grad.get_lines()) == 5 and len(loss.get_lines()) == 5  # the five components at lr 1e-4, no full
    assert {tuple(line.get_ydata()) for line in grad.get_lines()} == {(1.0001, 2.0001, 3.0001, 4.0001)}
    assert sorted(path.name for path in figures.iterdir()) == [
        "07_adam_ablation_ablation_adam_domainnet_sketch_lr0.0001_seed0.png"
    ]
    alone = plots.adam_ablation_figure(adam, None, None, "ablation_adam.yaml")  # no histories: the boxes alone
    assert len(alone.axes) == 1 and len(alone.axes[0].patches) == 5
    with pytest.raises(ValueError, match="valid datasets .*: cifar100, cifar10c/motion_blur"):
        plots.adam_ablation_figure(adam, sgd, histories, "ablation_adam.yaml", dataset="pets")
