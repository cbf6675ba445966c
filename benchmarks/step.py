"""The benchmarks of the training step: how fast ``finetune``'s step runs, and why.

- ``bench_finetune``: training images/s per component, the library's step against a plain fp32
  DataLoader loop (``python -m benchmarks finetune``).
- ``bench_presets``: each speed preset against "none", per precision (``python -m benchmarks presets``).
- ``bench_variants``: one component's step under every combination of the step's options, each
  row checked against the first (``python -m benchmarks variants``).
- ``bench_profile``: where a step's time goes (``python -m benchmarks profile``).
- ``bench_kernels``: our fused ops alone, against a copy of the same bytes (``python -m benchmarks kernels``).

Every step benchmark times the step a run trains with: the run's ``Config`` (``StepSettings.config``) through the
run's own builder, ``paperlib.train.step.build_step`` (``library_steps``: the model adapted as the run adapts it, LoRA
updates or an equal-capacity subset included, its optimizer and step options), and counts its FLOPs with PyTorch
(``step_flops``). What a benchmark times is ``StepSettings`` (which step) and ``Timing`` (how long, where).
"""

from __future__ import annotations

import contextlib
import copy
import gc
import itertools
import json
import os
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile
from torch.utils.data import DataLoader
from torch.utils.flop_counter import FlopCounterMode

from paperlib.data.imagesets import ImageDataset, random_images
from paperlib.data.loader import DeviceLoader, Transform
from paperlib.data.transforms import paper_transform
from paperlib.records import storage
from paperlib.records.methods import Method
from paperlib.records.step_options import PRESET_RECORD, STEP_OPTIONS, StepOptions, compile_choice, preset
from paperlib.speed.clock import Timed, device_name, endless, median_seconds, resolve_device, sync
from paperlib.speed.kernels import bias_gelu, bias_gelu_backward, qkv_heads_backward
from paperlib.speed.layers import is_fusable_attention, is_fusable_mlp
from paperlib.speed.options import check_precision, checked, triton_available
from paperlib.speed.step import autocast_for, compile_model, tf32_flags, warmup_steps
from paperlib.train.config import Config
from paperlib.train.step import adapt, build_step, network
from paperlib.vit import models
from paperlib.vit.components import check_run_component, set_trainable, trainable_parameters

PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0}  # dense bf16 tensor-core peaks

BENCH_LR = 1e-3
"""The learning rate of a benchmark's step (the paper's SGD: momentum 0.9, clipping at 1; ``Config``'s defaults)."""


@dataclass(frozen=True)
class StepSettings:
    """The step a benchmark times, for any component.

    A run of ``model`` (random weights, a 10-class head) at ``batch_size`` images, its step ``options`` (compilation,
    attention kernel, precision, fused ops), at ``image_size`` (None: the model's; the position embedding resampled, as
    a run does), training its component by ``method`` (a ``records.methods.Method``: its weights, LoRA updates, or a
    subset as large as a LayerNorm).

    ``config`` makes it a run's ``Config``, which ``library_steps`` builds as the run does."""

    model: str = "demo"
    batch_size: int = 64
    options: StepOptions = field(default_factory=StepOptions)
    image_size: int | None = None
    method: Method = Method()

    def config(self, component: str, device: torch.device) -> Config:
        """The run of ``component`` on ``device`` whose step is timed, checked (``Config``: before any work).

        The paper's SGD at ``BENCH_LR``, the whole batch in one pass (``micro_batch``: a benchmark measures
        the batch it is given, without splitting it when the GPU runs out of memory)."""
        return Config(
            model=self.model,
            component=component,
            batch_size=self.batch_size,
            micro_batch=self.batch_size,
            lr=BENCH_LR,
            device=str(device),
            image_size=self.image_size or 0,
            method=self.method,
            step=self.options,
        )


@dataclass(frozen=True)
class Timing:
    """How a step benchmark times.

    ``steps`` timed steps (after the warm-up), the median of ``repeats`` interleaved timings, on ``device`` (cuda,
    cuda:<index>, cpu, or "auto": a GPU if there is one), on synthetic uint8 images of ``source_size`` pixels
    (Cifar-like), resized to the model's resolution by the training transform."""

    steps: int = 10
    repeats: int = 3
    device: str = "auto"
    source_size: int = 32


