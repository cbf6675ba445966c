# %% [markdown]
# # 04 · Linear probing (paper Table 6, last column)
#
# The paper: "The linear probing performance is obtained over the attention hidden representation
# of the last layer." In the authors' released code this is a probe of the **pretrained** model,
# fitted with scikit-learn: the hidden representation after a component is taken from one forward
# pass, its tokens are mean-pooled, each image's vector is scaled to unit L2 norm, the features are
# standardised (`StandardScaler`, fitted on the training features) and a multinomial
# `LogisticRegression(max_iter=5000)` is fitted on the 80% training split and scored on the test
# split. `paperlib.measure.probe.linear_probe` computes that for every block and every probe point; its
# tables are cached under `results/probe/<model>/<dataset>/`.
#
# **Which point is the paper's.** "The attention hidden representation of the last layer" most
# likely means the output of the last block's MHA, before the residual addition (the `mha` point,
# the authors' `attn`): every point of the authors' probing code is the hidden representation
# *after a component*, and the attention is the component. Two stored versions of the authors'
# plotting code read that point for this column; a third reads the output of the whole last block
# (`block`, their `ffn_res`; `docs/fidelity.md`). Those two readings and `attn_residual` are in the
# table and the figure below; `point` chooses the column.
#
# **Which images.** The authors' script reads the training images through its finetuning loader:
# the 80% training split (Flowers102: its official training split), one random resized crop and
# flip per image, shuffled, in batches of 512 with the last incomplete one dropped; the test images
# resized and centre-cropped. `train_features="augmented"` (the default) does the same, drawn from
# `split_seed`; `"clean"` fits on a centre crop of every training image instead.
#
# At demo scale (the default): the demo ViT on the six demo downstream sets; it runs in seconds on a
# CPU. Demo numbers are not the paper's.

# %% tags=["parameters"]
model = "demo"  # short name (demo, vit_base_in21k, ...) or any timm ViT name
datasets = ["digits", "digits_c/contrast", "digits_c/gaussian_noise", "digits_c/motion_blur", "digits_c/snow", "digits_c/speckle_noise"]  # downstream datasets
point = "mha"  # probe point of Table 6's column: mha (the last block's attention output, the paper's most likely reading), attn_residual, block, ...
block = -1  # block of Table 6's column (-1: the last, the paper's "last layer")
split_seed = 0  # seed of the 80/20 split of the training set that the probe is fitted on (and of its crops)
train_features = "augmented"  # augmented: the authors' (one random crop and flip per image, batches of 512, the last incomplete one dropped); clean: centre crops of every training image
probe_batch_size = 256  # images per forward pass of the probe
device = "cpu"  # cpu or cuda
data_root = ""  # data folder ("": $VIT_PLASTICITY_DATA or data/)
normalize = "imagenet"  # imagenet: ImageNet's mean and std (the paper); model: the statistics the model was pretrained with
spec = "parameters/sweeps/finetune_demo.yaml"  # last section: the finetuning sweep whose `linear` runs are shown (paper scale: finetune_paper.yaml)
run_linear_config = True  # last section: run the spec's missing `linear` runs of these datasets (False: only read those there are)
select = "test"  # last section: learning rate chosen by test accuracy (the paper) or val (no test-set selection)

# %%
import time

import matplotlib.pyplot as plt
import pandas as pd
from IPython.display import display

from paperlib.analysis import tables
from paperlib.measure import probe
from paperlib.reports import notebook, plots
from paperlib.sweeps.spec_runs import spec_runs

notebook.check_parameters()  # papermill's -p of a name this notebook does not have stops here

options = dict(split_seed=split_seed, train_features=train_features, device=device, batch_size=probe_batch_size,
               root=data_root or None, normalize=normalize)
start = time.perf_counter()
table = probe.probe_datasets(model, datasets, **options)
print(f"{model}: {table['block'].nunique()} blocks x {table['point'].nunique()} probe points on {len(datasets)} datasets "
      f"in {time.perf_counter() - start:.1f} s (cached tables are read, not recomputed)")

# %% [markdown]
# ## Table 6, last column: probe accuracy per dataset
#
# Test accuracy (%) of the probe at the chosen point of the chosen block (by default the last
# block's `mha`). For the paper's datasets, `paper (%)` is Table 6's linear-probing column
# (ViT-B/16 pretrained on ImageNet-21k).

# %%
column = probe.table6_column(model, datasets, point=point, block=block, **options)
paper = pd.read_csv(tables.PAPER_TABLE6, comment="#").query("component == 'probe'")
column = column.merge(paper[["dataset", "mean"]].rename(columns={"mean": "paper (%)"}), on="dataset", how="left")
column.rename(columns={"accuracy": f"probe at block {block}, {point} (%)"}).set_index("dataset").round(2)

# %%
notebook.headline(f"{model}, probe at block {block}, {point}: {column['accuracy'].mean():.1f}% mean test accuracy over {len(column)} datasets",
                  paper=f"{paper['mean'].mean():.1f}% mean over its {len(paper)} benchmarks (ViT-B/16, Table 6's last column)")

# %% [markdown]
# ## Beyond the paper: probe accuracy along depth, for every probe point
#
# The same probe at every block and every point: the output of each component (LN1, MHA, LN2, FC1,
# FC2) and of the activation (GELU), and the residual stream after the attention (`x + MHA`) and
# after the block (dashed lines: the residual stream). One line per point, averaged over the
# datasets (left), and the spread over the datasets at the last block (right).

# %%
profile = probe.along_depth(table)
plots.probe_figure(table, profile, model, normalize, split_seed)
plt.show()
profile.round(1)

# %% [markdown]
# ## The `linear` finetuning configuration (a new head trained with SGD)
#
# Not the paper's Table 6 column: the finetuning configuration `linear` trains a new classification
# head with SGD on the frozen model's final class-token representation, with the protocol and code
# of notebook 05 (`finetune.run` with `component="linear"`). Its runs are the `linear` runs of the
# finetuning sweep `spec`, with that sweep's steps, learning rates, seeds and other parameters (at demo
# scale, those of `finetune_demo.yaml`; at paper scale, Table 5's in `finetune_paper.yaml`): the
# probe's `device`, `data_root` and `normalize` above do not reach them. So notebooks 04 and 07 read
# the same runs. It is a baseline of its own: what the finetuning protocol reaches when no
# component is trained. Test accuracy (%) at each run's best-validation checkpoint, at the learning
# rate chosen by `select`: mean ± standard deviation over seeds (their number in brackets), chosen
# and counted as notebook 07 does.

# %%
linear = {"component": ["linear"], "dataset": datasets}
runs, _ = spec_runs(spec, compute_missing=run_linear_config, only=linear, required=False)
if len(runs):
    runs = runs[(runs["component"] == "linear") & runs["dataset"].isin(datasets) & (runs["model"] == model)]
finished = runs[runs["status"] == "finished"] if len(runs) else runs
print(f"{len(runs)} runs of the linear configuration, {len(finished)} finished")
if len(finished):
    sgd = tables.table6(runs, select=select)
    display(sgd.set_index("dataset")[["lr"]].join(tables.formatted(sgd)["linear"].rename("SGD head, test accuracy (%)")))
