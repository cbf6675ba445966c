"""Benchmarks that print their figures (never timed tests).

    python -m benchmarks plasticity                 # demo ViT, plain definition vs measure
    python -m benchmarks plasticity --model vit_base_in21k --pairs 64 --batch-size 16
    python -m benchmarks finetune                   # demo ViT, the protocol's fp32, five components
    python -m benchmarks finetune --model vit_base_in21k --batch-size 256 --device cuda --precision autocast
    python -m benchmarks finetune --components mha,fc1,fc2 --equal-capacity  # the subsets equal-capacity runs train

    python -m benchmarks data                       # fixture Cifar10 at 224, batch 512
    python -m benchmarks data --dataset digits --image-size 224
    python -m benchmarks data --dataset cifar10 --root /data --device cuda

    python -m benchmarks gpu --out bench-gpu        # the one GPU check (benchmarks.gpu); a dry run without a GPU
    python -m benchmarks targets --out bench-out    # every benchmark at its target's settings, checked
    python -m benchmarks profile --model vit_base_in21k --batch-size 256 \
        --device cuda                               # where a step's time goes
    python -m benchmarks variants --model vit_base_in21k --batch-sizes 256,512 --attention auto,flash,cudnn \
        --device cuda --json variants.json          # one step under each compilation / attention kernel
    python -m benchmarks kernels --device cuda      # our fused ops alone, against a copy of their bytes
    python -m benchmarks presets --model vit_base_in21k --device cuda --batch-size 128 \
        --presets h100 --precisions fp32,tf32,autocast,bf16  # each preset against none, per precision, plain beside

``python -m benchmarks COMMAND --help`` lists each command's options with their meaning, type,
default and valid choices. Every step runs in the protocol's fp32 unless ``--precision`` says otherwise.

``data`` measures images/s delivered as ready batches on the device by the two data paths on the
same dataset: torchvision transforms in DataLoader workers (then copied to the device), and the
device path (``paperlib.data.loader``: uint8 images on the device, batched crop/resize/flip/normalise).
Without ``--root``, a paper dataset is benchmarked on a fixture written in its official format
(random images, ``--fixture-size`` of them), so the figures measure the pipeline, not a disk.

The benchmarks themselves: ``benchmarks.step`` (the training step: finetune, presets, variants, profile,
kernels) and ``benchmarks.data`` (the data paths and plasticity). Here: the command line (``main``: one
parser and one runner per command) and ``bench_targets``, every benchmark at the settings of its target,
checked. Measured figures: docs/benchmarks.md. The package's other benchmarks have their own commands:
``python -m benchmarks.grid`` (the paper's grid at its real size), ``python -m benchmarks.sharing`` (sweep processes
sharing a spec's runs) and ``python -m benchmarks.precision_calibration``.
They import ``paperlib``, which never imports them (``tests/test_layout.py``).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from benchmarks import gpu
from benchmarks.data import bench_data, bench_plasticity
from benchmarks.step import (
    StepSettings,
    Timing,
    bench_finetune,
    bench_kernels,
    bench_presets,
    bench_profile,
    bench_variants,
    variant_words,
)
from paperlib.data import datasets
from paperlib.records import cli, storage
from paperlib.records.methods import METHODS, method_of
from paperlib.records.names import RUN_COMPONENTS
from paperlib.records.step_options import ATTENTION_CHOICES, COMPILE_CHOICES, PRECISIONS, STEP_OPTIONS, StepOptions
from paperlib.speed.clock import resolve_device
from paperlib.speed.options import compile_modes

TARGET_PARTS = ("data", "plasticity", "finetune", "compiled")


@dataclass
class Targets:
    """The checks of ``bench_targets`` as they are made, and each part's figures.

    With ``out``, both are written there as soon as they are known (``<part>.json``, ``targets.json``)."""

    out: Path | None
    checks: list[dict] = field(default_factory=list)

    def check(self, target: str, measured: str, met: bool | None) -> None:
        self.checks.append({"target": target, "measured": measured, "met": met})
        if self.out:
            storage.atomic_write_text(self.out / "targets.json", json.dumps(self.checks, indent=2) + "\n")

    def keep(self, part: str, result) -> None:
        if self.out:
            storage.atomic_write_text(self.out / f"{part}.json", json.dumps(result, indent=2) + "\n")


def _data_targets(targets: Targets, device: torch.device) -> None:
    """The data paths on a Cifar10 fixture at 224, checked against their target.

    The device path is to be >= 5x the DataLoader path on CUDA, and never slower on a CPU."""
    result = bench_data("cifar10", batch_size=512, image_size=224, device=str(device))
    targets.keep("data", result)
    need = 5.0 if device.type == "cuda" else 1.0
    targets.check(
        f"device path >= {need:g}x the DataLoader path (Cifar10 at 224, batch 512)",
        f"{result['device_path_images_per_s']:,.0f} vs "
        f"{result['dataloader_images_per_s']:,.0f} img/s ({result['speedup']}x)",
        result["speedup"] >= need,
    )


def _plasticity_targets(targets: Targets, device: torch.device) -> None:
    """The plasticity measurement (``measure``) against the plain definition, checked against its target.

    On a GPU, the paper's 12,800 ViT-Base pairs in under a minute (``measure``); on a CPU, ``measure`` >= 2x the plain
    definition on the demo ViT and on ViT-Base."""
    cuda = device.type == "cuda"
    # (model, pairs, batch, repeats): on a GPU, the paper's 12,800 pairs once
    settings = [("demo", 256, 64, 3), ("vit_base_in21k", 12800, 128, 1) if cuda else ("vit_base_in21k", 32, 16, 3)]
    results = [
        bench_plasticity(name, pairs, batch, str(device), repeats=repeats) for name, pairs, batch, repeats in settings
    ]
    targets.keep("plasticity", results)
    for (name, pairs, _, _), result in zip(settings, results):
        figures = (
            f"{result['measure_pairs_per_s']:,.1f} vs {result['plain_pairs_per_s']:,.1f} pairs/s ({result['speedup']}x)"
        )
        if cuda:
            targets.check(f"measure vs plain definition, {name}, {pairs:,} pairs", figures, None)
        else:
            targets.check(f"measure >= 2x the plain definition, {name}", figures, result["speedup"] >= 2.0)
    if cuda:
        seconds = results[-1]["seconds_for_12800_pairs"]
        targets.check("12,800 ViT-Base pairs in under a minute (measure, no decoding)", f"{seconds} s", seconds < 60)


def _step_scale(device: torch.device) -> tuple[str, int]:
    """The model and batch the step targets are measured at: ViT-Base/16 at 256 on a GPU, the demo ViT at 64."""
    return ("vit_base_in21k", 256) if device.type == "cuda" else ("demo", 64)


def _check_mfu(targets: Targets, result: dict) -> None:
    """The utilisation target for one ``bench_finetune`` result.

    The check is named by how its step ran (its options, as they resolved)."""
    mfu = result.get("full_library_mfu")
    targets.check(
        f"full finetuning at >= 40% model FLOP utilisation on an H100 ({variant_words(result)}, "
        f"batch {result['batch_size']})",
        f"{mfu:.1%}" if mfu is not None else f"{result['full_library_tflops']} TFLOP/s (no known peak for this device)",
        None if mfu is None else mfu >= 0.40,
    )


def _finetune_targets(targets: Targets, device: torch.device) -> None:
    """Every component's step under bf16 autocast against the plain fp32 loop.

    Frozen components are to be faster than full finetuning; on a GPU, also the utilisation target and the cost of
    the protocol's fp32."""
    name, batch = _step_scale(device)
    timing = Timing(steps=10, device=str(device))
    eager = bench_finetune(StepSettings(name, batch, StepOptions(precision="autocast")), RUN_COMPONENTS, timing)
    targets.keep("finetune", eager)
    for component in RUN_COMPONENTS:
        targets.check(
            f"{component}: library step vs plain fp32 DataLoader loop ({name}, batch {batch})",
            f"{eager[f'{component}_library_images_per_s']:,.1f} vs "
            f"{eager[f'{component}_plain_images_per_s']:,.1f} img/s ({eager[f'{component}_speedup']}x)",
            eager[f"{component}_speedup"] >= 1.0,
        )
    full = eager["full_library_images_per_s"]
    slower = [c for c in RUN_COMPONENTS if c != "full" and eager[f"{c}_library_images_per_s"] <= full]
    targets.check(
        "frozen components faster than full finetuning", "slower or equal: " + (", ".join(slower) or "none"), not slower
    )
    if device.type == "cuda":
        _check_mfu(targets, eager)
        # the paper's own precision (fp32), so that its cost is known beside the fast options'
        paper = bench_finetune(StepSettings(name, batch, StepOptions()), ("full",), timing, plain=False)
        targets.keep("finetune_fp32", paper)
        targets.check(
            f"full finetuning in fp32, the paper's precision ({name}, batch {batch})",
            f"{paper['full_library_images_per_s']:,.1f} img/s",
            None,
        )