def _peak_tflops(device: torch.device) -> float | None:
    """The dense bf16 peak of ``device`` if it is a GPU of ``PEAK_TFLOPS``, else None (no utilisation)."""
    if device.type != "cuda":
        return None
    return next((value for name, value in PEAK_TFLOPS.items() if name in torch.cuda.get_device_name(device)), None)


def _significant(value: float, digits: int = 5) -> float:
    """``value`` to ``digits`` significant digits (a CPU's TFLOP/s would round to 0.0 at 3 decimals)."""
    return float(f"{value:.{digits}g}")


def step_flops(model, images, labels) -> int:
    """FLOPs of one training step (forward + backward) of the eager model on ``images``.

    As its parameters' ``requires_grad`` stand, counted by PyTorch (blocks compiled in place are returned
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


def library_steps(config: Config, model, loader: DeviceLoader):
    """The step a run of ``config`` trains ``model`` with, built by the run's builder (``train.step.build_step``).

    ``model`` is adapted in place, LoRA updates or an equal-capacity subset included, the run's optimizer and step
    options; ``StepSettings.config``: the paper's SGD, the whole batch in one pass): returns ``steps(first, count)``,
    which trains on the loader's batches ``first`` to ``first + count - 1`` and returns the last (loss, norm)."""
    one_step = build_step(config, model)

    def steps(first: int, count: int):
        for index in range(first, first + count):
            last = one_step(*loader.batch(index))
        return last

    return steps


def plain_step(model, trainable, optimizer, images, labels, context=contextlib.nullcontext) -> None:
    """One step of the plain loop in the authors' style.

    Forward (in ``context``, e.g. autocast), cross-entropy, backward, clipping at global norm 1, the optimizer's
    update."""
    with context():
        loss = torch.nn.functional.cross_entropy(model(images), labels)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(trainable, 1.0)
    optimizer.step()


def _plain_loader(dataset: ImageDataset, batch_size: int, size: int, workers: int, device: torch.device):
    """The plain loop's data.

    ``dataset``'s images through the paper's torchvision transform in ``workers`` DataLoader workers, as the authors'
    code loads them."""
    transformed = ImageDataset(dataset.images, dataset.targets, dataset.classes, "synthetic", "train")
    transformed.transform = paper_transform(True, size)
    return DataLoader(
        transformed,
        batch_size,
        shuffle=True,
        drop_last=True,
        num_workers=workers,
        pin_memory=device.type == "cuda",
        persistent_workers=workers > 0,
    )


def _plain_run(model, loader: DataLoader, steps: int, device: torch.device) -> tuple:
    """(timed run, warm-up) of the plain loop on ``model`` as its trainable parameters stand.

    Batches of ``loader`` copied to the device, ``torch.optim.SGD`` with PyTorch's default kernels, fp32."""
    trainable = [p for _, p in trainable_parameters(model)]
    optimizer = torch.optim.SGD(trainable, lr=1e-3, momentum=0.9)

    def plain_steps(count: int):
        iterator = endless(loader)
        for _ in range(count):
            x, y = next(iterator)
            plain_step(model, trainable, optimizer, x.to(device, non_blocking=True), y.to(device, non_blocking=True))
        iterator.close()

    return lambda: plain_steps(steps), lambda: plain_steps(1)


def _random_model(config: Config, device: torch.device):
    """The network a run of ``config`` trains, with random weights and a 10-class head, on ``device``.

    ``train.step.network``: at the run's image size."""
    return network(config, 10, pretrained=False).to(device)


