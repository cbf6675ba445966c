"""The benchmarks of the training step: how fast ``finetune``'s step runs, and why.

- ``bench_finetune``: training images/s per configuration, the library's step against a plain
  fp32 DataLoader loop (``python -m paperlib.speed.bench finetune``).
- ``bench_variants``: one configuration's step under every combination of the step's options,
  each row checked against the first (``... bench variants``).
- ``bench_profile``: where a step's time goes (``... bench profile``).
- ``bench_kernels``: our fused ops alone, against a copy of the same bytes (``... bench kernels``).

Every step benchmark builds its step as ``finetune.train`` does (``library_steps``: ``speed.Step``,
``finetune``'s optimizer) and counts its FLOPs with PyTorch (``step_flops``).
"""

from __future__ import annotations

import contextlib
import copy
import gc
import itertools
import json
import os
from dataclasses import asdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile
from torch.utils.data import DataLoader
from torch.utils.flop_counter import FlopCounterMode

from .. import components, finetune, lora, models, paths
from ..imagesets import ImageDataset
from ..loader import DeviceLoader
from ..transforms import paper_transform
from .bench_data import Timed, device_name, endless, median_seconds, resolve_device, sync
from .kernels import bias_gelu, bias_gelu_backward, qkv_heads_backward, triton_available
from .layers import is_fusable_attention, is_fusable_mlp
from .options import PRESET_RECORD, StepOptions, check_precision, compile_choice, fuses_update, preset
from .step import MasterWeights, Step, autocast_for, clip_and_update, compile_model, tf32_flags, warmup_steps

PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0}  # dense bf16 tensor-core peaks


def _peak_tflops(device: torch.device) -> float | None:
    """The dense bf16 peak of ``device`` if it is a GPU of ``PEAK_TFLOPS``, else None (no utilisation)."""
    if device.type != "cuda":
        return None
    return next((value for name, value in PEAK_TFLOPS.items() if name in torch.cuda.get_device_name(device)), None)


def _significant(value: float, digits: int = 5) -> float:
    """``value`` to ``digits`` significant digits (a CPU's TFLOP/s would round to 0.0 at 3 decimals)."""
    return float(f"{value:.{digits}g}")


def step_flops(model, images, labels) -> int:
    """FLOPs of one training step (forward + backward) of the eager model on ``images`` as its
    parameters' ``requires_grad`` stand, counted by PyTorch (blocks compiled in place are returned
    to eager). Counted on one image and multiplied by the batch (every counted op of a ViT is linear
    in the batch; a test checks it): a counting pass at the full batch in fp32 would need about
    twice the activation memory of the bf16 step it is for (the likely cause of running out of GPU
    memory at large batches before: docs/benchmarks.md)."""
    compile_model(model, "none", fused="none")  # counting must not put in fused ops a row may not want
    counter = FlopCounterMode(display=False)
    with counter:
        torch.nn.functional.cross_entropy(model(images[:1]), labels[:1]).backward()
    model.zero_grad(set_to_none=True)
    return counter.get_total_flops() * len(images)


def synthetic_train_set(n: int, source_size: int):
    """``n`` random uint8 images of ``source_size`` pixels (Cifar-like) with labels of 10 classes."""
    generator = torch.Generator().manual_seed(0)
    return ImageDataset(
        torch.randint(0, 256, (n, 3, source_size, source_size), dtype=torch.uint8, generator=generator),
        torch.randint(0, 10, (n,), generator=generator),
        [str(i) for i in range(10)],
        "synthetic",
        "train",
    )


def library_steps(
    model,
    config: str,
    loader: DeviceLoader,
    batch_size: int,
    device: torch.device,
    options: StepOptions,
    lora_rank: int = 0,
):
    """The library's training step for ``config``, as ``finetune.train`` runs it (``finetune``'s
    optimizer, and ``speed.Step`` with ``options``, checked: ``StepOptions.checked``; with
    ``lora_rank``, the model carries its LoRA layers), at the whole batch (no retry with smaller
    micro-batches: a benchmark measures the batch it is given): returns ``steps(first, count)``,
    which trains on the loader's batches ``first`` to ``first + count - 1`` and returns the last
    (loss, norm)."""
    finetune.set_trainable(model, config, lora_rank)
    trainable = [p for _, p in components.trainable_parameters(model)]
    optimizer = finetune.make_optimizer(trainable, 1e-3, 0.9, device, fuses_update(options.fused, device))
    one_step = Step(model, trainable, optimizer, options, batch_size, 1.0, micro_batch=batch_size)

    def steps(first: int, count: int):
        for index in range(first, first + count):
            last = one_step(*loader.batch(index))
        return last

    return steps