def _compiled_targets(targets: Targets, device: torch.device) -> None:
    """The utilisation target for compiled steps under bf16 autocast, then for full at the fastest settings measured.

    Compiled under bf16 autocast: the whole model for full, MHA, LN1 and linear; full with its blocks compiled. The
    fastest settings measured: the paper's batch, blocks compiled with inductor's tuning, bf16 compute with fp32
    masters, full finetuning without and with our fused ops (fc1's bias+GELU, the q/k/v split)."""
    name, batch = _step_scale(device)
    measured = {
        "finetune_compiled": (("full", "mha", "ln1", "linear"), batch, StepOptions("model", precision="autocast")),
        "finetune_compiled_blocks": (("full",), batch, StepOptions("blocks", precision="autocast")),
    }
    fastest = StepOptions("blocks", compile_mode="coordinate-descent", precision="bf16")
    for part, fused in (("finetune_compiled_fastest", "none"), ("finetune_compiled_fused", "all")):
        measured[part] = (("full",), batch * 2, replace(fastest, fused=fused))
    for part, (components, batch_size, options) in measured.items():
        result = bench_finetune(
            StepSettings(name, batch_size, options), components, Timing(steps=10, device=str(device)), plain=False
        )
        targets.keep(part, result)
        _check_mfu(targets, result)