def bench_finetune(
    settings: StepSettings = StepSettings(),
    components: tuple[str, ...] = ("full", "mha", "fc1", "ln1", "linear"),
    timing: Timing = Timing(),
    *,
    workers: int | None = None,
    plain: bool = True,
) -> dict:
    """Training images/s per component: the library step vs a plain fp32 DataLoader loop.

    The step of ``settings`` for each component of ``components``, timed as ``timing`` says. Random weights and
    synthetic uint8 images (``Timing.source_size`` pixels, Cifar-like), upsampled to the model's resolution with the
    paper's training transform. The library step is the one a run trains with (``library_steps``, the run's builder:
    images on the device, batched augmentation, only trainable weights get gradients, the step options: compilation,
    attention kernel, precision, fused ops); its first steps (with any compilation) are timed apart as
    ``warmup_seconds``. The plain loop (what the authors' code does): a twin of the timm model as created,
    torchvision transforms in ``workers`` DataLoader workers (None: one per CPU core), fp32, the same parameters
    trainable (``train.step.adapt``). Model FLOP utilisation counts the FLOPs PyTorch reports for one step (forward
    and backward). Median of ``Timing.repeats`` interleaved timings of ``Timing.steps`` steps; ``plain=False`` times
    the library step alone. With another ``StepSettings.method`` than the weights', each component trains what the
    method adds (LoRA updates, a subset as large as a LayerNorm) in both loops, each on a fresh copy of the model.
    ``<component>_trainable_parameters``: the parameters its step trains.
    """
    device = resolve_device(timing.device)
    workers = os.cpu_count() if workers is None else workers
    if not components:
        raise ValueError("no component to time: give at least one")
    configs = {component: settings.config(component, device) for component in components}  # checked before any work
    options = checked(settings.options, device)  # recorded as what ran
    model = _random_model(next(iter(configs.values())), device)
    # a run that adds to its model (LoRA updates, a subset) is adapted on an untouched copy per component and loop
    adds = settings.method.name != "weights"
    pristine = copy.deepcopy(model) if adds else None
    # the library's changes to its model (patch embedding, compiled blocks) stay out of the plain loop
    plain_model = copy.deepcopy(model) if plain and not adds else None
    size = settings.image_size or model.patch_embed.img_size[0]
    batch_size = settings.batch_size
    dataset = random_images(batch_size * 4, timing.source_size)
    fast = DeviceLoader(dataset, batch_size, Transform(True, size), device=device)
    plain_loader = _plain_loader(dataset, batch_size, size, workers, device) if plain else None
    peak = _peak_tflops(device)
    result = {
        "model": f"{settings.model} ({size}px, random weights)",
        "batch_size": batch_size,
        "device": device_name(device),
        **asdict(options),
        "steps": timing.steps,
        "repeats": timing.repeats,
        "dataloader_workers": workers,
        "peak_tflops_bf16": peak,
        **settings.method.record(),
    }
    for component, config in configs.items():
        if adds:
            model = copy.deepcopy(pristine)
            plain_model = copy.deepcopy(pristine) if plain else None
        train_steps = library_steps(config, model, fast)
        warmup = Timed(lambda: train_steps(0, warmup_steps(options)), device)
        runs = {"library": (lambda: train_steps(1, timing.steps), warmup)}
        if plain:
            runs["plain"] = _plain_run(adapt(plain_model, config), plain_loader, timing.steps, device)
        seconds = median_seconds(runs, device, timing.repeats)
        rates = {name: batch_size * timing.steps / value for name, value in seconds.items()}
        # counted after the timing: counting runs the model eager (blocks compiled in place are returned to eager)
        flops = step_flops(model, *fast.batch(0))
        if plain:
            result[f"{component}_plain_images_per_s"] = round(rates["plain"], 1)
            result[f"{component}_speedup"] = round(rates["library"] / rates["plain"], 2)
        result[f"{component}_library_images_per_s"] = round(rates["library"], 1)
        result[f"{component}_warmup_seconds"] = round(warmup.seconds, 2)
        result[f"{component}_trainable_parameters"] = sum(p.numel() for _, p in trainable_parameters(model))
        achieved = flops / batch_size * rates["library"] / 1e12
        result[f"{component}_library_tflops"] = _significant(achieved)
        if peak:
            result[f"{component}_library_mfu"] = round(achieved / peak, 6)
    plain_loader = plain_model = None  # shuts its workers down
    gc.collect()
    return result | {"torch": torch.__version__}


