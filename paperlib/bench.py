"""Benchmarks that print their figures (never timed tests).

    python -m paperlib.bench plasticity                 # demo ViT, plain definition vs measure
    python -m paperlib.bench plasticity --model vit_base_in21k --pairs 64 --batch-size 16
    python -m paperlib.bench finetune                   # demo ViT, every configuration
    python -m paperlib.bench finetune --model vit_base_in21k --batch-size 256 --device cuda

    python -m paperlib.bench data                       # fixture Cifar10 at 224, batch 512
    python -m paperlib.bench data --dataset digits --image-size 224
    python -m paperlib.bench data --dataset cifar10 --root /data --device cuda

    python -m paperlib.bench targets --out bench-out     # all of them at the issues' settings, checked
    python -m paperlib.bench profile --model vit_base_in21k --batch-size 256 --device cuda   # where a step's time goes
    python -m paperlib.bench variants --model vit_base_in21k --batch-sizes 256,512 --attention auto,flash,cudnn \
        --device cuda --json variants.json                # one step under each compilation / attention kernel
    python -m paperlib.bench kernels --device cuda        # our fused ops alone, against a copy of their bytes

``data`` measures images/s delivered as ready batches on the device by the two data paths on the
same dataset: torchvision transforms in DataLoader workers (then copied to the device), and the
device path (``paperlib.loader``: uint8 images on the device, batched crop/resize/flip/normalise).
Without ``--root``, a paper dataset is benchmarked on a fixture written in its official format
(random images, ``--fixture-size`` of them), so the figures measure the pipeline, not a disk.
"""

from __future__ import annotations

import argparse
import copy
import gc
import itertools
import json
import os
import platform
import statistics
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from . import data, fixtures, paths
from .loader import DeviceLoader, cache_side, uint8_images


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


def _seconds(runs: dict, device: torch.device, repeats: int = 1) -> dict[str, float]:
    """Median wall seconds of each ``runs[name] = (run, warmup)``, device synchronised.

    Every warm-up (allocations, kernels, compilation) runs first; then the runs are timed in
    turn, ``repeats`` rounds, so that a slow spell of a shared machine falls on all of them.
    """
    for _, warmup in runs.values():
        warmup()
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, (run, _) in runs.items():
            _sync(device)
            start = time.perf_counter()
            run()
            _sync(device)
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


class _Timed:
    """A callable that runs ``run`` and keeps its wall seconds (device synchronised) in ``seconds``
    and its return value in ``value``."""

    def __init__(self, run, device: torch.device):
        self.run, self.device, self.seconds, self.value = run, device, float("nan"), None

    def __call__(self):
        _sync(self.device)
        start = time.perf_counter()
        self.value = self.run()
        _sync(self.device)
        self.seconds = time.perf_counter() - start
        return self.value


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
        if root is None and data.dataset_source(dataset).group not in ("demo", "custom"):
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
        cached = uint8_images(data.get_dataset(dataset, "trainval", root=root), cache_side(image_size), cache_dir=Path(tmp) / "cache", workers=workers)
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


class _Cycled(torch.utils.data.Dataset):
    """``length`` (image, 0) samples cycling through a small pool of images: many pairs, little host memory."""

    def __init__(self, pool: torch.Tensor, length: int):
        self.pool, self.length = pool, length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        return self.pool[index % len(self.pool)], 0


def bench_plasticity(
    model_name: str = "demo", pairs: int = 256, batch_size: int = 64, device: str = "auto", image_size: int | None = None, repeats: int = 3
) -> dict:
    """Pairs/s of the plain definition and of ``plasticity.measure`` on random images (no decoding).

    Both stream the same ``pairs`` pairs in batches of ``batch_size`` from host memory (images
    cycle through a pool of at most 512 per side), after a warm-up on one batch; median of
    ``repeats`` interleaved timings.
    """
    from . import models, plasticity

    device = _device(device)
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
                plasticity.plain_rates(model, x, y).cpu()

    def fast(count: int) -> None:
        plasticity.measure(model, reference, target, count, batch_size, device, progress=False)

    first = min(batch_size, pairs)
    seconds = _seconds({"plain": (lambda: plain(pairs), lambda: plain(first)), "measure": (lambda: fast(pairs), lambda: fast(first))}, device, repeats)
    rates = {name: pairs / value for name, value in seconds.items()}
    return {
        "model": f"{model_name} ({sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, {len(model.blocks)} blocks, {size}px, random weights)",
        "pairs": pairs,
        "batch_size": batch_size,
        "repeats": repeats,
        "device": _device_name(device),
        "plain_pairs_per_s": round(rates["plain"], 1),
        "measure_pairs_per_s": round(rates["measure"], 1),
        "speedup": round(rates["measure"] / rates["plain"], 2),
        "seconds_for_12800_pairs": round(12800 / rates["measure"], 1),
        "torch": torch.__version__,
    }


PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0}  # dense bf16 tensor-core peaks


def _peak_tflops(device: torch.device) -> float | None:
    """The dense bf16 peak of ``device`` if it is a GPU of ``PEAK_TFLOPS``, else None (no utilisation)."""
    if device.type != "cuda":
        return None
    return next((value for name, value in PEAK_TFLOPS.items() if name in torch.cuda.get_device_name(device)), None)


def _significant(value: float, digits: int = 5) -> float:
    """``value`` to ``digits`` significant digits (a CPU's TFLOP/s would round to 0.0 at 3 decimals)."""
    return float(f"{value:.{digits}g}")


def _step_flops(model, images, labels) -> int:
    """FLOPs of one training step (forward + backward) of the eager model on ``images`` as its
    parameters' ``requires_grad`` stand, counted by PyTorch (blocks compiled in place are returned
    to eager). Counted on one image and multiplied by the batch (every counted op of a ViT is linear
    in the batch; a test checks it): a counting pass at the full batch in fp32 would need about
    twice the activation memory of the bf16 step it is for (the likely cause of batch 1024 running
    out of memory on an H100; not yet re-run there)."""
    from torch.utils.flop_counter import FlopCounterMode

    from . import finetune

    finetune.compile_model(model, "none", fused="none")  # counting must not put in fused ops a row may not want
    counter = FlopCounterMode(display=False)
    with counter:
        torch.nn.functional.cross_entropy(model(images[:1]), labels[:1]).backward()
    model.zero_grad(set_to_none=True)
    return counter.get_total_flops() * len(images)


