"""Sweeps: one papermill run per cell of a parameter grid, checked first, resumable, failure-isolated.

    python -m paperlib sweep parameters/sweeps/plasticity_demo.yaml
    python -m paperlib sweep parameters/sweeps/plasticity_paper.yaml --executor gpus     # all GPUs here
    python -m paperlib sweep parameters/sweeps/plasticity_paper.yaml --executor slurm    # via submitit
    python -m paperlib sweep parameters/sweeps/finetune_paper.yaml --plan    # what it costs; runs nothing

A spec (``specs``: a notebook, fixed parameters, a grid) expands into runs. Every run is checked
(``check``) before the first one starts: a bad value in one cell stops the sweep in one line, with
nothing written. Each run writes ``reports/<notebook>/<run name>.ipynb`` (the executed notebook;
with ``--html`` also its ``.html`` and ``.nocode.html`` reports, which a grid of hundreds of runs
rarely needs), then ``.done.json`` last; finished runs (``Run.finished``: for a finetuning run, its
run folder says so, ``runs.is_finished``) are skipped when the sweep is started again (a run whose
parameters were edited since, or whose custom images or model changed since, runs again). A
failing run leaves ``.error.txt`` with its error, and the summary its last line; it does not stop
the others. ``reports/index.html`` is rewritten at the end.

Several sweep processes of one spec on one results root share its runs: one process executes a run
at a time (its lock, ``storage.locked``), and a run another process holds is passed over and come
back to at the end; the summary says which runs another process finished. So N processes, one per
device (``CUDA_VISIBLE_DEVICES``, or ``VIT_PLASTICITY_WORKERS=N`` each on one machine's CPU cores:
``threads``), divide a sweep's runs between them.

Executors: ``local`` (one run after another, in this process), ``gpus`` (one worker process per
visible GPU, or per ``--gpus`` id, each pinned to its GPU with ``CUDA_VISIBLE_DEVICES``), ``slurm``
(submitit's cluster executor, one job per run) and ``submitit-local`` (submitit's local executor,
for tests).

``--plan`` trains and writes nothing: it counts the runs (finished, diverged, failed, missing) and,
for a finetuning sweep, estimates the device-hours of those to run on this machine (``plan``);
``--precision P`` as if the spec's precision were P, ``--plan-steps N`` steps timed per distinct step.
``--plan`` and ``--dry-run`` check the runs as a sweep does, except whether their devices are here
(a plan may be made on another machine than the sweep's).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import functools
import json
import multiprocessing
import os
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import submitit
import torch

from paperlib.data import datasets
from paperlib.measure import plasticity
from paperlib.records import cli, commands, paths, runs, specs, storage
from paperlib.records.names import check_normalize
from paperlib.reports import execute
from paperlib.speed import devices, threads
from paperlib.sweeps import plan
from paperlib.train.config import config_from
from paperlib.vit import models

STATUSES = {
    "done": "done",
    "other": "finished by another process",
    "skipped": "skipped (finished before)",
    "failed": "failed",
}
"""A run's status after a sweep, and what the summary calls it (``busy``, while another process holds
it, is come back to before the sweep ends)."""


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
    def reason(self) -> str:
        """A failed run's error in one line: its last.

        For an error in a notebook, that is the exception it raised: papermill's message starts with the traceback."""
        lines = [line.strip() for line in self.error.splitlines() if line.strip()]
        return lines[-1] if lines else ""

    @property
    def fingerprints(self) -> dict:
        """``parameter_fingerprints`` of this run's parameters, computed once.

        ``run_sweep`` computes them for all runs, each dataset read once."""
        if "fingerprints" not in self.extra:
            self.extra["fingerprints"] = parameter_fingerprints(self.parameters)
        return self.extra["fingerprints"]

    @property
    def finished(self) -> bool:
        """Whether this run is finished as its spec asks now.

        A finetuning run (notebook 05) asks its run folder (``runs.is_finished``: the parameters it recorded, the custom
        inputs as they are now), and its report must be there (the marker). Another notebook's run asks its marker: it
        must record these parameters (a spec edited since, say its steps, makes its runs unfinished: their names need
        not change) and the custom models and datasets as they are now (edited images, a re-saved model: unfinished)."""
        marker = storage.json_or_none(self.marker)  # a damaged marker: not finished (a warning names it)
        if marker is None:
            return False
        if self.notebook.stem == runs.NOTEBOOK:
            try:
                return runs.is_finished(config_from(self.parameters))
            except (ValueError, FileNotFoundError):  # the run itself will say what is wrong
                return False
        recorded, inputs = marker.get("parameters"), marker.get("fingerprints", {})
        return recorded == json.loads(json.dumps(self.parameters, default=str)) and inputs == self.fingerprints


