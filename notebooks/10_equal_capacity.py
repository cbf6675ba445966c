# %% [markdown]
# # 10 · Plasticity, not size: Takeaway 2 at equal capacity (beyond the paper)
#
# Takeaway 2 (§5.2): the more plastic a component, the better and steadier its finetuning. On
# ViT-Base/16 the paper's plasticity order (MHA > FC1 > FC2 > LN2 > LN1) is also nearly the order of
# the components' sizes (MHA, FC1 and FC2 33% of the model each, LN2 and LN1 0.02%: Table 3), so Table 6
# cannot tell "more plastic" from "larger", nor from "is a LayerNorm" (notebook 07, `paperlib.analysis.capacity`).
# An experiment can: here MHA, FC1 and FC2 each train a fixed random subset of their weights and
# biases as large as a LayerNorm (2d parameters per block; `paperlib.vit.equal_capacity`), the rest frozen,
# with the paper's protocol otherwise, so that the five components train the same number of
# parameters. LN2 and LN1 train whole in either design: their runs are the ordinary ones.
#
# Per dataset, Kendall's tau between P(f) and accuracy over the five components, in the ordinary
# design and at equal capacity; across datasets, the exact permutation test of the summed Kendall's S
# (the accuracies permuted among the components, one permutation for every dataset of a family;
# `p_value_by_dataset` permutes each dataset on its own) and a sign test by dataset family,
# which counts the corruptions of one test set once. At demo scale (the default): the demo ViT on the two
# demo sets whose components are least alike (`parameters/sweeps/equal_capacity_demo.yaml`, one seed, one
# learning rate; its runs are counted below), computed here when missing; both sets are digits, one family, so
# the family test has nothing to say. At paper scale, `parameters/sweeps/equal_capacity_paper.yaml` (ViT-Base on
# four benchmarks of four families, the paper's three seeds) measures Kendall's tau of P(f) with accuracy in both
# designs and tests their difference (`result.difference`: the design labels swapped for each component, one swap
# for every dataset of a family, exact; `smallest_p` is the lowest p the families at hand allow). With four
# families the family sign test cannot go below 2 × 0.5⁴ = 0.125, so it can never be significant there. A result
# that is not significant means the spec did not detect a difference, not that equal sizes keep the order.

# %% tags=["parameters"]
spec = "parameters/sweeps/finetune_demo.yaml"  # the ordinary runs: the equal design's LN2 and LN1, and the comparison
equal_spec = "parameters/sweeps/equal_capacity_demo.yaml"  # the equal-capacity runs of MHA, FC1 and FC2
compute_missing = True  # run the specs' missing runs, and measure missing plasticity, first (demo scale only)
select = "val"  # each component at its own best learning rate, chosen on validation (or test, as the paper's Table 6)
reference = None  # reference images of the plasticity (None: each dataset's default)
n_pairs = 179  # plasticity pairs for a missing measurement (the paper: 12,800)
device = "cpu"  # device for missing plasticity measurements
power_spec = "parameters/sweeps/equal_capacity_paper.yaml"  # the design whose power is said below (its benchmarks)

# %%
import matplotlib.pyplot as plt
import pandas as pd

from paperlib.analysis import capacity, component_tests, tables
from paperlib.measure import plasticity
from paperlib.records import names, paths, specs
from paperlib.reports import notebook, plots
from paperlib.sweeps.spec_runs import spec_runs
from paperlib.vit import equal_capacity, models

notebook.check_parameters()  # papermill's -p of a name this notebook does not have stops here

equal_runs, _ = spec_runs(equal_spec, compute_missing=compute_missing)
model = equal_runs["model"].iloc[0]
ordinary_runs, _ = spec_runs(spec, compute_missing=compute_missing, model=model)
datasets = sorted(equal_runs["dataset"].unique())
if compute_missing:
    wanted = [plasticity.Measurement(model, d, reference, n_pairs) for d in datasets]
    plasticity.measure_missing(wanted, device=device)
print(f"{len(equal_runs)} equal-capacity runs of {model} on {', '.join(datasets)}: "
      + ", ".join(f"{n} {s}" for s, n in equal_runs["status"].value_counts().items()))

# %% [markdown]
# ## What trains (Table 3's layout)
#
# Per component, the parameters an equal-capacity run trains per block and over all blocks, their share
# of the component, and with the head and the final LayerNorm, which train in every run: the five match.

# %%
# NBVAL_CHECK_OUTPUT
architecture = models.architecture(model, num_classes=5)
equal_capacity.parameter_table(architecture)

