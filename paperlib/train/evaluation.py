"""What a run sees at a validation: each split evaluated, image by image, its gradient, and the NaN model scored.

``evaluate`` evaluates a split (its mean loss and each image's outcome: ``Evaluation``); a run evaluates the
validation and the test split at every validation step (``evaluates``, ``SEEN``) and records them
(``outcomes``: ``readings.Outcomes``), from which every accuracy it reports is read (``readings.choose``), and the
share of the last step's gradient norm that is the component's (``component_grad_share``). A loss that is not finite
is scored as the authors' loop would score its NaN model (``nan_validation``).
"""

from __future__ import annotations

import contextlib
import math
from typing import NamedTuple

import numpy as np
import torch
from torch import nn

from paperlib.data.loader import DeviceLoader
from paperlib.records import readings
from paperlib.train.config import Config

EVAL_BATCH = 256  # images per forward pass when evaluating


class Evaluation(NamedTuple):
    """A split's evaluation: its mean cross-entropy and each image's outcome, in the split's order.

    ``hits``: True where the image was classified right (what a run records, ``readings.Outcomes``); ``accuracy``
    reads them as the authors' test does (``readings.accuracy``: the mean of per-batch accuracies over batches of
    ``readings.AUTHORS_BATCH``; their validation's batch is the run's, ``readings.validation_batch``), ``exact`` as
    right / images."""

    loss: float
    hits: np.ndarray

    @property
    def accuracy(self) -> float:
        return float(readings.accuracy(self.hits)[0])

    @property
    def exact(self) -> float:
        return float(readings.accuracy(self.hits, None)[0])


@torch.no_grad()
def evaluate(model: nn.Module, loader: DeviceLoader, context=contextlib.nullcontext, forward=None) -> Evaluation:
    """The ``Evaluation`` of a whole split; one read-back from the device at the end.

    ``model``: the module that runs (``speed.step.Step.network``); ``forward``: what calls it (``Step.forward``:
    compiled, or bf16 master weights); ``context``: the context of its forward passes (``Step.context``)."""
    model.eval()
    forward = model if forward is None else forward
    loss, hits = torch.zeros((), dtype=torch.float64, device=loader.device), []
    for images, labels in loader:
        with context():
            logits = forward(images)
        loss += nn.functional.cross_entropy(logits.float(), labels, reduction="sum").double()
        hits.append(logits.argmax(dim=1) == labels)
    hits = torch.cat(hits)  # True per image classified right, in the split's order
    return Evaluation((loss / len(hits)).item(), hits.cpu().numpy())


def nan_logits(num_classes: int):
    """A ``forward`` whose logits are NaN, as those of a model whose weights a non-finite loss has made NaN.

    ``evaluate`` with it scores what the authors' loop, which trains on after such a loss, validates and tests (argmax
    picks class 0)."""
    return lambda images: torch.full((len(images), num_classes), math.nan, device=images.device)


SEEN = ("val", "test")
"""The splits a run records at each validation, image by image (``readings.Outcomes``)."""


def seen_row(step: int, val: Evaluation, test: Evaluation, nan_model: bool = False) -> dict:
    """One validation's row of what a run saw, as a checkpoint holds it (tensors and plain types)."""
    hits = {f"{split}_hits": torch.from_numpy(np.asarray(e.hits, dtype=bool)) for split, e in zip(SEEN, (val, test))}
    return {"step": step, "val_loss": val.loss, "test_loss": test.loss, "nan_model": nan_model, **hits}


def outcomes(seen: list[dict], loaders: dict) -> readings.Outcomes:
    """``seen``'s rows as the ``readings.Outcomes`` a run records (none: empty arrays of its splits' widths)."""
    width = {split: len(loaders[split].images) for split in SEEN}
    hits = {
        split: np.stack([row[f"{split}_hits"].numpy() for row in seen]) if seen else np.zeros((0, width[split]), bool)
        for split in SEEN
    }
    column = {key: np.array([row[key] for row in seen]) for key in ("step", "val_loss", "test_loss", "nan_model")}
    return readings.Outcomes(
        steps=column["step"].astype(np.int64),
        val=hits["val"],
        test=hits["test"],
        val_loss=column["val_loss"].astype(np.float64),
        test_loss=column["test_loss"].astype(np.float64),
        nan_model=column["nan_model"].astype(bool),
    )


def component_grad_share(step_fn, inside: torch.Tensor) -> float:
    """The component's share of the gradient norm that clipping saw at the last step; NaN without its gradients.

    The norm of the gradients of what trains in the component's place (``inside``: per parameter of ``step_fn``'s,
    whether it is neither the head's nor the final norm's) over the norm of all of them. Clipping scales them alike:
    the share is the same after it. An equal-capacity run's subset has a small share where the head sets the norm, and
    so whether and how hard clipping binds."""
    grads = [p.grad for p in step_fn.trainable]
    if any(grad is None for grad in grads):
        return math.nan
    norms = torch.stack([grad.detach().float().norm() for grad in grads])
    return (norms[inside.to(norms.device)].norm() / norms.norm()).item()


def evaluates(step: int, config: Config) -> bool:
    """Whether a run validates after ``step`` steps.

    Every ``eval_every`` steps, as the authors' loop (none after the last step unless it is one of them), and at the end
    of a run too short for one."""
    return step % config.eval_every == 0 or (step == config.steps and config.eval_every > config.steps)


def nan_validation(config: Config, rows: list, loaders: dict, num_classes: int) -> list[dict]:
    """What the authors' loop would see of its NaN model after a loss that is not finite: [] or one row of ``seen``.

    The run stops at such a loss; the authors' loop trains on, with weights that are NaN from that step on, and
    validates them at its next validation step, which scores the share of class 0 (``nan_logits``). That row is
    chosen (``readings.choose``) if its accuracy is strictly greater than the best's and than 0, as theirs is: always
    when the loss turned NaN before the first validation (their starting best is 0, so the run is tested at about
    chance level rather than left without a result). It has no weights."""
    if not rows or math.isfinite(rows[-1]["train_loss"]):
        return []
    later = next((step for step in range(rows[-1]["step"], config.steps + 1) if evaluates(step, config)), None)
    if later is None:
        return []
    val, test = (evaluate(nn.Identity(), loaders[split], forward=nan_logits(num_classes)) for split in SEEN)
    return [seen_row(later, val, test, nan_model=True)]
