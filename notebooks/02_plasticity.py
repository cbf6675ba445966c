# %% [markdown]
# # 02 · Plasticity of the ViT components (paper §5.1, Fig. 3, Figs. 7-16)
#
# The plasticity of a component f is its average rate of change
# `||f(x) - f(y)||_F / ||x - y||_F` (Definition 1) over pairs of token sequences: x embeds an
# image of the pretraining distribution, y an image of the downstream dataset, and every
# component of every block is applied to that same pair of embeddings (appendix C.4; FC2's 4d
# inputs are zero-lifted). The paper finds MHA > FC1 > FC2 > LN2 > LN1 on ViT-Base and ViT-Huge,
# with MHA and FC1 above 1 (non-smooth) and the LayerNorms well below.
#
# At demo scale (the default) the model is the project's tiny ViT pretrained on digits 0-4, the
# reference images are held-out digits 0-4 and the downstream images are digits 5-9. Its numbers
# are not the paper's, and the demo model need not follow the paper's ranking.

# %% tags=["parameters"]
model = "demo"  # short name (demo, vit_base_in21k, vit_huge_in21k) or any timm ViT name
dataset = "digits"  # downstream dataset: its test split gives the images y
reference = "digits_source"  # pretraining-distribution images x (the paper: imagenet)
n_pairs = 179  # number of (x, y) pairs (the paper: 12,800; a smaller test split repeats, as in the authors' code)
batch_size = 64  # pairs per batch
device = "cpu"  # cpu or cuda
inputs = "embedding"  # embedding (the paper's definition) or in_situ (each component's actual input)
sample = "first"  # first: each test split in order, paired by position, cycled in whole batches of loader_batch (the authors'); once: each image at most once; random: a random subset of each
loader_batch = 0  # with sample first: the authors' loader batch, whose last partial batch is never used (0: theirs, 32 for vit_large_in21k and vit_huge_in21k, 64 otherwise)
seed = 0  # seed of the random subset (with sample random)
normalize = "imagenet"  # imagenet: ImageNet's mean and std for every model (the paper); model: the statistics the model was pretrained with (0.5 for vit_base_in21k)
data_root = None  # data folder (default: $VIT_PLASTICITY_DATA or data/)

# %%
from dataclasses import replace

import matplotlib.pyplot as plt

from paperlib.analysis import plasticity_table, ranking
from paperlib.measure import plasticity
from paperlib.records import names, paths
from paperlib.reports import notebook, plots

notebook.check_parameters()  # papermill's -p of a name this notebook does not have stops here

measurement = plasticity.Measurement(model, dataset, reference, n_pairs, inputs, sample, seed, normalize, loader_batch=loader_batch)
table, folder = plasticity.run(measurement, batch_size=batch_size, device=device, data_root=data_root, progress=False)
print(f"{table['pair'].nunique()} pairs x {table['block'].nunique()} blocks x 5 components -> {paths.display(folder)}")
print(f"token RMS norm of the embeddings measured: {table.attrs['token_rms']:.2f} (the paper's r for ViT-B/16 on Cifar10: {names.PAPER_R}); identical pairs excluded: {table.attrs['identical_pairs_excluded']}")

# %% [markdown]
# ## Plasticity per block and along depth (Fig. 3, left and middle)
#
# The authors' summary, as their figures draw it. Left: for each component, a box of its P(f) in
# each block (one value per block, the mean rate over the block's pairs: 12 values for ViT-Base),
# in plasticity order; whiskers reach 1.5 interquartile ranges and points beyond them are not
# drawn, as in the authors' figure. Right: P(f) in each block against the position of the block
# in the network (Fig. 3 middle; Fig. 3 right is the same with `model="vit_huge_in21k"`), with a
# band of ± 1.96 sd / √n around each curve, sd the standard deviation of the block's per-pair rates
# and n its number of pairs (a 95% interval of each block's mean; thin with many pairs). The dashed
# line at 1 separates contracting (smooth) from amplifying (non-smooth) behaviour.

# %%
plots.plasticity_figure(table, measurement)
plt.show()

# %% [markdown]
# ## Every rate of change (the package's richer view)
#
# The boxes above summarise each block by its mean; the paper's text and captions speak of "the
# distribution of rates of change". Here is that distribution itself: every rate (all pairs, all
# blocks) per component, as violins with their medians. It shows what the means hide: how widely
# single pairs spread, and whether a component amplifies some pairs while contracting most.