PLAIN_PRECISION = {"fp32": "fp32", "tf32": "tf32", "autocast": "autocast", "bf16": "autocast"}
"""The plain loop's precision beside the library's: a plain loop has no master weights, so bf16's is autocast."""


def bench_presets(
    model_name: str = "demo",
    components: tuple[str, ...] = ("full", "mha", "ln2"),
    batch_size: int = 64,
    timing: Timing = Timing(),
    presets: tuple[str, ...] = (),
    precisions: tuple[str, ...] = ("fp32", "autocast"),
    plain: bool = True,
) -> list[dict]:
    """Training images/s per precision, component and speed preset, on one machine.

    Each preset of ``presets`` (``options.preset``: names, files) against "none" in the same precision, and a plain loop
    in that precision (``PLAIN_PRECISION``; the authors' style: timm's model, ``torch.optim.SGD``, clipping at 1) on the
    same batches, already on the device, so that only the step differs. What a preset file records as its ``gain`` is
    this table's ``gain`` column. Rows: precision, preset, component, img/s, gain over "none", warm-up seconds
    (compilation included), and the plain loop's img/s beside "none". Each timed as ``timing`` says."""
    rows = []
    device_ = resolve_device(timing.device)
    for precision in precisions:
        check_precision(precision, device_)
        for name in ("none", *presets):
            chosen = {key: value for key, value in preset(name).items() if key not in PRESET_RECORD}
            options = StepOptions(**{**chosen, "precision": precision})
            result = bench_finetune(StepSettings(model_name, batch_size, options), components, timing, plain=False)
            for component in components:
                row = {"precision": precision, "preset": name, "component": component, "device": result["device"]}
                row["images_per_s"] = result[f"{component}_library_images_per_s"]
                row["warmup_seconds"] = result[f"{component}_warmup_seconds"]
                rows.append(row)
        if plain:
            plain_rates = bench_plain(
                model_name, components, batch_size, timing.steps, device_, PLAIN_PRECISION[precision]
            )
            for row in rows:
                if row["precision"] == precision and row["preset"] == "none":
                    row["plain_images_per_s"] = plain_rates[row["component"]]
    for row in rows:
        key = (row["precision"], "none", row["component"])
        none = next(r for r in rows if (r["precision"], r["preset"], r["component"]) == key)
        row["gain"] = round(row["images_per_s"] / none["images_per_s"], 3)
    return rows


def bench_plain(
    model_name: str, components: tuple[str, ...], batch_size: int, steps: int, device: torch.device, precision: str
) -> dict[str, float]:
    """Images/s per component of a plain training loop in ``precision`` (fp32, tf32 or autocast).

    On batches already on the device: timm's model as created, ``torch.optim.SGD`` (PyTorch's default kernels),
    clipping at norm 1; TF32 flags and autocast as the library's step sets them (``tf32_flags``, ``autocast_for``)."""
    model = models.create_model(model_name, pretrained=False, num_classes=10).to(device)
    size = model.patch_embed.img_size[0]
    loader = DeviceLoader(random_images(batch_size * 4, 32), batch_size, Transform(True, size), device=device)
    batches = [loader.batch(index) for index in range(4)]
    autocast = autocast_for(device, check_precision(precision, device))
    rates = {}
    for component in components:
        set_trainable(model, component)
        trainable = [p for _, p in trainable_parameters(model)]
        optimizer = torch.optim.SGD(trainable, lr=1e-3, momentum=0.9)

        def plain_steps(count: int):
            with tf32_flags(precision):
                for index in range(count):
                    plain_step(model, trainable, optimizer, *batches[index % len(batches)], autocast)

        seconds = median_seconds({"plain": (lambda: plain_steps(steps), lambda: plain_steps(2))}, device, 3)["plain"]
        rates[component] = round(batch_size * steps / seconds, 1)
    return rates


PRECISION_WORDS = {"fp32": "fp32", "tf32": "tf32", "autocast": "bf16 autocast", "bf16": "bf16 with fp32 masters"}


