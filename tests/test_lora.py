"""LoRA on one component (paperlib.vit.lora): what trains, what the updates compute, merging, the run's
record and folder, resume, bad parameters."""

import copy

import pandas as pd
import pytest
import torch
from conftest import interrupted, resumed, same_metrics
from torch.overrides import TorchFunctionMode

from paperlib.analysis import lora_comparison, tables
from paperlib.records import methods, names, runs_table, specs
from paperlib.records import runs as run_files
from paperlib.train import finetune
from paperlib.train.config import config_from, expected
from paperlib.vit import components, lora, models


def demo(seed: int = 0):
    torch.manual_seed(seed)
    return models.create_model("demo", num_classes=5).eval()


def images(n: int = 3) -> torch.Tensor:
    return torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(1))


def test_targets_are_the_weight_matrices_of_each_component_in_every_block():
    model = demo()
    depth = len(model.blocks)
    assert lora.target_names(model, "fc2") == [f"blocks.{i}.mlp.fc2" for i in range(depth)]
    assert lora.target_names(model, "mha")[:2] == ["blocks.0.attn.qkv", "blocks.0.attn.proj"]
    assert len(lora.target_names(model, "full")) == 4 * depth
    with pytest.raises(ValueError, match="valid configurations: mha, fc1, fc2, full"):
        lora.target_names(model, "ln1")


def test_lora_starts_as_the_pretrained_function_and_trains_only_its_updates_head_and_final_norm():
    model, reference = demo(), demo()
    x = images()
    lora.add_lora(model, "mha", rank=4)
    with torch.no_grad():
        assert torch.equal(model(x), reference(x))  # B starts at zero
    components.set_trainable(model, "mha", lora.updates(model))
    trainable = {name for name, _ in components.trainable_parameters(model)}
    expected = {
        f"blocks.{i}.attn.{m}.lora_{ab}.default.weight"
        for i in range(len(model.blocks))
        for m in ("qkv", "proj")
        for ab in "AB"
    } | {"head.weight", "head.bias", "norm.weight", "norm.bias"}
    assert trainable == expected
    assert (
        sum(p.numel() for _, p in components.trainable_parameters(model))
        == lora.parameter_table(reference, 4).loc["MHA (LoRA r=4)", "trainable"]
    )


def test_an_update_is_alpha_over_rank_times_b_a_and_merging_folds_it_into_the_weight():
    model, reference = demo(), demo()
    lora.add_lora(model, "fc1", rank=2, alpha=6.0)
    layer = model.blocks[1].mlp.fc1
    with torch.no_grad():
        for block in model.blocks:
            block.mlp.fc1.lora_B.default.weight.normal_()
        A, B = layer.lora_A.default.weight.clone(), layer.lora_B.default.weight.clone()
        x = torch.randn(5, A.shape[1])
        w, b = reference.blocks[1].mlp.fc1.weight, reference.blocks[1].mlp.fc1.bias
        assert torch.allclose(layer(x), x @ (w + 3.0 * B @ A).T + b, atol=1e-5)  # alpha / rank = 3
        before = model(images())
    merged = lora.merge(model)
    assert merged is model and not lora.adapted_layers(model)
    assert type(model.blocks[1].mlp.fc1) is torch.nn.Linear
    assert set(model.state_dict()) == set(reference.state_dict())  # timm's names again: loads into a plain ViT
    assert torch.allclose(model.blocks[1].mlp.fc1.weight, w + 3.0 * B @ A, atol=1e-6)
    with torch.no_grad():
        assert torch.allclose(model(images()), before, atol=1e-5)
    assert torch.equal(model.blocks[1].mlp.fc2.weight, reference.blocks[1].mlp.fc2.weight)


class Multiplications(TorchFunctionMode):
    """Counts the tensor multiplications called while it is on."""

    count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.count += getattr(func, "__name__", "") in ("mul", "__mul__", "mul_")
        return func(*args, **(kwargs or {}))