def _synthetic_train_set(n: int, source_size: int):
    """``n`` random uint8 images of ``source_size`` pixels (Cifar-like) with labels of 10 classes."""
    from .data import ImageDataset

    generator = torch.Generator().manual_seed(0)
    return ImageDataset(torch.randint(0, 256, (n, 3, source_size, source_size), dtype=torch.uint8, generator=generator),
                        torch.randint(0, 10, (n,), generator=generator), [str(i) for i in range(10)], "synthetic", "train")


def _library_steps(model, config: str, loader: DeviceLoader, batch_size: int, device: torch.device, options, lora_rank: int = 0):
    """The library's training step for ``config``, as ``finetune.train`` runs it (its optimizer, and
    ``options``, a checked ``finetune.StepOptions``; with ``lora_rank``, the model carries its LoRA
    layers): returns ``steps(first, count)``, which trains on the loader's batches ``first`` to
    ``first + count - 1`` and returns the last (loss, norm)."""
    from . import components, finetune

    finetune.set_trainable(model, config, lora_rank)
    trainable = [p for _, p in components.trainable_parameters(model)]
    optimizer = finetune.make_optimizer(trainable, 1e-3, 0.9, device, finetune.fuses_update(options.fused, device))
    forward = finetune.make_forward(model, options)
    context = finetune.step_context(device, options.attention, options.graph)
    one_step = finetune.make_step(forward, trainable, optimizer, batch_size, 1.0, context, options.graph)

    def steps(first: int, count: int):
        for step in range(first, first + count):
            last = one_step(*loader.batch(step))
        return last

    return steps


def bench_finetune(
    model_name: str = "demo",
    configs: tuple[str, ...] = ("full", "mha", "fc1", "ln1", "linear"),
    batch_size: int = 64,
    steps: int = 10,
    device: str = "auto",
    image_size: int | None = None,
    workers: int | None = None,
    source_size: int = 32,
    compile: bool | str = False,
    plain: bool = True,
    repeats: int = 3,
    compile_mode: str = "default",
    attention: str = "auto",
    precision: str = "autocast",
    fused: str = "auto",
    graph: bool = False,
    lora_rank: int = 0,
) -> dict:
    """Training images/s per configuration: the library step vs a plain fp32 DataLoader loop.

    Random weights and synthetic uint8 images of ``source_size`` pixels (Cifar-like), upsampled to
    the model's resolution with the paper's training transform. The library step is
    ``finetune.training_step`` with ``finetune``'s optimizer and precision (images on the device,
    batched augmentation, bf16 autocast and a fused SGD update on CUDA, only trainable weights get
    gradients, ``finetune.compile_model`` with ``compile``, ``compile_mode`` and the kernel chosen
    by ``attention``, ``precision``, the ``fused`` ops and ``graph``); its first steps (with any compilation) are timed apart as
    ``warmup_seconds``. The plain loop (what the authors' code does): a twin of the timm model as
    created, torchvision transforms in DataLoader workers, fp32, ``requires_grad`` set the same way.
    Model FLOP utilisation counts the FLOPs PyTorch reports for one step (forward and backward).
    Median of ``repeats`` interleaved timings of ``steps`` steps. With ``graph``, the graph keeps its
    activations' memory while the plain loop runs beside it: at large batches pass ``plain=False``
    (``--no-plain``), as ``bench targets`` does for its compiled parts. With ``lora_rank`` > 0 each
    configuration trains LoRA updates of that rank instead of its weights (``lora``), in both
    loops, each on a fresh copy of the model with peft's layers.
    """
    from torch.utils.data import DataLoader

    from . import components, finetune, lora, models
    from .data import ImageDataset
    from .transforms import paper_transform

    device = _device(device)
    workers = os.cpu_count() if workers is None else workers
    cuda = device.type == "cuda"
    for config in configs:
        lora.check(config, lora_rank)
    options = finetune.StepOptions(compile, compile_mode, attention, precision, fused, graph).checked(device)  # recorded as what ran
    model = models.create_model(model_name, pretrained=False, num_classes=10).to(device)
    plain_model = copy.deepcopy(model) if plain and not lora_rank else None  # the library's changes to its model (patch embedding, compiled blocks) stay out of the plain loop
    pristine = copy.deepcopy(model) if lora_rank else None  # LoRA goes on before the fused ops: on an untouched copy per configuration and loop
    size = image_size or model.patch_embed.img_size[0]
    dataset = _synthetic_train_set(batch_size * 4, source_size)
    fast = DeviceLoader(dataset, batch_size, augment=True, image_size=size, device=device)
    plain_set = ImageDataset(dataset.images, dataset.targets, dataset.classes, "synthetic", "train", transform=paper_transform(True, size))
    plain_loader = DataLoader(plain_set, batch_size, shuffle=True, drop_last=True, num_workers=workers, pin_memory=cuda, persistent_workers=workers > 0) if plain else None
    peak = _peak_tflops(device)
    result = {"model": f"{model_name} ({size}px, random weights)", "batch_size": batch_size, "device": _device_name(device),
              **asdict(options), "steps": steps,
              "repeats": repeats, "dataloader_workers": workers, "peak_tflops_bf16": peak, "lora_rank": lora_rank}
    for config in configs:
        if lora_rank:
            model = lora.add_lora(copy.deepcopy(pristine), config, lora_rank)
            plain_model = lora.add_lora(copy.deepcopy(pristine), config, lora_rank) if plain else None
        finetune.set_trainable(model, config, lora_rank)
        flops = _step_flops(model, *fast.batch(0))
        library_steps = _library_steps(model, config, fast, batch_size, device, options, lora_rank)
        warmup = _Timed(lambda: library_steps(0, finetune.warmup_steps(options)), device)
        runs = {"library": (lambda: library_steps(1, steps), warmup)}
        if plain:
            finetune.set_trainable(plain_model, config, lora_rank)
            plain_trainable = [p for _, p in components.trainable_parameters(plain_model)]
            plain_optimizer = torch.optim.SGD(plain_trainable, lr=1e-3, momentum=0.9)  # PyTorch's default SGD kernels

            def plain_steps(count: int):
                iterator = _endless(plain_loader)
                for _ in range(count):
                    x, y = next(iterator)
                    x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
                    loss = torch.nn.functional.cross_entropy(plain_model(x), y)
                    plain_optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    torch.nn.utils.clip_grad_norm_(plain_trainable, 1.0)
                    plain_optimizer.step()
                iterator.close()

            runs["plain"] = (lambda: plain_steps(steps), lambda: plain_steps(1))
        rates = {name: batch_size * steps / value for name, value in _seconds(runs, device, repeats).items()}
        if plain:
            result[f"{config}_plain_images_per_s"] = round(rates["plain"], 1)
            result[f"{config}_speedup"] = round(rates["library"] / rates["plain"], 2)
        result[f"{config}_library_images_per_s"] = round(rates["library"], 1)
        result[f"{config}_warmup_seconds"] = round(warmup.seconds, 2)
        achieved = flops / batch_size * rates["library"] / 1e12
        result[f"{config}_library_tflops"] = _significant(achieved)
        if peak:
            result[f"{config}_library_mfu"] = round(achieved / peak, 6)
    plain_loader = plain_model = None  # shuts its workers down
    gc.collect()
    result["torch"] = torch.__version__
    return result


