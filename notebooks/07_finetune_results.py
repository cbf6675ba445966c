# %% [markdown]
# # 07 · Finetuning results (paper Tables 1 and 6; Fig. 2 right, Fig. 4 left, Figs. 17 and 18)
#
# From a directory of finetuning runs: Table 6 (test accuracy at the best learning rate, mean and
# standard deviation over seeds; its linear-probing column is notebook 04's probe of the pretrained
# model, at the last block's attention output unless `probe_point` says otherwise), Table 1 (MHA
# against every other component across benchmarks, Wilcoxon signed-rank test), the relative gain over linear probing (Fig. 2 right), the average
# over benchmarks with its pooled standard error (Fig. 17) and the spread over learning rates and
# seeds (Fig. 4 left, Fig. 18). The paper's own Table 6 ships with the project
# (`parameters/paper/table6.csv`): Table 1 is recomputed from it, and our results are shown next
# to it for the datasets both have.
#
# At demo scale (the default) the runs are those of the demo finetuning sweep (six demo datasets,
# every configuration, one learning rate, one seed), computed here when missing (a few minutes on
# a CPU). With one seed there is no standard deviation. Demo numbers are not the paper's.

# %% tags=["parameters"]
spec = "parameters/sweeps/finetune_demo.yaml"  # the sweep whose runs are summarised
model = ""  # of a spec of several models (finetune_later_vits.yaml), the one summarised ("": the spec's one model)
compute_missing = True  # run the spec's missing runs, and measure missing plasticity, first (demo scale only)
select = "test"  # learning rate chosen by test accuracy (the paper) or val (no test-set selection)
reference = None  # reference images of the plasticity beside the results (None: each dataset's default: ImageNet, or digits_source in the demo world)
n_pairs = 179  # plasticity pairs for a missing measurement (the paper: 12,800; a smaller test split gives as many as it has)
probe_point = "mha"  # Table 6's linear-probing column: probe point (notebook 04; mha: the paper's "attention hidden representation")
probe_block = -1  # ... and block (-1: the last, the paper's "last layer")
device = "cpu"  # device for missing plasticity measurements and the probe's forward passes
sgd_spec = "parameters/sweeps/finetune_paper.yaml"  # with the Adam ablation's spec: the SGD runs its authors' table sets beside it
pairwise_alternative = "two-sided"  # the test of every pair of components: two-sided, or greater (one-sided: the row better than the column)

# %%
import matplotlib.pyplot as plt
import pandas as pd

from paperlib.analysis import capacity, component_tests, summary, tables
from paperlib.measure import plasticity, probe
from paperlib.records import names, paths, specs
from paperlib.records.runs_table import KEYS, histories_of
from paperlib.reports import notebook, plots
from paperlib.sweeps.spec_runs import spec_runs
from paperlib.vit import components, models

notebook.check_parameters()  # papermill's -p of a name this notebook does not have stops here

runs, missing = spec_runs(spec, compute_missing=compute_missing, model=model)  # the tables below: one model (and its normalisation)
model = runs["model"].iloc[0]
normalize = runs["normalize"].iloc[0]
if compute_missing:  # P(f) of the runs' model on their datasets, for the Takeaway 2 test below
    wanted = [plasticity.Measurement(model, d, reference, n_pairs, normalize=normalize) for d in sorted(runs["dataset"].unique())]
    plasticity.measure_missing(wanted, device=device)
print(f"{len(runs)} runs: " + ", ".join(f"{n} {s}" for s, n in runs["status"].value_counts().items()) + f"; {len(missing)} missing")

# %%
# NBVAL_CHECK_OUTPUT
not_finished = runs[runs["status"] != "finished"][KEYS + ["status"]]
print("runs not finished:", "none" if not_finished.empty else "")
if not not_finished.empty:
    print(not_finished.to_string(index=False))
print("runs missing:", "none" if missing.empty else "")
if not missing.empty:
    print(missing.to_string(index=False))

# %% [markdown]
# ## Table 6: test accuracy (%) at the best learning rate
#
# Mean ± standard deviation over seeds (numpy's `np.std`, ddof=0, as the authors' code; the number of seeds in brackets) of
# the test accuracy at the learning rate chosen by `select`. A learning rate whose seeds are not
# all finished is not chosen. The last column, linear probing, is the paper's: a logistic
# regression on the pretrained model's features at `probe_point` of block `probe_block` (notebook
# 04, `probe.table6_column`; cached under `results/probe/`), one value per dataset. The `linear`
# configuration beside it is another baseline: a new head trained with SGD by the protocol.

