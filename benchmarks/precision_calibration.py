"""How often ``analysis.precision_check``'s verdict says "differs", "same" or "inconclusive", in simulated worlds.

    python -m benchmarks.precision_calibration [--worlds 500]

A world is a precision check of the paper's grid at one learning rate, as ``precision_paper.yaml`` runs it:
every configuration of Table 6 but linear probing (whose Table 6 gives no spread), three seeds, in fp32 and
in another precision. Each run's test accuracy is Table 6's mean plus seed noise at Table 6's spread (its
numpy ``std`` over three seeds, times sqrt(3/2) for the population's), drawn independently in each precision:
a world with no precision effect at all. A planted effect lowers one configuration (or ``every`` one) by 2 points
on every dataset in the other precision. Divergence: a share of the runs of each precision diverges (its status,
its accuracy kept), 5% in both (no effect) or 30% in the other alone (an effect). The verdict should say
"differs" rarely without an effect (at most 10%) and often with one (at least 80%); ``tests/test_precision.py``
checks both on a few worlds, this on many, each share with its exact 95% interval (Clopper-Pearson).
Figures: docs/benchmarks.md ("The precision verdict, calibrated").
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from paperlib.records import cli, methods

ROOT = Path(__file__).resolve().parents[1]
PRECISION_PAPER = ["cifar100", "cifar10c/gaussian_noise", "flowers102", "pets"]
"""The datasets of ``parameters/sweeps/precision_paper.yaml``."""
SEEDS = [0, 42, 3407]


def table6() -> pd.DataFrame:
    """The paper's Table 6 without linear probing: dataset, component, mean, std (points)."""
    paper = pd.read_csv(ROOT / "parameters/paper/table6.csv", comment="#")
    return paper[paper["component"] != "probe"].reset_index(drop=True)


def world(
    datasets: list[str], rng, drop: str | None = None, points: float = 2.0, diverged=(0.0, 0.0), test_images=10000
):
    """A runs table (``runs_table.RUN_COLUMNS``) of ``datasets`` in fp32 and autocast, as above.

    ``drop``: the configuration that autocast lowers by ``points`` on every dataset (``every``: all of them; ``best``:
    each dataset's best configuration of Table 6, to ``points`` below its runner-up; None: no precision effect);
    ``diverged``: the share of fp32's and of autocast's runs that diverged; ``test_images``: each run's test set, or a
    dict of them by dataset (one image is worth 100 / ``test_images`` points, which raises a dataset's margin)."""
    from paperlib.records.runs_table import RUN_COLUMNS

    cells = table6()
    cells = cells[cells["dataset"].isin(datasets)]
    runs = cells.loc[cells.index.repeat(len(SEEDS))].reset_index(drop=True).assign(seed=SEEDS * len(cells))
    spread = runs["std"].to_numpy() * np.sqrt(1.5)
    parts = []
    for precision, share in zip(("fp32", "autocast"), diverged):
        accuracy = runs["mean"].to_numpy() + rng.normal(0.0, 1.0, len(runs)) * spread
        if precision == "autocast" and drop == "best":
            accuracy -= _below_runner_up(runs, points)
        elif precision == "autocast" and drop is not None:
            accuracy -= points * ((runs["component"] == drop).to_numpy() | (drop == "every"))
        status = np.where(rng.random(len(runs)) < share, "diverged", "finished")
        parts.append(
            runs[["dataset", "component", "seed"]].assign(
                precision=precision, test_accuracy=accuracy / 100, status=status
            )
        )
    setting = {"model": "vit_base_in21k", "lr": 0.01, "optimizer": "sgd", "weight_decay": 0.0, **methods.options()}
    setting |= {"normalize": "imagenet", "tag": ""}
    table = pd.concat(parts, ignore_index=True).assign(**setting, best_step=1)
    images = table["dataset"].map(test_images) if isinstance(test_images, dict) else test_images
    table = table.assign(test_images=images)
    return table.assign(best_val_accuracy=table["test_accuracy"]).reindex(columns=RUN_COLUMNS)


