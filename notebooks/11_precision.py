# %% [markdown]
# # 11 · Does a cheaper training precision keep the paper's conclusions? (beyond the paper)
#
# The paper trains in fp32: Table 4 reports the memory of a training step "with a default FP32 precision"
# (Appendix C.3). On a GPU that is the grid's main cost: TF32 and bf16 autocast run the same step several
# times faster (`docs/benchmarks.md`), but a cheaper precision is worth taking only if the paper's
# conclusions survive it: Table 1's decreases from MHA, Table 6's best configuration on each dataset, and
# how often a run diverges.
#
# `precision_check.effect` pairs each run of `spec` with its fp32 twin (same dataset, component, learning
# rate and seed; each run's test accuracy at its best-validation checkpoint). Per dataset and component: the
# mean difference and the interval that the equivalence test decides on (two one-sided t tests against
# ±`margin` points, raised to one test image's worth where that is more: "equivalent" means the difference
# is shown to be within the margin), from `precision_check.FEWEST` pairs at least; a precision that diverges
# more is never equivalent. Over datasets: one mean per dataset, since the pairs of a dataset share its test
# set. Then the conclusions, each decided with its uncertainty, never by exact equality of patterns (seed
# noise alone changes those): each decrease from MHA (Table 1's, and full finetuning's and linear probing's)
# compared across datasets; Table 6's best configuration on each dataset by its seeds (the same only where a
# test shows the fp32 best within the margin of the other's best, or of its runner-up where both pick it;
# different only if the two are in reverse order in both precisions); the overall level (the mean change over
# every configuration); divergence (the same only where a test shows it below 5% of the pairs). Each row is
# "same", "differs" (Holm over the rows), "inconclusive" or not tested; the verdict is "differs" if any row
# differs, "same" only if all are shown the same. How often the verdict errs in simulated
# worlds at Table 6's seed spreads is measured by `benchmarks/precision_calibration.py` (`docs/benchmarks.md`).
# The default margin is about the largest standard deviation over seeds of one component in the paper's Table 6
# (printed below; full finetuning's largest is wider).
#
# At demo scale (the default, `parameters/sweeps/precision_demo.yaml`): the demo ViT under bf16 autocast on
# a CPU, one dataset, MHA and LN1, one seed, runs of 12 steps (the other demo sweeps' have 60), computed here when
# missing: one pair per cell, too few for a
# verdict, and one test image is worth more than the margin (its worth in points is in the margins table
# below): it shows the check, it cannot pass it. The demo is this small and short because on a CPU without native bf16
# (`native_bf16()` False: AVX2 alone, as most laptops) PyTorch emulates bf16 matrix products: an autocast run
# takes several times as long as its fp32 twin (each run's wall time on the machine that ran it is printed at
# the end). The paper-scale check is `parameters/sweeps/precision_paper.yaml` (TF32 and autocast, three
# seeds); the power statement below says what that many seeds can show.

# %% tags=["parameters"]
spec = "parameters/sweeps/precision_demo.yaml"  # runs in fp32 and a cheaper precision (paper scale: parameters/sweeps/precision_paper.yaml)
compute_missing = True  # run the spec's missing runs first (demo scale only)
select = "test"  # learning rate chosen by test accuracy (the paper's Table 6) or val (no test-set selection)
margin = 0.5  # equivalence margin, in accuracy points (about the largest seed-to-seed std of a component in the paper's Table 6)

# %%
import matplotlib.pyplot as plt
import pandas as pd
import torch

from paperlib.analysis import precision_check, tables
from paperlib.records import names
from paperlib.speed.options import native_bf16
from paperlib.reports import notebook, plots
from paperlib.sweeps.spec_runs import spec_runs

notebook.check_parameters()  # papermill's -p of a name this notebook does not have stops here

print(f"native bf16 on this CPU: {native_bf16()} ({torch.backends.cpu.get_cpu_capability()})")
runs, missing = spec_runs(spec, compute_missing=compute_missing)
print(f"{len(runs)} runs: " + ", ".join(f"{n} {p}" for p, n in runs["precision"].value_counts().items()) + f"; {len(missing)} missing")
paper = pd.read_csv(tables.PAPER_TABLE6, comment="#").dropna(subset=["std"])
for what, part in (("a component", paper[paper["component"].isin(names.COMPONENTS)]), ("full finetuning", paper[paper["component"] == "full"])):
    widest = part.loc[part["std"].idxmax()]
    print(f"largest std over seeds of {what} in the paper's Table 6: {widest['std']:.2f} points ({widest['dataset']}, {names.LABELS[widest['component']]})")

# %% [markdown]
# ## Test accuracy in each precision
#
# Per dataset and configuration, each precision's mean test accuracy over seeds (fp32 first), the standard
# deviation over seeds as an error bar (none with one seed), a point per learning rate of the spec.

# %%
plots.precision_figure(runs, spec)
plt.show()

# %% [markdown]
# ## The verdict, the conclusions and the paired differences

# %%
skipped = precision_check.missing_precisions(runs, missing, reference="fp32")  # None: the spec's runs can be compared
if skipped:
    print(skipped)
else:
    effect = precision_check.effect(runs, reference="fp32", margin=margin, select=select)
    display(effect["verdicts"].set_index("precision").round(3))
    display(effect["conclusions"].set_index(["precision", "conclusion"]).round(3))
    display(precision_check.formatted(effect["differences"]).rename(columns=names.LABELS))
    display(effect["margins"].round(3))
    print(precision_check.power_statement(effect["verdicts"], margin, runs["dataset"].nunique(), conclusions=effect["conclusions"]))

# %%
verdicts = {} if skipped else effect["verdicts"].set_index("precision")["verdict"]
here = skipped or ", ".join(f"{p} against fp32: {v}" for p, v in verdicts.items()) + f" over {runs['dataset'].nunique()} dataset(s)"
notebook.headline(here, paper="trained in fp32 only (Table 4's text)")

# %%
print(runs[["dataset", "component", "precision", "wall_seconds"]].to_string(index=False))  # what emulated bf16 costs (the text above)
