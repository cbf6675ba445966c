"""The demo ViT: deterministic pretraining on ``digits_source`` and its evaluation.

The demo world's stand-in for an ImageNet-21k checkpoint (a tiny ViT pretrained on digits 0-4). Run

    python -m paperlib demo pretrain     # writes paperlib/assets/demo_vit.safetensors (+ .json card)
    python -m paperlib demo evaluate     # accuracy of the committed weights on digits_source test
    python -m paperlib demo runs         # the demo sweeps' runs and the shared probes the notebooks read (pool)

Pretraining is deterministic for a given machine and library versions: fixed seeds, a private
random generator for shuffling and augmentation, and deterministic torch algorithms. Another CPU (its vector
instructions) or other library versions round otherwise, and make other weights: ``pretrain`` then leaves the
committed ones as they are, saying both SHA-256 and test accuracies, unless ``--overwrite`` (``replace_weights``).
"""

from __future__ import annotations

import hashlib
import json
import math
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import timm
import torch
from safetensors.torch import save
from torch import nn

from paperlib.data.datasets import get_dataset
from paperlib.data.imagesets import ImageDataset
from paperlib.data.loader import DeviceLoader, Transform
from paperlib.records import cli, commands, paths, storage
from paperlib.train import pool
from paperlib.train.evaluation import evaluate
from paperlib.vit.models import create_model


@dataclass(frozen=True)
class Recipe:
    """Pretraining settings of the demo ViT (AdamW, linear warm-up then cosine decay, per step)."""

    epochs: int = 120  # passes over digits_source's trainval split
    batch_size: int = 64  # images per step
    lr: float = 1e-3  # AdamW's peak learning rate
    weight_decay: float = 0.05  # AdamW's decoupled weight decay
    warmup_epochs: int = 5  # epochs of linear warm-up
    max_shift: int = 3  # random translation in pixels, the only augmentation (digits must not flip)
    label_smoothing: float = 0.1  # of the cross-entropy loss
    seed: int = 0  # initialisation, shuffling and augmentation


def shift_batch(images: torch.Tensor, max_shift: int, generator: torch.Generator) -> torch.Tensor:
    """Translate each image by a random integer offset in [-max_shift, max_shift], zero-filled."""
    if max_shift == 0:
        return images
    n, _, h, w = images.shape
    padded = nn.functional.pad(images, (max_shift,) * 4)
    offsets = torch.randint(0, 2 * max_shift + 1, (n, 2), generator=generator)
    return torch.stack([padded[i, :, dy : dy + h, dx : dx + w] for i, (dy, dx) in enumerate(offsets.tolist())])


def accuracy(model: nn.Module, dataset: ImageDataset, batch_size: int = 512) -> float:
    """Top-1 accuracy of ``model`` on an in-memory dataset (``evaluation.evaluate`` at its own size)."""
    loader = DeviceLoader(dataset, batch_size, Transform(False, dataset.images.shape[-1]))
    return evaluate(model, loader).exact


def pretrain(recipe: Recipe = Recipe(), log_every: int = 10) -> tuple[nn.Module, dict]:
    """Train the demo ViT from scratch on ``digits_source`` train; returns (model, metrics)."""
    torch.manual_seed(recipe.seed)
    torch.use_deterministic_algorithms(True)
    generator = torch.Generator().manual_seed(recipe.seed)
    train, test = get_dataset("digits_source", "trainval"), get_dataset("digits_source", "test")
    model = create_model("demo", pretrained=False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=recipe.lr, weight_decay=recipe.weight_decay)
    steps_per_epoch = math.ceil(len(train) / recipe.batch_size)
    total, warmup = recipe.epochs * steps_per_epoch, recipe.warmup_epochs * steps_per_epoch
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda step: (
            (step + 1) / warmup if step < warmup else 0.5 * (1 + math.cos(math.pi * (step - warmup) / (total - warmup)))
        ),
    )
    loss_fn = nn.CrossEntropyLoss(label_smoothing=recipe.label_smoothing)
    start = time.perf_counter()
    for epoch in range(recipe.epochs):
        model.train()
        order = torch.randperm(len(train), generator=generator)
        for first in range(0, len(train), recipe.batch_size):
            index = order[first : first + recipe.batch_size]
            images = shift_batch(train.images[index], recipe.max_shift, generator)
            loss = loss_fn(model(train.normalize(images)), train.targets[index])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
        if log_every and ((epoch + 1) % log_every == 0 or epoch + 1 == recipe.epochs):
            print(
                f"epoch {epoch + 1:4d}  loss {loss.item():.4f}  test accuracy {accuracy(model, test):.4f}", flush=True
            )
    metrics = {
        "train_accuracy": accuracy(model, train),
        "test_accuracy": accuracy(model, test),
        "train_seconds": round(time.perf_counter() - start, 1),
    }
    return model, metrics


