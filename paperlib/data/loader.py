"""The fast data path: decode once into uint8, transform whole batches on the device.

At paper scale a run reads 5-10 million images, most of them 32x32 Cifar images upsampled to
224; resizing them one by one with PIL in DataLoader workers is what would bound the GPU. Here
each dataset is decoded once into a uint8 array (kept in memory, cached on disk for file
datasets, whole and with their aspect ratio: shorter side ``cache_side``), moved to the device
once, and every batch is cropped, resized, flipped and normalised there
(``transforms.device_transform``), with the augmentation distribution of the torchvision
transforms: a training crop is drawn from the whole image, as ``RandomResizedCrop`` draws it.
``torch.utils.data.DataLoader`` over ``get_dataset(...)`` stays the plain path, for CPUs and for
checking.
"""

from __future__ import annotations

import copy
import hashlib
import math
import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader
from torchvision.transforms import v2

from paperlib.data.imagesets import FileDataset, ImageDataset, UnevenImages
from paperlib.data.transforms import IMAGENET, as_mean_std, device_transform
from paperlib.records import paths, storage
from paperlib.speed import threads

CACHE_SIZE = 256  # shorter side of the uint8 images cached for file datasets (crops of 224 come from them)


def cache_side(image_size: int) -> int:
    """The shorter side of the cached images for a model of ``image_size``.

    ``CACHE_SIZE`` up to 224, and above it as much larger as 256 is than 224 (439 for a 384 model), so that
    a larger model's crops are cut from images that have its resolution, not upsampled from 256."""
    if not isinstance(image_size, int) or image_size < 1:
        raise ValueError(f"image_size must be a positive integer, got {image_size!r}")
    return max(CACHE_SIZE, math.ceil(image_size * CACHE_SIZE / 224))


def _cache_file(dataset: FileDataset, size: int, cache_dir: Path) -> Path:
    lines = list(map(str, dataset.keys))
    if dataset.stat_keyed:  # edited images get a new cache (one stat per file; official datasets skip it)
        lines += [f"{s.st_size}:{s.st_mtime_ns}" for s in map(os.stat, dataset.files)]
    digest = hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]
    # by content, not split name: trainval and the train/val parts share it ("short": whole images,
    # shorter side ``size``)
    return cache_dir / dataset.name.replace("/", "_") / f"{size}short-{digest}.npy"


def resized_size(height: int, width: int, shorter: int) -> tuple[int, int]:
    """(height, width) of an image in the cache, never upsampled.

    As ``v2.Resize(shorter)`` makes it (the shorter side to ``shorter``, the aspect ratio kept, the longer side
    rounded down as torchvision rounds it) when its shorter side is longer than ``shorter``; else as it is (crops of
    a small image are resampled from its own pixels, as the paper's transform resamples them)."""
    if min(height, width) <= shorter:
        return height, width
    if height <= width:
        return shorter, int(shorter * width / height)
    return int(shorter * height / width), shorter


class _Shrink:
    """The decoding transform of the cache: a PIL image to uint8 CHW, resized as ``resized_size`` says."""

    def __init__(self, shorter: int):
        self.shorter, self.resize = shorter, v2.Resize(shorter, antialias=True)

    def __call__(self, image) -> torch.Tensor:
        image = v2.functional.to_image(image)
        return self.resize(image) if min(image.shape[1:]) > self.shorter else image


