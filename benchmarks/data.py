"""The benchmarks of the data path and of plasticity (they train nothing; the training step's are ``step``).

- ``bench_data``: images/s delivered as ready batches on the device by the two data paths on the
  same dataset (``python -m benchmarks data``).
- ``bench_plasticity``: pairs/s of plasticity's plain definition and of ``plasticity.measure``
  (``python -m benchmarks plasticity``).

Both measure with ``paperlib.speed.clock`` (the device, and a clock that waits for it), as the step benchmarks do.
"""

from __future__ import annotations

import gc
import os
import tempfile
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from paperlib.data import datasets, fixtures
from paperlib.data.loader import DeviceLoader, Transform, cache_side, uint8_images
from paperlib.data.transforms import paper_transform
from paperlib.measure import component_rates, plasticity
from paperlib.speed.clock import device_name, endless, median_seconds, resolve_device, sync
from paperlib.vit import models


def _rate(batches, device: torch.device, n_batches: int, warmup: int = 1) -> float:
    """Images/s over ``n_batches`` ready batches (after ``warmup`` batches)."""
    iterator = iter(batches)
    for _ in range(warmup):
        next(iterator)
    sync(device)
    start, count = time.perf_counter(), 0
    for _ in range(n_batches):
        images, labels = next(iterator)
        images = images.to(device, non_blocking=True)
        labels = labels.to(device, non_blocking=True)
        count += len(images)
    sync(device)
    rate = count / (time.perf_counter() - start)
    iterator.close()
    return rate


def bench_data(
    dataset: str = "cifar10",
    data: str | Path | int = 5000,
    batch_size: int = 512,
    image_size: int = 224,
    batches: int = 5,
    workers: int | None = None,
    device: str = "auto",
) -> dict:
    """Images/s of both data paths on one dataset; returns the figures.

    The two paths: torchvision transforms in DataLoader workers (then copied to the device), and
    the device path (``paperlib.data.loader``: uint8 images on the device, batched crop/resize/flip/
    normalise). ``data``: the data root with the real files, or a number of random images: a paper
    dataset is then benchmarked on a fixture of that many written in its official format, so the
    figures measure the pipeline, not a disk (the demo sets and ``custom/<name>`` are read from the
    default data root).
    """
    device = resolve_device(device)
    workers = os.cpu_count() if workers is None else workers
    root = None if isinstance(data, int) else data
    with tempfile.TemporaryDirectory() as tmp:
        source = "local files"
        if root is None and datasets.dataset_source(dataset).group not in ("demo", "custom"):
            if dataset not in ("cifar10", "cifar100"):
                raise ValueError(
                    f"fixture benchmarks support cifar10, cifar100 and the demo sets; pass --root for {dataset!r}"
                )
            fixtures.write_cifar(Path(tmp), dataset, n_train=data, n_test=10)
            root, source = tmp, f"fixture of {data} random images in the official format"
        plain = datasets.get_dataset(dataset, "trainval", root=root, image_size=image_size)
        plain.transform = paper_transform(True, image_size, plain.mean_std)
        loader = DataLoader(
            plain,
            batch_size=batch_size,
            shuffle=True,
            drop_last=True,
            num_workers=workers,
            pin_memory=device.type == "cuda",
            persistent_workers=workers > 0,
        )
        dataloader_rate = _rate(endless(loader), device, batches)
        del loader  # shut its workers down before the next measurement
        gc.collect()
        start = time.perf_counter()
        cached = uint8_images(
            datasets.get_dataset(dataset, "trainval", root=root),
            cache_side(image_size),
            cache_dir=Path(tmp) / "cache",
            workers=workers,
        )
        device_loader = DeviceLoader(cached, batch_size, Transform(True, image_size), device=device, drop_last=True)
        setup = time.perf_counter() - start
        device_rate = _rate(endless(device_loader), device, batches)
    return {
        "dataset": dataset,
        "source": source,
        "images": len(plain),
        "batch_size": batch_size,
        "image_size": image_size,
        "device": device_name(device),
        "dataloader_workers": workers,
        "dataloader_images_per_s": round(dataloader_rate, 1),
        "device_path_images_per_s": round(device_rate, 1),
        "device_path_setup_s": round(setup, 2),
        "speedup": round(device_rate / dataloader_rate, 2),
        "torch": torch.__version__,
    }


class _Cycled(torch.utils.data.Dataset):
    """``length`` (image, 0) samples cycling through a small pool of images: many pairs, little host memory."""

    def __init__(self, pool: torch.Tensor, length: int):
        self.pool, self.length = pool, length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        return self.pool[index % len(self.pool)], 0


def bench_plasticity(
    model_name: str = "demo",
    pairs: int = 256,
    batch_size: int = 64,
    device: str = "auto",
    image_size: int | None = None,
    repeats: int = 3,
) -> dict:
    """Pairs/s of the plain definition and of ``plasticity.measure`` on random images (no decoding).

    Both stream the same ``pairs`` pairs in batches of ``batch_size`` from host memory (images
    cycle through a pool of at most 512 per side), after a warm-up on one batch; median of
    ``repeats`` interleaved timings.
    """
    device = resolve_device(device)
    model = models.create_model(model_name, pretrained=False).to(device).eval()
    size = image_size or model.patch_embed.img_size[0]
    generator = torch.Generator().manual_seed(0)
    pool = min(pairs, 512)
    reference = _Cycled(torch.randn(pool, 3, size, size, generator=generator), pairs)
    target = _Cycled(torch.randn(pool, 3, size, size, generator=generator), pairs)

    def plain(count: int) -> None:
        with torch.no_grad():
            for start in range(0, count, batch_size):
                index = range(start, min(start + batch_size, count))
                x = torch.stack([reference[i][0] for i in index]).to(device, non_blocking=True)
                y = torch.stack([target[i][0] for i in index]).to(device, non_blocking=True)
                component_rates.plain_rates(model, x, y).cpu()

    def fast(count: int) -> None:
        plasticity.measure(
            model, reference, target, count, running=plasticity.Running(batch_size, device, progress=False)
        )

    first = min(batch_size, pairs)
    seconds = median_seconds(
        {"plain": (lambda: plain(pairs), lambda: plain(first)), "measure": (lambda: fast(pairs), lambda: fast(first))},
        device,
        repeats,
    )
    rates = {name: pairs / value for name, value in seconds.items()}
    return {
        "model": (
            f"{model_name} ({sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, "
            f"{len(model.blocks)} blocks, {size}px, random weights)"
        ),
        "pairs": pairs,
        "batch_size": batch_size,
        "repeats": repeats,
        "device": device_name(device),
        "plain_pairs_per_s": round(rates["plain"], 1),
        "measure_pairs_per_s": round(rates["measure"], 1),
        "speedup": round(rates["measure"] / rates["plain"], 2),
        "seconds_for_12800_pairs": round(12800 / rates["measure"], 1),
        "torch": torch.__version__,
    }