def test_an_update_of_scale_1_is_not_multiplied_by_it_and_gives_peft_s_numbers(tiny_model):
    # alpha = the rank (the default): peft's own layer multiplies the update by 1.0, a pass over the
    # output each way; ours skips it, with peft's numbers to the bit, forward and backward
    from peft import LoraConfig, inject_adapter_in_model
    from peft.tuners.lora import Linear

    ours, theirs = lora.add_lora(copy.deepcopy(tiny_model), "full", rank=4), tiny_model
    inject_adapter_in_model(LoraConfig(r=4, lora_alpha=4, target_modules=lora.target_names(theirs, "full")), theirs)
    assert type(theirs.blocks[0].mlp.fc1) is Linear and type(ours.blocks[0].mlp.fc1) is not Linear
    with torch.no_grad():
        for layer in lora.adapted_layers(ours):
            layer.lora_B.default.weight.normal_(generator=torch.Generator().manual_seed(3))
    theirs.load_state_dict(ours.state_dict())
    x, labels = images(4), torch.tensor([0, 1, 2, 0])
    for model in (ours, theirs):
        components.set_trainable(model, "full", lora.updates(model))
        torch.nn.functional.cross_entropy(model(x), labels).backward()
    with torch.no_grad():
        assert torch.equal(ours(x), theirs(x))
    for (name, mine), (_, peft_s) in zip(ours.named_parameters(), theirs.named_parameters()):
        assert (mine.grad is None and peft_s.grad is None) or torch.equal(mine.grad, peft_s.grad), name
    tokens = torch.randn(2, 5, 64)
    counts = []
    for layer in (ours.blocks[0].mlp.fc1, theirs.blocks[0].mlp.fc1):
        with Multiplications() as mode:
            layer(tokens)
        counts.append(mode.count)
    assert counts == [0, 1]


@pytest.mark.parametrize("component", ["mha", "fc2", "full"])
def test_a_lora_run_changes_only_its_updates_the_head_and_the_final_norm(component, small):
    model, metrics = finetune.train(small(component=component, method="lora", lora_rank=4))
    initial = demo()  # the run's initialisation: same seed, same head (LoRA goes on after the head)
    weights = dict(model.named_parameters())
    changed_lora = set()
    for name, layer in ((n, m) for n, m in model.named_modules() if hasattr(m, "lora_A")):
        assert torch.equal(layer.base_layer.weight, initial.get_submodule(name).weight)  # frozen, bit for bit
        if not torch.equal(layer.lora_B.default.weight, torch.zeros_like(layer.lora_B.default.weight)):
            changed_lora.add(name)
    assert changed_lora == set(lora.target_names(initial, component))
    plain = {name.replace(".base_layer", ""): p for name, p in weights.items() if "lora_" not in name}
    changed = {n for n, p in plain.items() if not torch.equal(p.detach(), initial.state_dict()[n])}
    assert changed == {"head.weight", "head.bias", "norm.weight", "norm.bias"}
    assert (
        metrics["trainable_parameters"]
        == lora.parameter_table(initial, 4).loc[f"{names.LABELS[component]} (LoRA r=4)", "trainable"]
    )


def test_a_lora_run_has_its_own_folder_and_record_and_is_repeatable(
    results, tmp_path, monkeypatch, small, move_results
):
    plain, adapted = small(component="fc1"), small(component="fc1", method="lora", lora_rank=4)
    assert adapted.folder().name == "seed=0+lora-r4" and adapted.folder().parent == plain.folder().parent
    assert (
        small(component="fc1", method="lora", lora_rank=4, lora_alpha=8.0, lora_dropout=0.1).folder().name
        == "seed=0+lora-r4-a8-d0.1"
    )
    # alpha 0 means the rank: one run, one folder, one record
    assert small(component="fc1", method="lora", lora_rank=4, lora_alpha=4.0) == adapted
    first = finetune.run(adapted)
    finetune.run(plain)
    assert (plain.folder() / "metrics.json").is_file() and (adapted.folder() / "metrics.json").is_file()
    runs = runs_table.load()
    assert sorted(zip(runs["method"], runs["lora_rank"])) == [("lora", 4), ("weights", 0)]
    with pytest.raises(ValueError, match="runs of one method, got lora, weights"):
        tables.table6(runs)
    assert len(tables.table6(runs[runs["lora_rank"] == 4])) == 1
    move_results("again")
    # same seed, same LoRA initialisation, same numbers
    assert same_metrics(finetune.run(adapted)) == same_metrics(first)


