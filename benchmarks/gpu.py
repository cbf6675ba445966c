"""``python -m benchmarks gpu``: the one GPU check, printed as one markdown table for docs/benchmarks.md.

On a GPU: ``tests/test_cuda.py`` under ``pytest -rA --tb=long`` (its whole output printed, and kept in
``<out>/test_cuda.txt``), the speed presets in every precision at the paper's batch 512, the plasticity of the paper's
12,800 ViT-Base pairs, and one paper-protocol step beside the images/s ``sweep --plan`` estimates for it. Without a
GPU, a dry run: what it would measure. A part that fails is a row with its error; the others still run.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

from benchmarks.data import bench_plasticity
from benchmarks.step import StepSettings, Timing, bench_finetune, bench_presets
from paperlib.records import paths, storage
from paperlib.records.step_options import PRECISIONS, StepOptions
from paperlib.sweeps import plan
from paperlib.train.config import Config

MODEL, BATCH = "vit_base_in21k", 512
PROTOCOL = {"model": MODEL, "component": "mha", "batch_size": BATCH, "device": "cuda"}
"""The paper-protocol step compared with ``--plan``'s estimate: ViT-Base/16, MHA, fp32, batch 512."""

PARTS = {
    "tests": "tests/test_cuda.py under pytest -rA --tb=long, its whole output kept",
    "presets": f"full finetuning of ViT-Base/16 at batch {BATCH}: presets none and h100 in {', '.join(PRECISIONS)}",
    "plasticity": "12,800 ViT-Base/16 pairs in batches of 128: plasticity.measure and the plain definition",
    "protocol": f"the paper's MHA step (fp32, batch {BATCH}) timed, beside the img/s sweep --plan estimates for it",
}


def cuda_tests(out: Path | None) -> list[dict]:
    """``tests/test_cuda.py`` in a fresh process, its whole output printed (and written to ``out``); one row."""
    command = [sys.executable, "-m", "pytest", "-rA", "--tb=long", "-p", "no:cacheprovider", "tests/test_cuda.py"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(paths.ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(command, cwd=paths.ROOT, env=env, capture_output=True, text=True)
    text = done.stdout + done.stderr
    print(text)
    if out:
        storage.atomic_write_text(out / "test_cuda.txt", text)
    summary = next((line.strip("= ") for line in reversed(text.splitlines()) if line.startswith("=")), "no summary")
    return [{"part": "tests", "setting": "tests/test_cuda.py", "figure": f"{summary} (exit {done.returncode})"}]


def presets() -> list[dict]:
    """``bench_presets`` of full finetuning at batch 512, ``none`` and ``h100`` in every precision; a row each."""
    found = bench_presets(MODEL, ("full",), BATCH, Timing(steps=5, device="cuda"), ("h100",), PRECISIONS, plain=False)
    return [
        {
            "part": "presets",
            "setting": f"{row['precision']}, preset {row['preset']}, full, batch {BATCH}",
            "figure": f"{row['images_per_s']:,.1f} img/s ({row['gain']:.2f}x none; "
            f"warm-up {row['warmup_seconds']:.0f} s)",
        }
        for row in found
    ]


def plasticity() -> list[dict]:
    """``bench_plasticity`` of the paper's 12,800 ViT-Base pairs, timed once; one row."""
    result = bench_plasticity(MODEL, 12800, 128, "cuda", repeats=1)
    figure = (
        f"{result['measure_pairs_per_s']:,.1f} pairs/s ({result['seconds_for_12800_pairs']} s), "
        f"plain {result['plain_pairs_per_s']:,.1f} ({result['speedup']}x)"
    )
    return [{"part": "plasticity", "setting": "ViT-Base/16, 12,800 pairs, batch 128", "figure": figure}]


def protocol_step() -> list[dict]:
    """The paper's MHA step timed by ``bench_finetune`` beside ``plan.time_step``'s estimate of it; one row."""
    config = Config(**PROTOCOL)
    estimate = plan.time_step(config)
    timed = bench_finetune(StepSettings(MODEL, BATCH, StepOptions()), ("mha",), Timing(device="cuda"), plain=False)
    rate = timed["mha_library_images_per_s"]
    figure = f"{rate:,.1f} img/s timed, {estimate:,.1f} estimated by --plan ({rate / estimate:.2f}x)"
    return [{"part": "protocol", "setting": f"MHA, fp32, batch {BATCH}", "figure": figure}]


def bench_gpu(out: Path | None = None, parts: tuple[str, ...] | None = None) -> list[dict]:
    """The rows of ``PARTS`` (all by default) on the GPU, or a dry run's rows (each part's description) without one."""
    for part in parts or ():
        if part not in PARTS:
            raise ValueError(f"unknown part {part!r}; valid parts: {', '.join(PARTS)}")
    parts = parts or tuple(PARTS)
    if not torch.cuda.is_available():
        return [{"part": part, "setting": PARTS[part], "figure": "dry run: no GPU here"} for part in parts]
    measure = {"tests": lambda: cuda_tests(out), "presets": presets, "plasticity": plasticity}
    measure["protocol"] = protocol_step
    rows = []
    for part in parts:
        try:
            rows += measure[part]()
        except Exception as error:  # a part that fails is reported; the others still run
            rows.append({"part": part, "setting": PARTS[part], "figure": f"failed: {type(error).__name__}: {error}"})
    return rows


def print_table(rows: list[dict], json_path: Path | None = None) -> None:
    """The rows as one markdown table, headed by the device (a dry run says so)."""
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU: a dry run, nothing measured"
    print(f"device: {device}; torch {torch.__version__}\n")
    print("| part | setting | figure |\n|---|---|---|")
    for row in rows:
        print(f"| {row['part']} | {row['setting']} | {row['figure']} |")
