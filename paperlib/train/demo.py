"""The demo ViT: deterministic pretraining on ``digits_source`` and its evaluation.

The demo world's stand-in for an ImageNet-21k checkpoint (a tiny ViT pretrained on digits 0-4). Run

    python -m paperlib demo pretrain     # writes paperlib/assets/demo_vit.safetensors (+ .json card)
    python -m paperlib demo evaluate     # accuracy of the committed weights on digits_source test

Pretraining is deterministic for a given machine and library versions: fixed seeds, a private
random generator for shuffling and augmentation, and deterministic torch algorithms.
"""

from __future__ import annotations

import contextlib
import json
import math
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import timm
import torch
from safetensors.torch import save_file
from torch import nn

from paperlib.data.datasets import get_dataset
from paperlib.data.imagesets import ImageDataset
from paperlib.data.loader import DeviceLoader, Transform
from paperlib.records import cli, commands, storage
from paperlib.train.finetune import evaluate
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
    """Top-1 accuracy of ``model`` on an in-memory dataset (``finetune.evaluate`` at its own size)."""
    loader = DeviceLoader(dataset, batch_size, Transform(False, dataset.images.shape[-1]))
    return evaluate(model, loader, contextlib.nullcontext)[1]


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


def save_weights(model: nn.Module, path: Path, card: dict | None = None) -> None:
    """Write the state dict as safetensors (and an optional JSON card beside it), atomically."""
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    storage.atomic_write(path, lambda tmp: save_file(state, tmp))
    if card is not None:
        storage.atomic_write_text(path.with_suffix(".json"), json.dumps(card, indent=2) + "\n")


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
            save_weights(model, args.out, card)
            print(json.dumps(metrics))
            print(f"wrote {args.out}")
        else:
            model = create_model("demo", weights=args.weights)
            for split in ("trainval", "test"):
                print(f"digits_source {split} accuracy: {accuracy(model, get_dataset('digits_source', split)):.4f}")
    except cli.BAD_INPUT as error:  # a weight file missing or not one
        parser.exit(cli.fail(error))
