"""Every table of a sweep's runs at once, as notebook 07 shows them (or of the paper's Table 6); the ``stats`` command.

``summary`` gives Table 6 (``tables``) and the tests across benchmarks (``component_tests.comparisons``) for the
runs of one setting, ``paper_summary`` the same of the paper's Table 6; ``python -m paperlib stats SPEC`` prints them
(``main``).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from paperlib.analysis.component_tests import comparisons, formatted_pairs, paper_order, plasticity_for
from paperlib.analysis.tables import PAPER_TABLE6, formatted, grid_spread, table6, with_probing
from paperlib.records import cli, commands, paths, runs_table, specs, storage


def summary(
    runs: pd.DataFrame,
    select: str = "test",
    reference: str | None = None,
    probing: pd.DataFrame | None = None,
    pairwise_alternative: str = "two-sided",
) -> dict[str, pd.DataFrame]:
    """Notebook 07's tables for the runs of one setting.

    ``table6`` (with the linear-probing column ``probing``, when given: ``with_probing``) and its ``comparisons``, with
    P(f) from ``plasticity_for``, the spread of each component over the grid (``grid_spread``) and every pair tested
    with ``pairwise_alternative``."""
    accuracy_table = table6(runs, select=select)
    if probing is not None:
        accuracy_table = with_probing(accuracy_table, probing)
    measured, source = plasticity_for(runs, reference)
    return {
        "table6": accuracy_table,
        **comparisons(
            accuracy_table, measured, source, grid_spread(runs), "spread over the grid", pairwise_alternative
        ),
    }


def paper_summary(pairwise_alternative: str = "two-sided") -> dict[str, pd.DataFrame]:
    """The tables of ``summary`` computed on the paper's own Table 6 (``PAPER_TABLE6``).

    With the paper's ranking in place of P(f) (``paper_order``) and its standard deviation over seeds as the spread."""
    paper = pd.read_csv(PAPER_TABLE6, comment="#")
    order = paper_order(sorted(paper["dataset"].unique()))
    return {"table6": paper, **comparisons(paper, order, "paper", paper, "std over seeds", pairwise_alternative)}


def main(argv: list[str] | None = None) -> int:
    """``python -m paperlib stats SPEC [--select val] [--accuracy exact] [--csv DIR]``: ``summary``'s tables printed.

    What it prints: ``records.commands.stats``' description."""
    args = commands.stats().parse_args(argv)
    try:
        spec = specs.load_spec(args.spec)
        found, missing = runs_table.for_spec(spec, accuracy=args.accuracy)
        runs_table.at_least_one(found, args.spec, missing)
        several = found["precision"].nunique() > 1
        if several:  # a precision check (precision_check.main): here, the paper's tables of its fp32 runs
            found = found[found["precision"] == "fp32"]
        tables = summary(found, args.select, args.reference)
        if args.csv:  # before anything is printed: a refused folder is the one line the command prints
            write_csv(tables, args.csv, indexed=("takeaway2",), overwrite=args.overwrite)
    except cli.BAD_INPUT as error:
        return cli.fail(error)
    counts = ", ".join(f"{n} {s}" for s, n in found["status"].value_counts().items())
    why = missing["reason"].str.split(":").str[0].value_counts()
    why = f" ({', '.join(f'{n} {reason}' for reason, n in why.items())})" if len(missing) else ""
    print(f"{len(found)} {'fp32 ' if several else ''}runs of {args.spec}: {counts}; {len(missing)} missing{why}")
    differ = missing[missing["reason"] != "no run"]
    if len(differ):  # folders that hold a run of other parameters than the spec's: not counted as its runs
        print(differ[["dataset", "component", "lr", "seed", "reason"]].to_string(index=False))
    print()
    if tables["table1"].empty:
        print("Table 1 needs finished MHA runs: none yet (the other tables are of the runs there are)\n")
    shown = {
        "Table 6: test accuracy (%) at the best learning rate": formatted(tables["table6"]),
        "Table 1: MHA against each component (Wilcoxon; p_holm: Holm over the four)": tables["table1"].round(4),
        "Every pair of components (difference, Holm-adjusted p over the pairs)": formatted_pairs(tables["pairwise"]),
        "Takeaway 2: Kendall's tau of P(f) with the result, per dataset": tables["accuracy_tau"].round(3),
        "Takeaway 2 across datasets (Wilcoxon of the taus against 0)": tables["takeaway2"].round(3),
    }
    for title, table in shown.items():
        print(f"{title}\n{table.to_string()}\n")
    if several:
        print(f"several precisions: their effect on these results is python -m paperlib precision {args.spec}\n")
    if (found["method"] == "subset").any():
        print("equal-capacity runs: their LN2 and LN1 are the ordinary runs; notebook 10 compares the two designs\n")
    if args.csv:
        print(f"tables written to {paths.display(args.csv)}")
    return 0


def write_csv(
    tables: dict[str, pd.DataFrame], folder: str | Path, indexed: tuple[str, ...] = (), overwrite: bool = False
) -> None:
    """Each table as ``<folder>/<name>.csv``, atomically, with its index for the ``indexed`` ones.

    Nothing is written if ``folder`` is a file (NotADirectoryError) or already holds one of the tables and not
    ``overwrite`` (FileExistsError, saying how to replace them); a disk that refuses them is a ``CannotWrite``."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise NotADirectoryError(f"--csv takes a folder for the tables; {paths.display(folder)} is a file")
    there = [f"{name}.csv" for name in tables if (folder / f"{name}.csv").exists()]
    if there and not overwrite:
        raise FileExistsError(
            f"{paths.display(folder)} already holds {', '.join(there)}; pass --overwrite to replace them"
        )
    storage.make_folder(folder)
    for name, table in tables.items():
        storage.atomic_write(
            folder / f"{name}.csv", lambda tmp, table=table, index=name in indexed: table.to_csv(tmp, index=index)
        )
