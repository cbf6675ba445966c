"""The paper's finetuning grid at its real size, without training: its results tree, and its analysis timed on it.

    python -m benchmarks.grid build    # results-grid/: the 924 runs of finetune_paper.yaml and P(f) (minutes, once)
    python -m benchmarks.grid time     # stats, sweep --plan, notebooks 06 and 07 on it: wall time and peak memory

``build`` writes every run of ``parameters/sweeps/finetune_paper.yaml`` through the package's own writers
(``runs.start``, then ``runs.record``: ``params.json``, ``history.csv``, ``metrics.json``), each history
at its real length (a row per step: about 10 million rows), with test accuracies drawn around the paper's
Table 6 (``parameters/paper/table6.csv``), seeded: the same tree on every machine; beside them, the P(f) a lab
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
from pathlib import Path

import numpy as np
import pandas as pd

from paperlib.records import cli
from paperlib.train import checkpoints
from paperlib.train.config import configs

ROOT = Path(__file__).resolve().parents[1]
SPEC = "parameters/sweeps/finetune_paper.yaml"
NOTEBOOK_06 = ["-p", "spec", SPEC, "-p", "dataset", "domainnet/sketch", "-p", "lr", "0.01"]
NOTEBOOK_06 += ["-p", "compute_missing", "False"]
NOTEBOOK_07 = ["-p", "spec", SPEC, "-p", "compute_missing", "False"]
"""The README's paper-scale options of notebooks 06 and 07."""


def build(root: Path, **only) -> int:
    """Write the paper grid's runs under ``root`` (a run already recorded there is kept); the runs written.

    ``only``: the runs of these values alone (``specs.restrict``: a test's part of the grid)."""
    os.environ["VIT_PLASTICITY_RESULTS"] = str(root)
    from paperlib.records import runs, specs
    from paperlib.train import finetune

    paper = pd.read_csv(ROOT / "parameters/paper/table6.csv", comment="#").set_index(["dataset", "component"])
    rng = np.random.default_rng(0)  # seeded: the same tree on every machine
    written = 0
    spec = specs.load_spec(ROOT / SPEC)
    spec = specs.restrict(spec, **only) if only else spec
    for config in configs(spec):
        draws = rng.random(4)  # drawn for every run, written or not: the same tree whatever was there
        if runs.is_finished(config):
            continue
        mean, std = paper.loc[(config.dataset, config.component if config.component != "linear" else "probe")]
        std = 0.3 if math.isnan(std) else max(std, 0.05)
        lr_cost = abs(math.log10(config.lr) + 2) * 1.5  # best near lr 0.01, as most of the paper's grid
        accuracy = min(99.99, mean - lr_cost + std * (draws[0] * 2 - 1) * 1.7) / 100
        runs.start(config.folder(), runs.run_record(config))
        rows = history(config, finetune.lr_factor, draws[1])
        best = {"val_accuracy": accuracy + 0.002, "step": config.steps, "state": None}
        metrics = {
            "status": "finished",
            "diverged_step": None,
            "best_val_accuracy": best["val_accuracy"],
            "best_step": config.steps,
            "test_accuracy": accuracy,
            "test_loss": 1 - accuracy,
            "trainable_parameters": int(1e5 + draws[2] * 8e7),
            "micro_batch": config.batch_size,
            "wall_seconds": round(config.steps * 1.3, 2),
            "images_per_second": 400.0 + round(100 * draws[3], 1),
            "device": "NVIDIA H100 80GB HBM3",
            "precision": config.precision,
        }
        checkpoints.record(config.folder(), rows, best, metrics, config.save_weights)
        written += 1
    return written


LEVELS = {"mha": 3.0, "fc1": 2.0, "fc2": 1.6, "ln2": 1.0, "ln1": 0.8}
"""The level of each component's synthetic rates: the paper's order (Fig. 2), MHA most plastic."""


def build_plasticity(root: Path, pairs: int = 12_800) -> int:
    """Write P(f) of the grid's model on each of its datasets under ``root``, without measuring; the results written.

    A result already there is kept. Each is saved as ``plasticity.run`` saves it (``plasticity_table.save``: the
    rates, their P(f) per block and the record), its rates drawn seeded around each component's ``LEVELS``:
    ``pairs`` pairs (the paper's 12,800) x 12 blocks x 5 components each."""
    os.environ["VIT_PLASTICITY_RESULTS"] = str(root)
    import torch

    from paperlib.analysis import plasticity_table
    from paperlib.measure import component_rates, plasticity
    from paperlib.records import specs

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


def history(config, lr_factor, noise: float) -> list[dict]:
    """A history of ``config``'s length: a row per step, its validation every ``eval_every`` steps."""
    steps = np.arange(1, config.steps + 1)
    lr = config.lr * np.array([lr_factor(step - 1, config.warmup, config.steps) for step in steps])
    loss = 2.3 * np.exp(-steps / (config.steps / 5)) + 0.05 + 0.01 * noise
    grad = 1.0 / np.sqrt(steps) + 0.1
    validates = steps % config.eval_every == 0
    table = pd.DataFrame({"step": steps, "lr": lr, "train_loss": loss, "grad_norm": grad})
    table["val_loss"] = np.where(validates, loss * 1.1, np.nan)
    table["val_accuracy"] = np.where(validates, 1 - loss / 3, np.nan)
    return table.to_dict("records")


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
    parser.add_argument("what", choices=["build", "time"], help="write the grid's results tree, or time its analysis")
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
    print(time_all(root).to_string(index=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