# %%
probing = probe.table6_column(model, sorted(runs["dataset"].unique()), point=probe_point, block=probe_block, device=device, normalize=normalize,
                              compute=compute_missing)  # without compute_missing, the probes cached under results/probe/ only
ours = summary.summary(runs, select=select, reference=reference, probing=probing, pairwise_alternative=pairwise_alternative)  # every table below, of these runs
paper = summary.paper_summary(pairwise_alternative)  # the same tables of the paper's own Table 6
tables.formatted(ours["table6"]).rename(columns=names.LABELS)

# %%
ours_wide, paper_wide = tables.wide(ours["table6"], "mean"), tables.wide(paper["table6"], "mean")
common = sorted(set(ours_wide.index) & set(paper_wide.index))
if common:
    display(pd.concat([ours_wide.loc[common], paper_wide.loc[common].add_suffix(" (paper)")], axis=1).round(2))
else:
    print("No dataset in common with the paper's Table 6 (demo scale): the paper's table follows.")
paper_wide.rename(columns=names.LABELS)

# %% [markdown]
# ## Table 1: MHA against the other components
#
# Mean decrease in accuracy points from MHA to each component over the benchmarks, with a
# Wilcoxon signed-rank test across benchmarks (scipy, on the seed-averaged accuracies paired by
# benchmark, a benchmark where both are equal left out; significant at 5%). It counts each of the eleven
# benchmarks as independent, Cifar10's five corruptions included, as the paper's does. **The test is
# one-sided** (`alternative="greater"`: is MHA better?), as the authors' code computes it; the paper
# says only "a Wilcoxon signed-rank test". The two-sided test is `component_tests.table1(...,
# alternative="two-sided")`: on the paper's own Table 6 it doubles each p-value and gives the same
# bold entries. From the paper's own Table 6, the decreases are FC1 0.07, FC2 0.44, LN1 0.93, LN2
# 0.82 with the same significance pattern as the paper's Table 1, which prints LN1 0.8 and LN2 0.9:
# its two LayerNorm columns look swapped.
#
# Beyond the paper, `p_holm` adjusts the p-values for the four comparisons made (Holm's method,
# which controls the chance of any false positive among them): on the paper's own Table 6 the three
# significant decreases stay significant one-sided (LN2: p = 0.021, 0.042 adjusted); two-sided (the
# second table), MHA's lead over LN2 (p = 0.042, 0.084 adjusted) would not.

# %%
display(pd.concat({"paper's Table 6, one-sided": paper["table1"].set_index("component"), "ours, one-sided": ours["table1"].set_index("component")}, axis=1).round(4))
component_tests.table1(paper["table6"].rename(columns={"mean": "accuracy"}), alternative="two-sided").set_index("component").round(3).rename_axis("paper's Table 6, two-sided")

# %% [markdown]
# Every pair of components (beyond the paper, whose Table 1 compares MHA with each): the Wilcoxon
# signed-rank test of Table 1 on the same two decimals, so that a pair both tables test gets one p-value,
# but **two-sided** by default where Table 1 is one-sided (`pairwise_alternative = "greater"`: one-sided,
# the row better than the column). The mean difference in accuracy points (row minus column) over the
# datasets, and in brackets the p-value, Holm-adjusted over the ten pairs; `*` where it is below 5%. The
# line under each matrix names the pairs below 5%, from the numbers above it. Which pairs stay there
# depends on the sidedness: on the paper's Table 6, FC1 over FC2 (its differences tie at 0.18 points on
# Cifar10 and DomainNet Sketch at the table's two decimals) has p 0.0029 one-sided and 0.0059 two-sided
# before the adjustment, and Holm's ten pairs (x 9 for it) leave it below 5% one-sided only.

# %%
for name, summarised in (("paper's Table 6", paper), ("ours", ours)):
    sides = "two-sided" if pairwise_alternative == "two-sided" else "one-sided"
    display(component_tests.formatted_pairs(summarised["pairwise"]).rename(index=names.LABELS, columns=names.LABELS).rename_axis(f"{name}, {sides}"))
    print(f"{name}: " + component_tests.below(summarised["pairwise"], pairwise_alternative))