def _variant_words(row: dict) -> str:
    """How a step was run, in words: ", compiled (blocks, max-autotune), attention cudnn"."""
    words = ""
    if row.get("compile", "none") not in ("none", False):
        mode = row.get("compile_mode", "default")
        words += f", compiled ({row['compile']}{'' if mode == 'default' else ', ' + mode})"
    if row.get("attention", "auto") != "auto":
        words += f", attention {row['attention']}"
    if row.get("precision", "autocast") != "autocast":
        words += f", {row['precision']} with fp32 masters"
    if row.get("fused", "none") != "none":
        words += f", fused {row['fused']}"
    if row.get("graph"):
        words += ", CUDA graph"
    return words


CHECK_STEP = 4
"""The step (0-based) whose loss and gradient norm every variant row records beside its first's: by
then every variant runs as it is timed (``finetune.warmup_steps``; a graphed step replays)."""

VARIANT_KEYS = {"batch_size": None, "compile": None, "compile_mode": "default", "attention": "auto", "precision": "autocast", "fused": "none", "graph": False}
"""What tells the rows of ``bench_variants`` apart, with the value of rows written before the key existed."""


def bench_variants(
    model_name: str = "demo",
    config: str = "full",
    batch_sizes: tuple[int, ...] = (64,),
    compiles: tuple[str, ...] = ("none", "model", "blocks"),
    modes: tuple[str, ...] = ("default",),
    attentions: tuple[str, ...] = ("auto",),
    steps: int = 10,
    repeats: int = 3,
    device: str = "auto",
    out: Path | None = None,
    source_size: int = 32,
    precisions: tuple[str, ...] = ("autocast",),
    fuseds: tuple[str, ...] = ("auto",),
    graphs: tuple[bool, ...] = (False,),
) -> list[dict]:
    """The library's training step for ``config`` under every combination of batch size, compilation
    (``finetune.compile_model``: none, model, blocks), ``torch.compile`` mode, attention kernel,
    precision (``finetune.PRECISIONS``), fused ops (``finetune.FUSED_CHOICES``; rows record what
    "auto" resolves to) and CUDA graph or not (``finetune.GraphedStep``):
    images/s, TFLOP/s, model FLOP utilisation, warm-up seconds (compilation included) and, on CUDA,
    the peak GPU memory allocated (GiB) per row.

    Every row starts from the same random weights and the same batches, and records the loss and
    gradient norm of its first step and of step ``CHECK_STEP`` (after that many updates, and for a
    graphed step a replay of its graph) next to those of the first row (``agrees``: both within 5%,
    the bf16 tolerance), so that no variant is fast because it computes something else: a stale
    compiled graph that skips gradients, a replay with stale inputs or learning rates, an update
    that does not update. A variant that fails (a kernel missing for this device or
    shape, a compiler error) is recorded with its error; the others still run. With ``out``, the rows
    are written there (JSON) as each ends, and rows already there are kept and not measured again:
    a sweep stopped by a time limit goes on where it stopped.
    """
    from . import components, finetune, models

    components.check_config(config)  # every choice is checked before any work
    device = _device(device)
    runs = []  # (batch size, checked step options), each once
    for batch_size in batch_sizes:
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch sizes must be positive integers, got {batch_size!r}")
        for how in compiles:
            for mode in modes if finetune.compile_choice(how) != "none" else ("default",):
                for attention, precision, fused, graph in itertools.product(attentions, precisions, fuseds, graphs):
                    run = (batch_size, finetune.StepOptions(how, mode, attention, precision, fused, graph).checked(device))
                    if run not in runs:
                        runs.append(run)
    rows = json.loads(out.read_text()) if out and out.is_file() else []
    cuda = device.type == "cuda"
    peak = _peak_tflops(device)
    for batch_size, options in runs:
        combo = {"batch_size": batch_size, **asdict(options)}
        if any({key: row.get(key, default) for key, default in VARIANT_KEYS.items()} == combo for row in rows):
            continue
        row = {"model": model_name, "config": config, **combo, "device": _device_name(device), "torch": torch.__version__}
        try:
            torch.manual_seed(0)
            model = models.create_model(model_name, pretrained=False, num_classes=10).to(device)
            size = model.patch_embed.img_size[0]
            loader = DeviceLoader(_synthetic_train_set(batch_size * 2, source_size), batch_size, augment=True, image_size=size, device=device)
            components.set_trainable(model, config)
            flops = _step_flops(model, *loader.batch(0))
            steps_of = _library_steps(model, config, loader, batch_size, device, options)
            if cuda:
                torch.cuda.reset_peak_memory_stats(device)
            warmup = _Timed(lambda: steps_of(0, 1), device)  # the first step: same weights, same batch in every row
            assert finetune.warmup_steps(options) <= CHECK_STEP, "CHECK_STEP must cover the warm-up"  # compilation, a graph's capture
            more = lambda: steps_of(1, CHECK_STEP - 1)  # noqa: E731
            check = _Timed(lambda: steps_of(CHECK_STEP, 1), device)  # every row at its speed by now: a graph replays
            seconds = _seconds({"step": (lambda: steps_of(CHECK_STEP + 1, steps), lambda: (warmup(), more(), check()))}, device, repeats)["step"]
            loss, norm = (float(v) for v in warmup.value)
            check_loss, check_norm = (float(v) for v in check.value)
            rate = batch_size * steps / seconds
            achieved = flops / batch_size * rate / 1e12
            row.update({"images_per_s": round(rate, 1), "tflops": _significant(achieved), "mfu": round(achieved / peak, 6) if peak else None,
                        "warmup_seconds": round(warmup.seconds, 2), "first_loss": loss, "first_grad_norm": norm,
                        "check_loss": check_loss, "check_grad_norm": check_norm,
                        "peak_memory_gib": round(torch.cuda.max_memory_allocated(device) / 2**30, 2) if cuda else None})
            reference = next((r for r in rows if "first_loss" in r and r["batch_size"] == batch_size), None)
            if reference:
                near = lambda key: abs(row[key] - reference[key]) <= 0.05 * abs(reference[key])  # noqa: E731
                row["agrees"] = bool(near("first_loss") and near("first_grad_norm")
                                     and ("check_loss" not in reference or (near("check_loss") and near("check_grad_norm"))))
        except Exception as error:  # noqa: BLE001 -- one failing variant must not lose the others
            row["error"] = f"{type(error).__name__}: {error}".splitlines()[0][:300]
        finally:
            model = loader = steps_of = None
            gc.collect()
            if cuda:
                torch.cuda.empty_cache()
        rows.append(row)
        if out:
            paths.atomic_write_text(out, json.dumps(rows, indent=2) + "\n")
    return rows


