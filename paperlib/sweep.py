"""Sweeps: one papermill run per cell of a parameter grid, resumable, failure-isolated.

    python -m paperlib.sweep parameters/sweeps/plasticity_demo.yaml
    python -m paperlib.sweep parameters/sweeps/plasticity_paper.yaml --executor gpus     # all GPUs here
    python -m paperlib.sweep parameters/sweeps/plasticity_paper.yaml --executor slurm    # via submitit

A spec (YAML) names a ``notebook``, fixed ``parameters``, a ``grid`` of lists to expand (in the
order written; or a list of such grids, expanded one after the other), an optional run ``name`` template (default: the grid values joined by ``/``)
and optional ``slurm`` settings for submitit. Each run writes
``reports/<notebook>/<run name>.ipynb`` and ``.html``, then ``.done.json`` last: a run counts as
finished only when that marker exists and records the run's parameters and, for the
``custom/<name>`` models and datasets it names, what they held (``input_fingerprints``); finished
runs are skipped when the sweep is started again (a run whose parameters were edited since, or
whose custom images or model changed since, runs again). A failing run leaves ``.error.txt`` with its error and does not stop the others.
``reports/index.html`` is rewritten at the end.

Executors: ``local`` (one run after another, in this process), ``gpus`` (one worker process per
visible GPU, each pinned to its GPU with ``CUDA_VISIBLE_DEVICES``), ``slurm`` (submitit's
cluster executor, one job per run) and ``submitit-local`` (submitit's local executor, for tests).
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures
import itertools
import json
import multiprocessing
import os
import re
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from . import paths, report

EXECUTORS = ("local", "gpus", "slurm", "submitit-local")
SPEC_KEYS = {"notebook", "parameters", "grid", "name", "slurm"}


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
        """``input_fingerprints`` of this run's parameters, computed once (``run_sweep`` computes
        them for all runs, each dataset read once)."""
        if "fingerprints" not in self.extra:
            self.extra["fingerprints"] = input_fingerprints(self.parameters)
        return self.extra["fingerprints"]

    @property
    def finished(self) -> bool:
        """Whether this run's marker exists and records these parameters (a spec edited since, say
        its steps, makes its runs unfinished: their names need not change) and the custom models
        and datasets as they are now (edited images, a re-saved model: unfinished)."""
        if not self.marker.is_file():
            return False
        try:
            marker = json.loads(self.marker.read_text())
            recorded, inputs = marker.get("parameters"), marker.get("fingerprints", {})
        except (json.JSONDecodeError, AttributeError):
            return False
        return recorded == json.loads(json.dumps(self.parameters, default=str)) and inputs == self.fingerprints


def input_fingerprints(parameters: dict, memo: dict | None = None) -> dict:
    """What the ``custom/<name>`` models and datasets among a run's parameter values (names, or
    lists of names) hold now: ``{"model:<name>": models.content_fingerprint, "dataset:<name>":
    data.content_fingerprint}`` (datasets under the run's ``data_root``); empty when it names none.
    A name that is not there, or not valid, is left out: the run itself says what is wrong.
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
        run.extra["fingerprints"] = input_fingerprints(run.parameters, memo)
    return runs


def _fingerprint(kind: str, name: str, root) -> str | None:
    from . import data, models

    try:
        if kind == "model":
            return models.content_fingerprint(name)  # a model that is not there raises FileNotFoundError
        return data.content_fingerprint(name, root)
    except (ValueError, FileNotFoundError):
        return None


def load_spec(path: str | Path) -> dict:
    """Read and check a sweep spec."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"sweep spec not found: {path}")
    spec = yaml.safe_load(path.read_text()) or {}
    unknown = set(spec) - SPEC_KEYS
    if unknown:
        raise ValueError(f"unknown keys in {path}: {', '.join(sorted(unknown))}; valid keys: {', '.join(sorted(SPEC_KEYS))}")
    if "notebook" not in spec:
        raise ValueError(f"{path} names no notebook")
    for grid in _grids(spec):
        for key, values in grid.items():
            if not isinstance(values, list) or not values:
                raise ValueError(f"grid entry {key!r} in {path} must be a non-empty list, got {values!r}")
        overlap = set(grid) & set(spec.get("parameters") or {})
        if overlap:
            raise ValueError(f"{', '.join(sorted(overlap))} both fixed and in the grid of {path}")
    return spec


def _grids(spec: dict) -> list[dict]:
    """A spec's grid, or its list of grids (e.g. one per group of datasets with its own steps)."""
    grid = spec.get("grid") or {}
    return grid if isinstance(grid, list) else [grid]


def restrict(spec: dict, **values) -> dict:
    """The spec with only the runs whose parameters take the given values (``key=[value, ...]``),
    for a spec with one grid or a list of them; a ValueError naming the spec's values when no run
    takes them."""
    fixed = spec.get("parameters") or {}
    grids = []
    for grid in _grids(spec):
        kept = dict(grid)
        for key, wanted in values.items():
            if key in grid:
                kept[key] = [value for value in grid[key] if value in wanted]
                if not kept[key]:
                    break
            elif fixed.get(key) not in wanted:
                break
        else:
            grids.append(kept)
    if not grids:
        offered = {key: sorted({str(v) for grid in _grids(spec) for v in grid.get(key, [fixed.get(key)])}) for key in values}
        raise ValueError("the spec has no run with " + " and ".join(f"{key} in {list(wanted)}" for key, wanted in values.items())
                         + "; its values: " + "; ".join(f"{key}: {', '.join(choices)}" for key, choices in offered.items()))
    return {**spec, "grid": grids if isinstance(spec.get("grid"), list) else grids[0]}


def _safe(name: str) -> str:
    parts = [re.sub(r"[^A-Za-z0-9_.=+-]", "_", part) for part in name.split("/") if part not in ("", ".", "..")]
    return "/".join(parts) or "run"


def notebook_parameters(notebook: Path) -> dict:
    """The names and default values of a notebook's ``parameters`` cell (``None`` for a default that
    is not a literal). Read with ``ast``: papermill's ``inspect_notebook`` cannot parse every line
    of ours (a comment holding quotes)."""
    import nbformat

    cells = [c for c in nbformat.read(notebook, as_version=4).cells if "parameters" in c.metadata.get("tags", [])]
    if not cells:
        raise ValueError(f"{notebook} has no cell tagged 'parameters'")
    defaults = {}
    for node in ast.parse(cells[0].source).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                defaults[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                defaults[node.targets[0].id] = None
    return defaults


def _typed(name: str, value, default):
    """A spec's value for a numeric parameter given as a string (YAML reads ``1e-2`` as one) as a number."""
    from .cli import coerce

    numeric = isinstance(default, (int, float)) and not isinstance(default, bool)
    return coerce(name, value, default) if numeric and isinstance(value, str) else value


def expand(spec: dict, reports: Path | None = None) -> list[Run]:
    """The runs of a spec: the grid's product, in the order its keys and values are written.

    Every parameter must be one of the notebook's (papermill would pass a misspelt one on and the
    notebook would run on its default); numbers written as strings are read as numbers.
    """
    notebook = Path(spec["notebook"])
    if not notebook.is_absolute():
        notebook = paths.ROOT / notebook
    if not notebook.is_file():
        raise FileNotFoundError(f"notebook not found: {notebook}")
    defaults = notebook_parameters(notebook)
    given = set(spec.get("parameters") or {}) | {key for grid in _grids(spec) for key in grid}
    unknown = sorted(given - set(defaults))
    if unknown:
        raise ValueError(f"{notebook.name} has no parameter {', '.join(unknown)}; its parameters: {', '.join(defaults)}")
    fixed = {key: _typed(key, value, defaults[key]) for key, value in (spec.get("parameters") or {}).items()}
    folder = (reports or paths.reports_dir()) / notebook.stem
    runs = []
    for grid in _grids(spec):
        for values in itertools.product(*grid.values()):
            cell = {key: _typed(key, value, defaults[key]) for key, value in zip(grid, values)}
            template = spec.get("name")
            name = template.format(**fixed, **cell) if template else "/".join(str(v) for v in values) or "run"
            runs.append(Run(_safe(name), notebook, {**fixed, **cell}, folder))
    names = [r.name for r in runs]
    if len(set(names)) != len(names):
        raise ValueError("two runs of the sweep have the same name: give the spec a name template that uses every grid key")
    return runs


def execute_run(run: Run) -> Run:
    """Execute one run unless finished; record success (marker) or failure (error file)."""
    if run.finished:
        run.status = "skipped"
        return run
    start = time.perf_counter()
    try:
        executed = report.execute(run.notebook, run.stem.with_name(run.stem.name + ".ipynb"), run.parameters)
        report.render_html(executed)
        run.seconds = round(time.perf_counter() - start, 2)
        # the custom inputs as the run leaves them: a run that makes its own (notebook 08's example) records them
        run.extra["fingerprints"] = input_fingerprints(run.parameters)
        marker = {"name": run.name, "notebook": run.notebook.name, "parameters": run.parameters, "fingerprints": run.fingerprints,
                  "seconds": run.seconds, "finished": time.strftime("%Y-%m-%dT%H:%M:%S")}
        run.error_file.unlink(missing_ok=True)
        paths.atomic_write_text(run.marker, json.dumps(marker, indent=2, default=str) + "\n")
        run.status = "done"
    except Exception as error:  # a failed run is recorded; the sweep goes on
        run.seconds = round(time.perf_counter() - start, 2)
        run.status = "failed"
        run.error = f"{type(error).__name__}: {error}".strip()
        paths.atomic_write_text(run.error_file, run.error + "\n\n" + traceback.format_exc())
    return run


def _pin_gpu(queue) -> None:
    os.environ["CUDA_VISIBLE_DEVICES"] = str(queue.get())


def _visible_gpus() -> list[int]:
    import torch

    return list(range(torch.cuda.device_count()))


def run_sweep(spec: dict, executor: str = "local", gpus: list[int] | None = None, reports: Path | None = None) -> list[Run]:
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
        with concurrent.futures.ProcessPoolExecutor(len(gpus), mp_context=context, initializer=_pin_gpu, initargs=(queue,)) as pool:
            todo = list(pool.map(execute_run, todo))
    elif todo:
        import submitit

        folder = (reports or paths.reports_dir()) / runs[0].notebook.stem / ".submitit"
        if executor == "slurm":
            pool = submitit.AutoExecutor(folder=folder)
            pool.update_parameters(**(spec.get("slurm") or {}))
        else:
            pool = submitit.LocalExecutor(folder=folder)
            pool.update_parameters(timeout_min=int((spec.get("slurm") or {}).get("timeout_min", 60)))
        jobs = pool.map_array(execute_run, todo)
        todo = [job.result() for job in jobs]
    done = {r.name: r for r in todo}
    runs = [done.get(r.name, r) for r in runs]
    report.write_index(reports or paths.reports_dir())
    return runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m paperlib.sweep", description=__doc__.split("\n")[0])
    parser.add_argument("spec", type=Path, help="sweep spec (YAML), e.g. parameters/sweeps/plasticity_demo.yaml")
    parser.add_argument("--executor", default="local", choices=EXECUTORS)
    parser.add_argument("--gpus", default=None, help="GPU ids for --executor gpus, e.g. 0,1 (default: all visible)")
    parser.add_argument("--dry-run", action="store_true", help="list the runs and whether they are finished")
    args = parser.parse_args(argv)
    try:
        spec = load_spec(args.spec)
        if args.dry_run:
            for run in fingerprinted(expand(spec)):
                print(f"{'finished' if run.finished else 'to run':8}  {run.name}  {run.parameters}")
            return 0
        gpus = [int(g) for g in args.gpus.split(",")] if args.gpus else None
        runs = run_sweep(spec, args.executor, gpus)
    except (ValueError, FileNotFoundError, RuntimeError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    for run in runs:
        print(f"{run.status:8}  {run.name}  {run.seconds:7.1f} s  {run.error.splitlines()[0] if run.error else ''}")
    counts = {s: sum(r.status == s for r in runs) for s in ("done", "skipped", "failed")}
    print(f"\n{counts['done']} done, {counts['skipped']} skipped (finished before), {counts['failed']} failed; reports: {paths.reports_dir() / 'index.html'}")
    return 1 if counts["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