def parameter_fingerprints(parameters: dict, memo: dict | None = None) -> dict:
    """What the ``custom/<name>`` models and datasets among a notebook's parameters hold now.

    Names are found among the parameter values (names, or lists of names, under any parameter). The result
    is ``{"model:<name>": paths.model_fingerprint, "dataset:<name>": paths.dataset_fingerprint}``
    (datasets under the run's ``data_root``), as a run's marker keeps them; empty when it names none. A
    name that is not there, or not valid, is left out: the run itself says what is wrong. (A finetuning
    run's record keeps its own: ``runs.config_fingerprints``.) ``memo`` keeps fingerprints across the runs
    of one sweep, so a dataset is read once."""
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
    """``runs`` with their ``fingerprints`` computed as the custom inputs are now.

    Each dataset read once for all of them (what ``finished`` compares the markers with); returns them."""
    memo: dict = {}
    for run in runs:
        run.extra["fingerprints"] = parameter_fingerprints(run.parameters, memo)
    return runs


def _fingerprint(kind: str, name: str, root) -> str | None:
    try:
        if kind == "model":
            return paths.model_fingerprint(name)  # a model that is not there raises FileNotFoundError
        return paths.dataset_fingerprint(name, root)
    except (ValueError, FileNotFoundError):
        return None


def expand(spec: dict, reports: Path | None = None) -> list[Run]:
    """The runs of a spec (``specs.cells``), each with its outputs under ``reports/<notebook>/``."""
    found = specs.cells(spec)
    folder = (reports or paths.reports_dir()) / found[0][1].stem if found else None
    return [Run(name, notebook, parameters, folder) for name, notebook, parameters in found]


def _model_name(name: str) -> str:
    """A model's name as a sweep checks it: a ``custom/<name>`` by its form alone (notebook 08 makes its own)."""
    return name if paths.custom_name(name, "model") else models.resolve_name(name)


BY_NAME = {
    "model": _model_name,
    "models": _model_name,
    "dataset": datasets.check_dataset,
    "datasets": datasets.check_dataset,
    "reference": datasets.check_dataset,
    "normalize": check_normalize,
}
"""The checks of another notebook's parameters (not 05's or 02's) that go by these names; a list's values each."""


def check(found: list[Run], executor: str | None = None) -> list[Run]:
    """``found`` (a spec's runs), returned once each is checked, else a ValueError naming the first bad run.

    Its bad value and the valid choices: before anything runs. A finetuning run (notebook 05) is checked by building its
    ``Config`` (dataset, model, component, precision on its kind of device...), a plasticity run (notebook 02) by
    building its ``plasticity.Measurement``, another notebook's parameters by name (``BY_NAME``); each run's device as
    ``executor`` runs it (``check_device``; None: a name, for ``--plan`` and ``--dry-run``, which may be asked
    elsewhere)."""
    for run in found:
        try:
            _check_parameters(run)
            if "device" in run.parameters:  # else the notebook's default, the CPU
                check_device(run.parameters["device"], executor)
        except (ValueError, FileNotFoundError) as error:
            raise ValueError(f"run {run.name}: {error}") from None
    return found


