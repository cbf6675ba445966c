"""Finetuning runs as tables (paper §5.2): every run under a results root, histories, what is missing.

``load()`` reads ``results/finetune/<model>/<dataset>/<config>/lr=<lr>/seed=<seed>[-<precision>][-<optimizer>...][-lora-r<rank>...][-norm-model][+<tag>]/``
folders written by ``paperlib.finetune``. Every folder with a ``params.json`` is a row: ``finished`` and
``diverged`` runs carry their metrics; a run without ``metrics.json`` is ``partial`` (interrupted
or still running). ``missing(runs, spec)`` lists the runs a sweep spec expects and that have no
folder at all. Nothing is dropped silently.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from . import paths

RUN_COLUMNS = [
    "model", "dataset", "config", "lr", "seed", "precision", "optimizer", "weight_decay", "lora_rank", "lora_alpha", "lora_dropout", "normalize", "tag", "status", "best_val_accuracy", "best_step",
    "test_accuracy", "trainable_parameters", "wall_seconds", "images_per_second", "folder",
]
KEYS = ["model", "dataset", "config", "lr", "seed", "precision", "optimizer", "weight_decay", "lora_rank", "lora_alpha", "lora_dropout", "normalize", "tag"]
DEFAULTS = {"precision": "autocast", "optimizer": "sgd", "weight_decay": 0.0, "lora_rank": 0, "lora_alpha": 0.0, "lora_dropout": 0.0, "normalize": "imagenet", "tag": ""}
"""The value of a key for runs (and specs) written before it existed."""


def finetune_root(root: str | Path | None = None) -> Path:
    """``results/finetune`` (or ``<root>/finetune``)."""
    return (Path(root) if root is not None else paths.results_dir()) / "finetune"


def load(root: str | Path | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(runs, histories): one row per run folder, and every run's history with its keys."""
    runs, histories = [], []
    for params_file in sorted(finetune_root(root).rglob("params.json")):
        folder = params_file.parent
        params = json.loads(params_file.read_text())
        keys = {key: params.get(key, DEFAULTS.get(key)) for key in KEYS}
        row = keys | {"folder": str(folder)}
        metrics_file = folder / "metrics.json"
        if metrics_file.is_file():
            row |= json.loads(metrics_file.read_text())
        else:
            row["status"] = "partial"
        runs.append(row)
        history_file = folder / "history.csv"
        if history_file.is_file():
            history = pd.read_csv(history_file)
            for key, value in keys.items():
                history[key] = value
            histories.append(history)
    table = pd.DataFrame(runs).reindex(columns=RUN_COLUMNS)
    history = pd.concat(histories, ignore_index=True) if histories else pd.DataFrame(columns=KEYS + ["step"])
    return table, history


def spec_configs(spec: dict) -> list:
    """Each run of a finetuning sweep spec (``sweep.expand``: its fixed parameters and its grid's)
    as the ``finetune.Config`` that notebook 05 makes of them: its names mapped to Config's
    (``component`` -> ``config``...), values typed by Config's defaults (YAML reads ``1e-2`` as a string)."""
    from . import cli
    from .finetune import NOTEBOOK_NAMES, Config
    from .sweep import expand

    defaults = {name: field.default for name, field in Config.__dataclass_fields__.items()}
    configs = []
    for spec_run in expand(spec):
        values = {NOTEBOOK_NAMES.get(key, key): value for key, value in spec_run.parameters.items()}
        configs.append(Config(**{key: value if key == "compile" else cli.coerce(key, value, defaults[key])
                                 for key, value in values.items() if key in defaults}))
    return configs


def expected(spec: dict) -> pd.DataFrame:
    """The runs a finetuning sweep spec asks for (``KEYS``)."""
    return pd.DataFrame([{key: getattr(config, key) for key in KEYS} for config in spec_configs(spec)], columns=KEYS)


def missing(runs: pd.DataFrame, spec: dict) -> pd.DataFrame:
    """Runs expected by ``spec`` that have no folder under the results root."""
    wanted = expected(spec)
    have = runs[KEYS].astype({"lr": float, "seed": int, "weight_decay": float, "lora_rank": int, "lora_alpha": float, "lora_dropout": float}) if len(runs) else pd.DataFrame(columns=KEYS)
    merged = wanted.merge(have, on=KEYS, how="left", indicator=True)
    return merged.loc[merged["_merge"] == "left_only", KEYS].reset_index(drop=True)


def ensure(spec: dict, progress: bool = False) -> None:
    """Run, in this process, every run of a finetuning spec not finished with the spec's parameters.

    For demo-scale specs; paper-scale sweeps go through ``python -m paperlib.sweep``.
    """
    from .finetune import run

    for config in spec_configs(spec):  # each run's own parameters: the fixed ones and its grid's (precision, steps...)
        run(config, progress=progress)
