"""The paper's finetuning grid at its real size, without training: its results tree, and its analysis timed on it.

    python -m benchmarks.grid build    # results-grid/: the 924 runs of finetune_paper.yaml and P(f) (minutes, once)
    python -m benchmarks.grid time     # stats, sweep --plan, notebooks 06 and 07 on it: wall time and peak memory

``build`` writes every run of ``parameters/sweeps/finetune_paper.yaml`` through the package's own writers
(``runs.start``, then ``checkpoints.record``: ``params.json``, ``history.csv``, ``metrics.json``), each history
at its real length (a row per step: about 10 million rows), seeded: the same tree on every machine. Its runs look
like real ones: test accuracies drawn around the paper's Table 6 (``parameters/paper/table6.csv``, its
transcription), best validation steps spread over training, gradient norms per configuration and learning rate as
§5.2 and appendix D.2 describe them (``history``), trainable parameters counted on ViT-Base per configuration and
head (``trainable_counts``). Beside them, the P(f) a lab
that measured the paper's plasticity has (``build_plasticity``: 12,800 pairs on each of the grid's datasets).
``time`` runs each analysis command as a user would, in its own process under ``/usr/bin/time -v``, with that
tree as the results root (``VIT_PLASTICITY_RESULTS``), and prints its wall time and peak memory (maximum
resident set).
Figures: docs/benchmarks.md ("The paper's grid at its real size").
"""

from __future__ import annotations

import argparse
import math
import os
import re
import subprocess
import sys
import tempfile
import zlib
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from paperlib.analysis import plasticity_table
from paperlib.data.corruptions import CORRUPTIONS
from paperlib.measure import component_rates, plasticity
from paperlib.records import cli, readings, runs, specs
from paperlib.records.names import CONFIGURATIONS
from paperlib.train import checkpoints, evaluation, finetune
from paperlib.train.config import configs
from paperlib.vit import components, models

ROOT = Path(__file__).resolve().parents[1]
SPEC = "parameters/sweeps/finetune_paper.yaml"
NOTEBOOK_06 = ["-p", "spec", SPEC, "-p", "dataset", "domainnet/sketch", "-p", "lr", "0.01"]
NOTEBOOK_06 += ["-p", "compute_missing", "False"]
NOTEBOOK_07 = ["-p", "spec", SPEC, "-p", "compute_missing", "False"]
"""The README's paper-scale options of notebooks 06 and 07."""


NUM_CLASSES = {"cifar10": 10, "cifar10c": 10, "cifar100": 100, "domainnet": 345, "flowers102": 102, "pets": 37}
"""The classes of each of the grid's datasets (the head a run trains), by the name before its ``/``."""

GRADIENT_LEVELS = {"full": 3.0, "mha": 1.6, "fc1": 1.25, "fc2": 1.0, "ln2": 0.45, "ln1": 0.36, "linear": 0.25}
"""Each configuration's gradient-norm scale: the plasticity order of §5.2 (Fig. 4 middle: "the higher plasticity, the
larger gradient norms"), full finetuning, which trains every weight, above all. The paper draws no linear head."""

EASY = {"flowers102": 0.5, "pets": 0.5}
"""Gradient norms lower for every component where linear probing already does well (Figs. 46 and 49)."""


def num_classes(dataset: str) -> int:
    """The classes of one of the grid's datasets (``NUM_CLASSES``)."""
    return NUM_CLASSES[dataset.split("/")[0]]


def trainable_counts(model: str, datasets) -> dict:
    """(dataset, configuration) -> the parameters a run of it trains, counted on ``model``'s architecture.

    ``components.trained_parameters``: the configuration in every block, the final norm and a head of the dataset's
    classes, as ``finetune`` counts them."""
    counts = {}
    for dataset in datasets:
        architecture = models.architecture(model, num_classes=num_classes(dataset))
        counts |= {(dataset, c): components.trained_parameters(architecture, c) for c in CONFIGURATIONS}
    return counts


def accuracy(config, paper: pd.DataFrame, rng: np.random.Generator) -> float:
    """A test accuracy around the paper's Table 6 (appendix D.2): its mean at the best learning rate, its seed spread.

    The best learning rate is 0.01, 0.03 for the LayerNorms, which lose more away from it (appendix D.2: "lower
    gradient norms and a less steep descent for the LayerNorms, which is aggravated for low learning rates")."""
    mean, std = paper.loc[(config.dataset, config.component if config.component != "linear" else "probe")]
    std = 0.3 if math.isnan(std) else max(std, 0.05)
    layernorm = config.component in ("ln1", "ln2")
    lr_cost = abs(math.log10(config.lr / (0.03 if layernorm else 0.01))) * (3.0 if layernorm else 1.5)
    return min(99.99, mean - lr_cost + rng.normal(0, std)) / 100


