# %% [markdown]
# # 00 · The components of a ViT block (paper §2, appendix C.1 and C.3)
#
# The paper studies five components of every transformer block: the two LayerNorms (LN1 before
# attention, LN2 before the feedforward), multi-head self-attention (MHA) and the two feedforward
# linear layers (FC1, FC2). This notebook shows where they live in a timm `VisionTransformer`,
# computes Table 3 (trainable parameters per finetuning configuration) and Table 4 (memory load of
# gradients and SGD momentum) for ViT-Base, ViT-Huge and the demo ViT, and shows the demo world's
# images. Parameter counts need no weights: the paper's models are built on PyTorch's meta device.
#
# At demo scale (the default) everything runs offline on a CPU in seconds.

# %% tags=["parameters"]
model_name = "demo"  # the model whose block is printed and tabulated first (short name or timm ViT name)
paper_models = ["vit_base_in21k", "vit_huge_in21k"]  # architectures for Tables 3 and 4 (no weights needed)
num_classes = 10  # classes of the new head, as for Cifar10 in Table 4
bytes_per_parameter = 4  # fp32, as in Table 4
images_per_dataset = 8  # sample images shown per demo dataset

# %%
import matplotlib.pyplot as plt
import pandas as pd

from paperlib.data import datasets
from paperlib.records import names
from paperlib.reports import notebook, plots
from paperlib.vit import components, models

notebook.check_parameters()  # papermill's -p of a name this notebook does not have stops here

pd.options.display.float_format = "{:,.4g}".format

# %% [markdown]
# ## The five components in a block
#
# A pre-norm block computes `x + MHA(LN1(x))`, then `x + FC2(gelu(FC1(LN2(x))))` (paper §2,
# Fig. 2 left). Colours are fixed per component in every figure of the package; components are
# listed in the paper's plasticity order MHA > FC1 > FC2 > LN2 > LN1 (§5.1).

# %%
plots.block_figure()
plt.show()

# %%
model = models.create_model(model_name, pretrained=False, num_classes=num_classes)
print(model.blocks[0])

# %% [markdown]
# Where each component lives in every block of a timm ViT:

# %%
# NBVAL_CHECK_OUTPUT
pd.DataFrame(
    {
        "component": [names.LABELS[c] for c in components.COMPONENTS],
        "timm module (in model.blocks[i])": [components.MODULE_PATHS[c] for c in components.COMPONENTS],
        "modules": [len(components.component_modules(model, c)) for c in components.COMPONENTS],  # one per block (two for a SwiGLU's FC1)
    }
)

# %% [markdown]
# ## Table 3 and Table 4: trainable parameters and memory load
#
# `parameters` counts the component over all blocks, as the paper's Table 3 does;
# `memory load (MiB)` is the gradients plus the SGD momentum buffer of those parameters in fp32
# (Table 4). The paper reports 28M / 28M / 28M / 18K / 18K parameters (33%, 33%, 33%, 0.02%, 0.02%
# of the total) and 220 / 220 / 220 / 0.14 / 0.14 MB for ViT-Base. `trainable` is what
# `set_trainable` really trains: the component plus the new head and the final LayerNorm.

# %%
# NBVAL_CHECK_OUTPUT
tables = {name: components.parameter_table(models.architecture(name, num_classes=num_classes), bytes_per_parameter) for name in paper_models}
for name, table in tables.items():
    print(f"{name}: {models.resolve_name(name)}, {table.loc['All', 'parameters']:,} parameters")
    print(table.to_string(), end="\n\n")

# %%
# NBVAL_CHECK_OUTPUT
model_table = components.parameter_table(model, bytes_per_parameter)
print(f"{model_name}: {models.resolve_name(model_name)}, {model_table.loc['All', 'parameters']:,} parameters")
print(model_table.to_string())

# %%
first = tables[paper_models[0]]
plots.parameter_figure(first, paper_models[0])
plt.show()

# %%
share = first["% of total"]
notebook.headline(
    f"{paper_models[0]}: " + ", ".join(f"{names.LABELS[c]} {share[names.LABELS[c]]:.2g}%" for c in components.COMPONENTS) + " of the parameters",
    paper="MHA, FC1, FC2 33% each, LN2 and LN1 0.02% of ViT-Base's parameters (Table 3)",
)

# %% [markdown]
# ## The demo world
#
# scikit-learn's digits, split by class: digits 0-4 (`digits_source`) pretrain the demo ViT, the
# stand-in for ImageNet-21k; digits 5-9 are the downstream task, clean (`digits`, the stand-in for
# Cifar10) and with the five Cifar10-C corruptions at severity 5 (`digits_c/...`). Each set has a
# deterministic 80/20 train/test split; `val` is the finetuning protocol's 20% of `trainval`
# (§5.2), `train` the other 80%. Demo numbers are not the paper's.

# %%
# NBVAL_CHECK_OUTPUT
pd.DataFrame(
    [
        {"dataset": name, **{split: len(datasets.get_dataset(name, split)) for split in datasets.SPLITS}}
        for name in datasets.dataset_names("demo")
    ]
).set_index("dataset")

# %%
plots.sample_grid([datasets.get_dataset(name, "test") for name in datasets.dataset_names("demo")], images_per_dataset)
plt.show()

# %% [markdown]
# At paper scale the same `datasets.get_dataset(name, split, root=...)` serves the paper's 11
# benchmarks (appendix C.2) and the reference images used for plasticity (the paper used ImageNet
# validation images; Imagenette is a stand-in that torchvision downloads in one command). Images
# are 224x224 by default, with the paper's transforms.

# %%
# NBVAL_CHECK_OUTPUT
print("paper benchmarks:", ", ".join(datasets.dataset_names("paper")))
print("reference images:", ", ".join(datasets.dataset_names("reference")))
