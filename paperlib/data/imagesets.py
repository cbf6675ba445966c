"""Datasets of images with their labels, as every loader of ``datasets`` returns them.

``ImageDataset`` (uint8 images held in memory: the demo world, Cifar, Cifar10-C) and ``FileDataset`` (image files
decoded on access: Pets, Flowers102, DomainNet, ImageNet, your own folders); ``stack`` gathers the
first items of either into tensors. ``UnevenImages`` holds uint8 images of different sizes (decoded
image files keep their aspect ratio, ``loader.uint8_images``); ``random_images``, random ones to time a
step on."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Subset
from torchvision.datasets.folder import default_loader

from paperlib.data.transforms import IMAGENET, normalize


class UnevenImages:
    """uint8 CHW images of different sizes, one after another in one flat buffer.

    ``pixels``: every image's bytes (C, H, W order), concatenated; ``sizes``: (N, 2) int64, each
    image's height and width. ``images[i]`` is image ``i`` (a view); ``batch(index)`` pads a batch to
    its largest height and width (zeros at the bottom and right, which a crop inside each image's
    own size never reads).
    """

    def __init__(self, pixels: torch.Tensor, sizes: torch.Tensor):
        sizes = torch.as_tensor(sizes, dtype=torch.long).cpu()
        if pixels.dtype != torch.uint8 or pixels.ndim != 1 or sizes.ndim != 2 or sizes.shape[1] != 2:
            raise ValueError(
                f"expected flat uint8 pixels and (N, 2) sizes, got {pixels.dtype} {tuple(pixels.shape)} "
                f"and {tuple(sizes.shape)}"
            )
        counts = 3 * sizes[:, 0] * sizes[:, 1]
        if int(counts.sum()) != len(pixels):
            raise ValueError(f"sizes account for {int(counts.sum())} bytes but pixels has {len(pixels)}")
        self.pixels, self.sizes = pixels, sizes
        self.offsets = torch.cumsum(counts, 0) - counts

    def __len__(self) -> int:
        return len(self.sizes)

    def __getitem__(self, index: int) -> torch.Tensor:
        (height, width), start = self.sizes[index].tolist(), int(self.offsets[index])
        return self.pixels[start : start + 3 * height * width].view(3, height, width)

    @property
    def nbytes(self) -> int:
        return self.pixels.nbytes

    @property
    def device(self) -> torch.device:
        return self.pixels.device

    def to(self, device) -> "UnevenImages":
        return UnevenImages(self.pixels.to(device), self.sizes)

    def pin_memory(self) -> "UnevenImages":
        return UnevenImages(self.pixels.pin_memory(), self.sizes)

    def select(self, indices: Sequence[int]) -> "UnevenImages":
        """The images at ``indices``, in that order, copied into a buffer of their own."""
        indices = torch.as_tensor(list(indices), dtype=torch.long)
        sizes = self.sizes[indices]
        pixels = torch.empty(int((3 * sizes[:, 0] * sizes[:, 1]).sum()), dtype=torch.uint8, device=self.device)
        selected = UnevenImages(pixels, sizes)
        for k in torch.argsort(indices).tolist():  # in storage order: a memory-mapped buffer is read forward
            selected[k].copy_(self[int(indices[k])])
        return selected

    def batch(self, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The images at ``index`` (host indices) as one zero-padded (B, 3, H, W) uint8 tensor.

        The pixels are where they are in it (top left); their (B, 2) heights and widths come with it."""
        index = index.cpu()
        sizes = self.sizes[index]
        height, width = sizes.max(dim=0).values.tolist()
        out = torch.zeros((len(index), 3, height, width), dtype=torch.uint8, device=self.pixels.device)
        for row, i in enumerate(index.tolist()):
            image = self[i]
            out[row, :, : image.shape[1], : image.shape[2]] = image
        return out, sizes


