"""What a finetuning run saw, image by image, and every accuracy read from it, without torch.

At each validation a run records, for every validation and test image in its split's stored order, whether the model
classified it right, and each split's mean loss (``outcomes.npz``, beside ``history.csv``; ``write``). Every accuracy
the package reports is a reading of those records (``read``): the authors' (the mean of per-batch accuracies over
batches of ``AUTHORS_BATCH`` images, the last partial batch counted as a whole one) at any batch size and image order,
or the exact one (right / images), and the checkpoint a reading chooses, with its test accuracy (``choose``). A run's
``metrics.json`` holds ``choose``'s output at the run's end; a change of how a run is read re-reads these records and
trains nothing (``docs/reliability.md``).

    from paperlib.records import readings
    seen = readings.read(folder)                            # what the run in folder saw
    readings.choose(seen)                                   # its metrics' readings: the authors', at 512
    readings.choose(seen, batch=128, order=permutation)     # another batch and validation order
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from paperlib.records import paths, storage

OUTCOMES = "outcomes.npz"
"""The file of a run's per-image outcomes: a row per validation, each image's outcome one bit (``write``)."""

AUTHORS_BATCH = 512
"""The batch of the authors' evaluation (validation and test): their accuracy is the mean of its batches' accuracies,
the last partial batch counted as a whole one (``accuracy``)."""


@dataclass(frozen=True)
class Outcomes:
    """What a run saw at its validations: a row per validation, in order.

    ``steps``: the step of each; ``val`` and ``test``: booleans (validations x images), True where the image was
    classified right, in the split's stored order; ``val_loss``, ``test_loss``: each split's mean cross-entropy;
    ``nan_model``: whether the row scores the authors' NaN model (``finetune._nan_validation``), which their loop
    keeps only above a best of at least 0."""

    steps: np.ndarray
    val: np.ndarray
    test: np.ndarray
    val_loss: np.ndarray
    test_loss: np.ndarray
    nan_model: np.ndarray


@dataclass(frozen=True)
class Reading:
    """The checkpoint a reading chooses and what it reads of it (None and NaN where no validation ran)."""

    best_step: int | None
    best_val_accuracy: float
    best_val_accuracy_exact: float
    test_accuracy: float
    test_accuracy_exact: float
    test_loss: float
    nan_model: bool


def accuracy(hits: np.ndarray, batch: int | None = AUTHORS_BATCH, order: np.ndarray | None = None) -> np.ndarray:
    """The accuracy of each row of ``hits`` (validations x images, True where right).

    ``batch``: the authors' reading, the mean of the accuracies of consecutive batches of ``batch`` images (the last
    partial one counted as a whole one); None, the exact one (right / images). ``order``: the images' order for the
    batches (positions into the split's stored order; None, that order)."""
    hits = np.atleast_2d(np.asarray(hits, dtype=np.float64))
    if order is not None:
        hits = hits[:, np.asarray(order)]
    if batch is None or hits.shape[1] == 0:
        return hits.mean(axis=1) if hits.shape[1] else np.full(len(hits), math.nan)
    if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
        raise ValueError(f"batch must be a positive integer or None (the exact accuracy), got {batch!r}")
    starts = np.arange(0, hits.shape[1], batch)
    sums = np.add.reduceat(hits, starts, axis=1)
    sizes = np.diff(np.append(starts, hits.shape[1]))
    return (sums / sizes).mean(axis=1)


def choose(seen: Outcomes, batch: int | None = AUTHORS_BATCH, order: np.ndarray | None = None) -> Reading:
    """The checkpoint the validation accuracy read with ``batch`` and ``order`` (``accuracy``) chooses, and its test.

    The first validation whose accuracy is strictly greater than every one before it wins, as the authors' loop
    chooses; a row of the NaN model (``Outcomes.nan_model``) wins only above a best of at least 0, their starting
    best. The test is read with ``batch`` in the test split's stored order (the authors' test loader does not
    shuffle)."""
    val = accuracy(seen.val, batch, order)
    best = None
    for row, value in enumerate(val):
        floor = val[best] if best is not None else -1.0
        if value > (max(floor, 0.0) if seen.nan_model[row] else floor):
            best = row
    if best is None:
        return Reading(None, math.nan, math.nan, math.nan, math.nan, math.nan, False)
    exact = accuracy(seen.val[best], None)[0]
    test = accuracy(seen.test[best], batch)[0], accuracy(seen.test[best], None)[0]
    return Reading(
        int(seen.steps[best]),
        float(val[best]),
        float(exact),
        *map(float, test),
        float(seen.test_loss[best]),
        bool(seen.nan_model[best]),
    )


def write(path: str | Path, seen: Outcomes) -> dict:
    """Write ``seen`` to ``path`` (``OUTCOMES``) as ``storage.write_checked`` does; returns its size and checksum.

    Each image's outcome is one bit (``numpy.packbits``), the losses float64: a few kilobytes per run at demo scale,
    tens at paper scale (``docs/benchmarks.md``)."""
    arrays = {
        "steps": np.asarray(seen.steps, dtype=np.int64),
        "val": np.packbits(np.asarray(seen.val, dtype=bool), axis=1),
        "test": np.packbits(np.asarray(seen.test, dtype=bool), axis=1),
        "images": np.array([np.shape(seen.val)[1], np.shape(seen.test)[1]], dtype=np.int64),
        "val_loss": np.asarray(seen.val_loss, dtype=np.float64),
        "test_loss": np.asarray(seen.test_loss, dtype=np.float64),
        "nan_model": np.asarray(seen.nan_model, dtype=bool),
    }

    def save(tmp: str) -> None:
        with open(tmp, "wb") as file:
            np.savez_compressed(file, **arrays)

    return storage.write_checked(path, save)


def read(folder: str | Path) -> Outcomes:
    """The outcomes of the run in ``folder``, checked against the checksum its ``metrics.json`` holds.

    A ValueError naming the file if it is damaged or its arrays disagree (``storage.read_checked``); a
    FileNotFoundError if the run has none (a run written before they were recorded: ``runs.RECORD``)."""
    folder = Path(folder)
    raw = storage.read_checked(folder / "metrics.json", OUTCOMES)
    try:
        with np.load(io.BytesIO(raw), allow_pickle=False) as arrays:
            n_val, n_test = (int(n) for n in arrays["images"])
            seen = Outcomes(
                steps=arrays["steps"],
                val=np.unpackbits(arrays["val"], axis=1, count=n_val).astype(bool),
                test=np.unpackbits(arrays["test"], axis=1, count=n_test).astype(bool),
                val_loss=arrays["val_loss"],
                test_loss=arrays["test_loss"],
                nan_model=arrays["nan_model"],
            )
    except (KeyError, ValueError, OSError) as error:
        raise ValueError(f"{paths.display(folder / OUTCOMES)} cannot be read ({error}; damaged?)") from None
    rows = {len(seen.steps), len(seen.val), len(seen.test), len(seen.val_loss), len(seen.test_loss)}
    if rows != {len(seen.nan_model)}:
        raise ValueError(f"{paths.display(folder / OUTCOMES)} holds arrays of different lengths (damaged?)")
    return seen
