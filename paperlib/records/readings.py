"""What a finetuning run saw, image by image, and every accuracy read from it, without torch.

At each validation a run records, for every validation and test image in its split's stored order, whether the model
classified it right, and each split's mean loss (``outcomes.npz``, beside ``history.csv``; ``write``). Every accuracy
the package reports is a reading of those records (``read``): the authors' (the mean of float32 per-batch accuracies,
the last partial batch counted as a whole one) at any batch size and image order, or the exact one (right / images),
and the checkpoint a reading chooses, with its test accuracy (``choose``). The authors' validation batch is the run's
(``validation_batch``: 512, 128 or 64 as their scripts set it), their test batch ``AUTHORS_BATCH``. A run's
``metrics.json`` holds ``choose``'s output at the run's end; a change of how a run is read re-reads these records and
trains nothing (``docs/reliability.md``).

    from paperlib.records import readings
    seen = readings.read(folder)                            # what the run in folder saw
    readings.choose(seen, readings.validation_batch(params))  # its metrics' readings: the authors'
    readings.choose(seen, batch=None)                       # the exact reading
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
"""The batch of the authors' evaluation: their test's always (``eval.yaml``), their validation's unless their script
sets another (``validation_batch``). Their accuracy is the mean of its batches' accuracies, the last partial batch
counted as a whole one (``accuracy``)."""

VALIDATION_BATCHES = {"cifar10c/speckle_noise": 128, "vit_large_in21k": 128, "vit_huge_in21k": 64}
"""The validation batches the authors' scripts set instead of ``AUTHORS_BATCH``, by dataset or model: Cifar10-C
speckle noise in ``finetuning.sh``, ViT-Large and ViT-Huge in ``ablation/model_size.sh`` (``validation_batch``)."""


def validation_batch(params: dict) -> int:
    """The authors' validation batch for the run whose record (``params.json``, or a ``Run``'s fields) is ``params``.

    ``AUTHORS_BATCH`` unless its dataset or model is one ``VALIDATION_BATCHES`` names (the smaller where both are)."""
    named = [VALIDATION_BATCHES[params[key]] for key in ("dataset", "model") if params.get(key) in VALIDATION_BATCHES]
    return min(named, default=AUTHORS_BATCH)


@dataclass(frozen=True)
class Outcomes:
    """What a run saw at its validations: a row per validation, in order.

    ``steps``: the step of each; ``val`` and ``test``: booleans (validations x images), True where the image was
    classified right, in the split's stored order; ``val_loss``, ``test_loss``: each split's mean cross-entropy;
    ``nan_model``: whether the row scores the authors' NaN model (``evaluation.nan_validation``), a checkpoint without
    weights, which their loop chooses as any other (``choose``)."""

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

    ``batch``: the authors' reading, as their ``run_evaluation`` computes it: each batch's accuracy in float32 (right /
    images, rounded to float32 as torch's ``float().mean()``), summed in order in float64 and divided by the number of
    batches, so that the last partial batch counts as a whole one. None: the exact one (right / images). ``order``: the
    images' order for the batches (positions into the split's stored order; None, that order)."""
    hits = np.atleast_2d(np.asarray(hits, dtype=np.float64))
    if order is not None:
        hits = hits[:, np.asarray(order)]
    if batch is None or hits.shape[1] == 0:
        return hits.mean(axis=1) if hits.shape[1] else np.full(len(hits), math.nan)
    if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
        raise ValueError(f"batch must be a positive integer or None (the exact accuracy), got {batch!r}")
    starts = np.arange(0, hits.shape[1], batch)
    sums = np.add.reduceat(hits, starts, axis=1).astype(np.float32)
    sizes = np.diff(np.append(starts, hits.shape[1])).astype(np.float32)
    per_batch = (sums / sizes).astype(np.float64)
    return np.cumsum(per_batch, axis=1)[:, -1] / len(starts)  # added one after another, as their loop adds them


def choose(seen: Outcomes, batch: int | None = AUTHORS_BATCH, order: np.ndarray | None = None) -> Reading:
    """The checkpoint the validation accuracy read with ``batch`` and ``order`` (``accuracy``) chooses, and its test.

    The first validation whose accuracy is strictly greater than 0 and than every one before it wins, as the
    authors' loop chooses from its starting best of 0 (a row of their NaN model, ``Outcomes.nan_model``, too). The
    test is read in the test split's stored order (the authors' test loader does not shuffle) at ``AUTHORS_BATCH``,
    their test's batch whatever their validation's; with ``batch`` None, both exactly."""
    val = accuracy(seen.val, batch, order)
    best = None
    for row, value in enumerate(val):
        if value > (val[best] if best is not None else 0.0):
            best = row
    if best is None:
        return Reading(None, math.nan, math.nan, math.nan, math.nan, math.nan, False)
    exact = accuracy(seen.val[best], None)[0]
    test = accuracy(seen.test[best], None if batch is None else AUTHORS_BATCH)[0], accuracy(seen.test[best], None)[0]
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