def replace_weights(model: nn.Module, card: dict, path: Path, overwrite: bool) -> str:
    """Save ``model`` at ``path`` with its JSON ``card`` beside it unless other weights are there; says what it did.

    The state dict is written as safetensors, each file atomically. Weights other than ``path``'s (another SHA-256:
    pretraining on another CPU, or with other library versions, rounds otherwise) replace them only with ``overwrite``;
    otherwise nothing is written and a FileExistsError gives both SHA-256 and test accuracies (``card``'s
    ``test_accuracy``, and that of ``path``'s weights). The same weights: nothing is written either (their card keeps
    the run that made them)."""
    data = save({k: v.detach().contiguous() for k, v in model.state_dict().items()})
    digest = hashlib.sha256(data).hexdigest()
    if path.is_file():
        there = hashlib.sha256(path.read_bytes()).hexdigest()
        if there == digest:
            return f"the same weights as {paths.display(path)} (sha256 {digest}): left as they are"
        if not overwrite:
            kept = accuracy(create_model("demo", weights=path), get_dataset("digits_source", "test"))
            committed = " (the committed notebooks' numbers are theirs)" if path == paths.DEMO_WEIGHTS else ""
            raise FileExistsError(
                f"these weights differ from {paths.display(path)}{committed}: sha256 {digest}, test accuracy "
                f"{card['test_accuracy']:.4f} here; sha256 {there}, test accuracy {kept:.4f} there; "
                "pass --overwrite to replace them"
            )
    storage.atomic_write(path, lambda tmp: Path(tmp).write_bytes(data))
    storage.atomic_write_text(path.with_suffix(".json"), json.dumps(card, indent=2) + "\n")
    return f"wrote {paths.display(path)} (sha256 {digest})"


def main(argv: list[str] | None = None) -> None:
    """The demo's command line: ``python -m paperlib demo <command>`` (``records.commands.demo``)."""
    parser = commands.demo()
    args = parser.parse_args(argv)

    try:
        if args.command == "pretrain":
            if args.epochs is not None and args.epochs < 1:
                parser.error(f"--epochs must be at least 1, got {args.epochs}")
            recipe = Recipe() if args.epochs is None else Recipe(epochs=args.epochs)
            model, metrics = pretrain(recipe)
            card = {
                "model": "vit_demo_patch4_32",
                "dataset": "digits_source trainval (scikit-learn digits 0-4, 80% of them)",
                "recipe": asdict(recipe),
                **metrics,
                "parameters": sum(p.numel() for p in model.parameters()),
                "command": "python -m paperlib demo pretrain",
                "versions": {"python": platform.python_version(), "torch": torch.__version__, "timm": timm.__version__},
                "machine": f"{platform.machine()}, {torch.get_num_threads()} CPU threads",
            }
            said = replace_weights(model, card, args.out, args.overwrite)
            print(json.dumps(metrics))
            print(said)
        elif args.command == "runs":
            pool.demo_runs()
        else:
            model = create_model("demo", weights=args.weights)
            for split in ("trainval", "test"):
                print(f"digits_source {split} accuracy: {accuracy(model, get_dataset('digits_source', split)):.4f}")
    except cli.BAD_INPUT as error:  # a weight file missing or not one; other weights than pretraining's
        parser.exit(cli.fail(error))
