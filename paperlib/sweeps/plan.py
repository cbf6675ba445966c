"""What a sweep will cost before it runs: its runs counted, and the device-hours of those still to run.

    python -m paperlib sweep parameters/sweeps/finetune_paper.yaml --plan
    python -m paperlib sweep parameters/sweeps/finetune_paper.yaml --plan --precision bf16

Counts (any sweep), each run once: ``finished`` (a finetuning run: its results are there as the spec
asks, ``runs.is_finished``, whether or not the sweep has rendered its report yet; another notebook's
run: ``sweep.Run.finished``), ``diverged`` (finished, and its ``metrics.json`` says ``"status":
"diverged"``: a result, which the sweep does not run again), ``failed`` (not finished, and its last
try left an ``.error.txt``: the sweep tries it again) and ``missing`` (the rest). The failed and
missing runs are the ones to run, and the ones estimated. Finished and diverged runs written by an older
version of the package are kept and read as they are, upgraded in place where their records suffice,
and trained again only with ``--retrain-older``: one line says how many, and their device-hours
(``older_line``).

Estimate (finetuning sweeps, notebook 05, only): each run to run costs steps x batch size / images
per second / 3600 device-hours. Its images/s is its step's (``step_key``: model, component, batch
size, image size, LoRA rank, step options, device kind): the median ``images_per_second`` that the
finished runs of that step recorded on a device of that name (their whole training loop: its
validation and checkpoints included), or else the step timed here (``time_step``: the step a run
trains with, ``train.step.build_step``, random weights, synthetic images, a few steps after warm-up), once
per step. Not included: for a timed step, evaluation (validation every ``eval_every`` steps, the
test at the end); for every run, loading its data and model, and the steps a checkpoint would save
a run that resumes.
"""

from __future__ import annotations

import math
import statistics

import pandas as pd
import torch

from paperlib.data.imagesets import random_images
from paperlib.data.loader import DeviceLoader, Transform
from paperlib.records import methods, runs, storage
from paperlib.records.step_options import STEP_OPTIONS
from paperlib.speed.clock import device_name, median_seconds
from paperlib.speed.step import warmup_steps
from paperlib.train.config import Config, config_from
from paperlib.train.step import build_step, network

STATUSES = ("finished", "diverged", "failed", "missing")
TO_RUN = ("failed", "missing")
"""The statuses of the runs a sweep runs (again): those the estimate is for."""

SHOWN = ("model", "batch_size", "image_size", "device")
"""The parameters of a group of runs that the plan shows where they vary, with their method."""

STEP_KEY = ("model", "component", "batch_size", "image_size", "method", *methods.options(), *STEP_OPTIONS)
"""The ``Config`` fields a step's speed depends on (``step_key`` adds the device's kind)."""


def plan(found: list, precision: str | None = None, timing_steps: int = 3) -> dict[str, pd.DataFrame | None]:
    """``{"counts": ..., "estimate": ...}`` of a sweep's runs.

    ``found``: ``sweep.expand(spec)``'s ``sweep.Run``s (module docstring). ``counts``: a row per dataset and a ``total``
    row, columns ``runs`` and ``STATUSES``. ``estimate`` (None unless the spec is a finetuning sweep): a row per
    distinct step of the runs to run, with its runs, steps, images, images/s, hours and where the images/s came from
    (``NaN`` hours where it has none). ``precision``: the runs as if the spec's precision were this one (refused for a
    spec whose runs have several: each would be counted once per precision). ``timing_steps``: steps timed per
    distinct step that no finished run has recorded. Trains nothing, writes nothing."""
    if not isinstance(timing_steps, int) or isinstance(timing_steps, bool) or timing_steps < 1:
        raise ValueError(f"the timed steps (--plan-steps) must be a positive integer, got {timing_steps!r}")
    finetuning = found[0].notebook.stem == runs.NOTEBOOK
    if precision is not None and not finetuning:
        raise ValueError(f"--precision is for finetuning sweeps ({runs.NOTEBOOK}), not {found[0].notebook.stem}")
    if finetuning:
        configs = [config_from(run.parameters) for run in found]
        if precision is not None:
            asked = sorted({config.step.precision for config in configs})
            if len(asked) > 1:  # each run would be counted once per precision of the axis
                raise ValueError(
                    f"--precision replaces the spec's precision, and this spec has a precision axis "
                    f"({', '.join(asked)}): plan it without --precision"
                )
            # another precision as the runs would be asked for it: Config checks it (an unknown name, one the runs'
            # device lacks) and a speed preset not offered in it is refused (``step_options.offered``)
            configs = [config_from({**run.parameters, "precision": precision}) for run in found]
        rows = [{"dataset": c.dataset, "status": status(run, c), "config": c} for run, c in zip(found, configs)]
    else:  # Run.finished compares its marker with the custom inputs as they are now (fingerprinted)
        rows = [{"dataset": run.parameters.get("dataset", "-"), "status": status(run)} for run in found]
    table = pd.DataFrame(rows)
    counts = table.groupby(["dataset", "status"]).size().unstack(fill_value=0)
    counts = counts.reindex(index=table["dataset"].unique(), columns=list(STATUSES), fill_value=0)
    counts.insert(0, "runs", counts.sum(axis=1))
    counts.loc["total"] = counts.sum()
    todo = [row["config"] for row in rows if row["status"] in TO_RUN] if finetuning else None
    older = [
        row["config"]
        for row in rows
        if finetuning
        and row["status"] in ("finished", "diverged")
        and runs.lacks(runs.read_params(row["config"].folder()))
    ]
    return {
        "counts": counts,
        "estimate": None if todo is None else estimate(todo, timing_steps),
        "older": older_line(older, timing_steps),
    }


