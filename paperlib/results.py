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


def plasticity_for(runs: pd.DataFrame, reference: str | None = None) -> tuple[pd.DataFrame, str]:
    """P(f) of the runs' model on their datasets, measured on images normalised as the runs' were
    (``plasticity.collect``: the paper's pairs, against ``reference``, None: each dataset's default),
    and where it comes from: ``"measured"``, or, where none is saved, ``"paper"``: the ranking the
    paper finds on every benchmark (``stats.paper_order``), which uses the order only, as the
    Takeaway 2 test does. ``runs``: one model and normalisation (a ValueError otherwise)."""
    from . import plasticity, stats

    for key in ("model", "normalize"):
        if runs[key].nunique() != 1:
            raise ValueError(f"plasticity_for needs the runs of one {key}, got {', '.join(map(str, sorted(runs[key].unique())))}")
    model, normalize = runs["model"].iloc[0], runs["normalize"].iloc[0]
    datasets = sorted(runs["dataset"].unique())
    measured = plasticity.collect(normalize=normalize, reference=reference or "default")
    measured = measured[(measured["model"] == model) & measured["dataset"].isin(datasets)]
    if measured.empty:
        return stats.paper_order(datasets).assign(model=model), "paper"
    return measured, "measured"


def summary(runs: pd.DataFrame, select: str = "test", reference: str | None = None) -> dict[str, pd.DataFrame]:
    """Notebook 07's tables for the runs of one setting: ``table6``, ``table1`` (with Holm),
    ``pairwise``, and the Takeaway 2 test: ``accuracy_tau`` and ``spread_tau`` (per dataset) and
    ``takeaway2`` (their summaries), with P(f) from ``plasticity_for`` (its source in
    ``takeaway2``'s ``plasticity`` column)."""
    from . import stats

    table6 = stats.table6(runs, select=select)
    accuracies = table6.rename(columns={"mean": "accuracy"})
    measured, source = plasticity_for(runs, reference)
    accuracy_tau = stats.plasticity_correlation(measured, accuracies)
    spread_tau = stats.plasticity_correlation(measured, stats.grid_spread(runs), value="std")
    takeaway2 = pd.DataFrame.from_dict({"accuracy": stats.correlation_summary(accuracy_tau), "spread over the grid": stats.correlation_summary(spread_tau)},
                                       orient="index").rename_axis("Kendall's tau of P(f) with").assign(plasticity=source)
    return {"table6": table6, "table1": stats.table1(accuracies), "pairwise": stats.pairwise(accuracies),
            "accuracy_tau": accuracy_tau, "spread_tau": spread_tau, "takeaway2": takeaway2}


def main(argv: list[str] | None = None) -> int:
    """``python -m paperlib.results SPEC [--select val] [--reference R] [--csv DIR]``: notebook 07's
    tables for a finetuning sweep's runs, without the notebook: what is finished and missing, Table 6,
    Table 1 with Holm's adjustment, every pair of components, and the Takeaway 2 test."""
    import argparse
    import sys

    from . import stats, sweep

    parser = argparse.ArgumentParser(prog="python -m paperlib.results", description=main.__doc__.split(":", 1)[1].strip())
    parser.add_argument("spec", help="a finetuning sweep spec, e.g. parameters/sweeps/finetune_paper.yaml")
    parser.add_argument("--select", default="test", choices=stats.SELECTIONS, help="pick each learning rate by test (the paper) or val accuracy")
    parser.add_argument("--reference", default=None, help="reference images of the P(f) to read (default: each dataset's default)")
    parser.add_argument("--csv", default=None, metavar="DIR", help="also write each table as DIR/<table>.csv")
    args = parser.parse_args(argv)
    try:
        spec = sweep.load_spec(args.spec)
        runs, _ = load()
        runs = runs.merge(expected(spec), on=KEYS)
        if runs.empty:
            raise ValueError(f"no run of {args.spec} under {paths.display(finetune_root())}")
        tables = summary(runs, args.select, args.reference)
    except (ValueError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    counts = ", ".join(f"{n} {s}" for s, n in runs["status"].value_counts().items())
    print(f"{len(runs)} runs of {args.spec}: {counts}; {len(missing(runs, spec))} missing\n")
    shown = {"Table 6: test accuracy (%) at the best learning rate": stats.formatted(tables["table6"]),
             "Table 1: MHA against each component (Wilcoxon; p_holm: Holm over the four)": tables["table1"].round(4),
             "Every pair of components (difference, Holm-adjusted p over the pairs)": stats.formatted_pairs(tables["pairwise"]),
             "Takeaway 2: Kendall's tau of P(f) with the result, per dataset": tables["accuracy_tau"].round(3),
             "Takeaway 2 across datasets (Wilcoxon of the taus against 0)": tables["takeaway2"].round(3)}
    for title, table in shown.items():
        print(f"{title}\n{table.to_string()}\n")
    if args.csv:
        folder = Path(args.csv)
        folder.mkdir(parents=True, exist_ok=True)
        for name, table in tables.items():
            paths.atomic_write(folder / f"{name}.csv", lambda tmp, table=table, index=name == "takeaway2": table.to_csv(tmp, index=index))
        print(f"tables written to {paths.display(folder)}")
    return 0


if __name__ == "__main__":  # the package's module, not this __main__ copy of it
    from paperlib.results import main as _main

    raise SystemExit(_main())
