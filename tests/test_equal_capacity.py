"""Equal-capacity finetuning (``paperlib.vit.equal_capacity``) and its analysis (``capacity.at_equal_capacity``)."""

import itertools

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import interrupted, resumed, same_metrics

from paperlib.analysis import capacity
from paperlib.records import runs, runs_table, storage
from paperlib.records.names import COMPONENTS
from paperlib.records.runs import run_fields
from paperlib.train import checkpoints, evaluation, finetune
from paperlib.train.config import Config
from paperlib.train.step import adapt
from paperlib.vit import components, equal_capacity, models


def demo_model():
    return models.create_model("demo", num_classes=5)


def test_every_component_trains_k_parameters_per_block():
    model = demo_model()
    k = equal_capacity.per_block(model)
    assert k == 2 * model.embed_dim  # a LayerNorm's gain and bias
    head_and_norm = components.count_parameters(components.head_modules(model) + components.final_norm_modules(model))
    for component in COMPONENTS:
        config = Config(component=component, method="subset" if component in ("mha", "fc1", "fc2") else "weights")
        adapted = adapt(demo_model(), config)
        trainable = {name: p.numel() for name, p in adapted.named_parameters() if p.requires_grad}
        for block in range(len(adapted.blocks)):
            in_block = sum(n for name, n in trainable.items() if name.startswith(f"blocks.{block}."))
            assert in_block == k, (component, block, in_block)
        assert sum(trainable.values()) == k * len(adapted.blocks) + head_and_norm
    table = equal_capacity.parameter_table(model)
    assert table["trainable"].nunique() == 1 and (table["per block"] == k).all()


def test_the_subset_is_the_same_for_every_lr_and_seed_and_changes_with_its_own_seed():
    def digest(**fields):
        model = adapt(demo_model(), Config(**run_fields({"component": "fc2", "method": "subset", **fields})))
        return equal_capacity.digest(model)

    first = digest(lr=0.03, seed=0)
    assert digest(lr=0.3, seed=42) == first
    assert digest(subset_seed=1) != first
    drawn = equal_capacity.draw(demo_model(), "mha", seed=3)
    assert all(len(torch.unique(d)) == len(d) == equal_capacity.per_block(demo_model()) for d in drawn)
    assert not all(torch.equal(drawn[0], other) for other in drawn[1:])  # a draw per block


def test_frozen_entries_do_not_move_under_momentum_weight_decay_and_clipping():
    torch.manual_seed(0)
    model = demo_model()
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    updates = equal_capacity.add_subsets(model, "mha", seed=0)
    components.set_trainable(model, "mha", updates)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=0.1, weight_decay=0.5)
    for _ in range(3):
        optimizer.zero_grad()
        loss = model(torch.randn(4, 3, 32, 32)).square().mean()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        optimizer.step()
    equal_capacity.merge(model)
    after = dict(model.named_parameters())
    assert set(after) == set(before)  # a plain timm ViT again
    k = equal_capacity.per_block(model)
    for block in range(len(model.blocks)):
        names = [name for name in before if name.startswith(f"blocks.{block}.attn.")]
        moved = sum(int((before[name] != after[name]).sum()) for name in names)
        assert 0 < moved <= k
        others = [name for name in before if name.startswith(f"blocks.{block}.") and name not in names]
        assert all(torch.equal(before[name], after[name]) for name in others)