def variant_words(row: dict) -> str:
    """How a step was run, in words.

    "compiled (blocks, coordinate-descent), attention cudnn, bf16 autocast". A row without a precision was written when
    rows ran under autocast only."""
    words = ["eager"]
    if row.get("compile", "none") not in ("none", False):
        mode = row.get("compile_mode", "default")
        words = [f"compiled ({row['compile']}{'' if mode == 'default' else ', ' + mode})"]
    if row.get("attention", "auto") != "auto":
        words.append(f"attention {row['attention']}")
    words.append(PRECISION_WORDS[row.get("precision", "autocast")])
    if row.get("fused", "none") != "none":
        words.append(f"fused {row['fused']}")
    return ", ".join(words)


CHECK_STEP = 4
"""The step (0-based) whose loss and gradient norm every variant row records beside its first's: by
then every variant runs as it is timed (``step.warmup_steps``: compilation done)."""

VARIANT_KEYS = {
    "batch_size": None,
    "compile": None,
    "compile_mode": "default",
    "attention": "auto",
    "precision": "autocast",
    "fused": "none",
}
"""What tells the rows of ``bench_variants`` apart, with the value of rows written before the key existed
(those rows ran under autocast, without fused ops)."""


def variant_options(
    batch_sizes: tuple[int, ...], choices: dict[str, tuple], device: torch.device
) -> list[tuple[int, StepOptions]]:
    """(batch size, checked step options) for every combination of ``batch_sizes`` and ``choices``.

    ``choices``: a ``StepOptions`` field -> its values; a field not there keeps its default), each once, in that order
    (batch size first, then the fields in ``STEP_OPTIONS``' order); a mode only for compiled rows.
    Every choice is checked here, before any work."""
    unknown = sorted(set(choices) - set(STEP_OPTIONS))
    if unknown:
        raise ValueError(f"unknown step option(s) {', '.join(unknown)}; valid: {', '.join(STEP_OPTIONS)}")
    defaults = asdict(StepOptions())
    values = [choices.get(name, (defaults[name],)) for name in STEP_OPTIONS]
    runs = []
    for batch_size in batch_sizes:
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch sizes must be positive integers, got {batch_size!r}")
        for combination in itertools.product(*values):
            options = StepOptions(*combination)
            if compile_choice(options.compile) == "none":
                options = replace(options, compile_mode="default")
            run = (batch_size, checked(options, device))
            if run not in runs:
                runs.append(run)
    return runs


def _measure_variant(settings: StepSettings, component: str, timing: Timing) -> dict:
    """One row of ``bench_variants``.

    The step of ``settings`` for ``component`` from fresh random weights (seed 0) on synthetic batches, timed as
    ``timing`` says."""
    device = resolve_device(timing.device)
    config = settings.config(component, device)
    torch.manual_seed(0)
    model = _random_model(config, device)
    size = model.patch_embed.img_size[0]
    dataset = random_images(settings.batch_size * 2, timing.source_size)
    loader = DeviceLoader(dataset, settings.batch_size, Transform(True, size), device=device)
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    steps_of = library_steps(config, model, loader)
    warmup = Timed(lambda: steps_of(0, 1), device)  # the first step: same weights, same batch in every row
    assert warmup_steps(config.checked_options) <= CHECK_STEP, "CHECK_STEP must cover the warm-up"
    more = lambda: steps_of(1, CHECK_STEP - 1)  # noqa: E731 -- compilation
    check = Timed(lambda: steps_of(CHECK_STEP, 1), device)  # every row at its speed by now
    steps = timing.steps
    seconds = median_seconds(
        {"step": (lambda: steps_of(CHECK_STEP + 1, steps), lambda: (warmup(), more(), check()))},
        device,
        timing.repeats,
    )["step"]
    peak_memory = round(torch.cuda.max_memory_allocated(device) / 2**30, 2) if cuda else None
    # counted after the timing: counting runs the model eager (blocks compiled in place are returned to eager)
    flops = step_flops(model, *loader.batch(0))
    loss, norm = (float(v) for v in warmup.value)
    check_loss, check_norm = (float(v) for v in check.value)
    rate = settings.batch_size * steps / seconds
    achieved = flops / settings.batch_size * rate / 1e12
    peak = _peak_tflops(device)
    return {
        "images_per_s": round(rate, 1),
        "tflops": _significant(achieved),
        "mfu": round(achieved / peak, 6) if peak else None,
        "warmup_seconds": round(warmup.seconds, 2),
        "first_loss": loss,
        "first_grad_norm": norm,
        "check_loss": check_loss,
        "check_grad_norm": check_norm,
        "peak_memory_gib": peak_memory,
    }


