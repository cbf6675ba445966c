"""Sweeps: one papermill run per cell of a parameter grid, checked first, resumable, failure-isolated.

    python -m paperlib sweep parameters/sweeps/plasticity_demo.yaml
    python -m paperlib sweep parameters/sweeps/plasticity_paper.yaml --executor gpus     # all GPUs here
    python -m paperlib sweep parameters/sweeps/plasticity_paper.yaml --executor slurm    # via submitit
    python -m paperlib sweep parameters/sweeps/finetune_paper.yaml --plan    # what it costs; runs nothing

A spec (``specs``: a notebook, fixed parameters, a grid) expands into runs. Every run is checked
(``check``) before the first one starts: a bad value in one cell stops the sweep in one line, with
nothing written. Each run writes ``reports/<notebook>/<run name>.ipynb`` (the executed notebook;
with ``--html`` also its ``.html`` and ``.nocode.html`` reports, which a grid of hundreds of runs
rarely needs), then ``.done.json`` last. Finished runs are skipped, whoever made them (``Run.finished``,
judged by their results: a finetuning run's folder, a plasticity measurement's record; another notebook's
result is its executed notebook): a run whose parameters were edited since, or whose custom images or
model changed since, runs again. A finished run made outside a sweep (by a notebook or a command) has
no report; ``--reports`` executes it to write one (``Run.reported``). ``--plan``, ``--dry-run`` and
the sweep count the same runs finished. A failing run leaves ``.error.txt`` with its error, and the
summary its last line; it does not stop the others. ``reports/index.html`` is rewritten at the end.

Several sweep processes of one spec on one results root share its runs: one process executes a run
at a time (its lock, ``storage.locked``), and a run another process holds is passed over and come
back to at the end; the summary says which runs another process finished. So N processes, one per
device (``CUDA_VISIBLE_DEVICES``, or ``VIT_PLASTICITY_WORKERS=N`` each on one machine's CPU cores:
``threads``), divide a sweep's runs between them.

Executors: ``local`` (one run after another, in this process), ``gpus`` (one worker process per
visible GPU, or per ``--gpus`` id, each pinned to its GPU with ``CUDA_VISIBLE_DEVICES``), ``slurm``
(submitit's SLURM executor, one job per run; refused where SLURM's ``sbatch`` is not on PATH, where
submitit would fall back to running every job here at once) and ``submitit-local`` (submitit's local
executor: every run at once on this machine, each with its share of the cores, which it prints).

``--plan`` trains and writes nothing: it counts the runs (finished, diverged, failed, missing) and,
for a finetuning sweep, estimates the device-hours of those to run on this machine (``plan``);
``--precision P`` as if the spec's precision were P, ``--plan-steps N`` steps timed per distinct step.
``--plan`` and ``--dry-run`` check the runs as a sweep does, except whether their devices are here
(a plan may be made on another machine than the sweep's).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import json
import multiprocessing
import os
import shutil
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import submitit
import torch

from paperlib.data import datasets
from paperlib.measure import plasticity
from paperlib.records import cli, commands, measurements, paths, runs, specs, storage
from paperlib.records.names import check_choice, check_normalize
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
        return self.folder / f"{self.name}.done.json"

    @property
    def error_file(self) -> Path:
        return self.folder / f"{self.name}.error.txt"

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
        """Whether this run's results are there as its spec asks now, whoever made them.

        A finetuning run (notebook 05) asks its run folder (``runs.is_finished``: the parameters it recorded, the custom
        inputs as they are now), a plasticity run (notebook 02) its measurement's record (``Measurement.is_saved``; a
        record keeps no fingerprint of custom inputs, so a run naming some must be ``reported`` too). Another
        notebook's result is its executed notebook: it is finished when ``reported``."""
        if self.notebook.stem not in (runs.NOTEBOOK, plasticity.NOTEBOOK):
            return self.reported
        try:
            if self.notebook.stem == runs.NOTEBOOK:
                return runs.is_finished(config_from(self.parameters))
            return measurement(self.parameters, self.notebook).is_saved() and (not self.fingerprints or self.reported)
        except (ValueError, FileNotFoundError):  # the run itself will say what is wrong
            return False

    @property
    def reported(self) -> bool:
        """Whether its report (the executed notebook) is there, made as its spec asks now: its marker.

        The marker must record these parameters (a spec edited since, say its steps, makes its report outdated: the
        runs' names need not change) and the custom models and datasets as they are now."""
        marker = storage.json_or_none(self.marker)  # a damaged marker: no report (a warning names it)
        if marker is None:
            return False
        recorded, inputs = marker.get("parameters"), marker.get("fingerprints", {})
        return recorded == json.loads(json.dumps(self.parameters, default=str)) and inputs == self.fingerprints

    def to_run(self, reports: bool = False) -> bool:
        """Whether a sweep executes it: not ``finished``, or, with ``reports``, finished without its report."""
        return not self.finished or (reports and not self.reported)


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
    elsewhere), and, given an ``executor``, the custom datasets it reads (``check_custom_data``)."""
    read: set = set()  # the custom datasets read so far: each once
    for run in found:
        try:
            _check_parameters(run)
            if "device" in run.parameters:  # else the notebook's default, the CPU
                check_device(run.parameters["device"], executor)
            if executor is not None:
                check_custom_data(run, read)
        except (ValueError, FileNotFoundError) as error:
            raise ValueError(f"run {run.name}: {error}") from None
    return found


def measurement(parameters: dict, notebook: Path) -> plasticity.Measurement:
    """The measurement that ``notebook`` (02) makes with ``parameters``, its own defaults for those they leave out.

    Of both, the names that are ``Measurement``'s fields: the notebook's defaults (its ``reference``, say) can differ
    from ``Measurement``'s."""
    fields = {field.name for field in dataclasses.fields(plasticity.Measurement)}
    defaults = {name: value for name, value in specs.notebook_parameters(notebook).items() if value is not None}
    chosen = {**defaults, **parameters}
    return plasticity.Measurement(**{name: value for name, value in chosen.items() if name in fields})


