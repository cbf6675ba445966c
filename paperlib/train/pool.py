"""The runs of demo-scale finetuning specs, shared by a pool of processes: ``run_spec``.

Paper-scale sweeps go through ``python -m paperlib sweep`` (``sweeps.sweep``), which runs notebooks on GPUs.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor, as_completed

import torch

from paperlib.records import paths, runs
from paperlib.speed import threads
from paperlib.speed.options import native_bf16
from paperlib.train import finetune
from paperlib.train.config import Config, configs

EMULATED_BF16 = 7.0
"""How many times a demo run's fp32 time one in bf16 compute ("autocast", "bf16") takes on a CPU that emulates bf16
(AVX2 alone: 108 and 116 s against 11-21 s in fp32 for the precision demo's runs in one ``make demo``)."""


def expected_cost(config: Config) -> float:
    """What a run is expected to cost, to start the costliest first: its steps x its batch, in images.

    Times ``EMULATED_BF16`` for bf16 compute on a CPU without native bf16 (``native_bf16``), half for linear probing
    (no backward pass through the blocks)."""
    cost = config.steps * config.batch_size
    if config.precision in ("autocast", "bf16") and torch.device(config.device).type == "cpu" and not native_bf16():
        cost *= EMULATED_BF16
    return cost / 2 if config.component == "linear" else cost


def run_spec(*specs: dict, workers: int | None = None) -> None:
    """Run every run of finetuning sweep specs (``config.configs``) not finished as they ask (``finetune.run``).

    A run two specs share runs once, and the costliest start first (``expected_cost``), so that the workers end
    together; one line per run with the time it took.

    ``workers``: processes that share the runs. By default one per CPU core when every run is on the
    CPU, each with its share of the cores (``threads``: one thread each; a small model trains faster
    so than with every core on one run); runs on a GPU run here, one after another.
    """
    unique = {config.folder(): config for spec in specs for config in configs(spec)}  # by folder: once each
    todo = sorted((c for c in unique.values() if not runs.is_finished(c)), key=expected_cost, reverse=True)
    if workers is None:
        on_cpu = all(torch.device(config.device).type == "cpu" for config in todo)
        workers = threads.cores() if on_cpu else 1
    workers = max(1, min(workers, len(todo)))
    with contextlib.ExitStack() as stack:
        if workers == 1:
            finished = ((config, _timed_run(config)) for config in todo)
        else:
            stack.enter_context(threads.shared_by(workers))  # the workers take their share (threads.apply)
            pool = stack.enter_context(ProcessPoolExecutor(workers, multiprocessing.get_context("spawn")))
            futures = {pool.submit(_timed_run, config): config for config in todo}
            finished = ((futures[future], future.result()) for future in as_completed(futures))
        for done, (config, (status, seconds)) in enumerate(finished, start=1):
            print(f"[{done}/{len(todo)}] {paths.display(config.folder())}: {status} in {seconds:.1f} s", flush=True)


def _timed_run(config: Config) -> tuple[str, float]:
    """``finetune.run(config)``'s status and the seconds it took (a ``run_spec`` worker's task)."""
    start = time.perf_counter()
    return finetune.run(config)["status"], time.perf_counter() - start
