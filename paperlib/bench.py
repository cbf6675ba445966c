"""Benchmarks that print their figures (never timed tests).

    python -m paperlib.bench plasticity                 # demo ViT, plain definition vs measure
    python -m paperlib.bench plasticity --model vit_base_in21k --pairs 64 --batch-size 16
    python -m paperlib.bench finetune                   # demo ViT, every configuration
    python -m paperlib.bench finetune --model vit_base_in21k --batch-size 256 --device cuda

    python -m paperlib.bench data                       # fixture Cifar10 at 224, batch 512
    python -m paperlib.bench data --dataset digits --image-size 224
    python -m paperlib.bench data --dataset cifar10 --root /data --device cuda

``data`` measures images/s delivered as ready batches on the device by the two data paths on the
same dataset: torchvision transforms in DataLoader workers (then copied to the device), and the
device path (``paperlib.loader``: uint8 images on the device, batched crop/resize/flip/normalise).
Without ``--root``, a paper dataset is benchmarked on a fixture written in its official format
(random images, ``--fixture-size`` of them), so the figures measure the pipeline, not a disk.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import tempfile
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from . import data, fixtures
from .loader import DeviceLoader, uint8_images


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _rate(batches, device: torch.device, n_batches: int, warmup: int = 1) -> float:
    """Images/s over ``n_batches`` ready batches (after ``warmup`` batches)."""
    iterator = iter(batches)
    for _ in range(warmup):
        next(iterator)
    _sync(device)
    start, count = time.perf_counter(), 0
    for _ in range(n_batches):
        images, labels = next(iterator)
        images = images.to(device, non_blocking=True)
        labels = labels.to(device, non_blocking=True)
        count += len(images)
    _sync(device)
    rate = count / (time.perf_counter() - start)
    iterator.close()
    return rate


def _seconds(run, device: torch.device, warmup) -> float:
    """Wall seconds of ``run()`` after ``warmup()`` (allocations, kernels), device synchronised."""
    warmup()
    _sync(device)
    start = time.perf_counter()
    run()
    _sync(device)
    return time.perf_counter() - start


def _endless(loader):
    while True:
        yield from loader


def bench_data(
    dataset: str = "cifar10",
    root: str | None = None,
    batch_size: int = 512,
    image_size: int = 224,
    batches: int = 5,
    workers: int | None = None,
    device: str = "auto",
    fixture_size: int = 5000,
) -> dict:
    """Images/s of both data paths on one dataset; returns the figures."""
    device = _device(device)
    workers = os.cpu_count() if workers is None else workers
    with tempfile.TemporaryDirectory() as tmp:
        source = "local files"
        if root is None and data.DATASETS[data.check_dataset(dataset)].group != "demo":
            if dataset not in ("cifar10", "cifar100"):
                raise ValueError(f"fixture benchmarks support cifar10, cifar100 and the demo sets; pass --root for {dataset!r}")
            fixtures.write_cifar(Path(tmp), dataset, n_train=fixture_size, n_test=10)
            root, source = tmp, f"fixture of {fixture_size} random images in the official format"
        plain = data.get_dataset(dataset, "trainval", root=root, augment=True, image_size=image_size)
        loader = DataLoader(
            plain, batch_size=batch_size, shuffle=True, drop_last=True, num_workers=workers,
            pin_memory=device.type == "cuda", persistent_workers=workers > 0,
        )
        dataloader_rate = _rate(_endless(loader), device, batches)
        del loader  # shut its workers down before the next measurement
        gc.collect()
        start = time.perf_counter()
        cached = uint8_images(data.get_dataset(dataset, "trainval", root=root), cache_dir=Path(tmp) / "cache", workers=workers)
        device_loader = DeviceLoader(cached, batch_size, augment=True, image_size=image_size, device=device, drop_last=True)
        setup = time.perf_counter() - start
        device_rate = _rate(_endless(device_loader), device, batches)
    return {
        "dataset": dataset,
        "source": source,
        "images": len(plain),
        "batch_size": batch_size,
        "image_size": image_size,
        "device": _device_name(device),
        "dataloader_workers": workers,
        "dataloader_images_per_s": round(dataloader_rate, 1),
        "device_path_images_per_s": round(device_rate, 1),
        "device_path_setup_s": round(setup, 2),
        "speedup": round(device_rate / dataloader_rate, 2),
        "torch": torch.__version__,
    }


def _device(device: str) -> torch.device:
    return torch.device("cuda" if device == "auto" and torch.cuda.is_available() else ("cpu" if device == "auto" else device))


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return f"cuda: {torch.cuda.get_device_name(device)}"
    return f"cpu: {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads"


def bench_plasticity(model_name: str = "demo", pairs: int = 256, batch_size: int = 64, device: str = "auto", image_size: int | None = None) -> dict:
    """Pairs/s of the plain definition and of ``plasticity.measure`` on random images (no decoding)."""
    from torch.utils.data import TensorDataset

    from . import models, plasticity

    device = _device(device)
    model = models.create_model(model_name, pretrained=False).to(device).eval()
    size = image_size or model.patch_embed.img_size[0]
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(pairs, 3, size, size, generator=generator)
    y = torch.randn(pairs, 3, size, size, generator=generator)

    def plain() -> None:
        with torch.no_grad():
            for start in range(0, pairs, batch_size):
                plasticity.plain_rates(model, x[start : start + batch_size].to(device), y[start : start + batch_size].to(device)).cpu()

    def fast() -> None:
        plasticity.measure(model, TensorDataset(x, torch.zeros(pairs)), TensorDataset(y, torch.zeros(pairs)), pairs, batch_size, device, progress=False)

    rates = {name: pairs / _seconds(run, device, warmup=run) for name, run in (("plain", plain), ("measure", fast))}
    return {
        "model": f"{model_name} ({sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, {len(model.blocks)} blocks, {size}px, random weights)",
        "pairs": pairs,
        "batch_size": batch_size,
        "device": _device_name(device),
        "plain_pairs_per_s": round(rates["plain"], 1),
        "measure_pairs_per_s": round(rates["measure"], 1),
        "speedup": round(rates["measure"] / rates["plain"], 2),
        "seconds_for_12800_pairs": round(12800 / rates["measure"], 1),
        "torch": torch.__version__,
    }


PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0}  # dense bf16 tensor-core peaks


def _step_flops(model, images, labels) -> int:
    """FLOPs of one training step (forward + backward), counted by PyTorch."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        torch.nn.functional.cross_entropy(model(images), labels).backward()
    model.zero_grad(set_to_none=True)
    return counter.get_total_flops()


