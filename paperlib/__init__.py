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

Every command: ``python -m paperlib --help``.
"""

import os
import warnings

# OpenMP threads that wait by spinning hold a core each: beside any other busy process (a second run,
# a notebook) every barrier then waits for a thread that cannot run, and a run crawls (paperlib.speed.threads).
# Sleeping waits give the same numbers. Set before torch loads OpenMP, so it holds
# for our commands and every process they start; a value set by the user stands.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# tqdm.auto warns, with a path of this installation, when ipywidgets is missing; plain text
# progress bars are what we want in executed notebooks, and the path must not land in them.
warnings.filterwarnings("ignore", message="IProgress not found")

__version__ = "0.1.0"