def older_line(older: list[Config], timing_steps: int = 3) -> str:
    """What a sweep does with its runs written by an older version (``older``, kept as finished), in one line.

    "" if none. They are upgraded in place where their records suffice (``runs.upgradable``) or kept as they are, and
    ``--retrain-older`` would train them again, for the device-hours that ``estimate`` gives them."""
    if not older:
        return ""
    upgraded = sum(runs.upgradable(runs.read_params(config.folder())) for config in older)
    hours = estimate(older, timing_steps)["hours"]
    cost = f"{_hours(hours.sum())} device-hours" if hours.notna().all() else "device-hours unknown here"
    return (
        f"{len(older)} run{'s' if len(older) > 1 else ''} of an older version: {upgraded} upgraded in place, "
        f"{len(older) - upgraded} kept as they are; --retrain-older would train them again: {cost}"
    )


def status(run, config: Config | None = None) -> str:
    """One of ``STATUSES`` for a run of a sweep (``sweep.Run``; ``config``: a finetuning run's, module docstring)."""
    metrics = runs.finished(config) if config is not None else None
    if metrics is not None:
        return metrics["status"]  # finished or diverged (``runs.read_metrics``)
    if config is None and run.finished:
        return "finished"
    return "failed" if run.error_file.is_file() else "missing"


def estimate(todo: list[Config], timing_steps: int = 3) -> pd.DataFrame:
    """A row per distinct step (``step_key``) of the runs ``todo``, with its hours.

    Columns: its key's fields, ``runs``, ``steps``, ``images`` (steps x batch size), ``images_per_second``, ``hours``
    and ``source``."""
    recorded = recorded_rates()
    groups: dict[tuple, list[Config]] = {}
    for config in todo:
        groups.setdefault(step_key(config.parameters()), []).append(config)
    rows = []
    for group in groups.values():
        first = group[0]
        rate, source = images_per_second(first, recorded, timing_steps)
        images = sum(config.steps * config.batch_size for config in group)
        rows.append(
            {name: getattr(first, name) for name in SHOWN}
            | {"method": first.method.label()}
            | {"precision": first.step.precision, "component": first.component, "runs": len(group)}
            | {"steps": sum(config.steps for config in group), "images": images, "images_per_second": rate}
            | {"hours": images / rate / 3600, "source": source}
        )
    return pd.DataFrame(rows)


def step_key(record: dict) -> tuple:
    """What a step's speed depends on (``STEP_KEY``, and the kind of device), from a run's parameters.

    ``Run.parameters``, or the ``params.json`` it recorded (a field it lacks: None, the key of no run asked for)."""
    return tuple(record.get(name) for name in STEP_KEY) + (torch.device(record["device"]).type,)


def recorded_rates() -> dict[tuple, list[tuple[float, str]]]:
    """The (images/s, device name) that finished runs recorded, by ``step_key``.

    Every finished run under the results root, read from its ``metrics.json``."""
    found: dict[tuple, list[tuple[float, str]]] = {}
    for params_file in runs.finetune_root().rglob(runs.PARAMS):
        params = storage.json_or_none(params_file)
        metrics = storage.json_or_none(params_file.parent / runs.METRICS) if params is not None else None
        if metrics and metrics.get("status") == "finished" and metrics.get("images_per_second"):
            rate = (float(metrics["images_per_second"]), str(metrics.get("device")))
            found.setdefault(step_key(params), []).append(rate)
    return found


def images_per_second(config: Config, recorded: dict, timing_steps: int = 3) -> tuple[float, str]:
    """(images/s, where it came from) of ``config``'s step.

    The median that finished runs of the same step recorded on this machine's device (on any device of its kind, named,
    if this machine has none), else the step timed here (``time_step``); ``NaN`` if neither can be had."""
    here = _device_here(config.device)
    rates = [(rate, name) for rate, name in recorded.get(step_key(config.parameters()), []) if here in (None, name)]
    if rates:
        names = "" if here else f" on {', '.join(sorted({name for _, name in rates}))}"
        return statistics.median(rate for rate, _ in rates), f"recorded{names} (median of {len(rates)} runs)"
    if here is None:
        return math.nan, f"none: no {torch.device(config.device).type} device here, and no finished run to read"
    storage.notice(f"timing the {config.component} step of {config.model} at batch {config.batch_size} ...")
    try:
        return time_step(config, timing_steps), f"timed here ({timing_steps} steps)"
    except RuntimeError as error:  # out of memory, a kernel this device lacks: the other steps still count
        return math.nan, f"timing failed: {' '.join(str(error).split())[:120]}"