def _below_runner_up(runs: pd.DataFrame, points: float) -> np.ndarray:
    """Per run, what takes its dataset's best configuration (Table 6's means) to ``points`` below the runner-up."""
    means = runs.drop_duplicates(["dataset", "component"]).set_index(["dataset", "component"])["mean"]
    drop = {}
    for dataset, part in means.groupby(level="dataset"):
        ranked = part.sort_values(ascending=False)
        drop[ranked.index[0]] = ranked.iloc[0] - ranked.iloc[1] + points
    return np.array([drop.get((d, c), 0.0) for d, c in zip(runs["dataset"], runs["component"])])


def verdicts(
    datasets: list[str],
    worlds: int,
    drop: str | None = None,
    seed: int = 0,
    diverged=(0.0, 0.0),
    test_images=10000,
    points: float = 2.0,
):
    """How many of ``worlds`` seeded worlds (``world``) ``precision_check.effect``'s verdict calls each answer.

    Beside the answers, ``best differs``: the worlds where a Table 6 best configuration's own row says "differs", and
    ``best changed``: those where the two precisions' Table 6 picks another best configuration on some dataset
    (what comparing patterns would call a change)."""
    from paperlib.analysis import precision_check

    rng = np.random.default_rng(seed)
    said, best, changed = [], 0, 0
    for _ in range(worlds):
        effect = precision_check.effect(world(datasets, rng, drop, points, diverged, test_images))
        said.append(effect["verdicts"]["verdict"].iloc[0])
        rows = effect["conclusions"]
        best += bool((rows["conclusion"].str.startswith("Table 6's best") & (rows["verdict"] == "differs")).any())
        changed += bool((effect["best"]["fp32"] != effect["best"]["autocast"]).any())
    counts = pd.Series(said).value_counts().reindex(["differs", "same", "inconclusive"], fill_value=0)
    return pd.concat([counts, pd.Series({"best differs": best, "best changed": changed})])


SCENARIOS = {
    "no precision effect": {},
    "no precision effect, 40-image test sets": {"test_images": 40},
    "5% of runs diverged in both": {"diverged": (0.05, 0.05)},
    "mha 2 points lower": {"drop": "mha"},
    "fc1 2 points lower": {"drop": "fc1"},
    "ln1 2 points lower": {"drop": "ln1"},
    "full 2 points lower": {"drop": "full"},
    "every configuration 2 points lower": {"drop": "every"},
    "every configuration 2 points lower, 40-image test sets": {"drop": "every", "test_images": 40},
    "every best configuration 1 point below its runner-up": {"drop": "best", "points": 1.0},
    "30% of autocast's runs diverged": {"diverged": (0.0, 0.3)},
}
"""Each scenario's ``verdicts`` arguments: its planted drop, shares of diverged runs (fp32, autocast), test images."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.precision_calibration", description=__doc__, formatter_class=cli.Help
    )
    parser.add_argument("--worlds", type=int, default=500, help="worlds per scenario")
    parser.add_argument("--only", default=None, help="the scenarios whose name contains this text (default: all)")
    args = parser.parse_args(argv)
    every = sorted(table6()["dataset"].unique())
    print(f"Share of {args.worlds} worlds a scenario whose verdict says each answer, with its exact 95% interval")
    for name, datasets in (("precision_paper.yaml's 4 datasets", PRECISION_PAPER), ("all 11", every)):
        for what, scenario in SCENARIOS.items():
            if args.only and args.only not in what:
                continue
            counts = verdicts(datasets, args.worlds, **scenario)
            rates = ", ".join(f"{answer} {_share(n, args.worlds)}" for answer, n in counts.items())
            print(f"{name}, {what}: {rates}", flush=True)
    return 0


def _share(count: int, total: int) -> str:
    """``count`` of ``total`` as a percentage with its exact (Clopper-Pearson) 95% interval."""
    from scipy import stats

    low, high = stats.binomtest(int(count), total).proportion_ci(0.95)
    return f"{count / total:.1%} [{low:.1%}, {high:.1%}]"


if __name__ == "__main__":
    raise SystemExit(main())