# %%
plots.rates_figure(table, measurement)
plt.show()

# %% [markdown]
# ## Ranking
#
# P(f) averaged over pairs and blocks, ranked; `paper rank` is the paper's order. Kendall's tau
# measures the agreement of the two rankings (1: same order, -1: reversed).

# %%
ranked = plasticity_table.ranked(table)
tau = ranking.paper_agreement(table)
ranked.round(3)

# %%
# NBVAL_CHECK_OUTPUT
order = " > ".join(ranked.index)
verdict = "follows" if tau == 1.0 else "does not follow"
print(f"{model} on {dataset}: {order}")
print(f"This model {verdict} the paper's ranking MHA > FC1 > FC2 > LN2 > LN1 (Kendall's tau = {tau:.2f}).")

# %%
notebook.headline(f"{model} on {dataset}: {order} (Kendall's tau {tau:.2f} with the paper's ranking)", paper="MHA > FC1 > FC2 > LN2 > LN1 on every benchmark (Fig. 2)",
                why=notebook.token_scale_why(tau, table.attrs["token_rms"]))

# %% [markdown]
# ## How sure is the ranking? (an extension)
#
# The paper reports P(f) over 12,800 pairs without an interval. A bootstrap over the images of the
# pairs (a repeated image, as a smaller test split cycles, drawn with all its pairs; each pair's rates
# averaged over blocks, the five components resampled together) gives a 95% interval
# for each P(f), how often each component keeps its rank (`rank stable`), and an interval for
# Kendall's tau: with few pairs, or components of nearly equal plasticity, a ranking can be luck.

# %%
uncertainty = ranking.ranking_uncertainty(table, images=plasticity.pair_ids(measurement, data_root))
low, high = uncertainty.attrs["tau"]
print(f"Kendall's tau with the paper's ranking, 95% interval: [{low:.2f}, {high:.2f}]; "
      f"the whole order holds in {uncertainty.attrs['order stable']:.0%} of the resamples.")
uncertainty.round(3)

# %% [markdown]
# ## Beyond the paper: the ranking depends on the scale of the embeddings
#
# Multiply both embeddings of every pair by a factor a and measure again (Definition 1 on
# `a e(x)` and `a e(y)`): a linear map's rate does not change, so FC1 and FC2 stay flat; a
# LayerNorm's output does not depend on the scale of its input, so its rate falls as 1/a (while its
# eps is negligible); MHA, whose softmax sharpens with a², moves in between. The ranking of P(f) is
# therefore a property of a model *and* of the size of its tokens, which the paper does not say:
# ViT-B/16 in21k has a token RMS norm of r = 19.4 on Cifar10 (Fig. 6, appendix D.1), large enough
# to put the LayerNorms last, while a ViT with small embeddings (the demo's, above) can put them
# first. Two things scale cannot change: LN2 against LN1 (both fall as 1/a, so their order is set
# by their gains), and FC1 against FC2. The curve uses this notebook's own pairs (at most 512, held
# in memory); the dotted line marks the factor that gives the tokens the paper's r. At demo scale
# (the default), scaling the tokens up to the paper's r and beyond puts the LayerNorms last, but
# the paper's whole order never appears: LN1 stays above LN2 at every factor, and MHA levels off
# below FC1.

# %%
network, x, y = plasticity.pair_images(replace(measurement, n_pairs=min(n_pairs, 512)), data_root)
factors = [0.25, 0.5, 1, 2, 4, 8, 16, 32, 64]
curve = plasticity.scale_curve(network, x, y, factors, batch_size, device)
plots.scale_curve_figure(curve, table.attrs["token_rms"], names.PAPER_R, measurement)
plt.show()

# %%
by_factor = ranking.scale_ranking(curve)
onset = ranking.paper_order_from(curve)
if onset is None:
    print(f"The paper's ranking MHA > FC1 > FC2 > LN2 > LN1 appears at no factor from {factors[0]} to {factors[-1]} (at {factors[-1]}: {by_factor['order'].iloc[-1]}).")
else:
    print(f"The paper's ranking MHA > FC1 > FC2 > LN2 > LN1 appears from factor {onset:g} on (token RMS norm {onset * table.attrs['token_rms']:.1f}).")
by_factor