def test_a_run_trains_its_subset_and_nothing_else(tmp_path, monkeypatch):
    monkeypatch.setenv("VIT_PLASTICITY_RESULTS", str(tmp_path))
    config = Config(component="fc1", method="subset", steps=12, warmup=2, eval_every=6, save_weights=True)
    assert config.folder().name == "seed=0+equal"
    metrics = finetune.run(config)
    model = demo_model()
    k = equal_capacity.per_block(model)
    assert metrics["trainable_parameters"] == k * len(model.blocks) + 5 * model.embed_dim + 5 + 2 * model.embed_dim
    assert metrics["subset"] == equal_capacity.digest(adapt(demo_model(), config))
    trained = checkpoints.load_model(config)  # SGD with momentum 0.9, the paper's, merged back into the weights
    for block, (start, end) in enumerate(zip(model.blocks, trained.blocks)):
        changed = int(
            (start.mlp.fc1.weight != end.mlp.fc1.weight).sum() + (start.mlp.fc1.bias != end.mlp.fc1.bias).sum()
        )
        assert 0 < changed <= k, (block, changed)
        assert torch.equal(start.attn.qkv.weight, end.attn.qkv.weight)
        assert torch.equal(start.norm2.weight, end.norm2.weight)
    # how clipping bound, recorded for the comparison of the two designs
    history = runs.history(config).dropna(subset=["val_accuracy"])
    assert 0 < metrics["component_grad_share"] < 1 and history["component_grad_share"].between(0, 1).all()
    assert metrics["clipped_steps"] == (runs.history(config)["grad_norm"] > config.clip).mean()


def test_the_components_share_of_the_clipped_norm_is_its_gradients_norm_over_all_of_them():
    model = adapt(demo_model(), Config(component="fc1", method="subset"))
    trainable = [p for p in model.parameters() if p.requires_grad]
    outside = {
        id(p) for m in components.head_modules(model) + components.final_norm_modules(model) for p in m.parameters()
    }
    for p in trainable:  # the head and final norm: a norm of 3 in all; the subset: 4
        fill = 4.0 if id(p) not in outside else 3.0
        p.grad = torch.full_like(
            p, fill / np.sqrt(sum(q.numel() for q in trainable if (id(q) in outside) == (fill == 3.0)))
        )
    step = type("Step", (), {"trainable": trainable})
    inside = torch.tensor([id(p) not in outside for p in trainable])
    assert evaluation.component_grad_share(step, inside) == pytest.approx(4 / 5)
    trainable[0].grad = None  # a step that keeps no gradients
    assert np.isnan(evaluation.component_grad_share(step, inside))


def test_an_interrupted_equal_capacity_run_resumes_as_if_uninterrupted(results, monkeypatch, small, move_results):
    config = small(component="mha", method="subset", subset_seed=2)
    reference = finetune.run(config)
    move_results("interrupted")
    interrupted(config, 9, monkeypatch)
    assert (config.folder() / "checkpoint.pt").is_file()
    assert same_metrics(resumed(config, monkeypatch)) == same_metrics(reference)


def test_a_run_without_the_option_is_unchanged():
    config = Config(component="fc1")
    assert "equal" not in config.folder().name
    plain = adapt(demo_model(), config)
    assert not any("parametrizations" in name for name, _ in plain.named_parameters())
    expected = components.set_trainable(demo_model(), "fc1")
    assert [n for n, p in plain.named_parameters() if p.requires_grad] == [
        n for n, p in expected.named_parameters() if p.requires_grad
    ]


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"component": "ln1", "method": "subset"}, "its ordinary runs are its equal-capacity runs"),
        ({"component": "full", "method": "subset"}, "method 'subset' trains mha, fc1, fc2, not 'full'"),
        ({"component": "mha", "subset_seed": 3}, "subset_seed is method subset's: set method 'subset'"),
        ({"component": "mha", "method": "subset", "lora_rank": 2}, "lora_rank is method lora's"),
        ({"component": "mha", "method": "equal"}, "unknown method 'equal'; valid methods: weights, lora, subset"),
        ({"component": "mha", "method": "subset", "subset_seed": -1}, "subset_seed must be a non-negative integer"),
        ({"component": "mha", "method": "subset", "optimizer": "adamw", "weight_decay": 0.05}, "use weight_decay=0"),
    ],
)
def test_bad_options_are_refused_with_the_valid_choices(fields, message):
    with pytest.raises(ValueError, match=message):
        Config(**run_fields(fields))


