# %% [markdown]
# # 08 · Your own ViT and your own images (beyond the paper)
#
# The paper measures the plasticity of ViT-Base and ViT-Huge on eleven public benchmarks (§5.1)
# and finetunes each component on them (§5.2). This notebook runs the same two analyses on a model
# and a dataset you bring: a ViT saved as `custom/<name>` (`<models dir>/<name>/`, timm's hub
# layout) and images in class folders under `<data root>/custom/<name>/`. Every other notebook,
# run and sweep takes these names too (docs/beyond-the-paper.md: "Your own ViT and images"). Your ViT may be
# one of timm's later ones, saved as it is: DINOv2 or v3, EVA-02, CLIP, SigLIP, AIMv2 (RoPE, SwiGLU,
# RMSNorm; docs/beyond-the-paper.md: "Later ViTs").
#
# At demo scale (the default), `make_example` first makes both from the demo world: the demo ViT
# saved as `custom/demo_vit`, and digits 5-9 written as PNG class folders, `train/` and `test/`, as
# `custom/demo_digits`. For your own, save your model and put your folders there, then run
# `papermill notebooks/08_your_own_vit_and_data.ipynb out.ipynb -p make_example False -p model custom/<yours> -p dataset custom/<yours> -p reference imagenet -p device cuda`
# with the paper's settings (`-p n_pairs 12800 -p steps 10000 -p batch_size 512`).
# Demo numbers are not the paper's.

# %% tags=["parameters"]
make_example = True  # save the demo ViT and the demo digits under the names below first, if missing
model = "custom/demo_vit"  # your ViT: custom/<name> (or any model name the package knows)
dataset = "custom/demo_digits"  # your images: custom/<name> (or any dataset name)
reference = "digits_source"  # pretraining-distribution images for plasticity (the paper: imagenet; or custom/<name>)
n_pairs = 179  # plasticity pairs (the paper: 12,800)
sample = "first"  # first (the authors': paired by position, a smaller set repeating), once (each image at most once) or random (a seeded random subset of each set)
components_to_finetune = ["mha", "fc1", "ln1"]  # finetuning configurations to compare (any of mha, fc1, fc2, ln2, ln1, full, linear)
lr = 0.03  # peak learning rate of every run
steps = 60  # optimisation steps per run (the paper: 4,000 to 20,000)
batch_size = 32  # images per step (the paper: 512)
warmup = 6  # linear warm-up steps
eval_every = 10  # validation every this many steps
seed = 0  # seed of the head, the validation split, the batches and a random sample
normalize = "imagenet"  # imagenet: ImageNet's mean and std (the paper); model: those your model was pretrained with (its config.json's; e.g. CLIP's)
keep_weights = True  # keep what each run trained (weights.safetensors in its folder), to measure the plasticity of the best finetuned model below
device = "cpu"  # cpu or cuda

# %%
from dataclasses import replace

import matplotlib.pyplot as plt
import pandas as pd

from paperlib.analysis import capacity, plasticity_table, ranking
from paperlib.data import datasets
from paperlib.measure import plasticity
from paperlib.records import names, paths, runs
from paperlib.reports import notebook, plots
from paperlib.train import checkpoints, finetune
from paperlib.train.config import Config
from paperlib.vit import components, models

notebook.check_parameters()  # papermill's -p of a name this notebook does not have stops here

if make_example:
    if model.startswith("custom/") and not (models.custom_folder(model) / "config.json").is_file():
        models.save_model(models.create_model("demo"), model)
    if dataset.startswith("custom/"):  # each folder whole or not at all: one missing (an interrupted first run) is made again
        for split, folder in (("trainval", "train"), ("test", "test")):
            if not (paths.data_dir() / dataset / folder).is_dir():
                datasets.export_class_folders(datasets.get_dataset("digits", split), paths.data_dir() / dataset / folder)

# %% [markdown]
# ## What is there
#
# The custom models and datasets found, and what this model and dataset are: the architecture
# from the model's `config.json`, the classes from the training folder.

# %%
print("custom models:", ", ".join(paths.custom_model_names()) or "none")
print("custom datasets:", ", ".join(datasets.dataset_names("custom")) or "none")

# %%
# NBVAL_CHECK_OUTPUT
network = models.create_model(model)
train, test = datasets.get_dataset(dataset, "trainval"), datasets.get_dataset(dataset, "test")
print(f"{model}: {len(network.blocks)} blocks, width {network.embed_dim}, {network.patch_embed.img_size[0]}px input, "
      f"{sum(p.numel() for p in network.parameters()):,} parameters")
print(f"{dataset}: {len(train.classes)} classes ({', '.join(train.classes)}), {len(train)} training and {len(test)} test images")

# %% [markdown]
# ## Plasticity of each component (§5.1, Definition 1)
#
# Rates of change `||f(x) - f(y)||_F / ||x - y||_F` of every component of every block on pairs of
# a reference image x and an image y of your test split, and P(f), their mean, ranked. The paper
# finds MHA > FC1 > FC2 > LN2 > LN1 on its models; yours need not follow it.