# %% [markdown]
# ## Relative gain over linear probing (Fig. 2 right) and the average over benchmarks (Fig. 17)
#
# At demo scale the gain is far below the paper's (both in the headline below) because the two sides
# are not trained alike: each run stops after 60 SGD steps at batch 32 (the paper's: 4,000 to 20,000
# at batch 512, Table 5), while the probe is a logistic regression fitted to convergence. MHA's and the
# probe's test accuracy on `digits` are printed below. Trained longer
# (`python -m paperlib finetune --steps N`, runs outside the demo sweep), MHA on `digits` gains over the probe
# in the paper's order.
# Table 1 differs too: MHA is the demo ViT's least plastic component (notebook 02), and the paper's
# Takeaway 2 ties finetuning performance to plasticity.

# %%
table6 = ours["table6"].set_index(["dataset", "component"])["mean"]
steps = specs.load_spec(paths.ROOT / spec)["parameters"].get("steps")  # the demo spec's steps (a paper spec's vary)
if model == "demo" and {("digits", "mha"), ("digits", tables.PROBE)} <= set(table6.index):  # the numbers the text above cites
    print(f"digits: MHA {table6['digits', 'mha']:.1f}% test accuracy after {steps} steps, "
          f"linear probing {table6['digits', tables.PROBE]:.1f}%")

# %%
probed = tables.PROBE in set(ours["table6"]["component"])  # without a cached probe (compute_missing False): no Fig. 2 right
gain = tables.relative_gain(ours["table6"], value="mean") if probed else None
average = tables.average(ours["table6"])
plots.gain_figure(gain, average, spec, select)
plt.show()

# %%
decrease = ours["table1"].set_index("component")
paper_gain = tables.relative_gain(paper["table6"], value="mean")["mha"].mean()
why = (f"{steps}-step runs against a fully fitted probe (the paper's: 4,000-20,000 steps), "
       "and MHA is the demo ViT's least plastic component (notebook 02)") if model == "demo" else None  # the section above
notebook.headline("MHA minus " + ", ".join(f"{names.LABELS[c]} {row.decrease:+.2f} (one-sided p {row.p_value:.2f})" for c, row in decrease.iterrows())
                  + f" points over {ours['table6']['dataset'].nunique()} datasets"
                  + (f"; MHA {gain['mha'].mean():+.1f}% over linear probing" if probed else ""),
                  paper=f"FC1 0.07, FC2 0.44, LN1 0.8, LN2 0.9 points (Table 1; all but FC1 p < 0.05); MHA {paper_gain:+.1f}% over linear probing (Fig. 2, right)",
                  why=why)

# %% [markdown]
# ## Robustness over learning rates and seeds (Fig. 4 left on Sketch, Fig. 18 on every benchmark)
#
# One panel per dataset, as the authors draw it: test accuracy of every run of the grid (a run that
# diverged keeps its best-validation checkpoint's, and is counted under its configuration), full
# finetuning as a dashed line at its mean.

# %%
plots.robustness_figure(runs, spec)
plt.show()

# %% [markdown]
# ## The Adam ablation as the authors report it (their `ablation.py`, not in the paper)
#
# Table 6 above is the package's reading of these runs: each configuration at its best learning rate, mean ±
# standard deviation over seeds. The authors' code reports its AdamW ablation (`parameters/sweeps/ablation_adam.yaml`:
# Table 5's learning rates divided by 100) otherwise: seed 0 alone, mean ± standard deviation (ddof=0) of the test
# accuracy over the four learning rates, at one decimal, beside the SGD runs of the main grid (`sgd_spec`), and its
# average over the four benchmarks (`tables.authors_ablation`); a cell short of a learning rate says how many it has
# instead of averaging fewer. Their figure is DomainNet Sketch's: seed 0's test accuracy over the learning rates per
# component, Adam beside SGD, then the gradient norm and validation loss of the Adam runs at lr 1e-4 (1e-2 / 100).