def build(root: Path, **only) -> int:
    """Write the paper grid's runs under ``root`` (a run already recorded there is kept); the runs written.

    ``only``: the runs of these values alone (``specs.restrict``: a test's part of the grid). Each run's numbers are
    drawn from its own seeded generator (``run_rng``): the same tree on every machine, whatever part is written."""
    os.environ["VIT_PLASTICITY_RESULTS"] = str(root)
    paper = pd.read_csv(ROOT / "parameters/paper/table6.csv", comment="#").set_index(["dataset", "component"])
    spec = specs.load_spec(ROOT / SPEC)
    spec = specs.restrict(spec, **only) if only else spec
    todo = [config for config in configs(spec) if not runs.is_finished(config)]
    counts = trainable_counts(spec["parameters"]["model"], {config.dataset for config in todo})
    for config in todo:
        rng = run_rng(config)
        test = accuracy(config, paper, rng)
        runs.start(config.folder(), runs.run_record(config))
        rows, best = history(config, test, rng)
        seen = outcomes(config, rows, test, rng)
        exact = rng.uniform(-5e-4, 5e-4)  # the exact test accuracy beside the per-batch mean
        metrics = {
            "status": "finished",
            "diverged_step": None,
            "best_val_accuracy": best["val_accuracy"],
            "best_val_accuracy_exact": best["val_accuracy"] + exact,
            "best_step": best["step"],
            "test_accuracy": test,
            "test_accuracy_exact": test + exact,
            "test_loss": 1 - test,
            "trainable_parameters": counts[config.dataset, config.component],
            "micro_batch": config.batch_size,
            "num_classes": num_classes(config.dataset),
            "wall_seconds": round(config.steps * 1.3, 2),
            "images_per_second": 400.0 + round(100 * rng.random(), 1),
            "device": "NVIDIA H100 80GB HBM3",
            "precision": config.step.precision,
        }
        checkpoints.record(config.folder(), rows, seen, (None, best["step"]), metrics)
    return len(todo)


SPLIT_IMAGES = {"cifar10": (10_000, 10_000), "cifar100": (10_000, 10_000), "flowers102": (1_020, 6_149)}
SPLIT_IMAGES |= {"pets": (736, 3_669), "domainnet/clipart": (7_701, 9_626), "domainnet/sketch": (11_262, 14_077)}
SPLIT_IMAGES |= {f"cifar10c/{name}": (1_600, 2_000) for name in CORRUPTIONS}
"""(validation, test) images of each dataset of the grid: docs/fidelity.md's sizes; DomainNet's domains (48,129 and
70,386 images) cut 80/20 into train and test, the train 80/20 into train and validation, as the package reads them."""


def outcomes(config, rows: list[dict], test: float, rng: np.random.Generator) -> readings.Outcomes:
    """What a run of ``config`` saw (``readings.Outcomes``), drawn.

    At each validation of ``rows``, each validation image is right with the probability of its accuracy there, each
    test image with ``test``'s."""
    n_val, n_test = SPLIT_IMAGES[config.dataset]
    validations = [row for row in rows if evaluation.evaluates(row["step"], config)]
    accuracy = np.array([row["val_accuracy"] for row in validations])
    return readings.Outcomes(
        steps=np.array([row["step"] for row in validations]),
        val=rng.random((len(validations), n_val)) < accuracy[:, None],
        test=rng.random((len(validations), n_test)) < test,
        val_loss=np.array([row["val_loss"] for row in validations]),
        test_loss=np.full(len(validations), 1 - test),
        nan_model=np.zeros(len(validations), bool),
    )