def _print_variants(rows: list[dict]) -> None:
    print(f"{'batch':>6}  {'variant':<48}{'img/s':>10}{'TFLOP/s':>9}{'MFU':>7}{'warm-up s':>11}{'GiB':>7}  first loss / grad norm")
    for row in rows:
        variant = _variant_words(row).lstrip(", ") or "eager"
        if "error" in row:
            print(f"{row['batch_size']:>6}  {variant:<48}{row['error']}")
            continue
        mfu = f"{row['mfu']:.1%}" if row.get("mfu") is not None else "-"
        agrees = {True: "", False: "  DIFFERS from the first row", None: ""}[row.get("agrees")]
        memory = f"{row['peak_memory_gib']:.1f}" if row.get("peak_memory_gib") is not None else "-"
        print(f"{row['batch_size']:>6}  {variant:<48}{row['images_per_s']:>10,.1f}{row['tflops']:>9.2f}{mfu:>7}"
              f"{row['warmup_seconds']:>11.1f}{memory:>7}  {row['first_loss']:.4f} / {row['first_grad_norm']:.4f}{agrees}")


PROFILE_GROUPS = ("matrix products", "attention", "other")
_MATRIX = ("gemm", "nvjet", "cutlass", "xmma", "aten::mm", "aten::addmm", "aten::bmm", "aten::_addmm", "convolution", "mkldnn_linear")
_ATTENTION = ("flash", "fmha", "attention", "sdpa", "efficient_attention")


def _profile_group(name: str) -> str:
    """The group of a CUDA kernel's name (cuBLAS, cuDNN, Triton) or, on a CPU, of an ATen op's."""
    name = name.lower()
    if any(key in name for key in _ATTENTION):
        return "attention"
    if any(key in name for key in _MATRIX):
        return "matrix products"
    return "other"