def _device_here(device: str) -> str | None:
    """The name a run on ``device`` records in its ``metrics.json``, if this machine has that device; else None.

    The name is "cpu" or the GPU's name."""
    device = torch.device(device)
    if device.type == "cpu":
        return "cpu"
    return torch.cuda.get_device_name(device) if device.type == "cuda" and torch.cuda.is_available() else None


def time_step(config: Config, timing_steps: int = 3) -> float:
    """Training images/s of ``config``'s step on its device.

    The step a run of ``config`` trains with (``train.step.build_step``: its model adapted, LoRA or equal-capacity
    subset included, its optimizer, step options, clipping and micro-batches), on the run's network with random weights
    and a 10-class head (``train.step.network``: at ``image_size`` if set) and a batch of random uint8 images at its
    resolution (``imagesets.random_images``), timed over ``timing_steps`` steps after its warm-up
    (``step.warmup_steps``: compilation)."""
    device = torch.device(config.device)
    model = network(config, 10, pretrained=False).to(device)
    size = config.image_size or model.patch_embed.img_size[0]
    loader = DeviceLoader(random_images(config.batch_size, size), config.batch_size, Transform(True, size), device)
    step = build_step(config, model)

    def steps(first: int, count: int) -> None:
        for index in range(first, first + count):
            step(*loader.batch(index))

    warmup = warmup_steps(config.checked_options)
    seconds = median_seconds({"step": (lambda: steps(warmup, timing_steps), lambda: steps(0, warmup))}, device)
    return config.batch_size * timing_steps / seconds["step"]


WHAT_IT_INCLUDES = (
    "hours = steps x batch size / img/s. img/s 'timed here': the training step alone (random weights, synthetic "
    "images); 'recorded': the finished runs' whole training loops.\nNot included: evaluation in timed steps "
    "(validation every eval_every steps, the final test), loading data and models, what a checkpoint saves a run "
    "that resumes."
)


def formatted(result: dict) -> str:
    """``plan``'s result as text: the counts, then the estimate and what it includes (or why there is none)."""
    counts = result["counts"].rename_axis(index=None, columns=None).to_string()
    counts += f"\n{result['older']}" if result.get("older") else ""
    table = result["estimate"]
    if table is None:
        return f"{counts}\n\nno estimate: estimates are for finetuning sweeps ({runs.NOTEBOOK})"
    if table.empty:
        return f"{counts}\n\nnothing to run: 0 device-hours"
    devices = sorted({device_name(torch.device(d)) if _device_here(d) else f"{d} (not here)" for d in table["device"]})
    shown = table.assign(
        steps=table["steps"].map("{:,}".format),
        images=table["images"].map("{:,}".format),
        images_per_second=table["images_per_second"].map(lambda rate: "-" if math.isnan(rate) else f"{rate:,.1f}"),
        hours=table["hours"].map(_hours),
    ).rename(columns={"images_per_second": "img/s"})
    varying = [name for name in (*SHOWN, "method") if table[name].nunique() > 1]
    columns = varying + ["precision", "component", "runs", "steps", "images", "img/s", "hours", "source"]
    return "\n".join(
        [
            counts,
            "",
            f"estimate of the {table['runs'].sum()} runs to run (failed + missing), on {'; '.join(devices)}",
            shown[columns].to_string(index=False),
            _total(table),
            WHAT_IT_INCLUDES,
        ]
    )


def _total(table: pd.DataFrame) -> str:
    """The estimate's total line: its hours (in days or minutes too), and the runs without an img/s."""
    hours, unknown = table["hours"].sum(), table.loc[table["hours"].isna(), "runs"].sum()
    if unknown == table["runs"].sum():
        return (
            "total: unknown (no img/s for any run): run --plan on the machine that will run the sweep; "
            "the README gives the paper grid's H100-hours per precision"
        )
    total = f"total: {_hours(hours)} device-hours"
    total += f" ({hours / 24:,.1f} days on one device)" if hours >= 24 else f" ({hours * 60:.3g} min)"
    return total + (f", not counting {unknown} runs without an img/s" if unknown else "")


def _hours(hours: float) -> str:
    """Hours as a table shows them: 1,234.5, 12.3, 0.0123, or "-" for none."""
    return "-" if math.isnan(hours) else f"{hours:,.1f}" if hours >= 10 else f"{hours:.3g}"
