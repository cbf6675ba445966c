# %% [markdown]
# # 04 · Linear probing baseline (paper Table 6, last column)
#
# Linear probing trains only a new classification head on the frozen model's final class-token
# representation: the baseline that every component-wise finetuning of §5.2 should beat. The
# paper reports it per dataset in the last column of Table 6. Runs use the same protocol and code
# as notebook 05 (`finetune.run` with `component="linear"`), so they are shared with the sweeps.
#
# At demo scale (the default): the demo ViT on the six demo downstream sets, with the protocol of
# the demo finetuning sweep (its `linear` runs are these). Demo numbers are not the paper's.

# %% tags=["parameters"]
model = "demo"  # short name (demo, vit_base_in21k, ...) or any timm ViT name
datasets = ["digits", "digits_c/contrast", "digits_c/gaussian_noise", "digits_c/motion_blur", "digits_c/snow", "digits_c/speckle_noise"]  # downstream datasets
lrs = [0.03]  # learning-rate grid of the head (Table 6 reports the best; the paper's grids: Table 5)
select = "test"  # learning rate chosen by test accuracy (the paper) or val (no test-set selection)
seeds = [0]  # the paper: 0, 42, 3407
steps = 100  # optimisation steps
batch_size = 32  # images per step (the paper: 512)
warmup = 10  # linear warm-up steps
eval_every = 10  # validation every this many steps
device = "cpu"  # cpu or cuda
data_root = ""  # data folder ("" = $VIT_PLASTICITY_DATA or data/)
normalize = "imagenet"  # imagenet: ImageNet's mean and std (the paper); model: the statistics the model was pretrained with

# %%
from paperlib import finetune, stats
from paperlib.runs import for_spec

grid = {  # the runs of this baseline as a sweep spec: notebook 05's runs of the linear configuration
    "notebook": "notebooks/05_finetune.ipynb",
    "parameters": {"model": model, "component": "linear", "steps": steps, "batch_size": batch_size, "warmup": warmup,
                   "eval_every": eval_every, "device": device, "data_root": data_root, "normalize": normalize},
    "grid": {"dataset": datasets, "lr": lrs, "seed": seeds},
}
finetune.run_spec(grid)
runs, _, _ = for_spec(grid)
print(f"{len(runs)} linear-probing runs, {(runs['status'] == 'finished').sum()} finished")

# %% [markdown]
# ## Test accuracy per dataset (Table 6, last column)
#
# Test accuracy (%) at each run's best-validation checkpoint, at the learning rate chosen by
# `select`: mean ± standard deviation over seeds (their number in brackets), chosen and counted as
# notebook 07 does for every configuration (`stats.table6`: a learning rate with a diverged run is
# never chosen), so this column and the baseline of its relative gains agree.

# %%
table = stats.table6(runs, select=select)
table.set_index("dataset")[["lr"]].join(stats.formatted(table)["linear"].rename("test accuracy (%)"))