# %%
measurement = plasticity.Measurement(model, dataset, reference, n_pairs, sample=sample, seed=seed, normalize=normalize)
table, folder = plasticity.run(measurement, device=device, progress=False)
ranked = plasticity_table.ranked(table)
print(f"{table['pair'].nunique()} pairs -> {paths.display(folder)}; Kendall's tau with the paper's ranking: {ranking.paper_agreement(table):.2f}")
ranked.round(3)

# %%
plots.rates_along_depth_figure(table, measurement)
plt.show()

# %%
notebook.headline(f"{model} on {dataset}: " + " > ".join(ranked.index) + f" (Kendall's tau {ranking.paper_agreement(table):.2f} with the paper's ranking)",
                paper="MHA > FC1 > FC2 > LN2 > LN1 on ViT-Base and ViT-Huge (Fig. 2)", why=notebook.token_scale_why(ranking.paper_agreement(table), table.attrs["token_rms"]))

# %% [markdown]
# ## Finetuning one component at a time (§5.2)
#
# The paper's protocol (SGD with momentum 0.9, warm-up and cosine decay, clipping at norm 1, the
# test accuracy of the best-validation checkpoint) for each configuration, the new head and the
# final norm trained with it. The paper finds that the more plastic the component, the better and
# steadier the result; one learning rate and one seed, as here, is a first look, not its test
# (notebook 07 and a sweep over learning rates and seeds are).

# %%
rows = []
for component in components_to_finetune:
    config = Config(model=model, dataset=dataset, component=component, lr=lr, seed=seed, steps=steps,
                         batch_size=batch_size, warmup=warmup, eval_every=eval_every, device=device, normalize=normalize, save_weights=keep_weights)
    metrics = finetune.run(config)
    rows.append({"configuration": names.LABELS[component], "plasticity": ranked["plasticity"].get(names.LABELS[component]),
                 "status": metrics["status"], "best val accuracy": metrics.get("best_val_accuracy"), "test accuracy": metrics.get("test_accuracy"),
                 "trainable parameters": metrics.get("trainable_parameters"), "history": runs.history(config)})
summary = pd.DataFrame(rows).set_index("configuration")
summary.drop(columns="history").round(3)

# %%
plots.finetune_figure(dict(zip(components_to_finetune, summary["history"])), config)
plt.show()

# %% [markdown]
# ## Beyond the paper: plasticity or capacity?
#
# The components that hold many parameters (MHA, FC1, FC2) are also, on the paper's ViT-Base, the
# most plastic, so P(f) alone may credit plasticity for what capacity does (notebook 07,
# `paperlib.analysis.capacity`). Here both predictors stand beside the runs above: each component's P(f), its
# share of the model's parameters, and its test accuracy, with how often the runs followed each where
# they order a pair of components differently: a count, not a test (one run per component; notebook 07
# tests it over datasets and seeds). Where every such pair sets a LayerNorm against a linear layer, a
# result that follows capacity cannot be told from LayerNorms adapting worse as a kind of module.
# Before choosing components for your model by P(f), check that the runs agree.

# %%
by_label = {names.LABELS[c]: c for c in names.RUN_COMPONENTS}
both, said = capacity.verdict(ranked["plasticity"].rename(index=by_label), components.parameter_share(models.architecture(model)),
                              summary["test accuracy"].rename(index=by_label))
print(f"{model} on {dataset}: {said}")
both.round(4)

# %% [markdown]
# ## Beyond the paper: the plasticity of the finetuned model
#
# The paper measures plasticity on the pretrained model only. Here the run with the best
# validation accuracy (the test set plays no part in the choice) is rebuilt from the weights it
# kept (`checkpoints.load_model`: the pretrained model with what the run trained, at its
# best-validation checkpoint), saved as a model of its own, and measured on the same pairs. The
# ratio is finetuned / pretrained P(f) per component. Definition 1 feeds every component the same
# embedded pair, so a component the run did not train keeps its rates exactly (ratio 1; only
# `full` trains the patch embedding): what changes is the plasticity of the component trained.

# %%
if keep_weights and (summary["status"] == "finished").any():
    chosen = components_to_finetune[list(summary.index).index(summary["best val accuracy"].astype(float).idxmax())]
    config = Config(model=model, dataset=dataset, component=chosen, lr=lr, seed=seed, steps=steps,
                         batch_size=batch_size, warmup=warmup, eval_every=eval_every, device=device, normalize=normalize, save_weights=True)
    finetuned_name = f"custom/{model.removeprefix('custom/').replace('/', '_')}-finetuned-{chosen}"
    models.save_model(checkpoints.load_model(config), finetuned_name, overwrite=True)
    after, _ = plasticity.run(replace(measurement, model=finetuned_name), device=device, progress=False)
    change = pd.DataFrame({"pretrained": ranked["plasticity"], "finetuned": plasticity_table.ranked(after)["plasticity"]})
    change["finetuned / pretrained"] = change["finetuned"] / change["pretrained"]
    print(f"{finetuned_name}: {names.LABELS[chosen]} finetuned (best validation accuracy); ranking after: {' > '.join(plasticity_table.ranked(after).index)}")
    display(change.round(3))
else:
    print("keep_weights is off, or no run finished: nothing to measure")