# %%
adam = (runs["optimizer"] == "adamw").all()
if adam:  # the SGD side: the runs of sgd_spec already there, of this model and normalisation (never computed here)
    sgd_runs, sgd_missing = spec_runs(sgd_spec, compute_missing=False, required=False)
    sgd_runs = sgd_runs[(sgd_runs["model"] == model) & (sgd_runs["normalize"] == normalize)]
    if sgd_runs.empty:
        print(f"no run of {sgd_spec}: the Adam side alone")
    display(tables.authors_ablation(runs, sgd_runs, seed=0, missing=pd.concat([missing, sgd_missing[sgd_missing["model"] == model]])))
else:
    print(f"this section reads the Adam spec (parameters/sweeps/ablation_adam.yaml); {spec}'s runs are not AdamW runs")

# %%
if adam and "domainnet/sketch" in set(runs["dataset"]):
    drawn = runs[(runs["dataset"] == "domainnet/sketch") & (runs["seed"] == 0) & (runs["lr"] == 1e-4)]  # their curves' runs
    plots.adam_ablation_figure(runs, sgd_runs, histories_of(drawn, ["grad_norm", "val_loss"]), spec, "domainnet/sketch", lr=1e-4, seed=0)
    plt.show()
elif adam:
    print("no Adam run on domainnet/sketch yet: the authors' figure is of it")

# %% [markdown]
# ## Beyond the paper: does plasticity predict the result?
#
# The paper's Takeaway 2 (§5.2) reads: "a higher plasticity facilitates the optimization and leads
# to better and more stable finetuning performance". Here it is a test. Per dataset, Kendall's tau
# between the five components' P(f) (notebook 02's measurement of this model on this dataset,
# measured here when missing) and (a) their Table 6 accuracy, (b) the spread (standard deviation)
# of their test accuracy over every run of the grid, learning rates and seeds (the boxes above;
# over the cells of the grid where every component finished, so that a component is not made to
# look steadier by the runs it lost to divergence, which are counted beside): the paper's reading
# predicts tau > 0 for accuracy and tau < 0 for spread (each dataset's p: Kendall's exact test, two-sided). Across
# datasets, a two-sided Wilcoxon signed-rank test of the taus against 0, as Table 1 tests across benchmarks. With five
# components one dataset alone can barely be significant (a perfect order's exact two-sided p is 2/5!, two
# of the orderings of five), and the benchmarks are not independent (five of the paper's
# eleven are corruptions of one Cifar10 test set): the Wilcoxon p counts them as independent, so each
# summary also gives the count and two-sided sign test by family (`family_p_value`: Cifar10 and its corruptions
# as one unit, a family's mean tau), the test to read.
#
# The paper prints no P(f) table, but finds the same ranking on every benchmark (Fig. 2 middle):
# with that ranking as the order, its own Table 6 gives the "paper" rows (its standard deviations
# are over seeds at the best learning rate, not over the grid, which it shows only as boxes).
#
# At demo scale the grid has one learning rate and one seed, so there is no spread to correlate,
# and the demo ViT's plasticity ranking is not the paper's (notebook 02): read its taus as what
# this small model measures, not as a check of the paper.

# %%
datasets = sorted(ours["table6"]["dataset"].unique())
measured, source = component_tests.plasticity_for(runs, reference)  # where none is saved (paper scale before the plasticity sweep), the paper's ranking
if source == "paper":
    print("no P(f) saved for these runs: the paper's ranking (MHA > FC1 > FC2 > LN2 > LN1) stands in for it, as for its own Table 6")
else:
    print(f"P(f) of {model} on {measured['dataset'].nunique()} of {len(datasets)} datasets"
          + ("" if measured["dataset"].nunique() == len(datasets) else f"; none on {', '.join(sorted(set(datasets) - set(measured['dataset'])))}"))
takeaway2 = pd.concat({"ours": ours["takeaway2"], "paper's Table 6": paper["takeaway2"]}).drop(columns="plasticity")
takeaway2.index = [f"{source}: {value}" for source, value in takeaway2.index]
takeaway2.rename_axis("Kendall's tau of P(f) with").round(3)

# %%
shown = measured.merge(ours["table6"][["dataset", "component", "mean"]], on=["dataset", "component"])
taus = pd.concat([ours["accuracy_tau"].assign(source="ours"), paper["accuracy_tau"].assign(source="paper's Table 6")])
plots.accuracy_tau_figure(shown, taus, model, spec, select)
plt.show()