def bench_finetune(
    model_name: str = "demo",
    configs: tuple[str, ...] = ("full", "mha", "fc1", "ln1", "linear"),
    batch_size: int = 64,
    steps: int = 10,
    device: str = "auto",
    image_size: int | None = None,
    workers: int | None = None,
    source_size: int = 32,
) -> dict:
    """Training images/s per configuration: the library step vs a plain fp32 DataLoader loop.

    Random weights and synthetic uint8 images of ``source_size`` pixels (Cifar-like), upsampled to
    the model's resolution with the paper's training transform. The library step: images on the
    device, batched augmentation, bf16 autocast on CUDA, only trainable weights get gradients.
    The plain loop (what the authors' code does): torchvision transforms in DataLoader workers,
    fp32, ``requires_grad`` set the same way.
    """
    from torch.utils.data import DataLoader

    from . import components, models
    from .data import ImageDataset
    from .transforms import paper_transform

    device = _device(device)
    workers = os.cpu_count() if workers is None else workers
    cuda = device.type == "cuda"
    model = models.create_model(model_name, pretrained=False, num_classes=10).to(device)
    size = image_size or model.patch_embed.img_size[0]
    generator = torch.Generator().manual_seed(0)
    n = batch_size * 4
    dataset = ImageDataset(torch.randint(0, 256, (n, 3, source_size, source_size), dtype=torch.uint8, generator=generator),
                           torch.randint(0, 10, (n,), generator=generator), [str(i) for i in range(10)], "synthetic", "train")
    fast = DeviceLoader(dataset, batch_size, augment=True, image_size=size, device=device)
    plain_set = ImageDataset(dataset.images, dataset.targets, dataset.classes, "synthetic", "train", transform=paper_transform(True, size))
    plain_loader = DataLoader(plain_set, batch_size, shuffle=True, drop_last=True, num_workers=workers, pin_memory=cuda, persistent_workers=workers > 0)
    peak = next((v for k, v in PEAK_TFLOPS.items() if cuda and k in torch.cuda.get_device_name(device)), None)
    result = {"model": f"{model_name} ({size}px, random weights)", "batch_size": batch_size, "device": _device_name(device),
              "dataloader_workers": workers, "peak_tflops_bf16": peak}
    for config in configs:
        components.set_trainable(model, config)
        optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1e-3, momentum=0.9)
        images, labels = fast.batch(0)
        flops = _step_flops(model, images, labels)

        def library_step(step: int) -> None:
            x, y = fast.batch(step)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
                loss = torch.nn.functional.cross_entropy(model(x).float(), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0)
            optimizer.step()

        def plain_steps(count: int):
            iterator = _endless(plain_loader)
            for _ in range(count):
                x, y = next(iterator)
                x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
                loss = torch.nn.functional.cross_entropy(model(x), y)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0)
                optimizer.step()
            iterator.close()

        rates = {
            "library": batch_size * steps / _seconds(lambda: [library_step(s) for s in range(steps)], device, warmup=lambda: library_step(0)),
            "plain": batch_size * steps / _seconds(lambda: plain_steps(steps), device, warmup=lambda: plain_steps(1)),
        }
        result[f"{config}_library_images_per_s"] = round(rates["library"], 1)
        result[f"{config}_plain_images_per_s"] = round(rates["plain"], 1)
        result[f"{config}_speedup"] = round(rates["library"] / rates["plain"], 2)
        achieved = flops / batch_size * rates["library"] / 1e12
        result[f"{config}_library_tflops"] = round(achieved, 3)
        if peak:
            result[f"{config}_library_mfu"] = round(achieved / peak, 3)
    del plain_loader
    gc.collect()
    result["torch"] = torch.__version__
    return result


