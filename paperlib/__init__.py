"""paperlib: the helper library behind the vit-plasticity notebooks.

One module per concern, named for what it holds:

- ``paths``       where things live (repository, reports, results, data caches, demo weights)
- ``models``      ``create_model``: the paper's ViTs by short name, any timm ViT, the demo ViT
- ``components``  the five transformer components, trainable configurations, Tables 3 and 4
- ``data``        ``get_dataset``: the demo world, the paper's 11 benchmarks, the reference images
- ``transforms``  the paper's transforms, per image (torchvision) and per batch on the device
- ``loader``      the fast path: uint8 caches and ``DeviceLoader``
- ``fixtures``    tiny datasets in the official on-disk formats (tests, benchmarks)
- ``bench``       benchmarks that print their figures
- ``corruptions`` CIFAR-10-C corruptions at a given severity (Hendrycks & Dietterich, 2019)
- ``plasticity``  rates of change and plasticity of every component (Definition 1, §5.1)
- ``bounds``      upper bounds on plasticity (Propositions 1-4, §4) and the data constants they need
- ``finetune``    one finetuning run of the paper's protocol (§5.2), resumable, recorded
- ``results``     finetuning runs as tables: every run, histories, partial and missing runs
- ``stats``       Tables 1 and 6, relative gain, pooled standard errors (§5.2)
- ``sweep``       papermill runs over a parameter grid, resumable, on GPUs or SLURM
- ``demo``        the deterministic pretraining script of the demo ViT
- ``plots``       figures with a fixed colour per component
- ``report``      executing notebooks with papermill and rendering HTML reports
"""

import warnings

# tqdm.auto warns, with a path of this installation, when ipywidgets is missing; plain text
# progress bars are what we want in executed notebooks, and the path must not land in them.
warnings.filterwarnings("ignore", message="IProgress not found")

__version__ = "0.1.0"