def _agrees(row: dict, reference: dict) -> bool:
    """Whether ``row``'s first step is ``reference``'s, within 5% (the bf16 tolerance).

    And its step ``CHECK_STEP``, where ``reference`` has it."""
    near = lambda key: abs(row[key] - reference[key]) <= 0.05 * abs(reference[key])  # noqa: E731
    later = "check_loss" not in reference or (near("check_loss") and near("check_grad_norm"))
    return bool(near("first_loss") and near("first_grad_norm") and later)


def bench_variants(
    model_name: str = "demo",
    component: str = "full",
    batch_sizes: tuple[int, ...] = (64,),
    choices: dict[str, tuple] | None = None,
    timing: Timing = Timing(),
    out: Path | None = None,
) -> list[dict]:
    """The library's training step for ``component`` under every combination of batch size and step options.

    The combinations: ``variant_options``: ``choices`` maps a ``StepOptions`` field to its values, e.g.
    ``{"compile": ("none", "blocks"), "precision": ("fp32", "bf16")}``; rows record what "auto"
    resolves to): images/s, TFLOP/s, model FLOP utilisation, warm-up seconds (compilation included)
    and, on CUDA, the peak GPU memory allocated (GiB) per row; each row timed as ``timing`` says.

    Every row starts from the same random weights and the same batches, and records the loss and
    gradient norm of its first step and of step ``CHECK_STEP`` (after that many updates) next to
    those of the first row (``agrees``: both within 5%, the bf16 tolerance), so that no variant is
    fast because it computes something else: a stale compiled graph that skips gradients, an update
    that does not update. A variant that fails (a kernel missing for this device or shape, a compiler
    error) is recorded with its error; the others still run. With ``out``, the rows are written there
    (JSON) as each ends, and rows already there are kept and not measured again: a sweep stopped by
    a time limit goes on where it stopped.
    """
    check_run_component(component)  # every choice is checked before any work
    device = resolve_device(timing.device)
    runs = variant_options(batch_sizes, choices or {}, device)
    try:
        rows = json.loads(out.read_text()) if out and out.is_file() else []
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ValueError(f"{out} holds no rows of JSON: move it away or name another --json file") from None
    for batch_size, options in runs:
        combo = {"batch_size": batch_size, **asdict(options)}
        if any({key: row.get(key, default) for key, default in VARIANT_KEYS.items()} == combo for row in rows):
            continue
        row = {"model": model_name, "component": component, **combo}
        row |= {"device": device_name(device), "torch": torch.__version__}
        try:
            row |= _measure_variant(StepSettings(model_name, batch_size, options), component, timing)
            reference = next((r for r in rows if "first_loss" in r and r["batch_size"] == batch_size), None)
            if reference:
                row["agrees"] = _agrees(row, reference)
        except Exception as error:  # noqa: BLE001 -- one failing variant must not lose the others
            row["error"] = f"{type(error).__name__}: {error}".splitlines()[0][:300]
        finally:
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
        rows.append(row)
        if out:
            storage.atomic_write_text(out, json.dumps(rows, indent=2) + "\n")
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


def _self_times(profiler, cuda: bool) -> dict[str, float]:
    """The self time of each kernel (``cuda``) or ATen op (CPU) that a profile recorded, by name."""
    times: dict[str, float] = {}
    for event in profiler.key_averages():
        if cuda != (event.device_type.name == "CUDA"):
            continue
        spent = event.self_device_time_total if cuda else event.self_cpu_time_total
        if spent > 0:
            times[event.key] = times.get(event.key, 0.0) + spent
    if not times:
        raise RuntimeError("the profiler recorded no time; is this PyTorch build's profiler working?")
    return times


