"""Datasets by name, with deterministic train/test splits.

Paper appendix C.2. This module holds the offline demo world (DESIGN.md, "Two worlds"):
scikit-learn's handwritten digits, split by class into two disjoint halves.

- ``digits_source``: digits 0-4, the pretraining distribution of the demo ViT (the stand-in for
  ImageNet-21k), labels 0-4.
- ``digits``: digits 5-9, the clean downstream task (labels 0-4 stand for digits 5-9). New classes
  make it a genuine transfer problem with a new head, as from ImageNet-21k to Flowers102.
- ``digits_c/<corruption>``: the same images as ``digits`` corrupted at severity 5 with the five
  CIFAR-10-C corruptions of the paper (``paperlib.corruptions``), the stand-in for Cifar10-C.

Images are 8x8 digits upsampled (bilinear) to 32x32 RGB uint8, normalised with the ImageNet mean
and standard deviation like the paper's data. Each half is split 80/20 into train and test by
hashing the sample's position in scikit-learn's array: the split is the same in every process,
on every machine and with any global random state, and a digit's corrupted copies fall in the same
split as the clean one.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from typing import Callable, Sequence

import numpy as np
import torch
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from torch.utils.data import Dataset

from .corruptions import CORRUPTIONS, corrupt

SPLITS = ("train", "test")
TEST_FRACTION = 0.2
IMAGE_SIZE = 32
SEVERITY = 5
SOURCE_DIGITS = (0, 1, 2, 3, 4)
DOWNSTREAM_DIGITS = (5, 6, 7, 8, 9)
MEAN = IMAGENET_DEFAULT_MEAN
STD = IMAGENET_DEFAULT_STD


class ImageDataset(Dataset):
    """uint8 images kept in memory; items are (normalised CHW float tensor, int label).

    ``images`` (N, 3, H, W) uint8 and ``targets`` (N,) int64 are public so that a training loop can
    move the whole set to the GPU once and normalise there.
    """

    def __init__(self, images: torch.Tensor, targets: torch.Tensor, classes: Sequence[str], name: str, split: str):
        if images.dtype != torch.uint8 or images.ndim != 4 or images.shape[1] != 3:
            raise ValueError(f"expected uint8 images of shape (N, 3, H, W), got {images.dtype} {tuple(images.shape)}")
        if len(images) != len(targets):
            raise ValueError(f"{len(images)} images but {len(targets)} targets")
        self.images = images
        self.targets = targets.long()
        self.classes = list(classes)
        self.name = name
        self.split = split
        self.mean = torch.tensor(MEAN).view(3, 1, 1)
        self.std = torch.tensor(STD).view(3, 1, 1)

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return self.normalize(self.images[index]), int(self.targets[index])

    def normalize(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 images (any leading shape) to floats normalised with the ImageNet statistics."""
        mean, std = self.mean.to(images.device), self.std.to(images.device)
        return (images.float() / 255.0 - mean) / std

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The whole split as (normalised float images, labels), for small in-memory sets."""
        return self.normalize(self.images), self.targets

    def __repr__(self) -> str:
        return f"ImageDataset(name={self.name!r}, split={self.split!r}, size={len(self)}, classes={len(self.classes)})"


def deterministic_split(keys: Sequence, test_fraction: float = TEST_FRACTION, salt: str = "") -> tuple[np.ndarray, np.ndarray]:
    """Split positions ``0..len(keys)-1`` into (train, test) by hashing each key.

    Appendix C.2 asks for deterministic splits for datasets without an official one. The keys
    are ordered by the SHA-256 of ``f"{salt}:{key}"`` and the first ``round(test_fraction * n)``
    go to test; no random generator is involved. Both index arrays are sorted.
    """
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction!r}")
    digests = [hashlib.sha256(f"{salt}:{key}".encode()).hexdigest() for key in keys]
    order = np.argsort(np.array(digests), kind="stable")
    n_test = int(round(test_fraction * len(keys)))
    return np.sort(order[n_test:]), np.sort(order[:n_test])


@lru_cache(maxsize=1)
def digits_images() -> tuple[np.ndarray, np.ndarray]:
    """All 1,797 scikit-learn digits as (N, 32, 32, 3) uint8 images and their digit labels."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    small = torch.from_numpy(digits.images).float().unsqueeze(1) * (255.0 / 16.0)
    large = torch.nn.functional.interpolate(small, size=(IMAGE_SIZE, IMAGE_SIZE), mode="bilinear", align_corners=False)
    gray = large.round().clamp(0, 255).to(torch.uint8)
    images = gray.expand(-1, 3, -1, -1).permute(0, 2, 3, 1).contiguous().numpy()
    return images, digits.target.astype(np.int64)


def _half(digit_set: Sequence[int]) -> np.ndarray:
    """Positions in scikit-learn's array of the digits in ``digit_set``."""
    _, labels = digits_images()
    return np.flatnonzero(np.isin(labels, digit_set))


def _split_positions(digit_set: Sequence[int], split: str) -> np.ndarray:
    positions = _half(digit_set)
    train, test = deterministic_split(positions.tolist(), salt="digits")
    return positions[train if split == "train" else test]


@lru_cache(maxsize=None)
def _corrupted(corruption: str, digit_set: tuple[int, ...]) -> np.ndarray:
    """All digits with the half ``digit_set`` corrupted, each image seeded by its position."""
    images, _ = digits_images()
    positions = _half(digit_set)
    out = images.copy()
    out[positions] = corrupt(images[positions], corruption, severity=SEVERITY, seed=0, keys=positions)
    return out


def _digits_dataset(name: str, split: str, digit_set: tuple[int, ...], corruption: str | None = None) -> ImageDataset:
    images, labels = digits_images()
    positions = _split_positions(digit_set, split)
    source = images if corruption is None else _corrupted(corruption, digit_set)
    chosen = torch.from_numpy(source[positions]).permute(0, 3, 1, 2).contiguous()
    targets = torch.from_numpy(labels[positions] - digit_set[0])
    return ImageDataset(chosen, targets, [str(d) for d in digit_set], name, split)


DATASETS: dict[str, Callable[[str], ImageDataset]] = {
    "digits_source": lambda split: _digits_dataset("digits_source", split, SOURCE_DIGITS),
    "digits": lambda split: _digits_dataset("digits", split, DOWNSTREAM_DIGITS),
    **{
        f"digits_c/{c}": (lambda split, c=c: _digits_dataset(f"digits_c/{c}", split, DOWNSTREAM_DIGITS, c))
        for c in CORRUPTIONS
    },
}
"""Dataset builders by name; each takes a split name."""

DEMO_DOWNSTREAM = ("digits",) + tuple(f"digits_c/{c}" for c in CORRUPTIONS)
"""The demo world's downstream datasets, in the order of the paper's Cifar10 / Cifar10-C."""


def dataset_names() -> list[str]:
    """Valid names for ``get_dataset``."""
    return list(DATASETS)


def get_dataset(name: str, split: str = "train") -> ImageDataset:
    """A dataset split by name: a torch Dataset of (normalised CHW float tensor, int label)."""
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; valid datasets: {', '.join(DATASETS)}")
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r} for dataset {name!r}; valid splits: {', '.join(SPLITS)}")
    return DATASETS[name](split)
