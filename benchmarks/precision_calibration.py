"""How often ``analysis.precision_check``'s verdict says "differs", "same" or "inconclusive", in simulated worlds.

    python -m benchmarks.precision_calibration [--worlds 500]

A world is a precision check of the paper's grid at one learning rate, as ``precision_paper.yaml`` runs it:
every configuration of Table 6 but linear probing (whose Table 6 gives no spread), three seeds, in fp32 and
in another precision. Each run's test accuracy is Table 6's mean plus seed noise at Table 6's spread (its
numpy ``std`` over three seeds, times sqrt(3/2) for the population's), drawn independently in each precision:
a world with no precision effect at all. A planted effect lowers one configuration by 2 points on every
dataset in the other precision. The verdict should say "differs" rarely without an effect (at most 10%) and
often with one (at least 80%); ``tests/test_precision.py`` checks both on a few worlds, this on many.
Figures: docs/benchmarks.md ("The precision verdict, calibrated").
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from paperlib.records import cli

ROOT = Path(__file__).resolve().parents[1]
PRECISION_PAPER = ["cifar100", "cifar10c/gaussian_noise", "flowers102", "pets"]
"""The datasets of ``parameters/sweeps/precision_paper.yaml``."""
SEEDS = [0, 42, 3407]


def table6() -> pd.DataFrame:
    """The paper's Table 6 without linear probing: dataset, component, mean, std (points)."""
    paper = pd.read_csv(ROOT / "parameters/paper/table6.csv", comment="#")
    return paper[paper["component"] != "probe"].reset_index(drop=True)


def world(datasets: list[str], rng: np.random.Generator, drop: str | None = None, points: float = 2.0):
    """A runs table (``runs_table.RUN_COLUMNS``) of ``datasets`` in fp32 and autocast, as above.

    ``drop``: the configuration that autocast lowers by ``points`` on every dataset (None: no precision effect)."""
    from paperlib.records.runs_table import RUN_COLUMNS

    cells = table6()
    cells = cells[cells["dataset"].isin(datasets)]
    runs = cells.loc[cells.index.repeat(len(SEEDS))].reset_index(drop=True).assign(seed=SEEDS * len(cells))
    spread = runs["std"].to_numpy() * np.sqrt(1.5)
    parts = []
    for precision in ("fp32", "autocast"):
        accuracy = runs["mean"].to_numpy() + rng.normal(0.0, 1.0, len(runs)) * spread
        if precision == "autocast" and drop is not None:
            accuracy -= points * (runs["component"] == drop).to_numpy()
        parts.append(runs[["dataset", "component", "seed"]].assign(precision=precision, test_accuracy=accuracy / 100))
    setting = {"model": "vit_base_in21k", "lr": 0.01, "optimizer": "sgd", "weight_decay": 0.0, "lora_rank": 0}
    setting |= {"lora_alpha": 0.0, "lora_dropout": 0.0, "normalize": "imagenet", "tag": "", "status": "finished"}
    table = pd.concat(parts, ignore_index=True).assign(**setting, best_step=1, test_images=10000)
    return table.assign(best_val_accuracy=table["test_accuracy"]).reindex(columns=RUN_COLUMNS)


def verdicts(datasets: list[str], worlds: int, drop: str | None = None, seed: int = 0) -> pd.Series:
    """How many of ``worlds`` seeded worlds (``world``) ``precision_check.effect``'s verdict calls each answer."""
    from paperlib.analysis import precision_check

    rng = np.random.default_rng(seed)
    said = [precision_check.effect(world(datasets, rng, drop))["verdicts"]["verdict"].iloc[0] for _ in range(worlds)]
    return pd.Series(said).value_counts().reindex(["differs", "same", "inconclusive"], fill_value=0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.precision_calibration", description=__doc__, formatter_class=cli.Help
    )
    parser.add_argument("--worlds", type=int, default=500, help="worlds per scenario")
    args = parser.parse_args(argv)
    every = sorted(table6()["dataset"].unique())
    for name, datasets in (("precision_paper.yaml's 4 datasets", PRECISION_PAPER), ("all 11", every)):
        for drop in (None, "mha", "fc1", "ln1", "full"):
            counts = verdicts(datasets, args.worlds, drop)
            what = "no precision effect" if drop is None else f"{drop} 2 points lower"
            rates = ", ".join(f"{answer} {n / args.worlds:.1%}" for answer, n in counts.items())
            print(f"{name}, {what}: {rates} ({args.worlds} worlds)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