# %%
diverged = tables.grid_spread(runs).groupby("dataset")[["diverged", "cells"]].agg({"diverged": "sum", "cells": "max"}).rename(columns={"diverged": "diverged runs", "cells": "grid cells"})
ours["accuracy_tau"].merge(ours["spread_tau"][["dataset", "tau", "p_value"]], on="dataset", how="left", suffixes=("", " (spread)")).merge(diverged, on="dataset", how="left").round(3)


# %% [markdown]
# ## Beyond the paper: plasticity or capacity?
#
# On ViT-Base/16 the paper's plasticity order (MHA > FC1 > FC2 > LN2 > LN1) is also, nearly, the
# order of the components' parameters (Table 3: MHA, FC1 and FC2 hold 33% of the model each, LN2 and
# LN1 0.02%), so Table 6 cannot tell plasticity from capacity. Two
# analyses separate them (`paperlib.analysis.capacity`). **Within equal capacity** (MHA / FC1 / FC2 and
# LN2 / LN1, components within 10% of each other's parameters): Kendall's S between P(f) and accuracy
# inside each group and dataset, tested by an exact two-sided permutation of the accuracies within each stratum
# (dataset x group), with each adjacent pair's win count, two-sided sign test and Holm adjustment, and the same by
# dataset family (Cifar10 and its corruptions as one unit). **Discordant pairs**: pairs of components
# that plasticity and capacity order differently, tested (two-sided) by permuting the accuracies among the
# components, one permutation for all the datasets and seeds of a family (a run enters several pairs, and
# the corruptions of one test set are one unit), each component at its learning rate chosen on validation. On the paper's Table 6 with its ranking, the stratified test, with one permutation for
# every dataset of a family, is not significant over its 22 strata (`p_value`; `p_value_by_dataset` counts the
# corruptions as independent), and the evidence is one pair: FC1 beats FC2 on 9 of 11 benchmarks (not significant
# even with the corruptions counted separately), MHA beats FC1 on 5 and LN2 beats LN1 on 6; by family the MHA / FC1 / FC2 order holds in
# 5 of 6 (p = 0.22). Within equal capacity, only FC1 over FC2 is consistent across benchmarks. No pair
# is discordant there (the two orders agree). The demo ViT's plasticity order runs against its capacity,
# but every such pair sets a LayerNorm against a linear layer: a result that follows capacity cannot be
# told from LayerNorms adapting worse as a kind of module.

# %%
share = components.parameter_share(models.architecture(model))
paper_share = components.parameter_share(models.architecture("vit_base_in21k"))
print("parameter share (%):", ", ".join(f"{names.LABELS[c]} {100 * v:.2f}" for c, v in share.items()), f"({model})")
accuracy = {"ours": ours["table6"].rename(columns={"mean": "accuracy"}),
            "paper's Table 6": paper["table6"].rename(columns={"mean": "accuracy"})}
order = component_tests.paper_order(sorted(paper["table6"]["dataset"].unique()))
within = {name: capacity.within_capacity(p, accuracy[name], s)
          for name, p, s in (("ours", measured, share), ("paper's Table 6", order, paper_share))}
display(pd.concat({name: w.summary for name, w in within.items()}).round(3))
display(pd.concat({name: w.pairs for name, w in within.items()}).round(3))
display(pd.concat({name: w.family_pairs for name, w in within.items()}).round(3))

# %%
by_validation = tables.table6(runs, select="val")[["dataset", "component", "lr"]]  # each component's learning rate, chosen on validation
chosen = runs.merge(by_validation, on=["dataset", "component", "lr"])
chosen = chosen[chosen["status"].isin(["finished", "diverged"])].dropna(subset=["test_accuracy"]).rename(columns={"test_accuracy": "accuracy"})
pairs = capacity.discordant_pairs(measured, chosen, share)
print(f"{model}: pairs that plasticity and capacity order differently, over datasets and seeds (learning rates chosen on validation)"
      if len(pairs) else f"{model}: no pair of components that plasticity and capacity order differently")
print(capacity.layernorm_confound(pairs))
families, n_datasets = chosen["dataset"].map(names.family).nunique(), chosen["dataset"].nunique()
if len(pairs):  # a corruption counts with the dataset it corrupts (names.family): its runs share that test set
    print(f"{n_datasets} datasets in {families} famil{'y' if families == 1 else 'ies'}: one permutation relabels the components of a family's datasets together")
pairs.round(4)