def bench_profile(
    model_name: str = "demo",
    config: str = "full",
    batch_size: int = 64,
    steps: int = 3,
    device: str = "auto",
    compile: bool | str = False,
    top: int = 15,
    source_size: int = 32,
    compile_mode: str = "default",
    attention: str = "auto",
    precision: str = "autocast",
    fused: str = "auto",
    graph: bool = False,
) -> dict:
    """Where a training step's time goes: ``finetune.training_step`` on synthetic images through
    the ``DeviceLoader`` (the step ``bench finetune`` times), profiled with ``torch.profiler``.

    On CUDA, kernel time (self device time of every kernel); on a CPU, the self time of every
    ATen op. Grouped into matrix products, attention and the rest, with the ``top`` largest
    entries; ``time_ms_per_step`` is the profiled time per step (kernel time on CUDA, so launch
    gaps are not in it) and ``wall_ms_per_step`` the wall time of the same steps run unprofiled
    just before (on CUDA, the difference is the time the GPU waits between kernels).
    """
    from torch.profiler import ProfilerActivity, profile

    from . import components, finetune, models

    components.check_config(config)  # before any work
    device = _device(device)
    cuda = device.type == "cuda"
    options = finetune.StepOptions(compile, compile_mode, attention, precision, fused, graph).checked(device)  # recorded as what ran
    model = models.create_model(model_name, pretrained=False, num_classes=10).to(device)
    size = model.patch_embed.img_size[0]
    loader = DeviceLoader(_synthetic_train_set(batch_size * 2, source_size), batch_size, augment=True, image_size=size, device=device)
    steps_of = _library_steps(model, config, loader, batch_size, device, options)

    def run(first: int, count: int) -> None:
        steps_of(first, count)
        _sync(device)

    if options.graph:  # the profiler's first use after a graph's capture can miss or break the graph's kernels (pytorch#75504)
        with profile():
            pass
    run(0, max(2, finetune.warmup_steps(options)))  # warm-up (compilation, a graph's capture)
    wall = _Timed(lambda: run(1, steps), device)
    wall()  # the same steps unprofiled: wall time against the profiled time shows the gaps between kernels
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as profiler:
        run(1, steps)
    times: dict[str, float] = {}
    for event in profiler.key_averages():
        if cuda != (event.device_type.name == "CUDA"):
            continue
        spent = event.self_device_time_total if cuda else event.self_cpu_time_total
        if spent > 0:
            times[event.key] = times.get(event.key, 0.0) + spent
    total = sum(times.values())
    if not total:
        raise RuntimeError("the profiler recorded no time; is this PyTorch build's profiler working?")
    groups = {group: 0.0 for group in PROFILE_GROUPS}
    for name, spent in times.items():
        groups[_profile_group(name)] += spent
    largest = sorted(times.items(), key=lambda item: -item[1])[:top]
    return {
        "model": f"{model_name} ({size}px, random weights)", "config": config, "batch_size": batch_size,
        "device": _device_name(device), **asdict(options), "steps": steps, "measured": "CUDA kernel time" if cuda else "CPU time of ATen ops (self)",
        "time_ms_per_step": round(total / steps / 1000, 2),
        "wall_ms_per_step": round(wall.seconds / steps * 1000, 2),
        "shares": {group: round(spent / total, 4) for group, spent in groups.items()},
        "largest": [{"name": name, "group": _profile_group(name), "share": round(spent / total, 4)} for name, spent in largest],
        "torch": torch.__version__,
    }


def _print_profile(result: dict, json_path: Path | None) -> None:
    print(f"{result['model']}, {result['config']}, batch {result['batch_size']}, {result['device']}"
          f"{_variant_words(result)}: {result['time_ms_per_step']} ms per step ({result['measured']}); "
          f"wall time {result['wall_ms_per_step']} ms per step")
    print("  " + ", ".join(f"{group} {share:.0%}" for group, share in result["shares"].items()))
    for row in result["largest"]:
        print(f"  {row['share']:6.1%}  {row['group']:<16} {row['name'][:100]}")
    if json_path:
        paths.atomic_write_text(json_path, json.dumps(result, indent=2) + "\n")