def _check_parameters(run: Run) -> None:
    if run.notebook.stem == runs.NOTEBOOK:
        config_from(run.parameters)
    elif run.notebook.stem == plasticity.NOTEBOOK:
        measurement(run.parameters, run.notebook)
    else:
        for name, value in run.parameters.items():
            for one in value if isinstance(value, (list, tuple)) else [value]:
                if name in BY_NAME and one not in (None, ""):  # "": the notebook's default
                    BY_NAME[name](one)


READS = {runs.NOTEBOOK: ("dataset",), plasticity.NOTEBOOK: ("dataset", "reference")}
"""The parameters that name the datasets a notebook reads and never makes (notebook 08 makes its example's own)."""


def check_custom_data(run: Run, read: set) -> None:
    """The ``custom/<name>`` datasets that ``run`` reads (``READS``), each there and readable; else an error.

    The error (``datasets.custom_dataset``'s) says where the images go and which custom datasets there are. ``read``:
    the (name, data root) pairs already read, which this adds to."""
    root = run.parameters.get("data_root") or None
    for name in (run.parameters.get(parameter) for parameter in READS.get(run.notebook.stem, ())):
        if paths.custom_name(name, "dataset") and (name, root) not in read:
            datasets.custom_dataset(name, root)
            read.add((name, root))


def check_device(device, executor: str | None = None) -> None:
    """A run's device as ``executor`` runs it; a ValueError naming the valid ones otherwise.

    Valid: one this machine has (``local``, ``submitit-local``), the one GPU each worker sees (``gpus``: ``cuda`` or
    ``cuda:0``, or the CPU), any device's name (``slurm``: the cluster's; None)."""
    parsed = devices.check_device(device, here=executor in ("local", "submitit-local"))
    if executor == "gpus" and parsed.type == "cuda" and parsed.index not in (None, 0):
        raise ValueError(f"device {device!r}: under --executor gpus a run sees one GPU, cuda (or cuda:0)")


def check_executor(executor: str) -> str:
    """``executor`` if it can run here; a ValueError naming why not and the valid ones otherwise.

    ``slurm`` needs SLURM's ``sbatch`` on PATH: without it submitit's ``AutoExecutor`` would run the jobs here, all at
    once (``submitit-local`` asks for that by name)."""
    check_choice(executor, commands.EXECUTORS, "executor", "executors")
    if executor == "slurm" and shutil.which("sbatch") is None:
        raise ValueError(
            "executor 'slurm' needs SLURM, and sbatch is not on PATH here; valid executors here: local (one run "
            "after another), gpus (a process per GPU), submitit-local (every run at once on this machine)"
        )
    return executor


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


def execute_run(run: Run, wait: bool = True, html: bool = False, reports: bool = False) -> Run:
    """Execute one run unless finished (``reports``: and reported); record success (marker) or failure (error file).

    One process executes a run (``storage.locked``): a run another process holds is left ``busy`` (``wait``: waited
    for), and one another process finished since the sweep started is ``other``. ``html``: its reports too."""
    try:
        with storage.locked(run.stem, wait=wait):
            if not run.to_run(reports):  # finished by another process, since this sweep read the results
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
        executed = execute.execute(run.notebook, run.folder / f"{run.name}.ipynb", run.parameters)
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
    report_finished: bool = False,
) -> list[Run]:
    """Execute every unfinished run of ``spec``, each checked first; returns the runs with their status.

    The check is ``check``; the statuses are ``STATUSES``. A run another process holds is passed over, then come
    back to at the end. ``html``: each run's reports too (``report.render_html``), not only its executed notebook.
    ``report_finished``: a finished run without its report (``Run.reported``) is executed too, to write it."""
    gpus = check_gpus(gpus) if check_executor(executor) == "gpus" else gpus
    found = fingerprinted(check(expand(spec, reports), executor))
    todo = []
    for run in found:  # each result read once
        if run.to_run(report_finished):
            todo.append(run)
        else:
            run.status = "skipped"
            if run.notebook.stem == runs.NOTEBOOK:  # a run of an older version, where its records suffice
                config = config_from(run.parameters)
                older = (config.dataset, config.data_root or None, config.seed, config.validation)
                runs.upgrade(config.folder(), lambda: datasets.older_validation_order(*older))
    task = functools.partial(execute_run, html=html, reports=report_finished)
    todo = _executed(todo, spec, executor, gpus, functools.partial(task, wait=False))
    busy = [run for run in todo if run.status == "busy"]  # held by another process: come back to, waiting now
    again = _executed(busy, spec, executor, gpus, functools.partial(task, wait=True))
    done = {r.name: r for r in todo + again}
    found = [done.get(r.name, r) for r in found]
    execute.write_index(reports or paths.reports_dir())
    return found


