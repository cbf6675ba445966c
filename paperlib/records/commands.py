"""Every command's command line, built without the training stack.

``python -m paperlib <command>`` (``paperlib/__main__.py``) parses a command line with its parser here (``PARSERS``)
before it imports the command's module, which may import torch or scipy: ``--help`` and a mistyped option answer at
once. The module's ``main`` parses it again with the same parser and runs.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from paperlib.records import cli, measurements, paths, runs
from paperlib.records.names import ACCURACIES, SELECTIONS
from paperlib.records.step_options import PRECISIONS

FINETUNE = runs.Run.defaults() | {"speed": "auto", "wait": True}
"""``finetune``'s parameters and their defaults: a run's fields (notebook 05's parameters), a speed preset, and
whether to wait for a run another process is training."""

FINETUNE_HELP = {
    "speed": "a preset of step options, the same step to rounding: auto, none, a file of parameters/speed/ "
    "(e.g. h100); it sets the step options not given",
    "wait": "wait for a run another process is training (false: say it runs elsewhere and exit with status 75)",
}
"""``--help``'s meaning of ``finetune``'s options that are not a run's fields (theirs: ``cli.field_comments``)."""


def finetune() -> argparse.ArgumentParser:
    """The command line of ``python -m paperlib finetune`` (``train.finetune.main``)."""
    meanings = runs.Run.comments() | FINETUNE_HELP
    description = "One finetuning run (paper §5.2); notebook 05's parameters."
    return cli.parameters_parser(FINETUNE, description, "python -m paperlib finetune", meanings)


MEASURING = {"batch_size": 64, "device": "cpu", "data_root": None, "progress": True, "num_workers": 0}
"""``plasticity``'s options that are ``measure.plasticity.run``'s, not a measurement's fields, with its defaults
(``num_workers``: run's None, automatic, unless given; typed as the number a command line gives)."""

PLASTICITY = cli.field_defaults(measurements.Measurement) | MEASURING
"""``plasticity``'s parameters and their defaults: a measurement's fields (notebook 02's parameters) and
``MEASURING``."""

PLASTICITY_HELP = {
    "batch_size": "pairs per batch",
    "device": "cpu, cuda or cuda:<index>: a device this machine has",
    "data_root": "data folder (None: $VIT_PLASTICITY_DATA or data/)",
    "progress": "show a progress bar over the pairs",
    "num_workers": "DataLoader workers decoding images; not given: up to 8 on CUDA, 0 (the main process) on a CPU",
}
"""``--help``'s meaning of ``MEASURING`` (a measurement's fields': ``cli.field_comments``)."""


def plasticity() -> argparse.ArgumentParser:
    """The command line of ``python -m paperlib plasticity`` (``measure.plasticity.main``)."""
    meanings = cli.field_comments(measurements.Measurement) | PLASTICITY_HELP
    description = "Plasticity of every component (paper §5.1); notebook 02's parameters."
    return cli.parameters_parser(PLASTICITY, description, "python -m paperlib plasticity", meanings)


EXECUTORS = ("local", "gpus", "slurm", "submitit-local")
"""Where a sweep's runs execute (``sweeps.sweep.run_sweep``)."""

SWEEP = """\
Run a notebook once per cell of a parameter grid with papermill: every run checked before the first one starts,
finished runs skipped when the sweep is started again, a failed run leaving the others to go on.

A spec is a YAML file with these keys:
  notebook    the notebook to run, e.g. notebooks/05_finetune.ipynb
  parameters  the parameters every run shares, named as in the notebook's
              parameters cell
  grid        a list of values per parameter: one run per combination, in
              the order written (or a list of such grids, one after the
              other); a parameter is fixed or in the grid, not both
  name        optional: each run's name, a template of its parameters, e.g.
              "{dataset}/{component}/lr={lr}"; default: the grid's values
              joined by /
  slurm       optional: submitit's settings for --executor slurm, e.g.
              timeout_min, gpus_per_node

parameters/sweeps/ holds the paper's specs and the demo's.

Outputs, per run, in reports/<notebook>/:
  <name>.ipynb       the executed notebook (--html: .html, .nocode.html too)
  <name>.done.json   written last, when the run finished
  <name>.error.txt   a failed run's error

The notebooks save their results in results/: finetuning runs in finetune/, P(f) in plasticity/, linear probes in
probe/. reports/index.html lists the reports, rewritten at the end. reports/ is $VIT_PLASTICITY_REPORTS when set,
results/ $VIT_PLASTICITY_RESULTS and data/ $VIT_PLASTICITY_DATA.

Several sweeps of one spec share its runs, each run executed once. VIT_PLASTICITY_WORKERS=N says that N processes
of ours share this machine's CPU cores, so that each run takes its share of the threads: set it for each of N
sweeps started by hand on one machine (--executor gpus and submitit-local set it for their workers)."""
"""``sweep``'s ``--help`` above its options: what a sweep does, its spec's keys, its outputs and its variables."""


def sweep() -> argparse.ArgumentParser:
    """The command line of ``python -m paperlib sweep`` (``sweeps.sweep.main``)."""
    parser = argparse.ArgumentParser(prog="python -m paperlib sweep", description=SWEEP, formatter_class=cli.Help)
    parser.add_argument("spec", type=Path, help="sweep spec (YAML), e.g. parameters/sweeps/plasticity_demo.yaml")
    parser.add_argument(
        "--executor",
        default="local",
        choices=EXECUTORS,
        help="local: one run after another, here; gpus: a process per GPU here; slurm: a SLURM job per run "
        "(submitit; needs sbatch on PATH); submitit-local: submitit's jobs, every run at once here",
    )
    parser.add_argument(
        "--gpus", default=None, help="GPU ids for --executor gpus, e.g. 0,1; default: every visible GPU"
    )
    parser.add_argument(
        "--html",
        action="store_true",
        help="render each run's reports (.html, .nocode.html) beside its executed notebook; default: the notebook only",
    )
    parser.add_argument(
        "--reports",
        action="store_true",
        help="execute finished runs that have no report of their parameters too (a run made outside a sweep, by a "
        "notebook or a command, has none), to write it; default: finished runs are skipped",
    )
    parser.add_argument("--dry-run", action="store_true", help="list the runs and whether they are finished")
    parser.add_argument(
        "--retrain-older",
        action="store_true",
        help="train again the finetuning runs written by an older version of the package (--plan counts them and "
        "their device-hours); each result is replaced only once its new run is whole; default: they are kept and "
        "read as they are",
    )
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


def report() -> argparse.ArgumentParser:
    """The command line of ``python -m paperlib report`` (``reports.execute.main``): ``demo`` and ``inplace``."""
    parser = argparse.ArgumentParser(
        prog="python -m paperlib report",
        description="Notebooks executed with papermill and rendered as HTML reports.",
        formatter_class=cli.Help,
    )
    commands = parser.add_subparsers(dest="command", required=True)
    what = "execute notebooks at demo scale and render HTML reports, with an index page"
    demo = commands.add_parser("demo", help=what, description=what, formatter_class=cli.Help)
    names = ", ".join(notebook.stem for notebook in paths.notebook_paths())
    demo.add_argument(
        "-n",
        "--notebook",
        action="append",
        help=f"a notebook to run, by name (repeatable): {names}; default: every notebook",
    )
    demo.add_argument("--out", type=Path, help="report folder; default: $VIT_PLASTICITY_REPORTS if set, else reports/")
    what = "re-execute committed notebooks in place (nbclient), keeping their cells and metadata"
    inplace = commands.add_parser("inplace", help=what, description=what, formatter_class=cli.Help)
    inplace.add_argument("notebooks", nargs="+", type=Path, help="notebook files, e.g. notebooks/00_components.ipynb")
    return parser


def demo() -> argparse.ArgumentParser:
    """The command line of ``python -m paperlib demo`` (``train.demo.main``): ``pretrain``, ``evaluate``, ``runs``."""
    parser = argparse.ArgumentParser(
        prog="python -m paperlib demo",
        description="The demo ViT: pretraining on digits_source and its evaluation; the demo world's runs.",
        formatter_class=cli.Help,
    )
    commands = parser.add_subparsers(dest="command", required=True)
    committed = f"the committed weights, {paths.display(paths.DEMO_WEIGHTS)}"
    what = "pretrain the demo ViT on digits_source and save its weights, with a JSON card beside them"
    train = commands.add_parser("pretrain", help=what, description=what, formatter_class=cli.Help)
    train.add_argument(
        "--out",
        type=Path,
        default=paths.DEMO_WEIGHTS,
        help=f"weight file to write (safetensors); default: {committed}",
    )
    train.add_argument(
        "--epochs",
        type=int,
        default=None,
        help="passes over digits_source's trainval split; default: the recipe's, which made the committed weights",
    )
    train.add_argument(
        "--overwrite",
        action="store_true",
        help="replace weights at --out that differ from these (pretraining on another CPU or with other library "
        "versions rounds otherwise); without it, they are left as they are and both SHA-256 and test accuracies said",
    )
    what = "accuracy of demo weights on digits_source's trainval and test splits"
    evaluate = commands.add_parser("evaluate", help=what, description=what, formatter_class=cli.Help)
    evaluate.add_argument(
        "--weights",
        type=Path,
        default=paths.DEMO_WEIGHTS,
        help=f"weight file to read (safetensors); default: {committed}",
    )
    what = (
        "the demo world's runs and probes that the notebooks read, those missing made in one pool of processes (what "
        "make demo makes before the notebooks that read them)"
    )
    commands.add_parser("runs", help=what, description=what, formatter_class=cli.Help)
    return parser


def tables(prog: str, description: str, spec: str) -> argparse.ArgumentParser:
    """The command line that ``stats`` and ``precision`` share (each adds its own options).

    They print the tables of a finetuning sweep spec's runs (``spec``: what the spec is, e.g. its file), Table 6
    picking each learning rate by one of ``SELECTIONS``, the runs' accuracies read as one of ``ACCURACIES``, and write
    them as CSV files if asked (replacing none unless ``--overwrite``)."""
    parser = argparse.ArgumentParser(prog=prog, description=description, formatter_class=cli.Help)
    parser.add_argument("spec", type=Path, help=spec)
    parser.add_argument(
        "--select",
        default="test",
        choices=SELECTIONS,
        help="how Table 6 picks each learning rate: by test (the paper) or val accuracy",
    )
    parser.add_argument(
        "--accuracy",
        default=ACCURACIES[0],
        choices=ACCURACIES,
        help="the runs' accuracies as the authors' evaluation computes them (the mean of per-batch accuracies) or "
        "exact (correct / images), of the same checkpoints",
    )
    parser.add_argument(
        "--csv", type=Path, metavar="DIR", help="also write each table as DIR/<table>.csv; default: no file written"
    )
    parser.add_argument("--overwrite", action="store_true", help="with --csv: replace the tables already in DIR")
    return parser


def stats() -> argparse.ArgumentParser:
    """The command line of ``python -m paperlib stats`` (``analysis.summary.main``)."""
    description = (
        "Notebook 07's tables for a finetuning sweep's runs, without the notebook: what is finished and missing, "
        "Table 6, Table 1 with Holm's adjustment, every pair of components and the Takeaway 2 test. For a spec of "
        "several precisions, these of its fp32 runs (the precisions' effect: python -m paperlib precision)."
    )
    spec = "a finetuning sweep spec, e.g. parameters/sweeps/finetune_paper.yaml"
    parser = tables("python -m paperlib stats", description, spec)
    parser.add_argument(
        "--reference", help="the dataset P(f) was measured against (its reference images); default: each dataset's own"
    )
    return parser


def precision() -> argparse.ArgumentParser:
    """The command line of ``python -m paperlib precision`` (``analysis.precision_check.main``)."""
    description = (
        "Whether finetuning in a cheaper precision (tf32, autocast, bf16) keeps the paper's conclusions, from a "
        "sweep's runs in several precisions: each run paired with the reference precision's run of its grid point, "
        "the test accuracy differences with their 90% intervals and an equivalence test (TOST) within the margin, "
        "per dataset and component and over datasets, and whether Table 1's decreases from MHA, Table 6's best "
        "configuration, the overall level and divergence stay the same."
    )
    spec = "a finetuning sweep spec of several precisions, e.g. parameters/sweeps/precision_paper.yaml"
    parser = tables("python -m paperlib precision", description, spec)
    parser.add_argument(
        "--reference",
        default="fp32",
        help=f"the precision the others are compared with, one of {', '.join(PRECISIONS)}",
    )
    parser.add_argument("--margin", type=float, default=0.5, help="equivalence margin, accuracy points")
    return parser


PARSERS = {
    "finetune": finetune,
    "plasticity": plasticity,
    "sweep": sweep,
    "stats": stats,
    "precision": precision,
    "report": report,
    "demo": demo,
}
"""Each command's command line, by command (``paperlib.__main__.COMMANDS``' names)."""