def plain_step(model, trainable, optimizer, images, labels, context=contextlib.nullcontext) -> None:
    """One step of the plain loop in the authors' style: forward (in ``context``, e.g. autocast), cross-entropy,
    backward, clipping at global norm 1, the optimizer's update."""
    with context():
        loss = torch.nn.functional.cross_entropy(model(images), labels)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(trainable, 1.0)
    optimizer.step()


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
    ``step.training_step`` with ``finetune``'s optimizer and precision (images on the device,
    batched augmentation, bf16 autocast and a fused SGD update on CUDA, only trainable weights get
    gradients, ``step.compile_model`` with ``compile``, ``compile_mode`` and the kernel chosen
    by ``attention``, ``precision``, the ``fused`` ops and ``graph``); its first steps (with any compilation)
    are timed apart as ``warmup_seconds``. The plain loop (what the authors' code does): a twin of the timm model as
    created, torchvision transforms in DataLoader workers, fp32, ``requires_grad`` set the same way.
    Model FLOP utilisation counts the FLOPs PyTorch reports for one step (forward and backward).
    Median of ``repeats`` interleaved timings of ``steps`` steps. With ``graph``, the graph keeps its
    activations' memory while the plain loop runs beside it: at large batches pass ``plain=False``
    (``--no-plain``), as ``bench targets`` does for its compiled parts. With ``lora_rank`` > 0 each
    configuration trains LoRA updates of that rank instead of its weights (``lora``), in both
    loops, each on a fresh copy of the model with peft's layers.
    """
    device = resolve_device(device)
    workers = os.cpu_count() if workers is None else workers
    cuda = device.type == "cuda"
    for config in configs:
        lora.check(config, lora_rank)
    # recorded as what ran
    options = StepOptions(compile, compile_mode, attention, precision, fused, graph).checked(device)
    model = models.create_model(model_name, pretrained=False, num_classes=10).to(device)
    # the library's changes to its model (patch embedding, compiled blocks) stay out of the plain loop
    plain_model = copy.deepcopy(model) if plain and not lora_rank else None
    # LoRA goes on before the fused ops: on an untouched copy per configuration and loop
    pristine = copy.deepcopy(model) if lora_rank else None
    size = image_size or model.patch_embed.img_size[0]
    dataset = synthetic_train_set(batch_size * 4, source_size)
    fast = DeviceLoader(dataset, batch_size, augment=True, image_size=size, device=device)
    plain_set = ImageDataset(
        dataset.images, dataset.targets, dataset.classes, "synthetic", "train", transform=paper_transform(True, size)
    )
    plain_loader = (
        DataLoader(
            plain_set,
            batch_size,
            shuffle=True,
            drop_last=True,
            num_workers=workers,
            pin_memory=cuda,
            persistent_workers=workers > 0,
        )
        if plain
        else None
    )
    peak = _peak_tflops(device)
    result = {
        "model": f"{model_name} ({size}px, random weights)",
        "batch_size": batch_size,
        "device": device_name(device),
        **asdict(options),
        "steps": steps,
        "repeats": repeats,
        "dataloader_workers": workers,
        "peak_tflops_bf16": peak,
        "lora_rank": lora_rank,
    }
    for config in configs:
        if lora_rank:
            model = lora.add_lora(copy.deepcopy(pristine), config, lora_rank)
            plain_model = lora.add_lora(copy.deepcopy(pristine), config, lora_rank) if plain else None
        finetune.set_trainable(model, config, lora_rank)
        flops = step_flops(model, *fast.batch(0))
        train_steps = library_steps(model, config, fast, batch_size, device, options, lora_rank)
        warmup = Timed(lambda: train_steps(0, warmup_steps(options)), device)
        runs = {"library": (lambda: train_steps(1, steps), warmup)}
        if plain:
            finetune.set_trainable(plain_model, config, lora_rank)
            plain_trainable = [p for _, p in components.trainable_parameters(plain_model)]
            plain_optimizer = torch.optim.SGD(plain_trainable, lr=1e-3, momentum=0.9)  # PyTorch's default SGD kernels

            def plain_steps(count: int):
                iterator = endless(plain_loader)
                for _ in range(count):
                    x, y = next(iterator)
                    x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
                    plain_step(plain_model, plain_trainable, plain_optimizer, x, y)
                iterator.close()

            runs["plain"] = (lambda: plain_steps(steps), lambda: plain_steps(1))
        rates = {name: batch_size * steps / value for name, value in median_seconds(runs, device, repeats).items()}
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


PLAIN_PRECISION = {"fp32": "fp32", "tf32": "tf32", "autocast": "autocast", "bf16": "autocast"}
"""The plain loop's precision beside the library's: a plain loop has no master weights, so bf16's is autocast."""


def bench_presets(
    model_name: str = "demo",
    configs: tuple[str, ...] = ("full", "mha", "ln2"),
    batch_size: int = 64,
    steps: int = 10,
    device: str = "auto",
    presets: tuple[str, ...] = (),
    precisions: tuple[str, ...] = ("fp32", "autocast"),
    repeats: int = 3,
    plain: bool = True,
) -> list[dict]:
    """Training images/s per precision, configuration and speed preset, on one machine: each preset of
    ``presets`` (``options.preset``: names, files) against "none" in the same precision, and a plain loop in
    that precision (``PLAIN_PRECISION``; the authors' style: timm's model, ``torch.optim.SGD``, clipping at 1)
    on the same batches, already on the device, so that only the step differs. What a preset file records as
    its ``gain`` is this table's ``gain`` column. Rows: precision, preset, configuration, img/s, gain over
    "none", warm-up seconds (compilation included), and the plain loop's img/s beside "none"."""
    rows = []
    device_ = resolve_device(device)
    for precision in precisions:
        check_precision(precision, device_)
        for name in ("none", *presets):
            options = {key: value for key, value in preset(name).items() if key not in PRESET_RECORD}
            options = {**asdict(StepOptions()), **options, "precision": precision}
            result = bench_finetune(
                model_name, configs, batch_size, steps, device, plain=False, repeats=repeats, **options
            )
            for config in configs:
                row = {"precision": precision, "preset": name, "config": config, "device": result["device"]}
                row["images_per_s"] = result[f"{config}_library_images_per_s"]
                row["warmup_seconds"] = result[f"{config}_warmup_seconds"]
                rows.append(row)
        if plain:
            plain_rates = bench_plain(model_name, configs, batch_size, steps, device_, PLAIN_PRECISION[precision])
            for row in rows:
                if row["precision"] == precision and row["preset"] == "none":
                    row["plain_images_per_s"] = plain_rates[row["config"]]
    for row in rows:
        none = next(
            r for r in rows if (r["precision"], r["preset"], r["config"]) == (row["precision"], "none", row["config"])
        )
        row["gain"] = round(row["images_per_s"] / none["images_per_s"], 3)
    return rows


def bench_plain(
    model_name: str, configs: tuple[str, ...], batch_size: int, steps: int, device: torch.device, precision: str
) -> dict[str, float]:
    """Images/s per configuration of a plain training loop in ``precision`` (fp32, tf32 or autocast) on
    batches already on the device: timm's model as created, ``torch.optim.SGD`` (PyTorch's default kernels),
    clipping at norm 1; TF32 flags and autocast as the library's step sets them (``tf32_flags``, ``autocast_for``)."""
    model = models.create_model(model_name, pretrained=False, num_classes=10).to(device)
    size = model.patch_embed.img_size[0]
    loader = DeviceLoader(
        synthetic_train_set(batch_size * 4, 32), batch_size, augment=True, image_size=size, device=device
    )
    batches = [loader.batch(index) for index in range(4)]
    autocast = autocast_for(device, precision=precision)
    rates = {}
    for config in configs:
        components.set_trainable(model, config)
        trainable = [p for _, p in components.trainable_parameters(model)]
        optimizer = torch.optim.SGD(trainable, lr=1e-3, momentum=0.9)

        def plain_steps(count: int):
            with tf32_flags(precision):
                for index in range(count):
                    plain_step(model, trainable, optimizer, *batches[index % len(batches)], autocast)

        seconds = median_seconds({"plain": (lambda: plain_steps(steps), lambda: plain_steps(2))}, device, 3)["plain"]
        rates[config] = round(batch_size * steps / seconds, 1)
    return rates


def variant_words(row: dict) -> str:
    """How a step was run, in words: ", compiled (blocks, max-autotune), attention cudnn"."""
    words = ""
    if row.get("compile", "none") not in ("none", False):
        mode = row.get("compile_mode", "default")
        words += f", compiled ({row['compile']}{'' if mode == 'default' else ', ' + mode})"
    if row.get("attention", "auto") != "auto":
        words += f", attention {row['attention']}"
    if row.get("precision", "autocast") == "bf16":
        words += ", bf16 with fp32 masters"
    elif row.get("precision", "autocast") == "fp32":
        words += ", fp32"
    if row.get("fused", "none") != "none":
        words += f", fused {row['fused']}"
    if row.get("graph"):
        words += ", CUDA graph"
    return words


CHECK_STEP = 4
"""The step (0-based) whose loss and gradient norm every variant row records beside its first's: by
then every variant runs as it is timed (``step.warmup_steps``; a graphed step replays)."""

VARIANT_KEYS = {
    "batch_size": None,
    "compile": None,
    "compile_mode": "default",
    "attention": "auto",
    "precision": "autocast",
    "fused": "none",
    "graph": False,
}
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
    (``step.compile_model``: none, model, blocks), ``torch.compile`` mode, attention kernel,
    precision (``options.PRECISIONS``), fused ops (``options.FUSED_CHOICES``; rows record what
    "auto" resolves to) and CUDA graph or not (``step.GraphedStep``):
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
    components.check_config(config)  # every choice is checked before any work
    device = resolve_device(device)
    runs = []  # (batch size, checked step options), each once
    for batch_size in batch_sizes:
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch sizes must be positive integers, got {batch_size!r}")
        for how in compiles:
            for mode in modes if compile_choice(how) != "none" else ("default",):
                for attention, precision, fused, graph in itertools.product(attentions, precisions, fuseds, graphs):
                    run = (batch_size, StepOptions(how, mode, attention, precision, fused, graph).checked(device))
                    if run not in runs:
                        runs.append(run)
    try:
        rows = json.loads(out.read_text()) if out and out.is_file() else []
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ValueError(f"{out} holds no rows of JSON: move it away or name another --json file") from None
    cuda = device.type == "cuda"
    peak = _peak_tflops(device)
    for batch_size, options in runs:
        combo = {"batch_size": batch_size, **asdict(options)}
        if any({key: row.get(key, default) for key, default in VARIANT_KEYS.items()} == combo for row in rows):
            continue
        row = {
            "model": model_name,
            "config": config,
            **combo,
            "device": device_name(device),
            "torch": torch.__version__,
        }
        try:
            torch.manual_seed(0)
            model = models.create_model(model_name, pretrained=False, num_classes=10).to(device)
            size = model.patch_embed.img_size[0]
            loader = DeviceLoader(
                synthetic_train_set(batch_size * 2, source_size),
                batch_size,
                augment=True,
                image_size=size,
                device=device,
            )
            components.set_trainable(model, config)
            flops = step_flops(model, *loader.batch(0))
            steps_of = library_steps(model, config, loader, batch_size, device, options)
            if cuda:
                torch.cuda.reset_peak_memory_stats(device)
            warmup = Timed(lambda: steps_of(0, 1), device)  # the first step: same weights, same batch in every row
            # compilation, a graph's capture
            assert warmup_steps(options) <= CHECK_STEP, "CHECK_STEP must cover the warm-up"
            more = lambda: steps_of(1, CHECK_STEP - 1)  # noqa: E731
            check = Timed(lambda: steps_of(CHECK_STEP, 1), device)  # every row at its speed by now: a graph replays
            seconds = median_seconds(
                {"step": (lambda: steps_of(CHECK_STEP + 1, steps), lambda: (warmup(), more(), check()))},
                device,
                repeats,
            )["step"]
            loss, norm = (float(v) for v in warmup.value)
            check_loss, check_norm = (float(v) for v in check.value)
            rate = batch_size * steps / seconds
            achieved = flops / batch_size * rate / 1e12
            row.update(
                {
                    "images_per_s": round(rate, 1),
                    "tflops": _significant(achieved),
                    "mfu": round(achieved / peak, 6) if peak else None,
                    "warmup_seconds": round(warmup.seconds, 2),
                    "first_loss": loss,
                    "first_grad_norm": norm,
                    "check_loss": check_loss,
                    "check_grad_norm": check_norm,
                    "peak_memory_gib": round(torch.cuda.max_memory_allocated(device) / 2**30, 2) if cuda else None,
                }
            )
            reference = next((r for r in rows if "first_loss" in r and r["batch_size"] == batch_size), None)
            if reference:
                near = lambda key: abs(row[key] - reference[key]) <= 0.05 * abs(reference[key])  # noqa: E731
                row["agrees"] = bool(
                    near("first_loss")
                    and near("first_grad_norm")
                    and ("check_loss" not in reference or (near("check_loss") and near("check_grad_norm")))
                )
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


PROFILE_GROUPS = ("matrix products", "attention", "other")
_MATRIX = (
    "gemm",
    "nvjet",
    "cutlass",
    "xmma",
    "aten::mm",
    "aten::addmm",
    "aten::bmm",
    "aten::_addmm",
    "convolution",
    "mkldnn_linear",
)
_ATTENTION = ("flash", "fmha", "attention", "sdpa", "efficient_attention")


def profile_group(name: str) -> str:
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
    """Where a training step's time goes: ``step.training_step`` on synthetic images through
    the ``DeviceLoader`` (the step ``bench finetune`` times), profiled with ``torch.profiler``.

    On CUDA, kernel time (self device time of every kernel); on a CPU, the self time of every
    ATen op. Grouped into matrix products, attention and the rest, with the ``top`` largest
    entries; ``time_ms_per_step`` is the profiled time per step (kernel time on CUDA, so launch
    gaps are not in it) and ``wall_ms_per_step`` the wall time of the same steps run unprofiled
    just before (on CUDA, the difference is the time the GPU waits between kernels).
    """
    components.check_config(config)  # before any work
    device = resolve_device(device)
    cuda = device.type == "cuda"
    # recorded as what ran
    options = StepOptions(compile, compile_mode, attention, precision, fused, graph).checked(device)
    model = models.create_model(model_name, pretrained=False, num_classes=10).to(device)
    size = model.patch_embed.img_size[0]
    loader = DeviceLoader(
        synthetic_train_set(batch_size * 2, source_size), batch_size, augment=True, image_size=size, device=device
    )
    steps_of = library_steps(model, config, loader, batch_size, device, options)

    def run(first: int, count: int) -> None:
        steps_of(first, count)
        sync(device)

    # the profiler's first use after a graph's capture can miss or break the graph's kernels (pytorch#75504)
    if options.graph:
        with profile():
            pass
    run(0, max(2, warmup_steps(options)))  # warm-up (compilation, a graph's capture)
    wall = Timed(lambda: run(1, steps), device)
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
        groups[profile_group(name)] += spent
    largest = sorted(times.items(), key=lambda item: -item[1])[:top]
    return {
        "model": f"{model_name} ({size}px, random weights)",
        "config": config,
        "batch_size": batch_size,
        "device": device_name(device),
        **asdict(options),
        "steps": steps,
        "measured": "CUDA kernel time" if cuda else "CPU time of ATen ops (self)",
        "time_ms_per_step": round(total / steps / 1000, 2),
        "wall_ms_per_step": round(wall.seconds / steps * 1000, 2),
        "shares": {group: round(spent / total, 4) for group, spent in groups.items()},
        "largest": [
            {"name": name, "group": profile_group(name), "share": round(spent / total, 4)} for name, spent in largest
        ],
        "torch": torch.__version__,
    }


def bench_kernels(
    model_name: str = "vit_base_in21k", batch_size: int | None = None, device: str = "auto", min_run_time: float = 1.0
) -> dict:
    """Our fused ops alone (``kernels``: Triton on CUDA, their PyTorch reference elsewhere) at one
    model's training shapes, in bf16, against a copy of the same bytes (the memory-bound limit).

    ``batch_size`` images of the model's tokens give the rows (None: 512 on CUDA, the paper's batch,
    and 8 on a CPU); fc1's (rows x hidden) product for ``bias_gelu`` and its backward (which also sums
    the bias gradient), timm's strided q/k/v head gradients for ``qkv_heads_backward``. Milliseconds
    are the median of ``torch.utils.benchmark``'s blocked autorange; GB/s counts the bytes each op
    must read and write once. On CUDA, inductor's own bias + GELU forward is timed beside ours.

    The SGD update of all the model's parameters with bf16 master weights (clipping at norm 1, the
    update, the bf16 copy) is timed as a training step runs it (``step.clip_and_update``), unfused
    (the gradients copied to the fp32 masters, ``clip_grad_norm_``, ``torch.optim.SGD``, the masters
    copied back) and fused (``step.FusedSGD``: the norm, then one pass per parameter); GB/s counts
    the 22 bytes per parameter that the job must move (a bf16 gradient read twice, an fp32 weight and
    momentum read and written, a bf16 copy written). Timed eagerly, both include the host's kernel launches
    (one per parameter fused), which a training step mostly hides behind its backward; on CUDA both are also timed
    replayed from a CUDA graph (as ``graph=True`` runs them), which leaves the device's time alone.
    """
    # imported here, not at the top: torch.utils.benchmark imports torch.utils.cpp_extension, which
    # logs "No CUDA runtime is found" where a CUDA build of PyTorch runs without a GPU; at the top,
    # every command of the benchmark (and every import of this module) would print it
    from torch.utils.benchmark import Timer

    device = resolve_device(device)
    cuda = device.type == "cuda"
    batch_size = (512 if cuda else 8) if batch_size is None else batch_size
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    model = models.create_model(model_name, pretrained=False)
    block = model.blocks[0]
    if not (is_fusable_mlp(block.mlp) and is_fusable_attention(block.attn)):
        raise ValueError(
            f"bench kernels times our fused ops at a model's shapes, and {model_name!r} has not the layers they "
            "compute (timm's Mlp with a biased fc1 and exact GELU, Attention with a biased fused q/k/v)"
        )
    tokens = model.patch_embed.num_patches + model.num_prefix_tokens
    width, hidden, heads = model.embed_dim, block.mlp.fc1.out_features, block.attn.num_heads
    master = MasterWeights(model.to(device))  # fp32 masters and their bf16 copy, all trainable
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
        "bias_gelu forward": (lambda: bias_gelu(mm, bias), 4 * mm.numel()),
        "bias_gelu backward (+ bias gradient)": (lambda: bias_gelu_backward(grad, mm, bias), 6 * mm.numel()),
        "qkv_heads_backward (+ bias gradient)": (lambda: qkv_heads_backward(dq, dk, dv), 4 * packed.numel()),
    }
    updates = {
        f"SGD update with bf16 masters, {name}": (
            lambda optimizer=optimizer: clip_and_update(optimizer, master.masters, 1.0, master)
        )
        for name, optimizer in (("unfused", unfused_sgd), ("fused (FusedSGD)", fused_sgd))
    }
    ops |= {name: (update, 22 * parameters) for name, update in updates.items()}
    errors = {}
    if cuda:
        inductor = torch.compile(lambda a, b: torch.nn.functional.gelu(a + b))
        ops["inductor's bias + GELU forward"] = (lambda: inductor(mm, bias), 4 * mm.numel())
        # without the host's launches (one per parameter fused, a few per step unfused)
        for name, update in updates.items():
            try:
                ops[f"{name}, replayed from a CUDA graph"] = (_graphed(update, device), 22 * parameters)
            except RuntimeError as error:  # a step that cannot be recorded: say so, time the rest
                errors[f"{name}, replayed from a CUDA graph: error"] = str(error).splitlines()[0][:300]
    result = {
        "model": model_name,
        "batch_size": batch_size,
        "rows": rows,
        "hidden": hidden,
        "heads": heads,
        "parameters": parameters,
        "device": device_name(device),
        "torch": torch.__version__,
        "ops": "Triton kernels" if cuda and triton_available() else "PyTorch reference",
    }
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
