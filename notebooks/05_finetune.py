# %% [markdown]
# # 05 · One finetuning run (paper §5.2, appendix C.3, Tables 3-5)
#
# The paper finetunes one component at a time (MHA, FC1, FC2, LN2 or LN1 in every block, plus the
# new head and the final LayerNorm), against full finetuning and linear probing, with SGD
# (momentum 0.9, no weight decay), warm-up and cosine decay, clipping at norm 1, and reports the
# test accuracy of the checkpoint with the best validation accuracy. This notebook is one run:
# `papermill notebooks/05_finetune.ipynb out.ipynb -p component mha`; the paper's protocol for a
# dataset is in `parameters/finetune/<dataset>.yaml` (Table 5) and the whole grid in
# `parameters/sweeps/finetune_paper.yaml`.
#
# At demo scale (the default): the demo ViT pretrained on digits 0-4, finetuned on digits 5-9 for
# 100 steps on a CPU (`Config()`'s defaults). The demo sweeps that notebooks 06 and 07 read run 60, in
# folders of their own (`parameters/sweeps/finetune_demo.yaml`, tagged `steps60`), so that `make demo` takes
# minutes on a laptop. Demo numbers are not the paper's.

# %% tags=["parameters"]
model = "demo"  # short name (demo, vit_base_in21k, ...) or any timm ViT name
dataset = "digits"  # downstream dataset
component = "mha"  # mha, fc1, fc2, ln2, ln1, full or linear
lr = 0.03  # peak learning rate (Table 5 grids: 1e-3 to 3e-2, 3e-3 to 6e-2 for DomainNet)
seed = 0  # the paper's seeds: 0, 42, 3407
steps = 100  # optimisation steps (Table 5: 4,000 to 20,000)
batch_size = 32  # images per step (the paper: 512)
micro_batch = 0  # images per forward pass (0: the whole batch, split automatically if the GPU runs out of memory)
warmup = 10  # linear warm-up steps (the authors' code: 2,000)
eval_every = 10  # validation every this many steps (the authors' per dataset: parameters/finetune/)
validation = "official"  # official: a dataset's official validation split where it has one (Flowers102), as the authors' code; fraction: 20% of the training set everywhere (the paper's words)
device = "cpu"  # cpu or cuda
image_size = 0  # 0: the model's resolution; else the images' and the model's (its position embedding resampled)
precision = "fp32"  # fp32 (the paper's), or beyond it tf32 (CUDA only), autocast (bf16 autocast) or bf16 (fp32 master weights): faster on a GPU, their runs get their own folders
# how steps run, the same step to rounding (beyond the paper): a preset, or the step options one by one
speed = "auto"  # a preset: auto, none or a file of parameters/speed/ (e.g. h100); it sets the options below left at None
compile = None  # torch.compile: False, True (the whole model) or "blocks" (one graph shared by the blocks); None: the preset's, else False
compile_mode = None  # torch.compile's mode: default, coordinate-descent, max-autotune-no-cudagraphs, ...; None: the preset's, else default
attention = None  # scaled-dot-product attention kernel: auto, flash, cudnn, efficient or math; None: the preset's, else auto
fused = None  # our fused kernels: auto (gelu+qkv on CUDA, none elsewhere), none, all, gelu, qkv or gelu+qkv; None: the preset's, else auto
optimizer = "sgd"  # sgd (the paper) or adamw (beyond the paper; its runs get their own folder)
weight_decay = 0.0  # AdamW's weight decay on weight matrices (SGD: 0, as in the paper)
method = "weights"  # how the component trains: weights (the paper: its own), or beyond the paper lora (a rank-r update of its weight matrices; mha, fc1, fc2 or full) or subset (as many parameters per block as a LayerNorm, a random subset; mha, fc1 or fc2)
lora_rank = 0  # method lora: the rank r of each update (e.g. 8)
lora_alpha = 0.0  # method lora: updates are scaled by lora_alpha / lora_rank (0: the rank, a scale of 1)
lora_dropout = 0.0  # method lora: dropout on the updates' input
subset_seed = 0  # method subset: the seed of the subset, the same for every learning rate and seed of a configuration
tag = ""  # a name of your own for runs that change steps, batch size, warm-up, momentum or clip (not in the folder name): their own folder, kept beside the others
stop_exploded = False  # stop a run whose loss goes above 10x chance level's (the authors' loop never stops; a loss that is not finite stops it either way)
save_weights = False  # keep what the run trained, at its best checkpoint (weights.safetensors in its folder; checkpoints.load_model rebuilds the model)
normalize = "imagenet"  # imagenet: ImageNet's mean and std (the paper); model: the statistics the model was pretrained with (beyond the paper; its runs get their own folder)
data_root = ""  # data folder ("": $VIT_PLASTICITY_DATA or data/)

# %%

import matplotlib.pyplot as plt

from paperlib.analysis import tables
from paperlib.records import names, paths, runs
from paperlib.reports import notebook, plots
from paperlib.train import finetune
from paperlib.train.config import config_from_namespace
from paperlib.vit import methods, models

notebook.check_parameters()  # papermill's -p of a name this notebook does not have stops here

config = config_from_namespace(globals())  # the parameters cell, whole
metrics = finetune.run(config)
history = runs.history(config)
print(f"{names.LABELS[component]} on {dataset}: {metrics['status']}; results in {paths.display(config.folder())}")

# %% [markdown]
# ## What trains (Tables 3 and 4)
#
# Trainable parameters of this configuration (the component over all blocks, as in Table 3, and
# with the head and final norm, as trained here) and the memory of their gradients and SGD
# momentum in fp32 (Table 4). With method `lora`, the LoRA updates that train in the component's
# place (`paperlib.vit.lora`): their share of the weights they adapt, and the memory they need. With
# method `subset`, the subset that trains: as many parameters per block as a LayerNorm has
# (`paperlib.vit.equal_capacity`).

# %%
# NBVAL_CHECK_OUTPUT
architecture = models.architecture(model, num_classes=metrics.get("num_classes", 5))
methods.trainer_of(config.method).parameter_table(architecture, config.method, config.component)

# %% [markdown]
# ## Training curves
#
# Left: training loss. Middle: global norm of the trainable gradients before clipping (clipped
# at 1), the quantity of the paper's Fig. 1 and Fig. 4. Right: validation accuracy; the marker is
# the best-validation checkpoint whose test accuracy is the result.

# %%
plots.run_figure(history, metrics, config)
plt.show()

# %% [markdown]
# ## Result

# %%
{key: metrics[key] for key in ("status", "best_step", "best_val_accuracy", "test_accuracy", "trainable_parameters", "images_per_second")}

# %%
paper_value = tables.paper_accuracy(dataset, component)  # None off the paper's benchmarks
notebook.headline(f"{component} on {dataset}: test accuracy {100 * (metrics.get('test_accuracy') or float('nan')):.1f}% ({metrics['status']}, best validation at step {metrics.get('best_step')})",
                paper=None if paper_value is None else f"{paper_value:.2f}% at the best of its learning rates, mean of 3 seeds (Table 6)")