def bench_kernels(model_name: str = "vit_base_in21k", batch_size: int | None = None, device: str = "auto",
                  min_run_time: float = 1.0) -> dict:
    """Our fused ops alone (``kernels``: Triton on CUDA, their PyTorch reference elsewhere) at one
    model's training shapes, in bf16, against a copy of the same bytes (the memory-bound limit).

    ``batch_size`` images of the model's tokens give the rows (None: 512 on CUDA, the paper's batch,
    and 8 on a CPU); fc1's (rows x hidden) product for ``bias_gelu`` and its backward (which also sums
    the bias gradient), timm's strided q/k/v head gradients for ``qkv_heads_backward``. Milliseconds
    are the median of ``torch.utils.benchmark``'s blocked autorange; GB/s counts the bytes each op
    must read and write once. On CUDA, inductor's own bias + GELU forward is timed beside ours.

    The SGD update of all the model's parameters with bf16 master weights (clipping at norm 1, the
    update, the bf16 copy) is timed as ``finetune`` runs it unfused (the gradients copied to the fp32
    masters, ``clip_grad_norm_``, ``torch.optim.SGD``, the masters copied back) and fused
    (``FusedSGD``: the norm, then one pass per parameter); GB/s counts the 22 bytes per parameter
    that the job must move (a bf16 gradient read twice, an fp32 weight and momentum read and written,
    a bf16 copy written). Timed eagerly, both include the host's kernel launches (one per parameter
    fused), which a training step mostly hides behind its backward; on CUDA both are also timed
    replayed from a CUDA graph (as ``graph=True`` runs them), which leaves the device's time alone.
    """
    from torch.utils.benchmark import Timer

    from . import finetune, kernels, models

    device = _device(device)
    cuda = device.type == "cuda"
    batch_size = (512 if cuda else 8) if batch_size is None else batch_size
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    model = models.create_model(model_name, pretrained=False)
    block = model.blocks[0]
    if not (models._is_fusable_mlp(block.mlp) and models._is_fusable_attention(block.attn)):
        raise ValueError(f"bench kernels times our fused ops at a model's shapes, and {model_name!r} has not the layers they "
                         "compute (timm's Mlp with a biased fc1 and exact GELU, Attention with a biased fused q/k/v)")
    tokens = model.patch_embed.num_patches + model.num_prefix_tokens
    width, hidden, heads = model.embed_dim, block.mlp.fc1.out_features, block.attn.num_heads
    master = finetune.MasterWeights(model.to(device))  # fp32 masters and their bf16 copy, all trainable
    del model, block
    gradients = torch.Generator(device).manual_seed(1)
    for copied in master.copies:
        copied.grad = torch.randn(copied.shape, device=device, generator=gradients).to(copied.dtype)
    unfused_sgd = finetune.make_optimizer(master.masters, 1e-4, 0.9, device)
    fused_sgd = finetune.make_optimizer(master.masters, 1e-4, 0.9, device, fused_update=True)
    parameters = sum(p.numel() for p in master.masters)
    rows, dtype = batch_size * tokens, torch.bfloat16
    generator = torch.Generator(device).manual_seed(0)
    mm = torch.randn(rows, hidden, device=device, dtype=dtype, generator=generator)
    grad, out = torch.randn_like(mm), torch.empty_like(mm)
    bias = torch.randn(hidden, device=device, dtype=dtype, generator=generator)
    packed = torch.randn(batch_size, tokens, 3, heads, width // heads, device=device, dtype=dtype, generator=generator)
    dq, dk, dv = packed.permute(2, 0, 3, 1, 4).unbind(0)  # timm's split: strided views
    ops = {
        "copy (the memory-bound limit)": (lambda: out.copy_(mm), 4 * mm.numel()),
        "bias_gelu forward": (lambda: kernels.bias_gelu(mm, bias), 4 * mm.numel()),
        "bias_gelu backward (+ bias gradient)": (lambda: kernels.bias_gelu_backward(grad, mm, bias), 6 * mm.numel()),
        "qkv_heads_backward (+ bias gradient)": (lambda: kernels.qkv_heads_backward(dq, dk, dv), 4 * packed.numel()),
    }
    updates = {f"SGD update with bf16 masters, {name}": (lambda optimizer=optimizer: finetune.clip_and_update(optimizer, master.masters, 1.0, master))
               for name, optimizer in (("unfused", unfused_sgd), ("fused (FusedSGD)", fused_sgd))}
    ops |= {name: (update, 22 * parameters) for name, update in updates.items()}
    errors = {}
    if cuda:
        inductor = torch.compile(lambda a, b: torch.nn.functional.gelu(a + b))
        ops["inductor's bias + GELU forward"] = (lambda: inductor(mm, bias), 4 * mm.numel())
        for name, update in updates.items():  # without the host's launches (one per parameter fused, a few per step unfused)
            try:
                ops[f"{name}, replayed from a CUDA graph"] = (_graphed(update, device), 22 * parameters)
            except RuntimeError as error:  # a step that cannot be recorded: say so, time the rest
                errors[f"{name}, replayed from a CUDA graph: error"] = str(error).splitlines()[0][:300]
    result = {"model": model_name, "batch_size": batch_size, "rows": rows, "hidden": hidden, "heads": heads, "parameters": parameters,
              "device": _device_name(device), "torch": torch.__version__,
              "ops": "Triton kernels" if cuda and kernels.triton_available() else "PyTorch reference"}
    for name, (run, nbytes) in ops.items():
        run()  # compile / warm up
        seconds = Timer(stmt="run()", globals={"run": run}).blocked_autorange(min_run_time=min_run_time).median
        result[f"{name}: ms"] = round(seconds * 1e3, 4)
        result[f"{name}: GB/s"] = round(nbytes / seconds / 1e9, 1)
    return result | errors


def _graphed(run, device: torch.device):
    """``run`` recorded into a CUDA graph (after three runs on a side stream, as PyTorch asks:
    kernels compiled, state allocated); returns the graph's replay."""
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        for _ in range(3):
            run()
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    return graph.replay


TARGET_PARTS = ("data", "plasticity", "finetune", "compiled")
FINETUNE_CONFIGS = ("full", "mha", "fc1", "fc2", "ln2", "ln1", "linear")


def bench_targets(device: str = "auto", out: Path | None = None, parts: tuple[str, ...] | None = None) -> list[dict]:
    """Every benchmark at the settings of its issue, each figure checked against its target.

    On CUDA: the data paths on a Cifar10 fixture at 224 (device path >= 5x the DataLoader path);
    12,800 ViT-Base pairs (plain definition and ``measure``, under a minute); ViT-Base/16
    training steps at batch 256 for every configuration (``finetune``: frozen configurations
    faster than full, full finetuning at >= 40% FLOP utilisation on an H100), and compiled for
    full, MHA, LN1 and linear, full with its blocks compiled, and full at the fastest settings
    measured (batch 512, blocks compiled with ``coordinate-descent``, ``precision="bf16"``), with
    our fused ops, and with those replayed from a CUDA graph (``compiled``: the same utilisation target). On a CPU, by default
    all but ``compiled``, at CPU scale: device path never slower; ``measure`` >= 2x the plain
    definition on the demo ViT and ViT-Base; the finetuning step against the plain loop on the
    demo ViT. Each part's figures go to ``<out>/<part>.json`` as soon as it ends, the checks to
    ``<out>/targets.json`` as they are made; returns the checks.
    """
    for part in parts or ():
        if part not in TARGET_PARTS:
            raise ValueError(f"unknown part {part!r}; valid parts: {', '.join(TARGET_PARTS)}")
    device = _device(device)
    cuda = device.type == "cuda"
    parts = parts or (TARGET_PARTS if cuda else TARGET_PARTS[:-1])
    checks: list[dict] = []

    def check(issue: int, target: str, measured: str, met: bool | None) -> None:
        checks.append({"issue": issue, "target": target, "measured": measured, "met": met})
        if out:
            paths.atomic_write_text(out / "targets.json", json.dumps(checks, indent=2) + "\n")

    def keep(part: str, result) -> None:
        if out:
            paths.atomic_write_text(out / f"{part}.json", json.dumps(result, indent=2) + "\n")

    if "data" in parts:
        result = bench_data("cifar10", batch_size=512, image_size=224, device=str(device))
        keep("data", result)
        need = 5.0 if cuda else 1.0
        check(3, f"device path >= {need:g}x the DataLoader path (Cifar10 at 224, batch 512)",
              f"{result['device_path_images_per_s']:,.0f} vs {result['dataloader_images_per_s']:,.0f} img/s ({result['speedup']}x)",
              result["speedup"] >= need)
    if "plasticity" in parts:
        # (model, pairs, batch, repeats): on a GPU, the paper's 12,800 pairs once
        settings = [("demo", 256, 64, 3), ("vit_base_in21k", 12800, 128, 1)] if cuda else [("demo", 256, 64, 3), ("vit_base_in21k", 32, 16, 3)]
        results = [bench_plasticity(name, pairs, batch, str(device), repeats=repeats) for name, pairs, batch, repeats in settings]
        keep("plasticity", results)
        for (name, pairs, _, _), result in zip(settings, results):
            figures = f"{result['measure_pairs_per_s']:,.1f} vs {result['plain_pairs_per_s']:,.1f} pairs/s ({result['speedup']}x)"
            if cuda:
                check(4, f"measure vs plain definition, {name}, {pairs:,} pairs", figures, None)
            else:
                check(4, f"measure >= 2x the plain definition, {name}", figures, result["speedup"] >= 2.0)
        if cuda:
            seconds = results[-1]["seconds_for_12800_pairs"]
            check(4, "12,800 ViT-Base pairs in under a minute (measure, no decoding)", f"{seconds} s", seconds < 60)
    name, batch = ("vit_base_in21k", 256) if cuda else ("demo", 64)

    def check_mfu(result: dict) -> None:
        """The utilisation target for one ``bench_finetune`` result, named by how its step ran (its options, as they resolved)."""
        mfu = result.get("full_library_mfu")
        how = _variant_words(result).lstrip(", ") or "eager"
        check(6, f"full finetuning at >= 40% model FLOP utilisation on an H100 ({how}, batch {result['batch_size']})",
              f"{mfu:.1%}" if mfu is not None else f"{result['full_library_tflops']} TFLOP/s (no known peak for this device)",
              None if mfu is None else mfu >= 0.40)

    if "finetune" in parts:
        eager = bench_finetune(name, FINETUNE_CONFIGS, batch, steps=10, device=str(device))
        keep("finetune", eager)
        for config in FINETUNE_CONFIGS:
            check(6, f"{config}: library step vs plain fp32 DataLoader loop ({name}, batch {batch})",
                  f"{eager[f'{config}_library_images_per_s']:,.1f} vs {eager[f'{config}_plain_images_per_s']:,.1f} img/s ({eager[f'{config}_speedup']}x)",
                  eager[f"{config}_speedup"] >= 1.0)
        full = eager["full_library_images_per_s"]
        slower = [c for c in FINETUNE_CONFIGS[1:] if eager[f"{c}_library_images_per_s"] <= full]
        check(6, "frozen configurations faster than full finetuning", "slower or equal: " + (", ".join(slower) or "none"), not slower)
        if cuda:
            check_mfu(eager)
    if "compiled" in parts:
        compiled = bench_finetune(name, ("full", "mha", "ln1", "linear"), batch, steps=10, device=str(device), compile="model", plain=False)
        keep("finetune_compiled", compiled)
        check_mfu(compiled)
        blocks = bench_finetune(name, ("full",), batch, steps=10, device=str(device), compile="blocks", plain=False)
        keep("finetune_compiled_blocks", blocks)
        check_mfu(blocks)
        # the fastest settings measured (the paper's batch, inductor's tuning, bf16 compute with fp32
        # masters), then the same with our fused ops (kernels: fc1's bias+GELU, the q/k/v split), then
        # that replayed from a CUDA graph
        for part, fused, graph in (("finetune_compiled_fastest", "none", False), ("finetune_compiled_fused", "all", False),
                                   ("finetune_compiled_graph", "all", True)):
            result = bench_finetune(name, ("full",), batch * 2, steps=10, device=str(device), compile="blocks", plain=False,
                                    compile_mode="coordinate-descent", precision="bf16", fused=fused, graph=graph)
            keep(part, result)
            check_mfu(result)
    return checks


def _print_checks(checks: list[dict]) -> None:
    print(f"{'issue':<6}{'met':<6}{'target':<78}measured")
    for row in checks:
        met = {True: "yes", False: "NO", None: "-"}[row["met"]]
        print(f"#{row['issue']:<5}{met:<6}{row['target']:<78}{row['measured']}")


def _print(result: dict, json_path: Path | None) -> None:
    width = max(map(len, result))
    for key, value in result.items():
        print(f"{key:<{width}}  {value}")
    if json_path:
        paths.atomic_write_text(json_path, json.dumps(result, indent=2) + "\n")


def _step_arguments(parser) -> None:
    parser.add_argument("--compile", nargs="?", const="model", default="none", metavar="HOW",
                        help="torch.compile the model: none, model (the default with a bare --compile) or blocks (one graph shared by the blocks)")
    parser.add_argument("--compile-mode", default="default", help="torch.compile's mode: default, coordinate-descent, max-autotune-no-cudagraphs, ...")
    parser.add_argument("--attention", default="auto", help="attention kernel: auto, flash, cudnn, efficient or math")
    parser.add_argument("--precision", default="autocast", help="autocast (the paper's protocol) or bf16 (bf16 compute, fp32 master weights)")
    parser.add_argument("--fused", default="auto", help="our fused ops: auto (gelu+qkv on CUDA, none elsewhere), none, all, or of gelu (fc1's bias+GELU), "
                        "qkv (the q/k/v split), update (clipping and SGD in one pass) one or several joined by '+'")
    parser.add_argument("--graph", action="store_true", help="replay each step from a CUDA graph (CUDA only)")


def _step_options(args) -> dict:
    """The options of ``_step_arguments`` (``finetune.STEP_OPTIONS``) as keyword arguments of ``bench_finetune`` and ``bench_profile``."""
    from . import finetune

    return {name: getattr(args, name) for name in finetune.STEP_OPTIONS}


def _booleans(text: str, option: str) -> tuple[bool, ...]:
    """"false,true" -> (False, True); anything else is a ValueError naming the valid words."""
    words = {"false": False, "true": True}
    values = tuple(word.strip().lower() for word in text.split(","))
    unknown = [value for value in values if value not in words]
    if unknown:
        raise ValueError(f"{option} takes comma-separated false/true, got {', '.join(map(repr, unknown))}")
    return tuple(words[value] for value in values)


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
    p.add_argument("--repeats", type=int, default=3, help="interleaved timings per path; the median is reported")
    p.add_argument("--json", type=Path, default=None, help="also write the figures to this file")
    f = commands.add_parser("finetune", help="training images/s per configuration: library step vs plain fp32 DataLoader loop")
    f.add_argument("--model", default="demo", help="demo, vit_base_in21k, ... (random weights)")
    f.add_argument("--configs", default="full,mha,fc1,ln1,linear", help="comma-separated configurations")
    f.add_argument("--batch-size", type=int, default=64)
    f.add_argument("--steps", type=int, default=10, help="timed steps per path (after one warm-up step)")
    f.add_argument("--image-size", type=int, default=None, help="default: the model's")
    f.add_argument("--workers", type=int, default=None, help="DataLoader workers of the plain loop (default: all CPU cores)")
    f.add_argument("--device", default="auto", help="cuda, cpu or auto")
    f.add_argument("--repeats", type=int, default=3, help="interleaved timings per path; the median is reported")
    _step_arguments(f)
    f.add_argument("--no-plain", action="store_true", help="skip the plain DataLoader loop")
    f.add_argument("--lora-rank", type=int, default=0, help="train LoRA updates of this rank instead of each configuration's weights (of mha, fc1, fc2, full)")
    f.add_argument("--json", type=Path, default=None, help="also write the figures to this file")
    r = commands.add_parser("profile", help="where a training step's time goes: matrix products, attention, the rest")
    r.add_argument("--model", default="demo", help="demo, vit_base_in21k, ... (random weights)")
    r.add_argument("--config", default="full", help="the configuration trained (full, mha, fc1, fc2, ln2, ln1, linear)")
    r.add_argument("--batch-size", type=int, default=64)
    r.add_argument("--steps", type=int, default=3, help="profiled steps (after the warm-up)")
    r.add_argument("--device", default="auto", help="cuda, cpu or auto")
    _step_arguments(r)
    r.add_argument("--top", type=int, default=15, help="how many of the largest kernels (ops on a CPU) to list")
    r.add_argument("--json", type=Path, default=None, help="also write the figures to this file")
    v = commands.add_parser("variants", help="one configuration's step under every combination of batch size, compilation and attention kernel")
    v.add_argument("--model", default="demo", help="demo, vit_base_in21k, ... (random weights)")
    v.add_argument("--config", default="full", help="the configuration trained (full, mha, fc1, fc2, ln2, ln1, linear)")
    v.add_argument("--batch-sizes", default="64", help="comma-separated")
    v.add_argument("--compile", default="none,model,blocks", help="comma-separated, of: none, model, blocks")
    v.add_argument("--modes", default="default", help="comma-separated torch.compile modes (for compiled rows)")
    v.add_argument("--attention", default="auto", help="comma-separated attention kernels, of: auto, flash, cudnn, efficient, math")
    v.add_argument("--precision", default="autocast", help="comma-separated, of: autocast, bf16")
    v.add_argument("--fused", default="auto", help="comma-separated, of: auto (gelu+qkv on CUDA, none elsewhere), none, all, "
                   "or gelu, qkv, update joined by '+' (our fused ops)")
    v.add_argument("--graph", default="false", help="comma-separated, of: false, true (replay each step from a CUDA graph; CUDA only)")
    v.add_argument("--steps", type=int, default=10, help="timed steps per row (after the warm-up)")
    v.add_argument("--repeats", type=int, default=3, help="timings per row; the median is reported")
    v.add_argument("--device", default="auto", help="cuda, cpu or auto")
    v.add_argument("--json", type=Path, default=None, help="rows go here as each ends; rows already there are not measured again")
    k = commands.add_parser("kernels", help="our fused ops alone at a model's training shapes, against a copy of the same bytes")
    k.add_argument("--model", default="vit_base_in21k", help="whose shapes: demo, vit_base_in21k, ...")
    k.add_argument("--batch-size", type=int, default=None, help="images (default: 512 on CUDA, 8 on a CPU)")
    k.add_argument("--device", default="auto", help="cuda, cpu or auto")
    k.add_argument("--json", type=Path, default=None, help="also write the figures to this file")
    t = commands.add_parser("targets", help="every benchmark at its issue's settings, checked against the targets")
    t.add_argument("--device", default="auto", help="cuda, cpu or auto")
    t.add_argument("--parts", default=None, help="comma-separated, of: " + ", ".join(TARGET_PARTS) + " (default: all; compiled on CUDA only)")
    t.add_argument("--out", type=Path, default=None, help="folder for <part>.json and targets.json")
    args = parser.parse_args(argv)
    try:
        if args.command == "targets":
            checks = bench_targets(args.device, args.out, tuple(args.parts.split(",")) if args.parts else None)
        elif args.command == "profile":
            result = bench_profile(args.model, args.config, args.batch_size, args.steps, args.device, top=args.top, **_step_options(args))
        elif args.command == "variants":
            try:
                batch_sizes = tuple(int(b) for b in args.batch_sizes.split(","))
            except ValueError:
                raise ValueError(f"--batch-sizes must be comma-separated integers, got {args.batch_sizes!r}") from None
            rows = bench_variants(args.model, args.config, batch_sizes, tuple(args.compile.split(",")), tuple(args.modes.split(",")),
                                  tuple(args.attention.split(",")), args.steps, args.repeats, args.device, args.json,
                                  precisions=tuple(args.precision.split(",")), fuseds=tuple(args.fused.split(",")),
                                  graphs=_booleans(args.graph, "--graph"))
        elif args.command == "data":
            result = bench_data(args.dataset, args.root, args.batch_size, args.image_size, args.batches, args.workers, args.device, args.fixture_size)
        elif args.command == "kernels":
            result = bench_kernels(args.model, args.batch_size, args.device)
        elif args.command == "plasticity":
            result = bench_plasticity(args.model, args.pairs, args.batch_size, args.device, args.image_size, args.repeats)
        else:
            result = bench_finetune(args.model, tuple(args.configs.split(",")), args.batch_size, args.steps, args.device, args.image_size,
                                    args.workers, plain=not args.no_plain, repeats=args.repeats, lora_rank=args.lora_rank, **_step_options(args))
    except ValueError as error:
        parser.exit(2, f"error: {error}\n")
    if args.command == "targets":
        _print_checks(checks)
    elif args.command == "profile":
        _print_profile(result, args.json)
    elif args.command == "variants":
        _print_variants(rows)
    else:
        _print(result, args.json)


if __name__ == "__main__":
    main()
