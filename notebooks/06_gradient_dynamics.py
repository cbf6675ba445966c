# %% [markdown]
# # 06 · Gradient dynamics during finetuning (paper Fig. 1, Fig. 4 middle and right, Figs. 19-51)
#
# The paper's argument: components with high plasticity allow large gradient norms, hence faster
# and better adaptation (§3, Fig. 1). Fig. 4 shows, on Sketch at the best learning rate, the
# global gradient norm (before clipping) and the validation loss along training, one curve per
# finetuned component: gradient norms are ordered like the plasticity ranking and the loss falls
# faster for MHA and the feedforward layers. Figs. 19-51 repeat this for every dataset, learning
# rate and seed.
#
# At demo scale (the default) the runs are those of the demo finetuning sweep, computed here when
# missing (a minute on a CPU). Demo numbers are not the paper's.

# %% tags=["parameters"]
spec = "parameters/sweeps/finetune_demo.yaml"  # finetuning sweep whose runs are shown
dataset = "digits"  # dataset of the figure
lr = 0.03  # learning rate of the first figure (Fig. 4 uses the best one)
seed = 0  # seed of the runs shown
compute_missing = True  # run the spec's missing runs for this dataset first (demo scale only)

# %%
from pathlib import Path

import matplotlib.pyplot as plt

from paperlib import paths, plots, results, sweep

grid_spec = sweep.load_spec(paths.ROOT / spec)
if compute_missing:
    results.ensure(sweep.restrict(grid_spec, dataset=[dataset], seed=[seed]))
runs, histories = results.load()
wanted = results.expected(grid_spec)
shown = histories.merge(wanted, on=results.KEYS)  # the spec's runs only
shown = shown[(shown["dataset"] == dataset) & (shown["seed"] == seed)]
print(f"{shown.groupby(['config', 'lr']).ngroups} runs on {dataset} (seed {seed})")

# %% [markdown]
# ## Gradient norm and validation loss per component (Fig. 4, middle and right)

# %%
one = shown[shown["lr"] == lr]
fig, axes = plt.subplots(1, 2, figsize=(10, 3.4))
plots.training_curves(one, "grad_norm", axes[0], log=True)
axes[0].set_ylabel("gradient norm (before clipping)")
plots.training_curves(one, "val_loss", axes[1])
axes[1].legend(fontsize=7)
fig.suptitle(f"{dataset}, lr {lr:g}, seed {seed}")
fig.tight_layout()
plots.save_figure(fig, plots.figure_path("06_dynamics", Path(spec).stem, dataset, f"lr{lr:g}", f"seed{seed}"))
plt.show()

# %% [markdown]
# Mean gradient norm over the first fifth of training, per component, ranked: the paper expects
# the plasticity order MHA > FC1 > FC2 > LN2 > LN1 (with `full` above all, having every weight).

# %%
early = one[one["step"] <= one["step"].max() / 5].groupby("config")["grad_norm"].mean().sort_values(ascending=False)
early.rename(index=plots.LABELS).round(3).to_frame("mean gradient norm, first 20% of steps")

# %% [markdown]
# ## Over the learning-rate grid (Figs. 19-51)

# %%
lrs = sorted(shown["lr"].unique())
fig, axes = plt.subplots(2, len(lrs), figsize=(4.5 * len(lrs), 6), squeeze=False)
for column, value in enumerate(lrs):
    part = shown[shown["lr"] == value]
    plots.training_curves(part, "grad_norm", axes[0, column], log=True)
    plots.training_curves(part, "val_loss", axes[1, column])
    axes[0, column].set_title(f"lr {value:g}")
axes[1, -1].legend(fontsize=7)
fig.tight_layout()
plots.save_figure(fig, plots.figure_path("06_dynamics_grid", Path(spec).stem, dataset, f"seed{seed}"))
plt.show()