def _print(result: dict, json_path: Path | None) -> None:
    width = max(map(len, result))
    for key, value in result.items():
        print(f"{key:<{width}}  {value}")
    if json_path:
        json_path.write_text(json.dumps(result, indent=2) + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m paperlib.bench", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    d = commands.add_parser("data", help="images/s of the DataLoader path and the device path")
    d.add_argument("--dataset", default="cifar10", help=f"one of: {', '.join(data.dataset_names())}")
    d.add_argument("--root", default=None, help="data root with the real files (default: a fixture)")
    d.add_argument("--batch-size", type=int, default=512)
    d.add_argument("--image-size", type=int, default=224)
    d.add_argument("--batches", type=int, default=5, help="timed batches per path (after one warm-up batch)")
    d.add_argument("--workers", type=int, default=None, help="DataLoader workers (default: all CPU cores)")
    d.add_argument("--device", default="auto", help="cuda, cpu or auto")
    d.add_argument("--fixture-size", type=int, default=5000)
    d.add_argument("--json", type=Path, default=None, help="also write the figures to this file")
    p = commands.add_parser("plasticity", help="pairs/s of the plain definition and of plasticity.measure")
    p.add_argument("--model", default="demo", help="demo, vit_base_in21k, ... (random weights)")
    p.add_argument("--pairs", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--image-size", type=int, default=None, help="default: the model's")
    p.add_argument("--device", default="auto", help="cuda, cpu or auto")
    p.add_argument("--json", type=Path, default=None, help="also write the figures to this file")
    f = commands.add_parser("finetune", help="training images/s per configuration: library step vs plain fp32 DataLoader loop")
    f.add_argument("--model", default="demo", help="demo, vit_base_in21k, ... (random weights)")
    f.add_argument("--configs", default="full,mha,fc1,ln1,linear", help="comma-separated configurations")
    f.add_argument("--batch-size", type=int, default=64)
    f.add_argument("--steps", type=int, default=10, help="timed steps per path (after one warm-up step)")
    f.add_argument("--image-size", type=int, default=None, help="default: the model's")
    f.add_argument("--workers", type=int, default=None, help="DataLoader workers of the plain loop (default: all CPU cores)")
    f.add_argument("--device", default="auto", help="cuda, cpu or auto")
    f.add_argument("--json", type=Path, default=None, help="also write the figures to this file")
    args = parser.parse_args(argv)
    try:
        if args.command == "data":
            result = bench_data(args.dataset, args.root, args.batch_size, args.image_size, args.batches, args.workers, args.device, args.fixture_size)
        elif args.command == "plasticity":
            result = bench_plasticity(args.model, args.pairs, args.batch_size, args.device, args.image_size)
        else:
            result = bench_finetune(args.model, tuple(args.configs.split(",")), args.batch_size, args.steps, args.device, args.image_size, args.workers)
    except ValueError as error:
        parser.exit(2, f"error: {error}\n")
    _print(result, args.json)


if __name__ == "__main__":
    main()