def _check_parameters(run: Run) -> None:
    if run.notebook.stem == runs.NOTEBOOK:
        config_from(run.parameters)
    elif run.notebook.stem == plasticity.NOTEBOOK:
        fields = {field.name for field in dataclasses.fields(plasticity.Measurement)}
        plasticity.Measurement(**{name: value for name, value in run.parameters.items() if name in fields})
    else:
        for name, value in run.parameters.items():
            for one in value if isinstance(value, (list, tuple)) else [value]:
                if name in BY_NAME and one not in (None, ""):  # "": the notebook's default
                    BY_NAME[name](one)


def check_device(device, executor: str | None = None) -> None:
    """A run's device as ``executor`` runs it; a ValueError naming the valid ones otherwise.

    Valid: one this machine has (``local``, ``submitit-local``), the one GPU each worker sees (``gpus``: ``cuda`` or
    ``cuda:0``, or the CPU), any device's name (``slurm``: the cluster's; None)."""
    parsed = devices.check_device(device, here=executor in ("local", "submitit-local"))
    if executor == "gpus" and parsed.type == "cuda" and parsed.index not in (None, 0):
        raise ValueError(f"device {device!r}: under --executor gpus a run sees one GPU, cuda (or cuda:0)")


def check_gpus(gpus: list[int] | None) -> list[int]:
    """The GPUs of executor ``gpus``; a ValueError naming those here otherwise.

    They are ``gpus``, each one this machine has, or every visible one."""
    here = _visible_gpus()
    if not here:
        raise ValueError("executor 'gpus' found no GPU here; use --executor local")
    absent = [gpu for gpu in gpus or [] if gpu not in here]
    if gpus == [] or absent:
        raise ValueError(
            f"no GPU {', '.join(map(str, absent or gpus))} on this machine; GPUs here: {', '.join(map(str, here))}"
        )
    return here if gpus is None else gpus


def execute_run(run: Run, wait: bool = True, html: bool = False) -> Run:
    """Execute one run unless finished; record success (marker) or failure (error file).

    One process executes a run (``storage.locked``): a run another process holds is left ``busy`` (``wait``: waited
    for), and one another process finished since the sweep started is ``other``. ``html``: its reports too."""
    try:
        with storage.locked(run.stem, wait=wait):
            if run.finished:  # by another process, since this sweep read the markers
                run.status = "other"
                return run
            return _execute(run, html)
    except storage.Busy:
        run.status = "busy"
        print(f"{run.name}: held by another process; come back to at the end", flush=True)
        return run


def _execute(run: Run, html: bool = False) -> Run:
    start = time.perf_counter()
    try:
        executed = execute.execute(run.notebook, run.stem.with_name(run.stem.name + ".ipynb"), run.parameters)
        if html:
            execute.render_html(executed)
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
        storage.write_json(run.marker, marker)
        run.status = "done"
    except Exception as error:  # a failed run is recorded; the sweep goes on
        run.seconds = round(time.perf_counter() - start, 2)
        run.status = "failed"
        run.error = f"{type(error).__name__}: {error}".strip()
        storage.atomic_write_text(run.error_file, run.error + "\n\n" + traceback.format_exc())
    print(f"{run.name}: {run.status} in {run.seconds:.0f} s", flush=True)  # one line per run, wherever it ran
    return run


def _pin_gpu(queue) -> None:
    os.environ["CUDA_VISIBLE_DEVICES"] = str(queue.get())


def _visible_gpus() -> list[int]:
    return list(range(torch.cuda.device_count()))


