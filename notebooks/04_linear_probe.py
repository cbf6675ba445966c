# %% [markdown]
# # 04 · Linear probing baseline (paper Table 6, last column)
#
# Linear probing trains only a new classification head on the frozen model's final class-token
# representation: the baseline that every component-wise finetuning of §5.2 should beat. The
# paper reports it per dataset in the last column of Table 6. Runs use the same protocol and code
# as notebook 05 (`finetune.run` with `config="linear"`), so they are shared with the sweeps.
#
# At demo scale (the default): the demo ViT on the six demo downstream sets, with the protocol of
# the demo finetuning sweep (its `linear` runs are these). Demo numbers are not the paper's.

# %% tags=["parameters"]
model = "demo"  # short name (demo, vit_base_in21k, ...) or any timm ViT name
datasets = ["digits", "digits_c/contrast", "digits_c/gaussian_noise", "digits_c/motion_blur", "digits_c/snow", "digits_c/speckle_noise"]  # downstream datasets
lr = 0.03  # peak learning rate of the head
seeds = [0]  # the paper: 0, 42, 3407
steps = 100  # optimisation steps
batch_size = 32  # images per step (the paper: 512)
warmup = 10  # linear warm-up steps
eval_every = 10  # validation every this many steps
device = "cpu"  # cpu or cuda
data_root = ""  # data folder ("" = $VIT_PLASTICITY_DATA or data/)

# %%
import pandas as pd

from paperlib import finetune

rows = []
for dataset in datasets:
    for seed in seeds:
        config = finetune.Config(
            model=model, dataset=dataset, config="linear", lr=lr, seed=seed, steps=steps,
            batch_size=batch_size, warmup=warmup, eval_every=eval_every, device=device, data_root=data_root,
        )
        rows.append({"dataset": dataset, "seed": seed, **finetune.run(config)})
runs = pd.DataFrame(rows)
print(f"{len(runs)} linear-probing runs, {(runs['status'] == 'finished').sum()} finished")

# %% [markdown]
# ## Test accuracy per dataset (Table 6, last column)
#
# Mean and standard deviation over seeds of the test accuracy (in %) at the best-validation
# checkpoint.

# %%
table = runs.groupby("dataset", sort=False)["test_accuracy"].agg(["mean", "std", "count"]) * [100, 100, 1]
table.columns = ["test accuracy (%)", "std over seeds", "seeds"]
table.round(2)