def record_sizes(root: Path) -> pd.DataFrame:
    """What a run's per-image records cost, per dataset of the grid.

    The validations of a run, the size of its ``readings.OUTCOMES`` (one run, written by ``outcomes`` at an accuracy
    of 0.9 into ``root``), and the forward passes the test at every validation adds, against those of its training
    steps (a training image taken as 3 forward passes: forward and backward)."""
    spec = specs.load_spec(ROOT / SPEC)
    rows = []
    for dataset in SPLIT_IMAGES:
        config = next(c for c in configs(specs.restrict(spec, dataset=[dataset], component=["mha"])))
        steps = [{"step": step, "val_accuracy": 0.9, "val_loss": 0.3} for step in range(1, config.steps + 1)]
        seen = outcomes(config, steps, 0.9, np.random.default_rng(0))
        kept = readings.write(root / f"{dataset.replace('/', '_')}.npz", seen)
        n_val, n_test = SPLIT_IMAGES[dataset]
        extra = (len(seen.steps) - 1) * n_test  # the test at each validation, less the one at the end it replaces
        rows.append(
            {"dataset": dataset, "validations": len(seen.steps), "val": n_val, "test": n_test, "bytes": kept["bytes"]}
            | {"extra_forward": extra, "share_of_training": extra / (3 * config.steps * config.batch_size)}
        )
    return pd.DataFrame(rows)


def run_rng(config) -> np.random.Generator:
    """The seeded generator of one run, from its dataset, component, learning rate and seed."""
    return np.random.default_rng(zlib.crc32(f"{config.dataset}/{config.component}/{config.lr}/{config.seed}".encode()))


def history(config, test: float, rng: np.random.Generator) -> tuple[list[dict], dict]:
    """A history of ``config``'s length (a row per step, its validation every ``eval_every`` steps), and its best.

    Gradient norms (Fig. 4 middle, appendix D.2, Figs. 19-51): a scale per configuration (``GRADIENT_LEVELS``), lower
    on the easy datasets (``EASY``) and for the LayerNorms at low learning rates; at a low rate they rise through
    training, at a high one they rise steeply, then slowly fall; noise per run (its seed) and per step. The losses
    fall faster for the more plastic components; the validation accuracy rises as they fall, and drifts down after a
    point drawn per run, with noise per validation. ``best``: the validation of the highest accuracy (``test`` + 0.2
    points) and its step, as ``finetune`` keeps it."""
    steps = np.arange(1, config.steps + 1)
    t = steps / config.steps
    speed = config.lr / 0.03
    layernorm = config.component in ("ln1", "ln2")
    level = GRADIENT_LEVELS[config.component] * EASY.get(config.dataset, 1.0) * rng.lognormal(0, 0.15)
    level *= (config.lr / 0.01) ** (0.5 if layernorm else 0.2)
    shape = (0.2 + 0.8 * (1 - np.exp(-t * speed / 0.02))) * np.exp(-2 * speed * t)
    grad = level * shape * rng.lognormal(0, 0.15, len(steps))
    rate = 6 * GRADIENT_LEVELS[config.component] ** 0.5 * (config.lr / 0.01) ** (0.5 if layernorm else 0.2)
    start, end = math.log(num_classes(config.dataset)), 1.2 * (1 - test) + 0.05
    peak = rng.uniform(0.3, 1.0)  # where validation peaks, as a fraction of training
    after = np.maximum(0, t - peak)
    loss = end + (start - end) * np.exp(-rate * t)
    validates = np.array([evaluation.evaluates(step, config) for step in steps])
    curve = -(test - 1 / num_classes(config.dataset)) * np.exp(-rate * t) - 0.02 * after
    curve += rng.normal(0, 0.0015, len(steps))
    curve = np.where(validates, curve, np.nan)
    curve += test + 0.002 - np.nanmax(curve)
    lr = config.lr * np.array([finetune.lr_factor(step - 1, config.warmup, config.steps) for step in steps])
    table = pd.DataFrame({"step": steps, "lr": lr, "train_loss": loss * rng.lognormal(0, 0.05, len(steps))})
    table["grad_norm"] = grad
    table["val_loss"] = np.where(validates, loss * 1.1 + 0.3 * after, np.nan)
    table["val_accuracy"] = curve
    best = int(np.nanargmax(curve))
    return table.to_dict("records"), {"val_accuracy": float(curve[best]), "step": int(steps[best]), "state": None}


LEVELS = {"mha": 3.0, "fc1": 2.0, "fc2": 1.6, "ln2": 1.0, "ln1": 0.8}
"""The level of each component's synthetic rates: the paper's order (Fig. 2), MHA most plastic."""