TARGETS = {
    "data": _data_targets,
    "plasticity": _plasticity_targets,
    "finetune": _finetune_targets,
    "compiled": _compiled_targets,
}


def bench_targets(device: str = "auto", out: Path | None = None, parts: tuple[str, ...] | None = None) -> list[dict]:
    """Every benchmark at the settings of its target, each figure checked against it; returns the checks.

    The parts' functions say which targets (``TARGETS``). On CUDA: the data paths, the paper's plasticity pairs,
    every component's step on ViT-Base/16 at batch 256 (``finetune``) and compiled steps (``compiled``: full
    finetuning at >= 40% FLOP utilisation on an H100). On a CPU, by default all but ``compiled``, at CPU scale (the
    demo ViT). Each part's figures go to ``<out>/<part>.json`` as soon as it ends, the checks to
    ``<out>/targets.json`` as they are made; the checks returned are (target, measured, met)."""
    for part in parts or ():
        if part not in TARGET_PARTS:
            raise ValueError(f"unknown part {part!r}; valid parts: {', '.join(TARGET_PARTS)}")
    device = resolve_device(device)
    parts = parts or (TARGET_PARTS if device.type == "cuda" else TARGET_PARTS[:-1])
    targets = Targets(out)
    for part in TARGET_PARTS:
        if part in parts:
            TARGETS[part](targets, device)
    return targets.checks


