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
compute_missing = True  # run the spec's missing runs for this dataset, and measure its missing plasticity, first (demo scale only)
reference = None  # reference images of the plasticity (None: each dataset's default: ImageNet, or digits_source in the demo world)
n_pairs = 179  # plasticity pairs for a missing measurement (the paper: 12,800; a smaller test split gives as many as it has)
device = "cpu"  # device for a missing plasticity measurement

# %%
import matplotlib.pyplot as plt

from paperlib.analysis import component_tests, plasticity_table, tables
from paperlib.measure import plasticity
from paperlib.records import names
from paperlib.records.runs_table import histories_of
from paperlib.reports import notebook, plots
from paperlib.sweeps.spec_runs import spec_runs

notebook.check_parameters()  # papermill's -p of a name this notebook does not have stops here

runs, _ = spec_runs(spec, compute_missing=compute_missing, only={"dataset": [dataset], "seed": [seed]})
# the histories this notebook draws, and only those: at this seed, on this dataset or at this learning rate
drawn = runs[(runs["seed"] == seed) & ((runs["dataset"] == dataset) | (runs["lr"] == lr))]
histories = histories_of(drawn, ["grad_norm", "val_loss"])
shown = histories[(histories["dataset"] == dataset) & (histories["seed"] == seed)]
print(f"{shown.groupby(['component', 'lr']).ngroups} runs on {dataset} (seed {seed})")

# %% [markdown]
# ## Gradient norm and validation loss per component (Fig. 4, middle and right)

# %%
one = shown[shown["lr"] == lr]
plots.dynamics_figure(one, spec, dataset, lr, seed)
plt.show()

# %% [markdown]
# Mean gradient norm over the first fifth of training, per component, ranked: the paper expects
# the plasticity order MHA > FC1 > FC2 > LN2 > LN1 (with `full` above all, having every weight).

# %%
early = tables.early_gradient_norm(one, runs, 0.2).set_index("component")["grad_norm"].sort_values(ascending=False)
early.rename(index=names.LABELS).round(3).to_frame("mean gradient norm, first 20% of steps")

# %%
notebook.headline(f"{dataset}, lr {lr:g}: mean gradient norm over the first 20% of steps " + " > ".join(names.LABELS[c] for c in early.index),
                paper="gradient norms in the plasticity order MHA > FC1 > FC2 > LN2 > LN1 (Fig. 4, middle)")

# %% [markdown]
# ## Beyond the paper: gradient norm against the measured plasticity
#
# The figure's reading ("the higher plasticity, the larger gradient norms") as a number: Kendall's
# tau between the five components' P(f) (notebook 02's measurement of this model, measured here
# for this dataset when missing) and their early gradient norm, on every dataset of the spec with
# runs at this learning rate and seed, and a Wilcoxon signed-rank test of the taus across datasets
# (notebook 07 does the same for accuracy and its spread). The paper predicts tau > 0. Runs that
# diverged are left out (one whose loss turned NaN stopped early: its first 20% is another window); they are
# likely the components of the largest gradients, which biases tau against the paper's reading:
# their number is printed.

# %%
at = histories[(histories["lr"] == lr) & (histories["seed"] == seed)]
norms = tables.early_gradient_norm(at, runs, 0.2)  # finished runs only: a diverged one may have stopped early
if norms.empty:
    print(f"no finished run at lr {lr:g} and seed {seed}")
else:
    model, normalize = norms["model"].iloc[0], norms["normalize"].iloc[0]
    if compute_missing:
        plasticity.measure_missing([plasticity.Measurement(model, dataset, reference, n_pairs, normalize=normalize)], device=device)
    measured = plasticity_table.collect(normalize=normalize, reference=reference or "default")
    per_dataset = component_tests.plasticity_correlation(measured[measured["model"] == model], norms[norms["model"] == model], value="grad_norm")
    lost = runs.query("lr == @lr and seed == @seed and status == 'diverged'")
    print(f"{model}, lr {lr:g}, seed {seed}: {len(per_dataset)} dataset(s) with P(f) and runs ({len(lost)} diverged runs left out);",
          ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in component_tests.correlation_summary(per_dataset).items()))
    display(per_dataset.round(3))

# %% [markdown]
# ## Over the learning-rate grid (Figs. 19-51)

# %%
plots.dynamics_grid_figure(shown, spec, dataset, seed)
plt.show()
