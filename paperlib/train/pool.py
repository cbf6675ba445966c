"""The runs of demo-scale finetuning specs, and the probes notebooks share, made by a pool of processes: ``run_spec``.

Paper-scale sweeps go through ``python -m paperlib sweep`` (``sweeps.sweep``), which runs notebooks on GPUs.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Iterable

import torch

from paperlib.measure.probe import Probe, linear_probe
from paperlib.records import paths, runs, specs
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
    bf16 = config.step.precision in ("autocast", "bf16")
    if bf16 and torch.device(config.device).type == "cpu" and not native_bf16():
        cost *= EMULATED_BF16
    return cost / 2 if config.component == "linear" else cost


def run_spec(*specs: dict, probes: Iterable[Probe] = (), workers: int | None = None) -> None:
    """Run the runs of finetuning specs not finished as asked, and fit the ``probes`` not cached.

    The runs are ``config.configs``' (each ``finetune.run``), the probes ``probe.linear_probe``'s.
    A run two specs share runs once, and the costliest start first (``expected_cost``), so that the workers end
    together; the probes come last (a demo probe costs about what a linear probing run does). One line per run or
    probe with the time it took. ``demo_runs`` gives the probes that notebooks 04 and 07 both read, so that they are
    made once, before either notebook starts, instead of one notebook waiting on the other's lock.

    ``workers``: processes that share the work. By default one per CPU core when every run is on the
    CPU, each with its share of the cores (``threads``: one thread each; a small model trains faster
    so than with every core on one run); runs on a GPU run here, one after another.
    """
    unique = {config.folder(): config for spec in specs for config in configs(spec)}  # by folder: once each
    todo = sorted((c for c in unique.values() if not runs.is_finished(c)), key=expected_cost, reverse=True)
    todo += [p for p in probes if linear_probe(p, compute=False) is None]
    if workers is None:
        on_cpu = all(torch.device(config.device).type == "cpu" for config in todo if isinstance(config, Config))
        workers = threads.cores() if on_cpu else 1
    workers = max(1, min(workers, len(todo)))
    with contextlib.ExitStack() as stack:
        if workers == 1:
            finished = ((job, _timed_run(job)) for job in todo)
        else:
            stack.enter_context(threads.shared_by(workers))  # the workers take their share (threads.apply)
            pool = stack.enter_context(ProcessPoolExecutor(workers, multiprocessing.get_context("spawn")))
            futures = {pool.submit(_timed_run, job): job for job in todo}
            finished = ((futures[future], future.result()) for future in as_completed(futures))
        for done, (job, (status, seconds)) in enumerate(finished, start=1):
            print(f"[{done}/{len(todo)}] {paths.display(job.folder())}: {status} in {seconds:.1f} s", flush=True)


def _timed_run(job: Config | Probe) -> tuple[str, float]:
    """A ``run_spec`` worker's task: a run's status (``finetune.run``) or a probe's ("probed"), and its seconds."""
    start = time.perf_counter()
    if isinstance(job, Probe):
        linear_probe(job, progress=False)
        return "probed", time.perf_counter() - start
    return finetune.run(job)["status"], time.perf_counter() - start


DEMO_SWEEPS = ("finetune_demo.yaml", "lora_demo.yaml", "precision_demo.yaml", "equal_capacity_demo.yaml")
"""The demo finetuning sweeps the notebooks read, under ``parameters/sweeps/``."""


def demo_specs() -> dict[str, dict]:
    """The demo sweeps' specs (``DEMO_SWEEPS``), loaded, by file name."""
    return {name: specs.load_spec(paths.PARAMETERS / "sweeps" / name) for name in DEMO_SWEEPS}


def shared_probes() -> list[Probe]:
    """The probes notebooks 04 and 07 both read at their defaults: notebook 04's, one per dataset of its parameters.

    Notebook 07's probe (Table 6's linear probing column: the last block's attention output) is one of each table."""
    given = specs.notebook_parameters(paths.NOTEBOOKS / "04_linear_probe.ipynb")
    fields = {"split_seed", "train_features", "normalize"}
    options = {name: given[name] for name in fields} | {"root": given["data_root"] or None}
    return [Probe(given["model"], dataset, **options) for dataset in given["datasets"]]


NOTEBOOK_05 = {"notebook": str(paths.NOTEBOOKS / f"{runs.NOTEBOOK}.ipynb")}
"""Notebook 05's one run at its defaults (``Config()``'s: 100 steps, where the demo sweeps run 60), as a spec."""


def demo_runs(workers: int | None = None) -> None:
    """The demo world's runs and probes the notebooks read, made once in one pool: ``python -m paperlib demo runs``.

    The demo sweeps' missing runs, notebook 05's own (``NOTEBOOK_05``) and the probes two notebooks share
    (``shared_probes``): what ``make demo`` makes before the notebooks that read them, and ``make test`` before
    nbval."""
    run_spec(*demo_specs().values(), NOTEBOOK_05, probes=shared_probes(), workers=workers)


def demo_settings() -> str:
    """What the demo runs are, as the landing page says it: each sweep's, its validation period too; notebook 05's."""
    said = []
    for name, spec in demo_specs().items():
        spec_configs = configs(spec)
        steps = "/".join(str(n) for n in sorted({c.steps for c in spec_configs}))
        every = "/".join(str(n) for n in sorted({c.eval_every for c in spec_configs}))
        said.append(
            f"{name} {len(spec_configs)} runs of {steps} steps of {spec_configs[0].batch_size} images, "
            f"validated every {every}"
        )
    own = configs(NOTEBOOK_05)[0]
    return (
        f"The demo sweeps (parameters/sweeps/): {'; '.join(said)}. Notebook 05's own "
        f"run: {own.steps} steps of {own.batch_size} images."
    )
