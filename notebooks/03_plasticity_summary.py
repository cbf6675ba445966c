# %% [markdown]
# # 03 · Plasticity across datasets and models (paper Fig. 2 middle, Fig. 3 right)
#
# Reads every plasticity result saved by notebook 02 (or by a sweep of it) under
# `results/plasticity/<model>/<dataset>/`, pools P(f) per component across datasets, compares
# models, and tabulates the ranking per dataset. The paper finds the same ranking,
# MHA > FC1 > FC2 > LN2 > LN1, on all 11 benchmarks for ViT-Base and ViT-Huge.
#
# At demo scale (the default), results missing for the demo model on the demo datasets are
# computed first (seconds on a CPU). Demo numbers are not the paper's.

# %% tags=["parameters"]
compute_missing = True  # measure (model, dataset) pairs of the lists below that have no saved result
models = ["demo"]  # models to measure when missing (short names or timm ViT names)
datasets = ["digits", "digits_c/contrast", "digits_c/gaussian_noise", "digits_c/motion_blur", "digits_c/snow", "digits_c/speckle_noise"]  # downstream datasets
reference = "digits_source"  # reference images for missing results (the paper: imagenet)
n_pairs = 179  # pairs per missing result (the paper: 12,800)
batch_size = 64  # pairs per batch
device = "cpu"  # cpu or cuda
inputs = "embedding"  # embedding (the paper's definition) or in_situ
sample = "first"  # results whose pairs were drawn this way: first (the authors' pair set), once (each image at most once) or random (notebook 02's sample)
seed = 0  # the seed of random draws to read and compute
normalize = "imagenet"  # results whose images were normalised this way: imagenet (the paper) or model (notebook 02's normalize)
data_root = None  # data folder (default: $VIT_PLASTICITY_DATA or data/)
include_all_results = False  # also show saved results of models and datasets not listed above

# %%
import matplotlib.pyplot as plt

from paperlib.analysis import plasticity_table, ranking
from paperlib.measure import plasticity
from paperlib.records import measurements
from paperlib.reports import notebook, plots

notebook.check_parameters()  # papermill's -p of a name this notebook does not have stops here

if compute_missing:
    wanted = [plasticity.Measurement(m, d, reference, n_pairs, inputs, sample, seed, normalize) for m in models for d in datasets]
    plasticity.measure_missing(wanted, batch_size=batch_size, device=device, data_root=data_root)
against = "default" if all(reference == measurements.default_reference(d) for d in datasets) else reference  # each dataset's own, or the one asked for
summary = plasticity_table.collect(inputs, sample=sample, seed=seed if sample == "random" else None, normalize=normalize, reference=against)
if not include_all_results:
    summary = summary[summary["model"].isin(models) & summary["dataset"].isin(datasets)]
print(f"{len(summary) // 5} results: {summary['model'].nunique()} model(s) x {summary['dataset'].nunique()} dataset(s)")

# %% [markdown]
# ## Pooled across datasets (Fig. 2, middle)
#
# Left, the authors' summary: for each component, a box of its P(f) in every block of every
# dataset (one value per block and dataset: 12 blocks x 11 datasets for ViT-Base at paper scale),
# one panel per model (the paper's Fig. 2 shows ViT-Base); whiskers reach 1.5 interquartile ranges
# and points beyond them are not drawn, as in the authors' figure. Right, the package's richer
# view: each point is P(f) of one component on one dataset (averaged over blocks), the bar their
# mean over datasets, so a dataset that departs from the others stands out.

# %%
layers = plasticity_table.collect(inputs, sample=sample, seed=seed if sample == "random" else None, normalize=normalize, reference=against, by_block=True)
layers = layers.merge(summary[["model", "dataset"]].drop_duplicates())  # the results the summary shows
plots.pooled_figure(summary, layers)
plt.show()

# %%
pooled = ranking.pooled_order(summary)  # per model: the components by P(f) averaged over datasets, and tau with the paper's order
token_rms = summary.groupby("model")["token_rms"].mean()
whys = {row.model: notebook.token_scale_why(row.tau, token_rms[row.model]) for row in pooled.itertuples()}
notebook.headline("; ".join(f"{row.model}: {row.order} (Kendall's tau {row.tau:.2f})" for row in pooled.itertuples()) + f", P(f) averaged over {summary['dataset'].nunique()} datasets",
                paper="MHA > FC1 > FC2 > LN2 > LN1 (Fig. 2, middle)", why="; ".join(f"{m}: {why}" for m, why in whys.items() if why) or None)

# %% [markdown]
# ## Models side by side (Fig. 3, right: ViT-Base vs ViT-Huge at paper scale)
#
# P(f) averaged over blocks, per model. The paper's Fig. 3 (right) draws ViT-Huge's P(f) along
# depth on one dataset, with its band: notebook 02 with `model="vit_huge_in21k"`.

# %%
summary.pivot_table(index="component", columns="model", values="plasticity", aggfunc="mean", observed=True).round(3)

# %% [markdown]
# ## Beyond the paper: the scale of the embeddings
#
# Each result records the RMS norm of the tokens it was measured on (`token_rms`). A LayerNorm's
# rate falls as one over the scale of its input while a linear map's does not change (notebook 02's
# scale curve), so the ranking depends on it: ViT-Base/16 (ImageNet-21k) has tokens of RMS norm about
# 19 (Fig. 6's r), which puts the LayerNorms last; a model with small tokens, such as the demo ViT,
# puts them first.

# %%
summary.groupby(["model", "dataset"])["token_rms"].first().unstack("model").round(2)

# %% [markdown]
# ## Ranking per dataset
#
# Rank 1 is the most plastic component for that model and dataset; the paper's ranking is
# MHA 1, FC1 2, FC2 3, LN2 4, LN1 5 on every dataset.

# %%
# NBVAL_CHECK_OUTPUT
ranks = summary.pivot_table(index=["model", "dataset"], columns="component", values="rank", observed=True).astype(int)
print(ranks.to_string())