def _print_checks(checks: list[dict], json_path: None = None) -> None:
    print(f"{'met':<6}{'target':<84}measured")
    for row in checks:
        met = {True: "yes", False: "NO", None: "-"}[row["met"]]
        print(f"{met:<6}{row['target']:<84}{row['measured']}")


def _print(result: dict, json_path: Path | None) -> None:
    width = max(map(len, result))
    for key, value in result.items():
        print(f"{key:<{width}}  {value}")
    if json_path:
        storage.atomic_write_text(json_path, json.dumps(result, indent=2) + "\n")


def _print_variants(rows: list[dict], json_path: Path | None = None) -> None:
    print(
        f"{'batch':>6}  {'variant':<62}{'img/s':>10}{'TFLOP/s':>9}{'MFU':>7}"
        f"{'warm-up s':>11}{'GiB':>7}  first loss / grad norm"
    )
    for row in rows:
        variant = variant_words(row)
        if "error" in row:
            print(f"{row['batch_size']:>6}  {variant:<62}{row['error']}")
            continue
        mfu = f"{row['mfu']:.1%}" if row.get("mfu") is not None else "-"
        agrees = {True: "", False: "  DIFFERS from the first row", None: ""}[row.get("agrees")]
        memory = f"{row['peak_memory_gib']:.1f}" if row.get("peak_memory_gib") is not None else "-"
        print(
            f"{row['batch_size']:>6}  {variant:<62}{row['images_per_s']:>10,.1f}{row['tflops']:>9.2f}{mfu:>7}"
            f"{row['warmup_seconds']:>11.1f}{memory:>7}  {row['first_loss']:.4f} / {row['first_grad_norm']:.4f}{agrees}"
        )