class ImageDataset(Dataset):
    """uint8 images held as one array; items are (normalised CHW float tensor, int label).

    ``images`` (N, 3, H, W) uint8 (or ``UnevenImages`` of different sizes) and ``targets`` (N,) int64
    are public so that a training loop can move the whole set to the GPU once and transform it there
    (``paperlib.data.loader``). Without a ``transform`` items are the images normalised at their own size;
    with one set (``dataset.transform = transforms.paper_transform(...)``, as ``get_dataset`` sets it) the
    transform receives the uint8 CHW tensor.
    """

    def __init__(
        self,
        images: torch.Tensor,
        targets: torch.Tensor,
        classes: Sequence[str],
        name: str,
        split: str,
        keys: Sequence | None = None,
        mean_std: tuple = IMAGENET,
    ):
        uneven = isinstance(images, UnevenImages)
        if not uneven and (images.dtype != torch.uint8 or images.ndim != 4 or images.shape[1] != 3):
            raise ValueError(f"expected uint8 images of shape (N, 3, H, W), got {images.dtype} {tuple(images.shape)}")
        if len(images) != len(targets):
            raise ValueError(f"{len(images)} images but {len(targets)} targets")
        self.images = images
        self.targets = torch.as_tensor(targets).long()
        self.classes = list(classes)
        self.name = name
        self.split = split
        self.keys = list(range(len(images))) if keys is None else list(keys)
        self.transform: Callable | None = None
        self.mean_std = mean_std  # how items without a transform are normalised (get_dataset sets it)

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        image = self.images[index]
        image = self.transform(image) if self.transform is not None else self.normalize(image)
        return image, int(self.targets[index])

    def normalize(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 images (any leading shape) to floats normalised with ``mean_std``.

        ImageNet's statistics unless ``get_dataset`` was given others."""
        return normalize(images.float() / 255.0, self.mean_std)

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The whole split as (normalised float images, labels), for small in-memory sets."""
        if isinstance(self.images, UnevenImages):
            raise ValueError(f"{self.name}'s images differ in size; transform them (paper_transform) and stack()")
        return self.normalize(self.images), self.targets

    def subset(self, indices: Sequence[int], split: str) -> "ImageDataset":
        index = torch.as_tensor(np.asarray(indices, dtype=np.int64))
        keys = [self.keys[i] for i in index.tolist()]
        images = self.images.select(index.tolist()) if isinstance(self.images, UnevenImages) else self.images[index]
        part = ImageDataset(images, self.targets[index], self.classes, self.name, split, keys, self.mean_std)
        part.transform = self.transform
        return part

    def __repr__(self) -> str:
        return f"ImageDataset(name={self.name!r}, split={self.split!r}, size={len(self)}, classes={len(self.classes)})"


def random_images(n: int, side: int, classes: int = 10) -> ImageDataset:
    """``n`` random uint8 images of ``side`` x ``side`` pixels with random labels of ``classes`` classes.

    The same on every call (seeded): what a step is timed on (``plan.time_step``, the benchmarks)."""
    generator = torch.Generator().manual_seed(0)
    return ImageDataset(
        torch.randint(0, 256, (n, 3, side, side), dtype=torch.uint8, generator=generator),
        torch.randint(0, classes, (n,), generator=generator),
        [str(i) for i in range(classes)],
        "synthetic",
        "train",
    )


class FileDataset(Dataset):
    """Images read from files (decoded with PIL on access); items are (transformed image, int label).

    A ``transform`` set on it (``get_dataset`` sets one) receives the PIL image."""

    def __init__(
        self,
        files: Sequence[Path],
        targets: Sequence[int],
        classes: Sequence[str],
        name: str,
        split: str,
        keys: Sequence | None = None,
        stat_keyed: bool = False,
    ):
        if len(files) != len(targets):
            raise ValueError(f"{len(files)} files but {len(targets)} targets")
        self.files = [Path(f) for f in files]
        self.targets = torch.as_tensor(list(targets), dtype=torch.long)
        self.classes = list(classes)
        self.name = name
        self.split = split
        self.keys = [str(f) for f in self.files] if keys is None else list(keys)
        self.transform: Callable | None = None
        # the images may change under the same names (custom datasets): decoded caches are keyed by
        # each file's size and modification time too (loader.uint8_images)
        self.stat_keyed = stat_keyed
        self.parent, self.parent_indices = None, None  # set by subset()

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int):
        try:
            image = default_loader(str(self.files[index]))
        except (OSError, ValueError, SyntaxError) as error:  # truncated, damaged, not an image
            raise ValueError(f"cannot read image {self.files[index]}: {error}") from None
        return (self.transform(image) if self.transform is not None else image), int(self.targets[index])

    def subset(self, indices: Sequence[int], split: str) -> "FileDataset":
        indices = [int(i) for i in indices]
        part = FileDataset(
            [self.files[i] for i in indices],
            self.targets[indices].tolist(),
            self.classes,
            self.name,
            split,
            [self.keys[i] for i in indices],
            self.stat_keyed,
        )
        part.transform = self.transform
        # where it came from: loader.uint8_images decodes (and caches) the whole once, so the
        # protocol's train and val splits of every seed share one cache of the official split
        part.parent, part.parent_indices = (
            (self.parent, [self.parent_indices[i] for i in indices]) if self.parent is not None else (self, indices)
        )
        return part

    def __repr__(self) -> str:
        return f"FileDataset(name={self.name!r}, split={self.split!r}, size={len(self)}, classes={len(self.classes)})"


def stack(
    dataset: Dataset, n: int | None = None, batch_size: int = 256, num_workers: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``n`` items of a dataset (all by default) as one (images, labels) pair of tensors."""
    n = len(dataset) if n is None else n
    if not 0 < n <= len(dataset):
        raise ValueError(f"n must be in 1..{len(dataset)} for {getattr(dataset, 'name', 'this dataset')}, got {n}")
    images, labels = zip(*DataLoader(Subset(dataset, range(n)), batch_size=batch_size, num_workers=num_workers))
    return torch.cat(images), torch.cat(labels)