def bench_profile(
    settings: StepSettings = StepSettings(),
    component: str = "full",
    timing: Timing = Timing(steps=3),
    top: int = 15,
) -> dict:
    """Where a training step's time goes.

    The library's step of ``settings`` for ``component`` (``library_steps``, the step ``python -m benchmarks finetune``
    times) on synthetic images through the ``DeviceLoader``, profiled with ``torch.profiler`` over ``Timing.steps``
    steps (after the warm-up).

    On CUDA, kernel time (self device time of every kernel); on a CPU, the self time of every
    ATen op. Grouped into matrix products, attention and the rest, with the ``top`` largest
    entries; ``time_ms_per_step`` is the profiled time per step (kernel time on CUDA, so launch
    gaps are not in it) and ``wall_ms_per_step`` the wall time of the same steps run unprofiled
    just before (on CUDA, the difference is the time the GPU waits between kernels).
    """
    device = resolve_device(timing.device)
    config = settings.config(component, device)  # every choice checked before any work
    cuda = device.type == "cuda"
    options = config.checked_options  # recorded as what ran
    model = _random_model(config, device)
    size = model.patch_embed.img_size[0]
    batch_size, steps = settings.batch_size, timing.steps
    images = random_images(batch_size * 2, timing.source_size)
    loader = DeviceLoader(images, batch_size, Transform(True, size), device=device)
    steps_of = library_steps(config, model, loader)

    def run(first: int, count: int) -> None:
        steps_of(first, count)
        sync(device)

    run(0, max(2, warmup_steps(options)))  # warm-up (compilation)
    wall = Timed(lambda: run(1, steps), device)
    wall()  # the same steps unprofiled: wall time against the profiled time shows the gaps between kernels
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as profiler:
        run(1, steps)
    times = _self_times(profiler, cuda)
    total = sum(times.values())
    groups = {group: 0.0 for group in PROFILE_GROUPS}
    for name, spent in times.items():
        groups[profile_group(name)] += spent
    largest = sorted(times.items(), key=lambda item: -item[1])[:top]
    return {
        "model": f"{settings.model} ({size}px, random weights)",
        "component": component,
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
    """Our fused ops alone at one model's training shapes, in bf16, against a copy of the same bytes.

    The ops: ``kernels``, Triton on CUDA and their PyTorch reference elsewhere; the copy: the memory-bound limit.

    ``batch_size`` images of the model's tokens give the rows (None: 512 on CUDA, the paper's batch,
    and 8 on a CPU); fc1's (rows x hidden) product for ``bias_gelu`` and its backward (which also sums
    the bias gradient), timm's strided q/k/v head gradients for ``qkv_heads_backward``. Milliseconds
    are the median of ``torch.utils.benchmark``'s blocked autorange; GB/s counts the bytes each op
    must read and write once. On CUDA, inductor's own bias + GELU forward is timed beside ours.
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
            f"the kernels benchmark times our fused ops at a model's shapes, and {model_name!r} has not the layers "
            "they compute (timm's Mlp with a biased fc1 and exact GELU, Attention with a biased fused q/k/v)"
        )
    tokens = model.patch_embed.num_patches + model.num_prefix_tokens
    width, hidden, heads = model.embed_dim, block.mlp.fc1.out_features, block.attn.num_heads
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
    if cuda:
        inductor = torch.compile(lambda a, b: torch.nn.functional.gelu(a + b))
        ops["inductor's bias + GELU forward"] = (lambda: inductor(mm, bias), 4 * mm.numel())
    result = {
        "model": model_name,
        "batch_size": batch_size,
        "rows": rows,
        "hidden": hidden,
        "heads": heads,
        "device": device_name(device),
        "torch": torch.__version__,
        "ops": "Triton kernels" if cuda and triton_available() else "PyTorch reference",
    }
    for name, (run, nbytes) in ops.items():
        run()  # compile / warm up
        seconds = Timer(stmt="run()", globals={"run": run}).blocked_autorange(min_run_time=min_run_time).median
        result[f"{name}: ms"] = round(seconds * 1e3, 4)
        result[f"{name}: GB/s"] = round(nbytes / seconds / 1e9, 1)
    return result
