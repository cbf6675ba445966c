"""Benchmarks that print their figures (never timed tests).

    python -m paperlib.speed.bench plasticity                 # demo ViT, plain definition vs measure
    python -m paperlib.speed.bench plasticity --model vit_base_in21k --pairs 64 --batch-size 16
    python -m paperlib.speed.bench finetune                   # demo ViT, every configuration
    python -m paperlib.speed.bench finetune --model vit_base_in21k --batch-size 256 --device cuda

    python -m paperlib.speed.bench data                       # fixture Cifar10 at 224, batch 512
    python -m paperlib.speed.bench data --dataset digits --image-size 224
    python -m paperlib.speed.bench data --dataset cifar10 --root /data --device cuda

    python -m paperlib.speed.bench targets --out bench-out     # all of them at the issues' settings, checked
    python -m paperlib.speed.bench profile --model vit_base_in21k --batch-size 256 \
        --device cuda                                             # where a step's time goes
    python -m paperlib.speed.bench variants --model vit_base_in21k --batch-sizes 256,512 --attention auto,flash,cudnn \
        --device cuda --json variants.json                # one step under each compilation / attention kernel
    python -m paperlib.speed.bench kernels --device cuda        # our fused ops alone, against a copy of their bytes
    python -m paperlib.speed.bench presets --model vit_base_in21k --device cuda --batch-size 128 \
        --presets h100 --precisions fp32,tf32,autocast,bf16  # each preset against none, per precision, plain beside

``data`` measures images/s delivered as ready batches on the device by the two data paths on the
same dataset: torchvision transforms in DataLoader workers (then copied to the device), and the
device path (``paperlib.loader``: uint8 images on the device, batched crop/resize/flip/normalise).
Without ``--root``, a paper dataset is benchmarked on a fixture written in its official format
(random images, ``--fixture-size`` of them), so the figures measure the pipeline, not a disk.

The benchmarks themselves: ``bench_data`` (data paths, plasticity; and the device and clock every
benchmark measures with) and ``bench_step`` (the training step: finetune, variants, profile,
kernels). Here: the command line (``main``, the step options its subcommands share, printing) and
``bench_targets``, every benchmark at its issue's settings, checked. Measured figures:
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from .. import cli, data, paths
from .bench_data import bench_data, bench_plasticity, resolve_device
from .bench_step import bench_finetune, bench_kernels, bench_presets, bench_profile, bench_variants, variant_words
from .options import STEP_OPTIONS

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
    our fused ops, and with those replayed from a CUDA graph (``compiled``: the same utilisation target).
    On a CPU, by default all but ``compiled``, at CPU scale: device path never slower; ``measure`` >= 2x the plain
    definition on the demo ViT and ViT-Base; the finetuning step against the plain loop on the
    demo ViT. Each part's figures go to ``<out>/<part>.json`` as soon as it ends, the checks to
    ``<out>/targets.json`` as they are made; returns the checks.
    """
    for part in parts or ():
        if part not in TARGET_PARTS:
            raise ValueError(f"unknown part {part!r}; valid parts: {', '.join(TARGET_PARTS)}")
    device = resolve_device(device)
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
        check(
            3,
            f"device path >= {need:g}x the DataLoader path (Cifar10 at 224, batch 512)",
            f"{result['device_path_images_per_s']:,.0f} vs "
            f"{result['dataloader_images_per_s']:,.0f} img/s ({result['speedup']}x)",
            result["speedup"] >= need,
        )
    if "plasticity" in parts:
        # (model, pairs, batch, repeats): on a GPU, the paper's 12,800 pairs once
        settings = (
            [("demo", 256, 64, 3), ("vit_base_in21k", 12800, 128, 1)]
            if cuda
            else [("demo", 256, 64, 3), ("vit_base_in21k", 32, 16, 3)]
        )
        results = [
            bench_plasticity(name, pairs, batch, str(device), repeats=repeats)
            for name, pairs, batch, repeats in settings
        ]
        keep("plasticity", results)
        for (name, pairs, _, _), result in zip(settings, results):
            figures = (
                f"{result['measure_pairs_per_s']:,.1f} vs "
                f"{result['plain_pairs_per_s']:,.1f} pairs/s ({result['speedup']}x)"
            )
            if cuda:
                check(4, f"measure vs plain definition, {name}, {pairs:,} pairs", figures, None)
            else:
                check(4, f"measure >= 2x the plain definition, {name}", figures, result["speedup"] >= 2.0)
        if cuda:
            seconds = results[-1]["seconds_for_12800_pairs"]
            check(4, "12,800 ViT-Base pairs in under a minute (measure, no decoding)", f"{seconds} s", seconds < 60)
    name, batch = ("vit_base_in21k", 256) if cuda else ("demo", 64)

    def check_mfu(result: dict) -> None:
        """The utilisation target for one ``bench_finetune`` result, named by how its step ran (its options, as
        they resolved)."""
        mfu = result.get("full_library_mfu")
        how = variant_words(result).lstrip(", ") or "eager"
        check(
            6,
            f"full finetuning at >= 40% model FLOP utilisation on an H100 ({how}, batch {result['batch_size']})",
            f"{mfu:.1%}"
            if mfu is not None
            else f"{result['full_library_tflops']} TFLOP/s (no known peak for this device)",
            None if mfu is None else mfu >= 0.40,
        )

    if "finetune" in parts:
        eager = bench_finetune(name, FINETUNE_CONFIGS, batch, steps=10, device=str(device))
        keep("finetune", eager)
        for config in FINETUNE_CONFIGS:
            check(
                6,
                f"{config}: library step vs plain fp32 DataLoader loop ({name}, batch {batch})",
                f"{eager[f'{config}_library_images_per_s']:,.1f} vs "
                f"{eager[f'{config}_plain_images_per_s']:,.1f} img/s ({eager[f'{config}_speedup']}x)",
                eager[f"{config}_speedup"] >= 1.0,
            )
        full = eager["full_library_images_per_s"]
        slower = [c for c in FINETUNE_CONFIGS[1:] if eager[f"{c}_library_images_per_s"] <= full]
        check(
            6,
            "frozen configurations faster than full finetuning",
            "slower or equal: " + (", ".join(slower) or "none"),
            not slower,
        )
        if cuda:
            check_mfu(eager)
            # the paper's own precision (fp32), so that its cost is known beside the fast options'
            paper = bench_finetune(name, ("full",), batch, steps=10, device=str(device), precision="fp32", plain=False)
            keep("finetune_fp32", paper)
            check(
                6,
                f"full finetuning in fp32, the paper's precision ({name}, batch {batch})",
                f"{paper['full_library_images_per_s']:,.1f} img/s",
                None,
            )
    if "compiled" in parts:
        compiled = bench_finetune(
            name, ("full", "mha", "ln1", "linear"), batch, steps=10, device=str(device), compile="model", plain=False
        )
        keep("finetune_compiled", compiled)
        check_mfu(compiled)
        blocks = bench_finetune(name, ("full",), batch, steps=10, device=str(device), compile="blocks", plain=False)
        keep("finetune_compiled_blocks", blocks)
        check_mfu(blocks)
        # the fastest settings measured (the paper's batch, inductor's tuning, bf16 compute with fp32
        # masters), then the same with our fused ops (kernels: fc1's bias+GELU, the q/k/v split), then
        # that replayed from a CUDA graph
        for part, fused, graph in (
            ("finetune_compiled_fastest", "none", False),
            ("finetune_compiled_fused", "all", False),
            ("finetune_compiled_graph", "all", True),
        ):
            result = bench_finetune(
                name,
                ("full",),
                batch * 2,
                steps=10,
                device=str(device),
                compile="blocks",
                plain=False,
                compile_mode="coordinate-descent",
                precision="bf16",
                fused=fused,
                graph=graph,
            )
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


