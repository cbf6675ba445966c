"""paperlib: the helper library behind the vit-plasticity notebooks.

One module per concern, named for what it holds, in eight groups in the order they build on one another; each module
imports only modules above it (``tests/test_layout.py``):

Foundations: files, commands, devices, names
- ``paths``       where things live (repository, reports, results, data caches, demo weights)
- ``storage``     atomic writes, whole-JSON reads and the lock of what one process at a time writes (``locked``)
- ``cli``         the command lines' parameter files and overrides
- ``devices``     the devices a run may name, and those this machine has
- ``threads``     CPU threads of processes of ours that share a machine
- ``names``       the components' and configurations' names and labels, and the choices a P(f) result records,
                  without torch (what the analysis imports)

Data (appendix C.2)
- ``splits``      how datasets are split: the authors' train/test and validation draws
- ``transforms``  the paper's transforms, per image (torchvision) and per batch on the device
- ``corruptions`` CIFAR-10-C corruptions at a given severity (Hendrycks & Dietterich, 2019)
- ``imagesets``   ``ImageDataset`` (uint8 images in memory) and ``FileDataset`` (image files), ``stack``,
                  ``random_images`` (to time a step on)
- ``data``        ``get_dataset``: the demo world, the paper's 11 benchmarks, the reference images
- ``loader``      the fast data path: uint8 caches and ``DeviceLoader``
- ``fixtures``    tiny datasets in the official on-disk formats (tests, benchmarks)

Models and their components (§3)
- ``components``  the five transformer components in a model, trainable configurations, Tables 3 and 4
- ``models``      the catalogue: the paper's ViTs by short name, any timm ViT, the demo ViT, your own
- ``speed``       how a finetuning step is made fast (compilation, precision, fused ops); its
                  benchmarks are outside the package (``benchmarks/``, ``python -m benchmarks``)

Plasticity and its bounds (§4, §5.1)
- ``significance`` the tests behind the p-values: Wilcoxon's signed-rank, Kendall's tau, Holm's adjustment
- ``ranking``     statistics of a plasticity ranking: agreement with the paper's, bootstrap, scale curves
- ``plasticity_table`` saved plasticity results, without torch: their folder and record, read back, ranked,
                  collected as one table (what the analysis reads)
- ``component_rates`` the rate of change of every component on image pairs (Definition 1), exact and fast
- ``plasticity``  plasticity of every component (Definition 1, §5.1): a ``Measurement``, measured and saved
- ``probe``       linear probing of the pretrained model as the authors' code does it (Table 6's last column)
- ``bounds``      upper bounds on plasticity (Propositions 1-4, §4) and the data constants they need

Finetuning (§5.2)
- ``lora``        LoRA surgery on one component (beyond the paper)
- ``equal_capacity`` every component trained on as many parameters per block as a LayerNorm has (beyond the paper)
- ``specs``       sweep specs: read, checked, expanded into runs
- ``runs``        what a finetuning run is and where it lives: ``Config``, its folder and files, whether it is finished
- ``runs_table``  every run as a table: a results root's, a spec's (``for_spec``, without torch), their histories
- ``finetune``    the paper's finetuning protocol (§5.2), top to bottom

Analysis across runs (§5.2 and beyond the paper)
- ``stats``       every table across runs: Tables 1 and 6, pairs, Takeaway 2, LoRA; ``python -m paperlib.stats``
- ``precision``   whether a cheaper precision (tf32, bf16) keeps the results; ``python -m paperlib.precision``
- ``capacity``    plasticity or capacity: Takeaway 2 inside groups of equal size, and where the two disagree

Figures and reports
- ``plots``       figures with a fixed colour per component
- ``notebook``    what the notebooks call from their cells: ``check_parameters``, ``headline``
- ``report``      executing notebooks with papermill and rendering HTML reports

Sweeps
- ``plan``        what a sweep costs before it runs: its runs counted, the device-hours of those to run
- ``sweep``       papermill runs over a parameter grid, resumable, on GPUs or SLURM; ``--plan``
- ``demo``        the deterministic pretraining script of the demo ViT
"""

import os
import warnings

# OpenMP threads that wait by spinning hold a core each: beside any other busy process (a second run,
# a notebook) every barrier then waits for a thread that cannot run, and a run crawls (10x measured,
# paperlib.threads). Sleeping waits give the same numbers. Set before torch loads OpenMP, so it holds
# for our commands and every process they start; a value set by the user stands.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# tqdm.auto warns, with a path of this installation, when ipywidgets is missing; plain text
# progress bars are what we want in executed notebooks, and the path must not land in them.
warnings.filterwarnings("ignore", message="IProgress not found")

__version__ = "0.1.0"
