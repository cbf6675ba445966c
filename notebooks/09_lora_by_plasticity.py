# %% [markdown]
# # 09 · LoRA on the components of high plasticity (beyond the paper: its §7 future work)
#
# The paper finetunes each component's own weights (§5.2) and proposes, as future work, "applying
# LoRa only to the components with high plasticity" (§7). This notebook runs that comparison:
# LoRA of rank r on the weight matrices of one component in every block (MHA: the q/k/v and
# output projections; FC1; FC2), or of all of them (the usual LoRA of a ViT), with the head and
# the final LayerNorm trained as in the component-wise protocol, against finetuning the same
# components' own weights (`paperlib.vit.lora`; LayerNorms have no weight matrix for LoRA). One run is
# `papermill notebooks/05_finetune.ipynb out.ipynb -p component mha -p method lora -p lora_rank 8`.
#
# At demo scale (the default) the runs are those of `parameters/sweeps/lora_demo.yaml`: the demo
# ViT on digits, rank 4 and the components' own weights, three learning rates, one seed, computed
# here when missing (a few minutes on a CPU). At paper scale, run
# `parameters/sweeps/lora_paper.yaml` and set `spec` to it and `plain_spec` to
# `parameters/sweeps/finetune_paper.yaml`. Demo numbers are not the paper's, and one seed on one
# small dataset decides nothing.

# %% tags=["parameters"]
spec = "parameters/sweeps/lora_demo.yaml"  # the sweep of LoRA runs (at demo scale it also holds the runs of the components' own weights)
plain_spec = ""  # a sweep whose component-wise runs to compare with ("": those of spec); paper scale: parameters/sweeps/finetune_paper.yaml
compute_missing = True  # run the specs' missing runs first (demo scale only)
select = "test"  # learning rate chosen by test accuracy (as the paper's Table 6) or val (no test-set selection)
reference = "digits_source"  # reference images for the plasticity of the model (the paper: imagenet)
n_pairs = 179  # plasticity pairs when a result is missing (the paper: 12,800)
device = "cpu"  # device for missing plasticity measurements and runs
data_root = None  # data folder (default: $VIT_PLASTICITY_DATA or data/)

# %%
import matplotlib.pyplot as plt
import pandas as pd

from paperlib.analysis import lora_comparison, plasticity_table
from paperlib.measure import plasticity
from paperlib.records import names
from paperlib.reports import notebook, plots
from paperlib.sweeps.spec_runs import spec_runs

notebook.check_parameters()  # papermill's -p of a name this notebook does not have stops here

runs, missing = spec_runs(spec, plain_spec, compute_missing=compute_missing)
runs = lora_comparison.with_method(runs)
print(f"{len(runs)} runs of {runs['model'].nunique()} model(s) on {runs['dataset'].nunique()} dataset(s): "
      + ", ".join(f"{n} {m}" for m, n in runs["method"].value_counts(sort=False).items()))

# %%
# NBVAL_CHECK_OUTPUT
not_finished = runs[runs["status"] != "finished"][["dataset", "component", "method", "lr", "seed", "status"]]
print("runs not finished:", "none" if not_finished.empty else "\n" + not_finished.to_string(index=False))
print("runs missing:", "none" if missing.empty else "\n" + missing.to_string(index=False))

# %% [markdown]
# ## Accuracy at each method's best learning rate (as the paper's Table 6)
#
# For each dataset, configuration and method: the learning rate chosen by `select`, the test
# accuracy (%, mean ± standard deviation over seeds) there, and the parameters that train (the
# LoRA updates or the component, with the head and the final norm). Each method gets its own
# learning rate: LoRA's updates start at zero and take larger ones. For `full` the two are not the
# same parameters: the weights' run trains every parameter (LayerNorms and embeddings too), LoRA's
# the updates of the four weight matrices of each block (with the head and the final norm).

# %%
table = lora_comparison.comparison(runs, select=select)
shown = table.assign(configuration=table["component"].map(names.LABELS))
shown.set_index(["dataset", "configuration", "method"]).drop(columns="component").round(2)

# %% [markdown]
# ## Per component, averaged over datasets
#
# Left: test accuracy at each method's best learning rate, components in the paper's plasticity
# order (MHA > FC1 > FC2), then all of them. Right: the same against the parameters that train.

# %%
methods = list(dict.fromkeys(table["method"]))
average = table.groupby(["component", "method"], as_index=False)[["mean", "trainable_parameters"]].mean()
by_method = average.pivot(index="component", columns="method", values="mean")
notebook.headline("test accuracy (%), " + " / ".join(methods) + ": " + ", ".join(
    f"{names.LABELS[c]} " + " / ".join(f"{by_method.loc[c, m]:.1f}" for m in methods) for c in names.ADAPTABLE if c in by_method.index))
adapted = [c for c in names.ADAPTABLE if c in set(average["component"])]
plots.lora_figure(average, runs["model"].unique())
plt.show()

# %% [markdown]
# ## Over the learning-rate grid (as the paper's Fig. 4, left)
#
# Test accuracy at every learning rate (mean over datasets and seeds; a diverged run counts as
# missing). The paper finds high-plasticity components both better and steadier across learning
# rates when their weights train; here the same question for their LoRA updates.

# %%
finished = runs[runs["status"] == "finished"]
grid = finished.groupby(["component", "method", "lr"], as_index=False)["test_accuracy"].mean()
plots.lora_lr_figure(grid, runs["model"].unique())
plt.show()

# %% [markdown]
# ## Plasticity of the components (paper §5.1)
#
# The model's plasticity P(f) per component on the datasets of these runs (notebook 02; measured
# here when missing), beside the accuracy of each method on that component. The paper's
# hypothesis, carried over to LoRA: the components of higher plasticity adapt better. The demo
# ViT, trained from scratch on a few thousand digits, need not share the ranking the paper
# measures on pretrained ViTs (MHA > FC1 > FC2); compare the orders within this table.

# %%
measured_as = runs[["model", "dataset", "normalize"]].drop_duplicates()  # plasticity on images normalised as the runs' were
for model, dataset, normalize in measured_as.itertuples(index=False):
    if compute_missing:
        measurement = plasticity.Measurement(model, dataset, reference, n_pairs, normalize=normalize)
        plasticity.measure_missing([measurement], device=device, data_root=data_root)
measured = plasticity_table.collect(reference=reference, normalize=None).merge(measured_as, on=["model", "dataset", "normalize"])
side = (measured[measured["component"].isin(adapted)].groupby("component", observed=True)["plasticity"].mean()
        .rename("P(f)").to_frame())
side = side.join(average.pivot(index="component", columns="method", values="mean")[methods].add_prefix("accuracy (%), "))
side.index = side.index.map(names.LABELS)
side.round(3)
