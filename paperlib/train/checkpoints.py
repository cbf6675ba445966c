"""A finetuning run's files while it trains and when it ends: its checkpoint (saved, resumed), its record, its model.

The record is its history, its kept weights and, last, its metrics; ``load_model`` rebuilds the model of its weights.

``finetune``'s loop writes them; what a run is and where it lives is ``records.runs``.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pandas as pd
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from paperlib.records import paths, readings, runs, storage
from paperlib.records.runs import CHECKPOINT, HISTORY, HISTORY_COLUMNS, METRICS, PARAMS, WEIGHTS
from paperlib.train.config import Config
from paperlib.train.step import adapt, network
from paperlib.vit import methods

CHECKPOINT_KEYS = ("params", "step", "history", "best", "seen", "cache_side", "model", "optimizer", "schedule")
"""What a checkpoint holds (``finetune``'s loop writes it), besides the random-number states (``rng``)."""


def save_checkpoint(folder: Path, device: torch.device, state: dict, step_fn, schedule) -> None:
    """Write the checkpoint (``checkpoint.pt``) of the run in ``folder`` where it is, atomically, for ``resume``.

    ``state`` holds its step, history, best, trainable weights...; saved with its optimizer (``step_fn``'s), schedule
    and random generators (``device``'s too on CUDA). A run killed while writing keeps the last one. It holds tensors
    and plain types only (random-number states as tensors), so that it loads with ``weights_only=True``."""
    rng = {"cpu": torch.get_rng_state(), "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None}
    state = state | {"rng": rng, "optimizer": step_fn.optimizer.state_dict(), "schedule": schedule.state_dict()}
    storage.atomic_write(folder / CHECKPOINT, lambda tmp: torch.save(state, tmp))


def resume(folder: Path, device: torch.device, made: tuple, model: nn.Module, step_fn, schedule) -> tuple:
    """(first step, history rows, best checkpoint, what it saw) of the run in ``folder``: its last checkpoint's, or 0.

    ``made``: (the run's record, its decoded cache's side), what a checkpoint must have been taken with
    (``load_checkpoint``). From a checkpoint, the model, optimizer (``step_fn``'s), ``schedule`` and random generators
    are restored."""
    saved = load_checkpoint(folder, *made, device)
    if saved is None:
        return 0, [], {"val_accuracy": 0.0, "step": None, "state": None}, []  # the authors' starting best
    model.load_state_dict(saved["model"], strict=False)
    step_fn.optimizer.load_state_dict(saved["optimizer"])
    schedule.load_state_dict(saved["schedule"])
    # what draws from torch's generators during training (LoRA's dropout) goes on where it stopped
    if "rng" in saved:
        torch.set_rng_state(saved["rng"]["cpu"])
        if device.type == "cuda" and saved["rng"].get("cuda") is not None:
            torch.cuda.set_rng_state(saved["rng"]["cuda"], device)
    step_fn.loaded()
    return saved["step"], saved["history"], saved["best"], saved["seen"]


def load_checkpoint(folder: Path, params: dict, side: int, device: torch.device) -> dict | None:
    """The checkpoint of the run in ``folder``, if there is one it can resume from; None otherwise.

    One it can resume from is of this run (its record ``params``, ``OUTPUT_ONLY`` fields aside), taken on the
    images it resumes on (a decoded cache
    of ``side`` pixels); with None the run starts from the beginning. It is read with ``weights_only=True``: tensors
    and plain types, never code. One that cannot be read (truncated, damaged, or holding anything else) is reported
    as a warning and not resumed from."""
    checkpoint = folder / CHECKPOINT
    if not checkpoint.is_file():
        return None
    try:
        saved = torch.load(checkpoint, map_location=device, weights_only=True)
        if not isinstance(saved, dict) or "params" not in saved:
            raise ValueError("no params")
    except Exception as error:  # whatever torch.load raises for a damaged file (zip, pickle, EOF, type errors)
        reason = str(error).strip().splitlines()[0][:200] if str(error).strip() else type(error).__name__
        warnings.warn(f"{paths.display(checkpoint)} cannot be read ({reason}): the run starts from the beginning")
        return None
    if runs.differing(saved["params"], params) or saved.get("cache_side") != side:
        return None  # another run's, or this one's written by an earlier version: it starts from the beginning
    if runs.versions(saved["params"]) != runs.versions(params):  # what it saw is held as another version held it
        warnings.warn(f"{paths.display(checkpoint)} was written by an older version: the run starts from the beginning")
        return None
    lacking = [key for key in CHECKPOINT_KEYS if key not in saved]
    if lacking:
        warnings.warn(f"{paths.display(checkpoint)} holds no {', '.join(lacking)}: the run starts from the beginning")
        return None
    return saved


def record(folder: Path, rows: list[dict], outcomes: readings.Outcomes, weights: tuple, metrics: dict) -> None:
    """Record the run in ``folder`` that ended: its history, what it saw, its weights if kept, and its metrics last.

    The history is ``rows``; what it saw, ``outcomes`` (``readings.OUTCOMES``). ``weights``: (the trainable parameters
    of its best checkpoint, or None if not kept; that checkpoint's step); ``metrics["weights"]`` names the file, or
    None. The metrics last: the run is finished (``metrics["files"]``: the size and checksum of each file written
    before, so that a damaged one is not taken as finished). Its checkpoint is then removed. Each file is written
    atomically."""
    table = pd.DataFrame(rows, columns=HISTORY_COLUMNS)
    files = {HISTORY: storage.write_checked(folder / HISTORY, lambda tmp: table.to_csv(tmp, index=False))}
    files[readings.OUTCOMES] = readings.write(folder / readings.OUTCOMES, outcomes)
    state, step = weights
    metrics["weights"] = WEIGHTS if state is not None else None
    if state is not None:
        tensors = {name: tensor.detach().to("cpu").contiguous() for name, tensor in state.items()}
        files[WEIGHTS] = storage.write_checked(
            folder / WEIGHTS, lambda tmp: save_file(tensors, tmp, metadata={"step": str(step)})
        )
    else:  # weights of an earlier training of this run would not be this training's
        (folder / WEIGHTS).unlink(missing_ok=True)
    metrics["files"] = files
    storage.write_json(folder / METRICS, metrics)
    (folder / CHECKPOINT).unlink(missing_ok=True)


def load_model(config: Config, merge: bool = True) -> nn.Module:
    """The model a finished run with ``save_weights=True`` finetuned, at its best-validation checkpoint.

    In eval mode: the pretrained model with the run's new head, and the parameters the run trained (component, head,
    final norm; or its LoRA updates or subset) as it kept them. A LoRA or equal-capacity run's updates are merged into a
    plain timm ViT (``lora.merge``, ``equal_capacity.merge``) unless ``merge=False``. Its ``pretrained_cfg`` records the
    normalisation the run used. Save it as your own model with ``models.save_model(model, "custom/<name>")``."""
    folder = config.folder()
    weights = folder / WEIGHTS
    if not (folder / METRICS).is_file() or not weights.is_file():
        raise FileNotFoundError(
            f"no finetuned weights in {paths.display(folder)}: run it with save_weights=True "
            "(Config(save_weights=True), -p save_weights True, --save-weights true)"
        )
    differ = runs.differing(storage.read_json(folder / PARAMS), runs.run_record(config), how_it_ran=False)
    if differ:
        raise ValueError(
            f"the run in {paths.display(folder)} differs from this configuration in {', '.join(differ)} "
            "(fingerprints: a custom model or dataset changed since): run this configuration to finetune it"
        )
    metrics = storage.read_json(folder / METRICS, whole=True)  # the weights checked against their checksum
    model = adapt(network(config, metrics["num_classes"]), config)
    state = load_file(str(weights))
    unexpected = sorted(set(state) - {name for name, _ in model.named_parameters()})
    if unexpected:
        raise ValueError(
            f"{paths.display(weights)} holds parameters this model does not have: {', '.join(unexpected[:5])}"
        )
    model.load_state_dict(state, strict=False)
    if merge:
        model = methods.trainer_of(config.method).merge(model)
    if metrics.get("mean") is not None:  # the statistics it was finetuned with, which save_model then records
        model.pretrained_cfg = {**model.pretrained_cfg, "mean": tuple(metrics["mean"]), "std": tuple(metrics["std"])}
    return model.eval()