def _print_variants(rows: list[dict]) -> None:
    print(
        f"{'batch':>6}  {'variant':<48}{'img/s':>10}{'TFLOP/s':>9}{'MFU':>7}"
        f"{'warm-up s':>11}{'GiB':>7}  first loss / grad norm"
    )
    for row in rows:
        variant = variant_words(row).lstrip(", ") or "eager"
        if "error" in row:
            print(f"{row['batch_size']:>6}  {variant:<48}{row['error']}")
            continue
        mfu = f"{row['mfu']:.1%}" if row.get("mfu") is not None else "-"
        agrees = {True: "", False: "  DIFFERS from the first row", None: ""}[row.get("agrees")]
        memory = f"{row['peak_memory_gib']:.1f}" if row.get("peak_memory_gib") is not None else "-"
        print(
            f"{row['batch_size']:>6}  {variant:<48}{row['images_per_s']:>10,.1f}{row['tflops']:>9.2f}{mfu:>7}"
            f"{row['warmup_seconds']:>11.1f}{memory:>7}  {row['first_loss']:.4f} / {row['first_grad_norm']:.4f}{agrees}"
        )


def _print_presets(rows: list[dict], json_path: Path | None) -> None:
    print("| precision | preset | configuration | img/s | gain over none | warm-up s | plain loop img/s |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        plain = f"{row['plain_images_per_s']:,.1f}" if "plain_images_per_s" in row else ""
        print(
            f"| {row['precision']} | {row['preset']} | {row['config']} | {row['images_per_s']:,.1f} | "
            f"{row['gain']:.2f}x | {row['warmup_seconds']:.1f} | {plain} |"
        )
    if rows:
        print(f"device: {rows[0]['device']}")
    if json_path is not None:
        paths.atomic_write_text(json_path, json.dumps(rows, indent=2) + "\n")


def _print_profile(result: dict, json_path: Path | None) -> None:
    print(
        f"{result['model']}, {result['config']}, batch {result['batch_size']}, {result['device']}"
        f"{variant_words(result)}: {result['time_ms_per_step']} ms per step ({result['measured']}); "
        f"wall time {result['wall_ms_per_step']} ms per step"
    )
    print("  " + ", ".join(f"{group} {share:.0%}" for group, share in result["shares"].items()))
    for row in result["largest"]:
        print(f"  {row['share']:6.1%}  {row['group']:<16} {row['name'][:100]}")
    if json_path:
        paths.atomic_write_text(json_path, json.dumps(result, indent=2) + "\n")


def _step_arguments(parser) -> None:
    parser.add_argument(
        "--compile",
        nargs="?",
        const="model",
        default="none",
        metavar="HOW",
        help="torch.compile the model: none, model (the default with a bare --compile) "
        "or blocks (one graph shared by the blocks)",
    )
    parser.add_argument(
        "--compile-mode",
        default="default",
        help="torch.compile's mode: default, coordinate-descent, max-autotune-no-cudagraphs, ...",
    )
    parser.add_argument("--attention", default="auto", help="attention kernel: auto, flash, cudnn, efficient or math")
    parser.add_argument(
        "--precision",
        default="autocast",
        help="autocast (bf16 autocast, the benchmarks' default), bf16 (bf16 compute, fp32 master weights), "
        "tf32 (fp32 with TF32 matrix products; CUDA only) or fp32 (the paper's)",
    )
    parser.add_argument(
        "--fused",
        default="auto",
        help="our fused ops: auto (gelu+qkv on CUDA, none elsewhere), none, all, or of gelu (fc1's bias+GELU), "
        "qkv (the q/k/v split), update (clipping and SGD in one pass) one or several joined by '+'",
    )
    parser.add_argument("--graph", action="store_true", help="replay each step from a CUDA graph (CUDA only)")


def _step_options(args) -> dict:
    """The options of ``_step_arguments`` (``options.STEP_OPTIONS``) as keyword arguments of ``bench_finetune``
    and ``bench_profile``."""
    return {name: getattr(args, name) for name in STEP_OPTIONS}


def _booleans(text: str, option: str) -> tuple[bool, ...]:
    """ "false,true" -> (False, True); anything else is a ValueError naming the valid words."""
    words = {"false": False, "true": True}
    values = tuple(word.strip().lower() for word in text.split(","))
    unknown = [value for value in values if value not in words]
    if unknown:
        raise ValueError(f"{option} takes comma-separated false/true, got {', '.join(map(repr, unknown))}")
    return tuple(words[value] for value in values)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m paperlib.speed.bench", description=__doc__.split("\n")[0])
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
    f = commands.add_parser(
        "finetune", help="training images/s per configuration: library step vs plain fp32 DataLoader loop"
    )
    f.add_argument("--model", default="demo", help="demo, vit_base_in21k, ... (random weights)")
    f.add_argument("--configs", default="full,mha,fc1,ln1,linear", help="comma-separated configurations")
    f.add_argument("--batch-size", type=int, default=64)
    f.add_argument("--steps", type=int, default=10, help="timed steps per path (after one warm-up step)")
    f.add_argument("--image-size", type=int, default=None, help="default: the model's")
    f.add_argument(
        "--workers", type=int, default=None, help="DataLoader workers of the plain loop (default: all CPU cores)"
    )
    f.add_argument("--device", default="auto", help="cuda, cpu or auto")
    f.add_argument("--repeats", type=int, default=3, help="interleaved timings per path; the median is reported")
    _step_arguments(f)
    f.add_argument("--no-plain", action="store_true", help="skip the plain DataLoader loop")
    f.add_argument(
        "--lora-rank",
        type=int,
        default=0,
        help="train LoRA updates of this rank instead of each configuration's weights (of mha, fc1, fc2, full)",
    )
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
    v = commands.add_parser(
        "variants",
        help="one configuration's step under every combination of batch size, compilation and attention kernel",
    )
    v.add_argument("--model", default="demo", help="demo, vit_base_in21k, ... (random weights)")
    v.add_argument("--config", default="full", help="the configuration trained (full, mha, fc1, fc2, ln2, ln1, linear)")
    v.add_argument("--batch-sizes", default="64", help="comma-separated")
    v.add_argument("--compile", default="none,model,blocks", help="comma-separated, of: none, model, blocks")
    v.add_argument("--modes", default="default", help="comma-separated torch.compile modes (for compiled rows)")
    v.add_argument(
        "--attention", default="auto", help="comma-separated attention kernels, of: auto, flash, cudnn, efficient, math"
    )
    v.add_argument(
        "--precision", default="autocast", help="comma-separated, of: fp32 (the paper's), tf32, autocast, bf16"
    )
    v.add_argument(
        "--fused",
        default="auto",
        help="comma-separated, of: auto (gelu+qkv on CUDA, none elsewhere), none, all, "
        "or gelu, qkv, update joined by '+' (our fused ops)",
    )
    v.add_argument(
        "--graph",
        default="false",
        help="comma-separated, of: false, true (replay each step from a CUDA graph; CUDA only)",
    )
    v.add_argument("--steps", type=int, default=10, help="timed steps per row (after the warm-up)")
    v.add_argument("--repeats", type=int, default=3, help="timings per row; the median is reported")
    v.add_argument("--device", default="auto", help="cuda, cpu or auto")
    v.add_argument(
        "--json", type=Path, default=None, help="rows go here as each ends; rows already there are not measured again"
    )
    k = commands.add_parser(
        "kernels", help="our fused ops alone at a model's training shapes, against a copy of the same bytes"
    )
    k.add_argument("--model", default="vit_base_in21k", help="whose shapes: demo, vit_base_in21k, ...")
    k.add_argument("--batch-size", type=int, default=None, help="images (default: 512 on CUDA, 8 on a CPU)")
    k.add_argument("--device", default="auto", help="cuda, cpu or auto")
    k.add_argument("--json", type=Path, default=None, help="also write the figures to this file")
    s = commands.add_parser(
        "presets", help="images/s per precision: each speed preset against none, a plain loop beside, one machine"
    )
    s.add_argument("--model", default="demo", help="demo, vit_base_in21k, ... (random weights)")
    s.add_argument("--configs", default="full,mha,ln2", help="comma-separated configurations")
    s.add_argument("--presets", default="", help="comma-separated presets (parameters/speed/<name>, files) beside none")
    s.add_argument("--precisions", default="fp32,autocast", help="comma-separated, of: fp32, tf32, autocast, bf16")
    s.add_argument("--batch-size", type=int, default=64)
    s.add_argument("--steps", type=int, default=10, help="timed steps per row (after the warm-up)")
    s.add_argument("--repeats", type=int, default=3, help="timings per row; the median is reported")
    s.add_argument("--device", default="auto", help="cuda, cpu or auto")
    s.add_argument("--no-plain", action="store_true", help="skip the plain loop")
    s.add_argument("--json", type=Path, default=None, help="also write the rows to this file")
    t = commands.add_parser("targets", help="every benchmark at its issue's settings, checked against the targets")
    t.add_argument("--device", default="auto", help="cuda, cpu or auto")
    t.add_argument(
        "--parts",
        default=None,
        help="comma-separated, of: " + ", ".join(TARGET_PARTS) + " (default: all; compiled on CUDA only)",
    )
    t.add_argument("--out", type=Path, default=None, help="folder for <part>.json and targets.json")
    args = parser.parse_args(argv)
    try:
        if args.command == "targets":
            checks = bench_targets(args.device, args.out, tuple(args.parts.split(",")) if args.parts else None)
        elif args.command == "profile":
            result = bench_profile(
                args.model, args.config, args.batch_size, args.steps, args.device, top=args.top, **_step_options(args)
            )
        elif args.command == "variants":
            try:
                batch_sizes = tuple(int(b) for b in args.batch_sizes.split(","))
            except ValueError:
                raise ValueError(f"--batch-sizes must be comma-separated integers, got {args.batch_sizes!r}") from None
            rows = bench_variants(
                args.model,
                args.config,
                batch_sizes,
                tuple(args.compile.split(",")),
                tuple(args.modes.split(",")),
                tuple(args.attention.split(",")),
                args.steps,
                args.repeats,
                args.device,
                args.json,
                precisions=tuple(args.precision.split(",")),
                fuseds=tuple(args.fused.split(",")),
                graphs=_booleans(args.graph, "--graph"),
            )
        elif args.command == "presets":
            rows = bench_presets(
                args.model,
                tuple(args.configs.split(",")),
                args.batch_size,
                args.steps,
                args.device,
                tuple(name for name in args.presets.split(",") if name),
                tuple(args.precisions.split(",")),
                args.repeats,
                plain=not args.no_plain,
            )
        elif args.command == "data":
            result = bench_data(
                args.dataset,
                args.root,
                args.batch_size,
                args.image_size,
                args.batches,
                args.workers,
                args.device,
                args.fixture_size,
            )
        elif args.command == "kernels":
            result = bench_kernels(args.model, args.batch_size, args.device)
        elif args.command == "plasticity":
            result = bench_plasticity(
                args.model, args.pairs, args.batch_size, args.device, args.image_size, args.repeats
            )
        else:
            result = bench_finetune(
                args.model,
                tuple(args.configs.split(",")),
                args.batch_size,
                args.steps,
                args.device,
                args.image_size,
                args.workers,
                plain=not args.no_plain,
                repeats=args.repeats,
                lora_rank=args.lora_rank,
                **_step_options(args),
            )
    except cli.BAD_INPUT as error:  # a bad option, or a data root or --json file missing or malformed
        parser.exit(cli.fail(error))
    if args.command == "targets":
        _print_checks(checks)
    elif args.command == "profile":
        _print_profile(result, args.json)
    elif args.command == "variants":
        _print_variants(rows)
    elif args.command == "presets":
        _print_presets(rows, args.json)
    else:
        _print(result, args.json)


if __name__ == "__main__":
    main()