def run_sweep(
    spec: dict,
    executor: str = "local",
    gpus: list[int] | None = None,
    reports: Path | None = None,
    html: bool = False,
) -> list[Run]:
    """Execute every unfinished run of ``spec``, each checked first; returns the runs with their status.

    The check is ``check``; the statuses are ``STATUSES``. A run another process holds is passed over, then come
    back to at the end. ``html``: each run's reports too (``report.render_html``), not only its executed notebook."""
    if executor not in commands.EXECUTORS:
        raise ValueError(f"unknown executor {executor!r}; valid executors: {', '.join(commands.EXECUTORS)}")
    gpus = check_gpus(gpus) if executor == "gpus" else gpus
    runs = fingerprinted(check(expand(spec, reports), executor))
    todo = []
    for run in runs:  # each marker read once
        if run.finished:
            run.status = "skipped"
        else:
            todo.append(run)
    todo = _executed(todo, spec, executor, gpus, functools.partial(execute_run, wait=False, html=html))
    busy = [run for run in todo if run.status == "busy"]  # held by another process: come back to, waiting now
    again = _executed(busy, spec, executor, gpus, functools.partial(execute_run, wait=True, html=html))
    done = {r.name: r for r in todo + again}
    runs = [done.get(r.name, r) for r in runs]
    execute.write_index(reports or paths.reports_dir())
    return runs


def _executed(todo: list[Run], spec: dict, executor: str, gpus: list[int] | None, task) -> list[Run]:
    """``todo`` after ``task`` (``execute_run``) ran on each, as ``executor`` runs them."""
    if todo and executor == "local":
        return [task(r) for r in todo]
    if todo and executor == "gpus":
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
            return list(pool.map(task, todo))
    if todo:
        folder = todo[0].folder / ".submitit"  # reports/<notebook>/.submitit
        if executor == "slurm":
            pool = submitit.AutoExecutor(folder=folder)
            pool.update_parameters(**(spec.get("slurm") or {}))
        else:
            pool = submitit.LocalExecutor(folder=folder)
            pool.update_parameters(timeout_min=int((spec.get("slurm") or {}).get("timeout_min", 60)))
        # submitit's local jobs run at once on this machine: a share of the cores each (a cluster's have their own)
        with threads.shared_by(len(todo)) if executor == "submitit-local" else contextlib.nullcontext():
            jobs = pool.map_array(task, todo)
        return [job.result() for job in jobs]
    return todo


def main(argv: list[str] | None = None) -> int:
    """``python -m paperlib sweep``: run, plan or dry-run a sweep spec."""
    args = commands.sweep().parse_args(argv)
    try:
        if not args.plan and (args.precision is not None or args.plan_steps is not None):
            raise ValueError("--precision and --plan-steps are options of --plan")
        if args.gpus is not None and args.executor != "gpus":
            raise ValueError(f"--gpus is an option of --executor gpus, not of --executor {args.executor}")
        gpus = _gpu_ids(args.gpus)
        spec = specs.load_spec(args.spec)
        if args.plan:
            steps = 3 if args.plan_steps is None else args.plan_steps
            result = plan.plan(fingerprinted(check(expand(spec))), args.precision, steps)
            print(f"plan of {args.spec}" + (f", as if its precision were {args.precision}" if args.precision else ""))
            print(plan.formatted(result))
            return 0
        if args.dry_run:
            for run in fingerprinted(check(expand(spec))):
                print(f"{'finished' if run.finished else 'to run':8}  {run.name}  {run.parameters}")
            return 0
        runs = run_sweep(spec, args.executor, gpus, html=args.html)
    except (*cli.BAD_INPUT, RuntimeError) as error:
        return cli.fail(error)
    for run in runs:
        detail = run.reason if run.status == "failed" else STATUSES[run.status] if run.status == "other" else ""
        print(f"{run.status:8}  {run.name}  {run.seconds:7.1f} s  {detail}".rstrip())
    counts = ", ".join(f"{sum(r.status == status for r in runs)} {words}" for status, words in STATUSES.items())
    print(f"\n{counts}; reports: {paths.reports_dir() / 'index.html'}")
    return 1 if any(r.status == "failed" for r in runs) else 0


def _gpu_ids(text: str | None) -> list[int] | None:
    """``--gpus``' ids (``0,1``), or None (not given: every visible GPU)."""
    if text is None:
        return None
    ids = text.split(",")
    if not all(part.strip().isdigit() for part in ids):
        raise ValueError(f"--gpus takes GPU ids joined by commas, e.g. 0,1; got {text!r}")
    return [int(part) for part in ids]