# %% [markdown]
# ## Accuracy in both designs
#
# Test accuracy (%) at the learning rate `select` chooses, per dataset and component; the equal
# design's LN2 and LN1 are the ordinary runs.

# %%
result, source = capacity.at_equal_capacity_of_runs(ordinary_runs, equal_runs, select, reference)
print(f"P(f): {source}")
result.accuracies.round(2)

# %% [markdown]
# ## How the chosen runs trained
#
# Per design, the learning rate each component was compared at, whether it is the top of the grid tried (a better
# one may lie above it), and, over its seeds, how often clipping at norm 1 cut the gradient and the component's share
# of the norm it cut: in an equal-capacity run the head and the final LayerNorm set most of that norm, so the two
# designs are not clipped alike. A subset run trains without weight decay, which is refused for it.

# %%
trained = capacity.how_they_trained(ordinary_runs, equal_runs, select)
at_top = trained[trained["at top"] & (trained["rates"] > 1)]
print(f"{len(at_top)} chosen learning rate(s) at the top of a grid of several" if len(at_top) else
      "no chosen learning rate at the top of a grid of several" if (trained["rates"] > 1).any() else
      "one learning rate per component: whether a higher one would be better is not tried at this scale")
trained.round(3)

# %% [markdown]
# ## Accuracy against P(f) in both designs
#
# Per design, each component's test accuracy against its P(f), relative to its dataset's mean over the five
# components, each dataset's points joined in plasticity order: Takeaway 2 predicts a rising line in both.

# %%
measured, _ = component_tests.plasticity_for(ordinary_runs, reference)  # the P(f) the tests above use
plots.equal_capacity_figure(result.accuracies, measured, model, equal_spec, select)
plt.show()

# %% [markdown]
# ## Kendall's tau of P(f) with accuracy, ordinary and at equal capacity
#
# Per dataset, then across datasets: the mean tau, the summed S and its exact permutation p-value,
# and the family sign test.

# %%
# NBVAL_CHECK_OUTPUT
display(result.per_dataset.round(3))
result.summary

# %%
result.difference  # whether the two designs differ (one demo family: nothing it can detect)

# %% [markdown]
# ## Can the design test decide? Its power, before any run
#
# Where `smallest_p` is above 0.05, no outcome of the runs at hand could be significant. How often that holds is a
# property of the design (its families and seeds), not of its result: here, in worlds drawn from the paper's
# Table 6 (its means and seed spreads, the two designs alike, P(f) in the paper's order, 200 worlds), the share
# whose smallest reachable p is above 0.05 (`capacity.unreachable`), for `power_spec`'s benchmarks and for one
# benchmark of each family of the paper's eleven (a corruption shares its family's test set).

# %%
# NBVAL_CHECK_OUTPUT
paper_table6 = pd.read_csv(tables.PAPER_TABLE6, comment="#")
spec_datasets = sorted({parameters["dataset"] for _, _, parameters in specs.cells(specs.load_spec(paths.ROOT / power_spec))})
one_per_family = sorted(paper_table6.groupby(paper_table6["dataset"].map(names.family))["dataset"].min())
for name, chosen, seeds in ((power_spec, spec_datasets, 3), (power_spec, spec_datasets, 5), ("one benchmark of each family", one_per_family, 3)):
    share = capacity.unreachable(paper_table6, chosen, seeds=seeds)
    families = len({names.family(d) for d in chosen})
    print(f"{name} ({families} families, {seeds} seeds): the smallest reachable p is above 0.05 in {share:.0%} of 200 worlds")

# %%
row = {design: result.summary.loc[design] for design in capacity.DESIGNS}
notebook.headline(
    f"at equal capacity, P(f) and accuracy: mean tau {row['equal capacity']['mean_tau']:+.2f} (S {row['equal capacity']['S']}, "
    f"exact p {row['equal capacity']['p_value']:.2f}) against {row['ordinary']['mean_tau']:+.2f} (p {row['ordinary']['p_value']:.2f}) "
    f"with every component whole, over {row['equal capacity']['strata']} dataset(s) in {row['equal capacity']['families']} famil"
    f"{'y' if row['equal capacity']['families'] == 1 else 'ies'}",
    why="the paper-scale spec (parameters/sweeps/equal_capacity_paper.yaml) asks the same of ViT-Base on four benchmarks, 3 seeds",
)

# %% [markdown]
# ## The pairs the two designs order differently
#
# Per dataset, each pair of components whose order by accuracy flips between the designs, with each
# design's difference (first minus second), the more plastic of the two by P(f), and whether the equal
# design puts it ahead.

# %%
result.reordered.round(2)
