"""The authors' training loader, seeded: each image once as a random resized crop and flip, shuffled, in whole batches.

What the linear probe's augmented training features are computed on (``measure.probe``, ``train_features="augmented"``):
``augmented_batches`` cuts each crop from the image at its full resolution with torchvision (``SeededCrops``), or on the
device for images held whole no larger than the model's input (``crops_on_device``); crops, flips and order are drawn
from one seed.
"""

from __future__ import annotations

import copy

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from paperlib.data.imagesets import FileDataset, ImageDataset
from paperlib.data.loader import DeviceLoader, Transform, decode_workers
from paperlib.data.transforms import IMAGENET, paper_transform

AUGMENTED_BATCH = 512  # the authors' training loader's batch, whose last incomplete one is dropped


def image_seed(seed: int, index: int) -> int:
    """The seed of image ``index``'s crop and flip under the probe's ``seed``.

    A function of the pair alone (``numpy.random.SeedSequence``), so that neither the order nor the worker
    that transforms an image changes its crop."""
    return int(np.random.SeedSequence((seed % 2**64, index)).generate_state(1, np.uint64)[0])


def augmented_order(n: int, seed: int) -> list[int]:
    """The images of one shuffled epoch of the authors' training loader over ``n`` images.

    A permutation drawn from ``seed``, cut to whole batches of ``AUGMENTED_BATCH`` (the last incomplete one
    dropped; all ``n`` when they are fewer than a batch)."""
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    return order if n < AUGMENTED_BATCH else order[: n // AUGMENTED_BATCH * AUGMENTED_BATCH]


class SeededCrops(Dataset):
    """Items (normalised crop, label) of ``dataset``, each crop seeded by its image.

    Image ``index`` at its full resolution goes through ``transforms.paper_transform(augment=True)`` (the
    authors' ``build_transform(mode="train")``) inside ``torch.random.fork_rng``, seeded by
    ``image_seed(seed, index)``: the caller's random state is left as it was.
    """

    def __init__(self, dataset: ImageDataset | FileDataset, image_size: int, seed: int):
        self.dataset = copy.copy(dataset)  # the same images and labels, with the training transform
        self.dataset.transform = paper_transform(True, image_size, getattr(dataset, "mean_std", IMAGENET))
        self.seed = seed

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(image_seed(self.seed, index))
            return self.dataset[index]


def crops_on_device(dataset, image_size: int) -> bool:
    """Whether ``augmented_batches`` draws the crops of ``dataset`` on the device (``DeviceLoader``).

    So for images held whole in one array (the demo's digits, Cifar, Cifar10-C) no larger than the model's
    input: every crop is then an upsampling of the very pixels torchvision would read, where its
    antialiasing does nothing (the same crops within 1/255, ``transforms.resized_crops``)."""
    if not isinstance(dataset, ImageDataset) or not isinstance(dataset.images, torch.Tensor):
        return False  # image files, or decoded images of different sizes
    return max(dataset.images.shape[-2:]) <= image_size


def augmented_batches(dataset, image_size: int, device: torch.device, seed: int, num_workers: int | None = None):
    """(images, labels) batches of ``dataset`` as the authors' training loader gives them.

    Each image once, as one random resized crop of its full-resolution image and a random flip, shuffled, in
    batches of ``AUGMENTED_BATCH`` with the last incomplete one dropped (all in one batch if there are
    fewer); crops, flips and order drawn from ``seed``. Labels on the CPU.

    Image files and arrays larger than the model's input go through torchvision image by image
    (``SeededCrops``, ``augmented_order``) in a DataLoader of ``num_workers``; the others are cropped on
    the device (``crops_on_device``). docs/fidelity.md, "Training crops", compares them with the authors'."""
    batch = min(AUGMENTED_BATCH, len(dataset))
    if crops_on_device(dataset, image_size):
        loader = DeviceLoader(dataset, batch, Transform(True, image_size), device, drop_last=True, seed=seed)
        for images, labels in loader:
            yield images, labels.cpu()
        return
    if num_workers is None:
        num_workers = decode_workers() if device.type == "cuda" else 0
    crops = SeededCrops(dataset, image_size, seed)
    order = augmented_order(len(dataset), seed)
    loader = DataLoader(
        crops,
        batch_size=batch,
        sampler=order,
        num_workers=num_workers,
        pin_memory=device.type == "cuda",
        generator=torch.Generator().manual_seed(seed),  # its workers' seeds: not from the global generator
    )
    for images, labels in loader:
        yield images.to(device, non_blocking=True), labels