@pytest.mark.parametrize("precision, dropout", [("autocast", 0.0), ("bf16", 0.0), ("autocast", 0.3)])
def test_a_lora_run_resumes_after_an_interruption_as_if_uninterrupted(
    precision, dropout, results, tmp_path, monkeypatch, small, move_results, tiny_data
):
    # dropout draws from torch's generator: the checkpoint carries its state. 8 steps of 4 images on a tiny CIFAR-10,
    # interrupted after the first of two checkpoints: where bf16 is emulated (AVX2 alone) a bf16 image costs 7 fp32 ones
    lora = {"method": "lora", "lora_rank": 2, "lora_dropout": dropout}
    tiny = {"steps": 8, "batch_size": 4, "dataset": "cifar10", "data_root": tiny_data}
    config = small(component="mha", precision=precision, **tiny, **lora)
    reference = finetune.run(config)
    history = run_files.history(config)
    move_results("interrupted")
    interrupted(config, 6, monkeypatch)
    assert (config.folder() / "checkpoint.pt").is_file()
    assert same_metrics(resumed(config, monkeypatch)) == same_metrics(reference)
    pd.testing.assert_frame_equal(run_files.history(config), history)


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"component": "ln1", "method": "lora", "lora_rank": 4}, "method 'lora' trains mha, fc1, fc2, full, not 'ln1'"),
        ({"component": "linear", "method": "lora", "lora_rank": 4}, "LoRA adapts weight matrices and it has none"),
        ({"method": "lora", "lora_rank": -1}, "lora_rank must be a positive integer"),
        ({"method": "lora", "lora_rank": 2.5}, "lora_rank must be a positive integer"),
        ({"method": "lora"}, "lora_rank must be a positive integer"),
        ({"lora_alpha": 8.0}, "lora_alpha is method lora's: set method 'lora'"),
        ({"lora_rank": 4}, "lora_rank is method lora's: set method 'lora'"),
        ({"method": "lora", "lora_rank": 4, "lora_alpha": -1.0}, "lora_alpha must be a finite number >= 0"),
        ({"method": "lora", "lora_rank": 4, "lora_dropout": 1.0}, r"lora_dropout must be a finite number in \[0, 1\)"),
    ],
)
def test_bad_lora_parameters_fail_before_any_work(results, overrides, message, small):
    with pytest.raises(ValueError, match=message):
        finetune.run(small(**overrides))
    assert not results.exists()


def test_the_command_line_and_notebook_take_the_lora_parameters():
    names = specs.notebook_parameters("notebooks/05_finetune.ipynb")
    assert {"method", "lora_rank", "lora_alpha", "lora_dropout"} <= set(names)
    spec = {
        "notebook": "notebooks/05_finetune.ipynb",
        "parameters": {"steps": 4, "warmup": 1},
        "grid": [
            {"component": ["mha", "fc2"], "lr": [0.01], "seed": [0]},
            {"component": ["mha", "fc2"], "method": ["lora"], "lora_rank": [4], "lr": [0.01], "seed": [0]},
        ],
    }
    wanted = expected(spec)
    assert sorted(zip(wanted["component"], wanted["lora_rank"])) == [("fc2", 0), ("fc2", 4), ("mha", 0), ("mha", 4)]
    assert config_from({"method": "lora", "lora_rank": "4"}).method.rank == 4


def test_the_comparison_table_chooses_each_methods_learning_rate_apart(results, small):
    for rank in (0, 2):
        for lr in (0.01, 0.3):
            method = {"method": "lora", "lora_rank": rank} if rank else {}
            finetune.run(small(component="fc2", lr=lr, steps=4, eval_every=2, warmup=1, **method))
    finetune.run(small(component="ln1", steps=4, eval_every=2, warmup=1))  # no LoRA counterpart: not compared
    runs = runs_table.load()
    table = lora_comparison.comparison(runs)
    assert table["method"].tolist() == ["weights", "LoRA r=2"] and set(table["component"]) == {"fc2"}
    for rank, row in zip((0, 2), table.itertuples()):
        mine = runs[(runs["lora_rank"] == rank) & (runs["component"] == "fc2")]
        best = mine.loc[mine["test_accuracy"].idxmax()]
        assert row.lr == best["lr"] and row.mean == pytest.approx(100 * best["test_accuracy"])
        assert row.trainable_parameters == best["trainable_parameters"]
    assert table["trainable_parameters"].iloc[1] < table["trainable_parameters"].iloc[0]
    lora_run = {"method": "lora", "lora_rank": 4, "lora_alpha": 8.0, "lora_dropout": 0.1}
    assert methods.method_of(lora_run).label() == "LoRA r=4 (alpha=8, dropout=0.1)"
    assert methods.method_of(lora_run | {"lora_alpha": 4.0, "lora_dropout": 0}).label() == "LoRA r=4"


def test_alpha_zero_is_the_rank_in_the_record_the_results_and_the_tables(results, small):
    finetune.run(small(component="fc2", method="lora", lora_rank=2, lr=0.01, steps=4, eval_every=2, warmup=1))
    finetune.run(
        small(component="fc2", method="lora", lora_rank=2, lora_alpha=2.0, lr=0.3, steps=4, eval_every=2, warmup=1)
    )
    runs = runs_table.load()
    assert runs["lora_alpha"].tolist() == [2.0, 2.0]
    assert lora_comparison.comparison(runs)["method"].tolist() == ["LoRA r=2"]  # one setting, two learning rates
    spec = {
        "notebook": "notebooks/05_finetune.ipynb",
        "parameters": {"steps": 4, "eval_every": 2, "warmup": 1, "batch_size": 16},
        "grid": {"component": ["fc2"], "method": ["lora"], "lora_rank": [2], "lr": [0.01, 0.3], "seed": [0]},
    }
    found, missing = runs_table.for_spec(spec)  # alpha 0 in the spec is the runs' alpha 2: both found
    assert missing.empty and found["lr"].tolist() == [0.01, 0.3]