def _print_presets(rows: list[dict], json_path: Path | None) -> None:
    print("| precision | preset | component | img/s | gain over none | warm-up s | plain loop img/s |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        plain = f"{row['plain_images_per_s']:,.1f}" if "plain_images_per_s" in row else ""
        print(
            f"| {row['precision']} | {row['preset']} | {row['component']} | {row['images_per_s']:,.1f} | "
            f"{row['gain']:.2f}x | {row['warmup_seconds']:.1f} | {plain} |"
        )
    if rows:
        print(f"device: {rows[0]['device']}")
    if json_path is not None:
        storage.atomic_write_text(json_path, json.dumps(rows, indent=2) + "\n")


def _print_profile(result: dict, json_path: Path | None) -> None:
    print(
        f"{result['model']}, {result['component']}, batch {result['batch_size']}, {result['device']}, "
        f"{variant_words(result)}: {result['time_ms_per_step']} ms per step ({result['measured']}); "
        f"wall time {result['wall_ms_per_step']} ms per step"
    )
    print("  " + ", ".join(f"{group} {share:.0%}" for group, share in result["shares"].items()))
    for row in result["largest"]:
        print(f"  {row['share']:6.1%}  {row['group']:<16} {row['name'][:100]}")
    if json_path:
        storage.atomic_write_text(json_path, json.dumps(result, indent=2) + "\n")


def _list(choices) -> str:
    return ", ".join(choices)


COMPONENTS_HELP = f"of: {_list(RUN_COMPONENTS)}"
_OPTION_HELP = cli.field_comments(StepOptions)  # each step option's help, as a run's (and so its --help) says it
PRECISION_HELP, FUSED_HELP = _OPTION_HELP["precision"], _OPTION_HELP["fused"]


def _command(commands, name: str, summary: str) -> argparse.ArgumentParser:
    return commands.add_parser(name, help=summary, description=summary, formatter_class=cli.Help)


def _common(
    parser, model: str | None = "demo", json_help: str | None = "also write the figures to this JSON file"
) -> None:
    """The options most commands share: the model (random weights), the device and the JSON file.

    Without ``json_help``, there is no JSON file option."""
    if model is not None:
        parser.add_argument(
            "--model", default=model, help="a short name or timm ViT name (random weights): demo, vit_base_in21k, ..."
        )
    parser.add_argument("--device", default="auto", help="cuda, cuda:<index>, cpu or auto (a GPU if there is one)")
    if json_help is None:
        parser.set_defaults(json=None)
    else:
        parser.add_argument("--json", type=Path, default=None, help=f"{json_help}; default: none")


def _step_arguments(parser) -> None:
    """``StepOptions``' options, one value each, with their defaults (the protocol's fp32)."""
    defaults = StepOptions()
    parser.add_argument(
        "--compile",
        nargs="?",
        const="model",
        default="none",
        metavar="HOW",
        help=f"torch.compile: {_list(COMPILE_CHOICES)} (blocks: one graph shared by the blocks); "
        "a bare --compile is model",
    )
    parser.add_argument(
        "--compile-mode", default=defaults.compile_mode, help=f"torch.compile's mode, of: {_list(compile_modes())}"
    )
    parser.add_argument(
        "--attention", default=defaults.attention, help=f"attention kernel, of: {_list(ATTENTION_CHOICES)}"
    )
    parser.add_argument("--precision", default=defaults.precision, help=PRECISION_HELP)
    parser.add_argument("--fused", default=defaults.fused, help=FUSED_HELP)


def _step_options(args) -> StepOptions:
    """The ``StepOptions`` of ``_step_arguments``."""
    return StepOptions(**{name: getattr(args, name) for name in STEP_OPTIONS})


def _words(text: str) -> tuple[str, ...]:
    """ "a,b" -> ("a", "b"), empty words left out."""
    return tuple(word for word in text.split(",") if word)


def _data_command(commands) -> None:
    d = _command(commands, "data", "images/s of the DataLoader path and the device path on one dataset")
    d.add_argument("--dataset", default="cifar10", help=f"of: {_list(datasets.dataset_names())}")
    d.add_argument(
        "--root", default=None, help="data root with the real files; default: a fixture in the official format"
    )
    d.add_argument("--batch-size", type=int, default=512, help="images per batch")
    d.add_argument("--image-size", type=int, default=224, help="side of the images the paths deliver, in pixels")
    d.add_argument("--batches", type=int, default=5, help="timed batches per path (after one warm-up batch)")
    d.add_argument("--workers", type=int, default=None, help="DataLoader workers; default: one per CPU core")
    d.add_argument("--fixture-size", type=int, default=5000, help="random images in the fixture (without --root)")
    _common(d, model=None)
    d.set_defaults(
        run=lambda a: bench_data(
            a.dataset,
            a.fixture_size if a.root is None else a.root,
            a.batch_size,
            a.image_size,
            a.batches,
            a.workers,
            a.device,
        ),
        show=_print,
    )


def _plasticity_command(commands) -> None:
    p = _command(commands, "plasticity", "pairs/s of the plain definition and of plasticity.measure")
    p.add_argument("--pairs", type=int, default=256, help="image pairs measured")
    p.add_argument("--batch-size", type=int, default=64, help="pairs per batch")
    p.add_argument("--image-size", type=int, default=None, help="side of the images; default: the model's")
    p.add_argument("--repeats", type=int, default=3, help="interleaved timings per path; the median is reported")
    _common(p)
    p.set_defaults(
        run=lambda a: bench_plasticity(a.model, a.pairs, a.batch_size, a.device, a.image_size, a.repeats),
        show=_print,
    )


def _finetune_command(commands) -> None:
    f = _command(
        commands, "finetune", "training images/s per component: the library step vs a plain fp32 DataLoader loop"
    )
    f.add_argument(
        "--components", default="full,mha,fc1,ln1,linear", metavar="LIST", help=f"comma-separated, {COMPONENTS_HELP}"
    )
    f.add_argument("--batch-size", type=int, default=64, help="images per step")
    f.add_argument("--steps", type=int, default=10, help="timed steps per path (after the warm-up)")
    f.add_argument("--image-size", type=int, default=None, help="side of the images; default: the model's")
    f.add_argument(
        "--workers", type=int, default=None, help="DataLoader workers of the plain loop; default: one per CPU core"
    )
    f.add_argument("--repeats", type=int, default=3, help="interleaved timings per path; the median is reported")
    _step_arguments(f)
    f.add_argument("--no-plain", action="store_true", help="time the library step alone, without the plain loop")
    f.add_argument(
        "--method",
        default="weights",
        choices=list(METHODS),
        help="how each component trains, as a run's method: its weights, LoRA updates (of mha, fc1, fc2, full; "
        "--lora-rank) or a random subset as large as a LayerNorm (of mha, fc1, fc2)",
    )
    f.add_argument("--lora-rank", type=int, default=0, help="with --method lora: the rank of the updates")
    _common(f)
    f.set_defaults(
        run=lambda a: bench_finetune(
            StepSettings(a.model, a.batch_size, _step_options(a), a.image_size, method_of(vars(a))),
            _words(a.components),
            Timing(a.steps, a.repeats, a.device),
            workers=a.workers,
            plain=not a.no_plain,
        ),
        show=_print,
    )


def _profile_command(commands) -> None:
    r = _command(commands, "profile", "where a training step's time goes: matrix products, attention, the rest")
    r.add_argument("--component", default="full", help=f"what trains, {COMPONENTS_HELP}")
    r.add_argument("--batch-size", type=int, default=64, help="images per step")
    r.add_argument("--steps", type=int, default=3, help="profiled steps (after the warm-up)")
    _step_arguments(r)
    r.add_argument("--top", type=int, default=15, help="how many of the largest kernels (ops on a CPU) to list")
    _common(r)
    r.set_defaults(
        run=lambda a: bench_profile(
            StepSettings(a.model, a.batch_size, _step_options(a)), a.component, Timing(a.steps, device=a.device), a.top
        ),
        show=_print_profile,
    )


def _batch_sizes(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(b) for b in text.split(","))
    except ValueError:
        raise ValueError(f"--batch-sizes must be comma-separated integers, got {text!r}") from None


def _variants_command(commands) -> None:
    v = _command(commands, "variants", "one component's step under every combination of batch size and step options")
    v.add_argument("--component", default="full", help=f"what trains, {COMPONENTS_HELP}")
    v.add_argument("--batch-sizes", default="64", metavar="LIST", help="comma-separated integers")
    v.add_argument(
        "--compile", default="none,model,blocks", metavar="LIST", help=f"comma-separated, of: {_list(COMPILE_CHOICES)}"
    )
    v.add_argument(
        "--modes",
        default="default",
        metavar="LIST",
        help=f"comma-separated torch.compile modes (for compiled rows), of: {_list(compile_modes())}",
    )
    v.add_argument(
        "--attention", default="auto", metavar="LIST", help=f"comma-separated, of: {_list(ATTENTION_CHOICES)}"
    )
    v.add_argument("--precision", default="fp32", metavar="LIST", help=f"comma-separated, each {PRECISION_HELP}")
    v.add_argument("--fused", default="auto", metavar="LIST", help=f"comma-separated, each {FUSED_HELP}")
    v.add_argument("--steps", type=int, default=10, help="timed steps per row (after the warm-up)")
    v.add_argument("--repeats", type=int, default=3, help="timings per row; the median is reported")
    _common(v, json_help="rows go to this JSON file as each ends; rows already there are not measured again")
    v.set_defaults(
        run=lambda a: bench_variants(
            a.model,
            a.component,
            _batch_sizes(a.batch_sizes),
            {
                "compile": _words(a.compile),
                "compile_mode": _words(a.modes),
                "attention": _words(a.attention),
                "precision": _words(a.precision),
                "fused": _words(a.fused),
            },
            Timing(a.steps, a.repeats, a.device),
            a.json,
        ),
        show=_print_variants,
    )


def _kernels_command(commands) -> None:
    k = _command(commands, "kernels", "our fused ops alone at a model's training shapes, against a copy of their bytes")
    k.add_argument("--batch-size", type=int, default=None, help="images; default: 512 on CUDA, 8 on a CPU")
    _common(k, model="vit_base_in21k")
    k.set_defaults(run=lambda a: bench_kernels(a.model, a.batch_size, a.device), show=_print)


def _presets_command(commands) -> None:
    s = _command(
        commands, "presets", "images/s per precision: each speed preset against none, a plain loop beside, one machine"
    )
    s.add_argument("--components", default="full,mha,ln2", metavar="LIST", help=f"comma-separated, {COMPONENTS_HELP}")
    s.add_argument(
        "--presets",
        default="",
        metavar="LIST",
        help="comma-separated presets (names of parameters/speed/<name>.yaml, or files) measured beside none"
        "; default: none alone",
    )
    s.add_argument(
        "--precisions", default="fp32,autocast", metavar="LIST", help=f"comma-separated, of: {_list(PRECISIONS)}"
    )
    s.add_argument("--batch-size", type=int, default=64, help="images per step")
    s.add_argument("--steps", type=int, default=10, help="timed steps per row (after the warm-up)")
    s.add_argument("--repeats", type=int, default=3, help="timings per row; the median is reported")
    s.add_argument("--no-plain", action="store_true", help="skip the plain loop")
    _common(s, json_help="also write the rows to this JSON file")
    s.set_defaults(
        run=lambda a: bench_presets(
            a.model,
            _words(a.components),
            a.batch_size,
            Timing(a.steps, a.repeats, a.device),
            _words(a.presets),
            _words(a.precisions),
            plain=not a.no_plain,
        ),
        show=_print_presets,
    )


def _targets_command(commands) -> None:
    t = _command(commands, "targets", "every benchmark at its target's settings, checked against the target")
    t.add_argument(
        "--parts",
        default=None,
        metavar="LIST",
        help=f"comma-separated, of: {_list(TARGET_PARTS)} (compiled on CUDA only); default: all",
    )
    t.add_argument("--out", type=Path, default=None, help="folder for <part>.json and targets.json; default: none")
    _common(t, model=None, json_help=None)
    t.set_defaults(
        run=lambda a: bench_targets(a.device, a.out, _words(a.parts) if a.parts else None), show=_print_checks
    )


def _gpu_command(commands) -> None:
    g = _command(commands, "gpu", "the one GPU check: the CUDA tests, presets, plasticity and a protocol step")
    g.add_argument(
        "--parts", default=None, metavar="LIST", help=f"comma-separated, of: {_list(gpu.PARTS)}; default: all"
    )
    g.add_argument("--out", type=Path, default=None, help="folder for test_cuda.txt (the tests' output); default: none")
    g.set_defaults(
        run=lambda a: gpu.bench_gpu(a.out, _words(a.parts) if a.parts else None), show=gpu.print_table, json=None
    )


COMMANDS = (
    _gpu_command,
    _data_command,
    _plasticity_command,
    _finetune_command,
    _profile_command,
    _variants_command,
    _kernels_command,
    _presets_command,
    _targets_command,
)


def make_parser() -> argparse.ArgumentParser:
    """The command line: one subcommand per benchmark (``COMMANDS``), each with its runner and printer."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description=__doc__.split("\n")[0],
        epilog="python -m benchmarks COMMAND --help: the command's options",
        formatter_class=cli.Help,
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in COMMANDS:
        add(commands)
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = make_parser()
    args = parser.parse_args(argv)
    try:
        result = args.run(args)
    except cli.BAD_INPUT as error:  # a bad option, or a data root or --json file missing or malformed
        parser.exit(cli.fail(error))
    args.show(result, args.json)


if __name__ == "__main__":
    main()
