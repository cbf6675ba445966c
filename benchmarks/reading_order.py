"""What the authors' validation order and batch change in a run's reading, simulated: the size of ``runs.RECORD`` 7.

    python -m benchmarks.reading_order            # a minute on a CPU; prints one table

A run's validation accuracy, as the authors read it, is the mean of per-batch accuracies with the last partial batch
counted as a whole one (``readings.accuracy``), so which images share the last batch moves it, and with it the
checkpoint it chooses. Runs of ``RECORD`` 6 and before held the validation split sorted by position; since, in the
order of the authors' ``random_split`` (``splits.validation_split``), at the batch their script sets
(``readings.validation_batch``). Here, for each of the paper's validation splits that the protocol draws (sizes
below; Flowers102's is its official one, in file order either way), runs are simulated image by image: an image's
chance of being right at a validation rises over training around its own difficulty (a logistic model, about 90%
right at the end, as the paper's Cifar10-C runs), the same images each validation, the test split alike. Each run is
read both ways (``readings.choose``) at the authors' seeds; printed: the standard deviation and largest absolute
difference (points) of the best validation accuracy and of the test accuracy of the checkpoint each chooses, and how
often the two choose another checkpoint. Figures: docs/fidelity.md ("Validation split", "Accuracy over a split").
"""

from __future__ import annotations

import numpy as np
import torch

from paperlib.data import splits
from paperlib.records import readings

SPLITS = {  # dataset: (training images the validation split is drawn from, test images, validations, their batch)
    "cifar10c (speckle noise at 128)": (8000, 2000, 28, 128),
    "cifar10c": (8000, 2000, 28, 512),
    "pets": (3680, 3669, 20, 512),
    "cifar10": (50000, 10000, 20, 512),
}
SEEDS = (0, 42, 3407)
RUNS = 100  # simulated runs per seed


def simulated(n_val: int, n_test: int, validations: int, rng: np.random.Generator) -> readings.Outcomes:
    """A run's outcomes: image difficulties fixed, skill rising to about 90% right, noise per validation."""
    skill = np.log(np.linspace(1, 12, validations))[:, None] + rng.normal(0, 0.08, (validations, 1))

    def hits(n: int) -> np.ndarray:
        difficulty = rng.normal(-0.3, 1.2, n)
        return rng.random((validations, n)) < 1 / (1 + np.exp(difficulty - skill))

    steps = np.arange(1, validations + 1)
    zeros = np.zeros(validations)
    return readings.Outcomes(steps, hits(n_val), hits(n_test), zeros, zeros, np.zeros(validations, bool))


def main() -> None:
    rng = np.random.default_rng(0)
    print(f"{'split':34s} {'val':>6s}  {'val diff sd / max':>18s}  {'test diff sd / max':>19s}  other checkpoint")
    for name, (n, n_test, validations, batch) in SPLITS.items():
        val_diff, test_diff, other = [], [], 0
        for seed in SEEDS:
            _, val = splits.validation_split(n, seed)  # the authors' order
            older = np.argsort(np.argsort(val))  # where each stood in the sorted order of record 6
            back = np.argsort(older)  # the sorted order, as positions into the authors' order
            for _ in range(RUNS):
                seen = simulated(len(val), n_test, validations, rng)  # stored in the authors' order
                theirs = readings.choose(seen, batch)
                before = readings.choose(seen, readings.AUTHORS_BATCH, order=back)  # record 6: sorted, 512
                val_diff.append(100 * (before.best_val_accuracy - theirs.best_val_accuracy))
                test_diff.append(100 * (before.test_accuracy - theirs.test_accuracy))
                other += before.best_step != theirs.best_step
        val_diff, test_diff = np.array(val_diff), np.array(test_diff)
        print(
            f"{name:34s} {len(val):6d}  {val_diff.std():8.2f} / {np.abs(val_diff).max():6.2f}"
            f"  {test_diff.std():9.2f} / {np.abs(test_diff).max():6.2f}  {other / len(val_diff):6.0%}"
        )
    print(f"({RUNS} simulated runs x seeds {', '.join(map(str, SEEDS))}; torch {torch.__version__})")


if __name__ == "__main__":
    main()
