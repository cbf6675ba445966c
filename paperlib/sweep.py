"""Sweeps: one papermill run per cell of a parameter grid, resumable, failure-isolated.

    python -m paperlib.sweep parameters/sweeps/plasticity_demo.yaml
    python -m paperlib.sweep parameters/sweeps/plasticity_paper.yaml --executor gpus     # all GPUs here
    python -m paperlib.sweep parameters/sweeps/plasticity_paper.yaml --executor slurm    # via submitit
    python -m paperlib.sweep parameters/sweeps/finetune_paper.yaml --plan    # what it costs; runs nothing

A spec (``specs``: a notebook, fixed parameters, a grid) expands into runs. Each run writes
``reports/<notebook>/<run name>.ipynb`` and ``.html``, then ``.done.json`` last; finished runs
(``Run.finished``: for a finetuning run, its run folder says so, ``runs.is_finished``) are skipped
when the sweep is started again (a run whose parameters were edited since, or whose custom images
or model changed since, runs again). A failing run leaves ``.error.txt`` with its error and does
not stop the others. ``reports/index.html`` is rewritten at the end.

Executors: ``local`` (one run after another, in this process), ``gpus`` (one worker process per
visible GPU, each pinned to its GPU with ``CUDA_VISIBLE_DEVICES``), ``slurm`` (submitit's
cluster executor, one job per run) and ``submitit-local`` (submitit's local executor, for tests).

``--plan`` trains and writes nothing: it counts the runs (finished, diverged, failed, missing) and,
for a finetuning sweep, estimates the device-hours of those to run on this machine (``plan``);
``--precision P`` as if the spec's precision were P, ``--plan-steps N`` steps timed per distinct step.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import multiprocessing
import os
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import submitit
import torch

from . import cli, data, models, paths, plan, report, runs, specs, threads
from .speed.options import PRECISIONS

EXECUTORS = ("local", "gpus", "slurm", "submitit-local")


@dataclass
class Run:
    """One cell of the grid: a notebook, its parameters and where its outputs go."""

    name: str
    notebook: Path
    parameters: dict
    folder: Path
    status: str = "pending"
    error: str = ""
    seconds: float = 0.0
    extra: dict = field(default_factory=dict)

    @property
    def stem(self) -> Path:
        return self.folder / self.name

    @property
    def marker(self) -> Path:
        return self.stem.with_name(self.stem.name + ".done.json")

    @property
    def error_file(self) -> Path:
        return self.stem.with_name(self.stem.name + ".error.txt")

    @property
    def fingerprints(self) -> dict:
        """``parameter_fingerprints`` of this run's parameters, computed once (``run_sweep`` computes
        them for all runs, each dataset read once)."""
        if "fingerprints" not in self.extra:
            self.extra["fingerprints"] = parameter_fingerprints(self.parameters)
        return self.extra["fingerprints"]

    @property
    def finished(self) -> bool:
        """Whether this run is finished as its spec asks now. A finetuning run (notebook 05) asks
        its run folder (``runs.is_finished``: the parameters it recorded, the custom inputs as they
        are now), and its report must be there (the marker). Another notebook's run asks its
        marker: it must record these parameters (a spec edited since, say its steps, makes its
        runs unfinished: their names need not change) and the custom models and datasets as they
        are now (edited images, a re-saved model: unfinished)."""
        marker = paths.json_or_none(self.marker)  # a damaged marker: not finished (a warning names it)
        if marker is None:
            return False
        if self.notebook.stem == runs.NOTEBOOK:
            try:
                return runs.is_finished(runs.config_from(self.parameters))
            except (ValueError, FileNotFoundError):  # the run itself will say what is wrong
                return False
        recorded, inputs = marker.get("parameters"), marker.get("fingerprints", {})
        return recorded == json.loads(json.dumps(self.parameters, default=str)) and inputs == self.fingerprints


def parameter_fingerprints(parameters: dict, memo: dict | None = None) -> dict:
    """What the ``custom/<name>`` models and datasets among a notebook's parameter values (names, or
    lists of names, under any parameter) hold now: ``{"model:<name>": models.content_fingerprint,
    "dataset:<name>": data.content_fingerprint}`` (datasets under the run's ``data_root``), as a run's
    marker keeps them; empty when it names none. A name that is not there, or not valid, is left out: the
    run itself says what is wrong. (A finetuning run's record keeps its own: ``runs.config_fingerprints``.)
    ``memo`` keeps fingerprints across the runs of one sweep, so a dataset is read once."""
    memo = {} if memo is None else memo
    root = parameters.get("data_root") or None
    found = {}
    for value in parameters.values():
        for name in value if isinstance(value, (list, tuple)) else [value]:
            if not (isinstance(name, str) and name.startswith(paths.CUSTOM)):
                continue
            for kind in ("model", "dataset"):
                key = (kind, name, str(root))
                if key not in memo:
                    memo[key] = _fingerprint(kind, name, root)
                if memo[key] is not None:
                    found[f"{kind}:{name}"] = memo[key]
    return found


def fingerprinted(runs: list[Run]) -> list[Run]:
    """``runs`` with their ``fingerprints`` computed as the custom inputs are now, each dataset
    read once for all of them (what ``finished`` compares the markers with); returns them."""
    memo: dict = {}
    for run in runs:
        run.extra["fingerprints"] = parameter_fingerprints(run.parameters, memo)
    return runs


def _fingerprint(kind: str, name: str, root) -> str | None:
    try:
        if kind == "model":
            return models.content_fingerprint(name)  # a model that is not there raises FileNotFoundError
        return data.content_fingerprint(name, root)
    except (ValueError, FileNotFoundError):
        return None


def expand(spec: dict, reports: Path | None = None) -> list[Run]:
    """The runs of a spec (``specs.cells``), each with its outputs under ``reports/<notebook>/``."""
    found = specs.cells(spec)
    folder = (reports or paths.reports_dir()) / found[0][1].stem if found else None
    return [Run(name, notebook, parameters, folder) for name, notebook, parameters in found]


def execute_run(run: Run) -> Run:
    """Execute one run unless finished; record success (marker) or failure (error file). One process
    executes a run (``paths.locked``): a second sweep of the same spec waits for it, then skips it."""
    if run.finished:
        run.status = "skipped"
        return run
    with paths.locked(run.stem):
        if run.finished:  # by the sweep waited for
            run.status = "skipped"
            return run
        return _execute(run)


def _execute(run: Run) -> Run:
    start = time.perf_counter()
    try:
        executed = report.execute(run.notebook, run.stem.with_name(run.stem.name + ".ipynb"), run.parameters)
        report.render_html(executed)
        run.seconds = round(time.perf_counter() - start, 2)
        # the custom inputs as the run leaves them: a run that makes its own (notebook 08's example) records them
        run.extra["fingerprints"] = parameter_fingerprints(run.parameters)
        marker = {
            "name": run.name,
            "notebook": run.notebook.name,
            "parameters": run.parameters,
            "fingerprints": run.fingerprints,
            "seconds": run.seconds,
            "finished": time.strftime("%Y-%m-%dT%H:%M:%S"),
        }
        run.error_file.unlink(missing_ok=True)
        paths.atomic_write_text(run.marker, json.dumps(marker, indent=2, default=str) + "\n")
        run.status = "done"
    except Exception as error:  # a failed run is recorded; the sweep goes on
        run.seconds = round(time.perf_counter() - start, 2)
        run.status = "failed"
        run.error = f"{type(error).__name__}: {error}".strip()
        paths.atomic_write_text(run.error_file, run.error + "\n\n" + traceback.format_exc())
    print(f"{run.name}: {run.status} in {run.seconds:.0f} s", flush=True)  # one line per run, wherever it ran
    return run


def _pin_gpu(queue) -> None:
    os.environ["CUDA_VISIBLE_DEVICES"] = str(queue.get())


def _visible_gpus() -> list[int]:
    return list(range(torch.cuda.device_count()))


def run_sweep(
    spec: dict, executor: str = "local", gpus: list[int] | None = None, reports: Path | None = None
) -> list[Run]:
    """Execute every unfinished run of ``spec``; returns the runs with their status."""
    if executor not in EXECUTORS:
        raise ValueError(f"unknown executor {executor!r}; valid executors: {', '.join(EXECUTORS)}")
    runs = fingerprinted(expand(spec, reports))
    todo = []
    for run in runs:  # each marker read once
        if run.finished:
            run.status = "skipped"
        else:
            todo.append(run)
    if todo and executor == "local":
        todo = [execute_run(r) for r in todo]
    elif todo and executor == "gpus":
        gpus = gpus if gpus is not None else _visible_gpus()
        if not gpus:
            raise RuntimeError("executor 'gpus' found no GPU; use --executor local")
        context = multiprocessing.get_context("spawn")
        queue = context.Queue()
        for gpu in gpus:
            queue.put(gpu)
        with (
            threads.shared_by(len(gpus)),  # the workers' CPU threads: a share of the cores each
            concurrent.futures.ProcessPoolExecutor(
                len(gpus), mp_context=context, initializer=_pin_gpu, initargs=(queue,)
            ) as pool,
        ):
            todo = list(pool.map(execute_run, todo))
    elif todo:
        folder = (reports or paths.reports_dir()) / runs[0].notebook.stem / ".submitit"
        if executor == "slurm":
            pool = submitit.AutoExecutor(folder=folder)
            pool.update_parameters(**(spec.get("slurm") or {}))
        else:
            pool = submitit.LocalExecutor(folder=folder)
            pool.update_parameters(timeout_min=int((spec.get("slurm") or {}).get("timeout_min", 60)))
        # submitit's local jobs run at once on this machine: a share of the cores each (a cluster's have their own)
        with threads.shared_by(len(todo)) if executor == "submitit-local" else contextlib.nullcontext():
            jobs = pool.map_array(execute_run, todo)
        todo = [job.result() for job in jobs]
    done = {r.name: r for r in todo}
    runs = [done.get(r.name, r) for r in runs]
    report.write_index(reports or paths.reports_dir())
    return runs


def argument_parser() -> argparse.ArgumentParser:
    """The command line of ``python -m paperlib.sweep`` (``main``)."""
    parser = argparse.ArgumentParser(
        prog="python -m paperlib.sweep", description=__doc__.split("\n")[0], formatter_class=cli.Help
    )
    parser.add_argument("spec", type=Path, help="sweep spec (YAML), e.g. parameters/sweeps/plasticity_demo.yaml")
    parser.add_argument(
        "--executor",
        default="local",
        choices=EXECUTORS,
        help="local: one run after another, here; gpus: a process per GPU here; slurm: a cluster job per run "
        "(submitit); submitit-local: submitit's jobs, here",
    )
    parser.add_argument(
        "--gpus", default=None, help="GPU ids for --executor gpus, e.g. 0,1; default: every visible GPU"
    )
    parser.add_argument("--dry-run", action="store_true", help="list the runs and whether they are finished")
    parser.add_argument(
        "--plan", action="store_true", help="count the runs and estimate the device-hours of those to run; runs nothing"
    )
    parser.add_argument(
        "--precision",
        default=None,
        help=f"with --plan: as if the spec's precision were this, one of {', '.join(PRECISIONS)}; default: the spec's",
    )
    parser.add_argument(
        "--plan-steps",
        type=int,
        default=None,
        help="with --plan: steps timed per distinct step that no finished run recorded, after warm-up "
        "(ViT-Base at batch 512 takes minutes a step on a CPU); default: 3",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = argument_parser().parse_args(argv)
    try:
        if not args.plan and (args.precision is not None or args.plan_steps is not None):
            raise ValueError("--precision and --plan-steps are options of --plan")
        spec = specs.load_spec(args.spec)
        if args.plan:
            steps = 3 if args.plan_steps is None else args.plan_steps
            result = plan.plan(fingerprinted(expand(spec)), args.precision, steps)
            print(f"plan of {args.spec}" + (f", as if its precision were {args.precision}" if args.precision else ""))
            print(plan.formatted(result))
            return 0
        if args.dry_run:
            for run in fingerprinted(expand(spec)):
                print(f"{'finished' if run.finished else 'to run':8}  {run.name}  {run.parameters}")
            return 0
        gpus = [int(g) for g in args.gpus.split(",")] if args.gpus else None
        runs = run_sweep(spec, args.executor, gpus)
    except (*cli.BAD_INPUT, RuntimeError) as error:
        return cli.fail(error)
    for run in runs:
        print(f"{run.status:8}  {run.name}  {run.seconds:7.1f} s  {run.error.splitlines()[0] if run.error else ''}")
    counts = {s: sum(r.status == s for r in runs) for s in ("done", "skipped", "failed")}
    print(
        f"\n{counts['done']} done, {counts['skipped']} skipped (finished before), {counts['failed']} failed; "
        f"reports: {paths.reports_dir() / 'index.html'}"
    )
    return 1 if counts["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