def _executed(todo: list[Run], spec: dict, executor: str, gpus: list[int] | None, task) -> list[Run]:
    """``todo`` after ``task`` (``execute_run``) ran on each, as ``executor`` runs them."""
    if not todo:
        return todo
    if executor == "local":
        return [task(r) for r in todo]
    if executor == "gpus":
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
    folder = todo[0].folder / ".submitit"  # reports/<notebook>/.submitit
    if executor == "slurm":  # SLURM by name: never submitit's fallback to local jobs (check_executor)
        pool = submitit.AutoExecutor(folder=folder, cluster="slurm")
        pool.update_parameters(**(spec.get("slurm") or {}))
        jobs = pool.map_array(task, todo)
    else:  # submitit's local jobs run at once on this machine: a share of the cores each
        pool = submitit.LocalExecutor(folder=folder)
        pool.update_parameters(timeout_min=int((spec.get("slurm") or {}).get("timeout_min", 60)))
        with threads.shared_by(len(todo)):
            share = f"{threads.budget() or threads.cores()} of its {threads.cores()} CPU cores"
            print(f"submitit-local: {len(todo)} runs at once on this machine, each with {share}", flush=True)
            jobs = pool.map_array(task, todo)
    return [job.result() for job in jobs]


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
        if args.retrain_older:  # for this process and the notebooks it executes (``runs.finished``)
            os.environ[paths.RETRAIN_OLDER] = "1"
        if args.dry_run:
            found = fingerprinted(check(expand(spec)))
            finished = [run for run in found if run.finished]  # each result read once
            names = {run.name for run in finished}
            older = {run.name: lacking for run in finished if (lacking := _lacks(run))}
            for run in found:
                note = "  (no report)" if run.name in names and not run.reported else ""
                note += f"  (older version: {'; '.join(older[run.name])})" if run.name in older else ""
                print(f"{'finished' if run.name in names else 'to run':8}  {run.name}  {run.parameters}{note}")
            print(f"\n{len(finished)} finished, {len(found) - len(finished)} to run{_unreported(finished)}")
            if found and found[0].notebook.stem == runs.NOTEBOOK:
                print(plan.older_line([config_from(run.parameters) for run in found if run.name in older]))
            elif older:  # plasticity results: measured again with --retrain-older
                print(
                    f"{len(older)} results of an older version, kept as they are; --retrain-older would make them again"
                )
            return 0
        swept = run_sweep(spec, args.executor, gpus, html=args.html, report_finished=args.reports)
    except (*cli.BAD_INPUT, RuntimeError) as error:
        return cli.fail(error)
    for run in swept:
        detail = run.reason if run.status == "failed" else STATUSES[run.status] if run.status == "other" else ""
        print(f"{run.status:8}  {run.name}  {run.seconds:7.1f} s  {detail}".rstrip())
    counts = ", ".join(f"{sum(r.status == status for r in swept)} {words}" for status, words in STATUSES.items())
    print(f"\n{counts}{_unreported([r for r in swept if r.status == 'skipped'])}")
    print(f"reports: {paths.reports_dir() / 'index.html'}")
    return 1 if any(r.status == "failed" for r in swept) else 0


def _lacks(run: Run) -> list[str]:
    """What a finished run's result written by an older version lacks; [] for today's, and for any other notebook's.

    A finetuning run's (``runs.lacks``), a plasticity measurement's (``measurements.lacks``)."""
    if run.notebook.stem == runs.NOTEBOOK:
        return runs.lacks(runs.read_params(config_from(run.parameters).folder()) or {})
    if run.notebook.stem == plasticity.NOTEBOOK:
        metadata = storage.json_or_none(measurement(run.parameters, run.notebook).folder() / measurements.METADATA)
        return measurements.lacks(metadata) if metadata else []
    return []


def _unreported(finished: list[Run]) -> str:
    """What a summary says of the ``finished`` runs without a report (made outside a sweep): "" if none."""
    count = sum(not run.reported for run in finished)
    return f"; {count} finished without a report (--reports writes them)" if count else ""


def _gpu_ids(text: str | None) -> list[int] | None:
    """``--gpus``' ids (``0,1``), or None (not given: every visible GPU)."""
    if text is None:
        return None
    ids = text.split(",")
    if not all(part.strip().isdigit() for part in ids):
        raise ValueError(f"--gpus takes GPU ids joined by commas, e.g. 0,1; got {text!r}")
    return [int(part) for part in ids]