def test_equal_capacity_runs_are_another_setting_in_the_tables():
    from paperlib.analysis import tables

    assert "method" in tables.SETTING and "subset_seed" in tables.SETTING
    rows = [
        {"model": "demo", "dataset": "digits", "component": "fc1", "lr": 0.03, "seed": 0, "method": method}
        for method in ("weights", "subset")
    ]
    mixed = pd.DataFrame(rows).reindex(columns=runs_table.RUN_COLUMNS)
    with pytest.raises(ValueError):
        tables.check_one_setting(mixed, "table6")


def table(values: dict[str, dict[str, float]]) -> pd.DataFrame:
    return pd.DataFrame(
        [{"dataset": d, "component": c, "accuracy": v} for d, row in values.items() for c, v in row.items()]
    )


def test_at_equal_capacity_compares_the_two_designs():
    scores = dict(zip(COMPONENTS, [5.0, 4.0, 3.0, 2.0, 1.0]))
    datasets = ["a", "b", "c"]
    plasticity = table({d: scores for d in datasets}).rename(columns={"accuracy": "plasticity"})
    # ordinary: against plasticity on a; equal capacity: with plasticity everywhere
    ordinary = table({"a": dict(zip(COMPONENTS, [1, 2, 3, 5, 4])), "b": scores, "c": scores, "z": scores})
    equal = table({d: {"mha": 10.0, "fc1": 9.0, "fc2": 8.0} for d in datasets})
    result = capacity.at_equal_capacity(plasticity, ordinary, equal)
    row = result.per_dataset.set_index("dataset").loc["a"]
    assert row["family"] == "a" and row[list(capacity.DESIGNS)].tolist() == pytest.approx([-0.8, 1.0])
    assert "z" not in set(result.per_dataset["dataset"])
    assert result.summary.loc["equal capacity", "S"] == 30 and result.summary.loc["ordinary", "S"] == 12
    # the exact p of S = 30 over 3 independent datasets of 5 components: (1/120)^3 for each sign
    assert result.summary.loc["equal capacity", "p_value"] == pytest.approx(2 / 120**3)
    accuracies = result.accuracies  # both designs side by side; the equal design's LayerNorms are the ordinary runs
    assert list(accuracies.columns[:2]) == [("ordinary", "MHA"), ("ordinary", "FC1")] and len(accuracies.columns) == 10
    assert (
        accuracies.loc["a", ("equal capacity", "MHA")] == 10.0 and accuracies.loc["a", ("equal capacity", "LN2")] == 5.0
    )
    reordered = result.reordered
    assert set(reordered["dataset"]) == {"a"} and reordered["follows plasticity"].all()
    # on a, equal capacity reverses the pairs that involve a subset component; LN2 / LN1 is the same run
    assert "LN2 / LN1" not in set(reordered["pair"]) and len(reordered) == 9
    assert np.sign(reordered["ordinary"]).eq(-1).all()


def test_the_difference_between_the_designs_swaps_design_labels_by_family_and_component():
    scores = dict(zip(COMPONENTS, [5.0, 4.0, 3.0, 2.0, 1.0]))
    datasets = ["a", "cifar10c/fog", "cifar10c/snow"]  # two families: a, and Cifar10's two corruptions
    plasticity = table({d: scores for d in datasets}).rename(columns={"accuracy": "plasticity"})
    ordinary = table(
        {d: dict(zip(COMPONENTS, v)) for d, v in zip(datasets, ([1, 2, 3, 5, 4], [3, 4, 5, 2, 1], [5, 3, 4, 2, 1]))}
    )
    equal = table({d: dict(zip(COMPONENTS[:3], v)) for d, v in zip(datasets, ([10, 9, 8], [6, 7, 5], [8, 9, 7]))})
    difference = capacity.at_equal_capacity(plasticity, ordinary, equal).difference.iloc[0]

    # independently: every swap of the labels of each component, one per family, by itertools and sign counts
    def s(y):
        x = [scores[c] for c in COMPONENTS]
        return sum(np.sign(x[i] - x[j]) * np.sign(y[i] - y[j]) for i in range(5) for j in range(i + 1, 5))

    wide = {
        name: t.pivot(index="dataset", columns="component", values="accuracy")[list(COMPONENTS)]
        for name, t in (("ordinary", ordinary), ("equal", capacity.equal_capacity_results(ordinary, equal)))
    }
    families = {"a": ["a"], "cifar10": ["cifar10c/fog", "cifar10c/snow"]}
    per_family = []
    for members in families.values():
        values = []
        for swap in itertools.product([False, True], repeat=5):
            total = 0
            for d in members:
                e, o = wide["equal"].loc[d].tolist(), wide["ordinary"].loc[d].tolist()
                total += s([o[k] if swap[k] else e[k] for k in range(5)]) - s(
                    [e[k] if swap[k] else o[k] for k in range(5)]
                )
            values.append(total)
        per_family.append(values)
    observed = sum(values[0] for values in per_family)
    totals = [a + b for a, b in itertools.product(*per_family)]
    assert difference["S_difference"] == observed and difference["families"] == 2
    assert difference["p_value"] == pytest.approx(np.mean(np.abs(totals) >= abs(observed)))
    assert difference["smallest_p"] == pytest.approx(np.mean(np.abs(totals) >= max(np.abs(totals))))


