"""paperlib: the library behind the vit-plasticity notebooks, in packages along its one seam.

Each package imports only those below it (the layers contract in ``pyproject.toml``, checked by ``make test``);
``records`` and ``analysis``, what reads finished results, load no training stack. ``docs/architecture.md`` draws it.
Top down:

- ``sweeps``    a notebook over a parameter grid, planned before it runs
- ``reports``   figures, what notebook cells call, notebooks executed and rendered as HTML
- ``train``     the paper's finetuning protocol (§5.2), one run top to bottom
- ``measure``   plasticity (§5.1), its bounds (§4) and linear probing of a pretrained ViT
- ``vit``       the models by name, their five components, and how a run trains one (weights, LoRA, a subset)
- ``data``      the demo world, the paper's benchmarks and reference images, split and transformed
- ``speed``     how a step is made fast on this machine, the same step to rounding
- ``analysis``  the paper's tables and tests over saved results, without torch
- ``records``   what a saved result is, where it lives and how it is read back, without torch

Every command: ``python -m paperlib --help`` (``COMMANDS``).
"""

import os
import sys
import warnings
from importlib.machinery import ModuleSpec

# OpenMP threads that wait by spinning hold a core each: beside any other busy process (a second run,
# a notebook) every barrier then waits for a thread that cannot run, and a run crawls (paperlib.speed.threads).
# Sleeping waits give the same numbers. Set before torch loads OpenMP, so it holds
# for our commands and every process they start; a value set by the user stands.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# tqdm.auto warns, with a path of this installation, when ipywidgets is missing; plain text
# progress bars are what we want in executed notebooks, and the path must not land in them.
warnings.filterwarnings("ignore", message="IProgress not found")

__version__ = "0.1.0"

COMMANDS = {
    "finetune": ("paperlib.train.finetune", "one finetuning run as notebook 05 runs it (§5.2), without the notebook"),
    "plasticity": ("paperlib.measure.plasticity", "P(f) of every component of a model on a dataset (§5.1)"),
    "sweep": (
        "paperlib.sweeps.sweep",
        "a notebook over a parameter grid: planned (--plan), resumable, on GPUs or SLURM",
    ),
    "stats": ("paperlib.analysis.summary", "notebook 07's tables for a finetuning sweep's runs, without the notebook"),
    "precision": ("paperlib.analysis.precision_check", "whether a cheaper precision keeps the paper's conclusions"),
    "report": ("paperlib.reports.execute", "the demo's HTML reports (report demo), or notebooks re-executed in place"),
    "demo": ("paperlib.train.demo", "the committed demo ViT: pretrain it again, or evaluate it"),
}
"""Each command of ``python -m paperlib`` (``__main__``): its module, whose ``main(argv)`` runs it, and what it does."""


class CommandNames:
    """What ``python -m paperlib.<command>`` answers: the command to type, in one line, with exit status 2.

    ``python -m paperlib.sweep`` was the entry point of earlier READMEs; every command is now ``python -m paperlib
    <command>``. Python looks for ``paperlib.<command>`` after importing this package, asking ``sys.meta_path``'s
    finders one after the other; this one, appended last, is asked only when no real module has the name, and it
    answers only for a command's name (``COMMANDS``). Run with ``-m``, its module prints the line and exits;
    imported from Python code, it raises ModuleNotFoundError saying the same and runs nothing."""

    def find_spec(self, fullname: str, path=None, target=None) -> ModuleSpec | None:
        package, _, name = fullname.partition(".")
        if package != __name__ or not name or "." in name:
            return None
        return ModuleSpec(fullname, self) if name in COMMANDS else None

    def create_module(self, spec: ModuleSpec) -> None:
        return None  # a plain module, which exec_module refuses

    def exec_module(self, module) -> None:
        name = module.__name__.partition(".")[2]
        raise ModuleNotFoundError(
            f"{module.__name__} is not a module: {name} is a command, python -m paperlib {name} ... "
            f"(its module: {COMMANDS[name][0]})"
        )

    def get_code(self, fullname: str):
        """What ``python -m paperlib.<command>`` runs (``runpy`` sets ``__loader__``, this finder): ``answer``."""
        return compile("__loader__.answer(__spec__.name)", fullname, "exec")

    def answer(self, fullname: str) -> None:
        """Print the command to type, with the arguments given, and exit with status 2."""
        import shlex

        name, given = fullname.partition(".")[2], shlex.join(sys.argv[1:]) or "..."
        print(f"error: python -m {fullname} is not a command; type: python -m paperlib {name} {given}", file=sys.stderr)
        sys.exit(2)


sys.meta_path.append(CommandNames())