def decode_workers() -> int:
    """DataLoader workers for decoding image files.

    One per core of this process's share (``threads``), at most 8 (more rarely pays)."""
    return min(8, max(1, threads.cores() // threads.workers()))


def uint8_images(
    dataset: ImageDataset | FileDataset,
    cache_size: int = CACHE_SIZE,
    cache_dir: str | Path | None = None,
    workers: int = 0,
) -> ImageDataset:
    """The dataset as uint8 arrays: array datasets as they are; file datasets decoded once.

    File images are resized whole, their shorter side to ``cache_size`` and their aspect ratio
    kept (``v2.Resize(cache_size)``; nothing is cropped, so a training crop can come from any
    part of the image; images no larger are kept as they are), and returned as ``UnevenImages``.
    They are stored in ``cache_dir`` (default ``<root>/cache``, the data root the dataset was read
    from) as two ``.npy`` files,
    the pixels one after another and the (N, 2) sizes, written atomically and reused by later
    calls with the same samples. A part of a dataset (``FileDataset.subset``: the protocol's train
    and val splits of the official training set) is read from the whole's cache, memory-mapped,
    so every seed's splits share one.
    """
    if isinstance(dataset, ImageDataset):
        return dataset
    if cache_dir is None:
        cache_dir = Path(getattr(dataset, "root", None) or paths.data_dir()) / "cache"
    whole, indices = (dataset.parent, dataset.parent_indices) if dataset.parent is not None else (dataset, None)
    pixels, sizes = _decoded(whole, cache_size, Path(cache_dir), workers)
    if indices is None:
        images = UnevenImages(torch.from_numpy(np.array(pixels)), torch.from_numpy(sizes))  # into memory
    else:
        images = UnevenImages(torch.from_numpy(pixels), torch.from_numpy(sizes)).select(indices)
    return ImageDataset(
        images,
        dataset.targets,
        dataset.classes,
        dataset.name,
        dataset.split,
        dataset.keys,
        mean_std=getattr(dataset, "mean_std", IMAGENET),
    )  # the normalisation get_dataset was given


def _decoded(dataset: FileDataset, cache_size: int, cache_dir: Path, workers: int) -> tuple[np.ndarray, np.ndarray]:
    """The dataset's images decoded with their shorter side ``cache_size``, as (flat pixels, (N, 2) sizes).

    From its cache files (the pixels memory-mapped), or decoded now and cached.

    The sizes are known from the files' headers before decoding, so the pixels are written into
    their place as they come and a dataset larger than memory can be cached. One process decodes
    (``storage.locked``): another that wants the same cache waits for it, then reads it. A cache that
    is not whole (``_cached``) is decoded again."""
    file = _cache_file(dataset, cache_size, cache_dir)
    sizes_file = file.with_name(file.stem + "-sizes.npy")
    cached = _cached(file, sizes_file, len(dataset.files))
    if cached is not None:
        return cached
    with storage.locked(file):
        cached = _cached(file, sizes_file, len(dataset.files))  # made meanwhile by the process waited for
        if cached is not None:
            return cached
        return _decode(dataset, cache_size, file, sizes_file, workers)


def _cached(file: Path, sizes_file: Path, count: int) -> tuple[np.ndarray, np.ndarray] | None:
    """(pixels memory-mapped, sizes) of a decoded cache, if both files are there and whole.

    Whole: ``count`` images, as many pixels as their sizes say. None otherwise, with a warning if they are damaged."""
    if not (file.is_file() and sizes_file.is_file()):
        return None
    try:
        sizes = np.load(sizes_file)
        pixels = np.load(file, mmap_mode="c")  # "c": writable for torch, never written
        whole = sizes.shape == (count, 2) and pixels.shape == (int(3 * sizes.prod(axis=1).sum()),)
    except (ValueError, OSError, EOFError):  # a truncated .npy
        whole = False
    if not whole:
        warnings.warn(f"the decoded cache {paths.display(file)} is not whole: decoding again")
        return None
    return pixels, sizes


def _decode(
    dataset: FileDataset, cache_size: int, file: Path, sizes_file: Path, workers: int
) -> tuple[np.ndarray, np.ndarray]:
    """Decode the dataset's images into the cache files; returns them as ``_cached`` does."""
    sizes = []
    for path in dataset.files:
        try:
            with Image.open(path) as image:  # reads the header only
                width, height = image.size
        except (OSError, ValueError, SyntaxError) as error:  # not an image, or cut short before its size
            raise ValueError(f"cannot read image {path}: {error}") from None
        sizes.append(resized_size(height, width, cache_size))
    sizes = np.asarray(sizes, dtype=np.int64).reshape(-1, 2)
    counts = 3 * sizes[:, 0] * sizes[:, 1]
    offsets = np.cumsum(counts) - counts
    view = copy.copy(dataset)
    view.transform = _Shrink(cache_size)

    def write_pixels(tmp: str) -> None:
        pixels = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.uint8, shape=(int(counts.sum()),))
        try:
            for index, (image, _) in enumerate(DataLoader(view, batch_size=None, num_workers=workers)):
                if tuple(image.shape[1:]) != tuple(sizes[index]):
                    raise RuntimeError(
                        f"{dataset.files[index]} decoded to {tuple(image.shape[1:])}, not {sizes[index]}"
                    )
                pixels[offsets[index] : offsets[index] + counts[index]] = image.numpy().reshape(-1)
        except ValueError as error:  # an image that cannot be read: from a worker, the last line of its traceback
            raise ValueError(str(error).strip().splitlines()[-1].removeprefix("ValueError: ")) from None
        pixels.flush()
        del pixels

    def write_sizes(tmp: str) -> None:
        with open(tmp, "wb") as handle:
            np.save(handle, sizes)

    storage.atomic_write(sizes_file, write_sizes)
    storage.atomic_write(file, write_pixels)  # last: its presence says the cache is whole
    return np.load(file, mmap_mode="c"), sizes


AUTO_DEVICE_FRACTION = 0.25  # of a GPU's memory, at most, for a dataset's images (the rest: model, activations)


def placement(nbytes: int, device: torch.device, total_memory: int | None = None) -> str:
    """Where ``DeviceLoader(images_on="auto")`` keeps ``nbytes`` of images: "device" or "host"."""
    if device.type != "cuda":
        return "device"
    if total_memory is None:
        total_memory = torch.cuda.get_device_properties(device).total_memory
    return "device" if nbytes <= AUTO_DEVICE_FRACTION * total_memory else "host"


@dataclass(frozen=True)
class Transform:
    """How a ``DeviceLoader`` transforms its images, validated when it is made.

    ``augment``, the paper's training transform (random resized crop + flip) instead of the evaluation one
    (resize + centre crop); ``image_size``, the output resolution; ``mean_std``, the (mean, std) per RGB
    channel to normalise with (None: the dataset's, which ``get_dataset(mean_std=...)`` sets, ImageNet's
    unless given; ``models.normalization`` gives a model's own)."""

    augment: bool
    image_size: int
    mean_std: tuple | None = None

    def __post_init__(self):
        if self.image_size < 1:
            raise ValueError(f"image_size must be a positive integer, got {self.image_size!r}")


class DeviceLoader:
    """Batches of (transformed float images, labels) produced on ``device`` from uint8 images.

    Args:
        dataset: an ``ImageDataset`` (see ``uint8_images``); its images move to ``device`` once.
        batch_size: images per batch.
        transform: a ``Transform``: augment or not, the output resolution, the normalisation. An augmenting
            (training) loader draws a new order every epoch; the others keep the dataset's.
        drop_last: drop the last incomplete batch.
        seed: seeds the order and the augmentations; same seed, same batches.
        images_on: ``"device"`` moves every uint8 image to ``device`` once (fastest);
            ``"host"`` keeps them in (pinned) host memory and copies each batch, for datasets
            larger than the device's memory (DomainNet sketch at 256x256 is about 14 GB);
            ``"auto"`` takes ``"device"`` unless the images would fill more than
            ``AUTO_DEVICE_FRACTION`` of a GPU's memory.
    """

    def __init__(
        self,
        dataset: ImageDataset,
        batch_size: int,
        transform: Transform,
        device: str | torch.device = "cpu",
        drop_last: bool = False,
        seed: int = 0,
        images_on: str = "device",
    ):
        if images_on not in ("device", "host", "auto"):
            raise ValueError(f"images_on must be 'device', 'host' or 'auto', got {images_on!r}")
        if not isinstance(dataset, ImageDataset):
            raise TypeError(
                "DeviceLoader needs uint8 images: pass paperlib.data.loader.uint8_images(dataset), "
                f"got {type(dataset).__name__}"
            )
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        self.device = torch.device(device)
        if images_on == "auto":
            images_on = placement(dataset.images.nbytes, self.device)
        self.images_on = images_on
        mean_std = transform.mean_std
        self.mean_std = as_mean_std(*(mean_std if mean_std is not None else dataset.mean_std))
        if images_on == "device":
            self.images = dataset.images.to(self.device)
        else:
            self.images = dataset.images.pin_memory() if self.device.type == "cuda" else dataset.images
        self.targets = dataset.targets.to(self.device)
        self.batch_size = batch_size
        self.augment = transform.augment
        self.image_size = transform.image_size
        self.drop_last = drop_last
        self.seed = seed
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        # images in host memory for a GPU go through two pinned staging buffers (see _gather); compared
        # by type, since a tensor moved to "cuda" lives on "cuda:0", which is not equal to "cuda"
        self._uneven = isinstance(self.images, UnevenImages)  # whole file images, each its own size
        self._staged = not self._uneven and self.images.device.type != self.device.type
        self._staging, self._copied, self._turn = [], [None, None], 0
        if self._staged:
            self._staging = [
                torch.empty((batch_size, *self.images.shape[1:]), dtype=self.images.dtype, pin_memory=True)
                for _ in range(2)
            ]

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Training batch number ``step`` (0-based), a pure function of (seed, step).

        Epoch ``e`` visits the images in a permutation drawn from (seed, e); augmentations are
        drawn from (seed, step). With ``drop_last`` (the authors' training loader), an epoch is its
        ``n // batch_size`` whole batches and the images left over wait for a later epoch; without
        it (or with fewer images than a batch), the next batch goes on into the next epoch.
        Nothing depends on earlier calls, so a resumed run sees exactly the batches an
        uninterrupted one would.
        """
        n = len(self.images)

        def epoch_order(epoch: int) -> torch.Tensor:
            return torch.randperm(n, generator=torch.Generator().manual_seed(self.seed * 1_000_003 + epoch))

        per_epoch = n // self.batch_size
        if self.drop_last and per_epoch:
            epoch, position = divmod(step, per_epoch)
            indices = epoch_order(epoch)[position * self.batch_size : (position + 1) * self.batch_size].tolist()
        else:
            first = step * self.batch_size
            indices = []
            while len(indices) < self.batch_size:
                epoch, offset = divmod(first + len(indices), n)
                indices.extend(epoch_order(epoch)[offset : offset + self.batch_size - len(indices)].tolist())
        index = torch.tensor(indices)
        on_device = index.pin_memory().to(self.device, non_blocking=True) if self.device.type == "cuda" else index
        augment = torch.Generator(device=self.device).manual_seed(self.seed * 1_000_003 + 7919 * (step + 1))
        images, sizes = self._gather(index, on_device)
        batch = device_transform(images, self.augment, self.image_size, augment, self.mean_std, sizes)
        return batch, self.targets[on_device]

    def _gather(self, index: torch.Tensor, on_device: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The uint8 images at ``index`` on ``self.device``, without making the host wait for it, and their sizes.

        ``index`` is on the host, ``on_device`` the same on ``self.device``; the sizes are None when the images all
        have the array's size.

        Images of different sizes (``UnevenImages``) are padded to the batch's largest, where
        they are, and moved to the device.

        Images on the device are indexed there. Images in pinned host memory are gathered into
        one of two pinned staging buffers and copied asynchronously; a buffer is reused only once
        the copy out of it has finished, so the next batch is gathered while the device works.
        (Gathering into pageable memory would make the copy wait for the device.)
        """
        if self._uneven:
            images, sizes = self.images.batch(index)
            return images.to(self.device), sizes
        if not self._staged:
            return self.images[on_device], None
        slot = self._turn
        self._turn ^= 1
        if self._copied[slot] is not None:
            self._copied[slot].synchronize()  # the copy out of this buffer, two batches ago
        staging = self._staging[slot][: len(index)]
        torch.index_select(self.images, 0, index, out=staging)
        images = staging.to(self.device, non_blocking=True)
        self._copied[slot] = torch.cuda.Event()
        self._copied[slot].record()
        return images, None

    def __len__(self) -> int:
        n = len(self.images)
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def __iter__(self):
        n = len(self.images)
        if self.augment:
            order = torch.randperm(n, device=self.device, generator=self.generator)
        else:
            order = torch.arange(n, device=self.device)
        host_order = order.cpu() if self._staged or self._uneven else order
        for batch in range(len(self)):
            rows = slice(batch * self.batch_size, (batch + 1) * self.batch_size)
            index = order[rows]
            images, sizes = self._gather(host_order[rows], index)
            yield (
                device_transform(images, self.augment, self.image_size, self.generator, self.mean_std, sizes),
                self.targets[index],
            )