def build_plasticity(root: Path, pairs: int = 12_800) -> int:
    """Write P(f) of the grid's model on each of its datasets under ``root``, without measuring; the results written.

    A result already there is kept. Each is saved as ``plasticity.run`` saves it (``plasticity_table.save``: the
    rates, their P(f) per block and the record), its rates drawn seeded around each component's ``LEVELS``:
    ``pairs`` pairs (the paper's 12,800) x 12 blocks x 5 components each."""
    os.environ["VIT_PLASTICITY_RESULTS"] = str(root)
    rng = np.random.default_rng(1)
    levels = torch.tensor(list(LEVELS.values())).view(1, -1, 1)
    written = 0
    for model, dataset in sorted({(c.model, c.dataset) for c in configs(specs.load_spec(ROOT / SPEC))}):
        noise = torch.from_numpy(rng.lognormal(0.0, 0.4, size=(12, len(LEVELS), pairs)).astype("float32"))
        measurement = plasticity.Measurement(model=model, dataset=dataset, n_pairs=pairs)
        if measurement.is_saved():
            continue
        found = {"n_pairs": pairs, "distinct_reference": pairs, "distinct_target": pairs, "identical_pairs_excluded": 0}
        found |= {"token_rms": 1.0, "device": "synthetic"}
        plasticity_table.save(component_rates.to_table(levels * noise), measurement, found)
        written += 1
    return written


def timed(command: list[str], root: Path) -> dict:
    """Wall seconds and peak memory (GB) of ``command`` run with ``root`` as the results root."""
    env = os.environ | {"VIT_PLASTICITY_RESULTS": str(root), "MPLBACKEND": "Agg"}
    done = subprocess.run(["/usr/bin/time", "-v", *command], cwd=ROOT, env=env, capture_output=True, text=True)
    wall = re.search(r"Elapsed \(wall clock\) time .*: (?:(\d+):)?(\d+):([\d.]+)", done.stderr)
    peak = re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr)
    seconds = int(wall[1] or 0) * 3600 + int(wall[2]) * 60 + float(wall[3])
    said = [
        line
        for line in done.stderr.split("\tCommand being timed")[0].strip().splitlines()
        if "Command exited" not in line
    ]
    last = said[-1] if done.returncode and said else ""  # the command's last line: its error
    return {"exit": done.returncode, "wall_s": round(seconds, 2), "peak_gb": round(int(peak[1]) / 1e6, 2)} | {
        "error": last[:150]
    }


def time_all(root: Path) -> pd.DataFrame:
    """``timed`` for the analysis commands of a whole grid."""
    python = sys.executable
    with tempfile.TemporaryDirectory() as out:
        commands = {
            "python -m paperlib stats SPEC": [python, "-m", "paperlib", "stats", SPEC],
            "python -c 'import paperlib.analysis.summary'": [python, "-c", "import paperlib.analysis.summary"],
            "python -m paperlib sweep SPEC --plan": [python, "-m", "paperlib", "sweep", SPEC, "--plan"],
            "papermill 06 (README's options)": [
                *[python, "-m", "papermill", "notebooks/06_gradient_dynamics.ipynb", f"{out}/06.ipynb"],
                *NOTEBOOK_06,
            ],
            "papermill 07 (README's options)": [
                *[python, "-m", "papermill", "notebooks/07_finetune_results.ipynb", f"{out}/07.ipynb"],
                *NOTEBOOK_07,
            ],
        }
        rows = [{"command": name} | timed(command, root) for name, command in commands.items()]
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.grid", description=__doc__.split("\n")[0], formatter_class=cli.Help
    )
    parser.add_argument(
        "what",
        choices=["build", "time", "records"],
        help="write the grid's results tree, time its analysis, or print what a run's per-image records cost",
    )
    parser.add_argument(
        "--root", type=Path, default=ROOT / "results-grid", help="its results root; default: results-grid"
    )
    args = parser.parse_args(argv)
    root = args.root.resolve()
    if args.what == "build":
        print(f"{build(root)} runs written under {root}")
        print(f"{build_plasticity(root)} P(f) results written beside them")
        files = [f for f in root.rglob("*") if f.is_file()]
        print(f"{len(files)} files, {sum(f.stat().st_size for f in files) / 1e6:.0f} MB")
        return 0
    if args.what == "records":
        with tempfile.TemporaryDirectory() as folder:
            table = record_sizes(Path(folder))
        print(table.to_string(index=False, float_format=lambda x: f"{x:.4f}"))
        print(f"the grid's 924 runs (84 a dataset): {table['bytes'].sum() * 84 / 1e6:.1f} MB")
        return 0
    print(time_all(root).to_string(index=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