def test_notebook_05_trains_a_layernorms_worth_per_block_with_equal_capacity(results, tmp_path):
    from paperlib.records import paths
    from paperlib.reports import execute

    parameters = {"component": "fc1", "method": "subset", "steps": 4, "warmup": 1, "eval_every": 2}
    execute.execute(paths.NOTEBOOKS / "05_finetune.ipynb", tmp_path / "out.ipynb", parameters=parameters)
    config = Config(component="fc1", method="subset", steps=4, warmup=1, eval_every=2)
    metrics = storage.read_json(config.folder() / runs.METRICS)
    model = demo_model()
    head_and_norm = components.count_parameters(components.head_modules(model) + components.final_norm_modules(model))
    assert metrics["trainable_parameters"] - head_and_norm == 2 * model.embed_dim * len(model.blocks)
    assert metrics["subset"] and config.folder().name == "seed=0+equal"


def test_how_the_designs_trained_flags_a_chosen_rate_at_the_top_of_its_grid():
    def runs(method, components, best_lr):
        rows = []
        for c, lr, seed in itertools.product(components, [0.01, 0.03], [0, 1]):
            accuracy = 0.9 if lr == best_lr[c] else 0.8
            clipped = {0.01: 0.25, 0.03: 0.75}[lr] + 0.1 * seed  # seeds 0 and 1: their mean is +0.05
            share = 0.1 if method == "subset" else 0.9
            rows.append(
                {"model": "demo", "dataset": "d", "component": c, "lr": lr, "seed": seed, "method": method}
                | {"status": "finished", "test_accuracy": accuracy, "best_val_accuracy": accuracy}
                | {"clipped_steps": clipped, "component_grad_share": share}
            )
        return pd.DataFrame(rows).reindex(columns=runs_table.RUN_COLUMNS)

    best = {"mha": 0.03, "fc1": 0.01, "fc2": 0.01, "ln2": 0.03, "ln1": 0.01}
    ordinary = runs("weights", COMPONENTS, best)
    equal = runs("subset", ["mha", "fc1", "fc2"], {"mha": 0.01, "fc1": 0.03, "fc2": 0.03})
    table = capacity.how_they_trained(ordinary, equal)
    assert table.loc[("ordinary", "d", "MHA"), "at top"] and not table.loc[("ordinary", "d", "FC1"), "at top"]
    assert table.loc[("equal capacity", "d", "FC1"), "at top"] and table.loc[("equal capacity", "d", "LN2"), "at top"]
    assert table.loc[("equal capacity", "d", "MHA"), "clipped_steps"] == pytest.approx(0.3)
    assert table.loc[("equal capacity", "d", "MHA"), "component_grad_share"] == pytest.approx(0.1)
    assert table.loc[("equal capacity", "d", "LN1"), "component_grad_share"] == pytest.approx(0.9)  # the ordinary run
    assert (table["rates"] == 2).all() and len(table) == 10
