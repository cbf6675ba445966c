import math

import pytest
import torch
from timm.models.vision_transformer import VisionTransformer

from paperlib.records import names
from paperlib.records.names import COMPONENTS, RUN_COMPONENTS
from paperlib.train.config import Config
from paperlib.vit import components, models


def vit_base_counts(d=768, hidden=3072, depth=12):
    """Table 3 from the ViT-Base architecture, written out by hand (weights + biases)."""
    return {
        "mha": depth * ((d * 3 * d + 3 * d) + (d * d + d)),  # qkv projection + output projection
        "fc1": depth * (d * hidden + hidden),
        "fc2": depth * (hidden * d + d),
        "ln2": depth * 2 * d,  # gamma and beta
        "ln1": depth * 2 * d,
    }


@pytest.fixture(scope="module")
def vit_base():
    # A randomly initialised ViT-Base: no weights are downloaded.
    return models.create_model("vit_base_in21k", pretrained=False, num_classes=10)


def test_plasticity_order_and_configs():
    assert COMPONENTS == ("mha", "fc1", "fc2", "ln2", "ln1")
    assert set(RUN_COMPONENTS) == set(COMPONENTS) | {"full", "linear"}


@pytest.mark.parametrize("component", COMPONENTS)
def test_vit_base_component_counts_are_table_3(vit_base, component):
    assert components.component_parameters(vit_base, component) == vit_base_counts()[component]


def test_vit_base_counts_round_to_the_papers_table_3(vit_base):
    total = sum(p.numel() for p in vit_base.parameters())
    counts = {c: components.component_parameters(vit_base, c) for c in COMPONENTS}
    # Paper Table 3: 28M, 28M, 28M, 18K, 18K; 33%, 33%, 33%, 0.02%, 0.02% of 86M.
    assert [round(counts[c] / 1e6) for c in ("mha", "fc1", "fc2")] == [28, 28, 28]
    assert [round(counts[c] / 1e3) for c in ("ln2", "ln1")] == [18, 18]
    assert round(total / 1e6) == 86
    assert [round(100 * counts[c] / total) for c in ("mha", "fc1", "fc2")] == [33, 33, 33]
    assert [round(100 * counts[c] / total, 2) for c in ("ln2", "ln1")] == [0.02, 0.02]


def test_memory_load_is_table_4(vit_base):
    table = components.parameter_table(vit_base)
    # gradient + one momentum buffer, 4 bytes each
    assert table.loc["MHA", "memory load (MiB)"] == pytest.approx(vit_base_counts()["mha"] * 8 / 2**20)
    # Paper Table 4: 220 MB for MHA/FC1/FC2 and 0.14 MB for the LayerNorms.
    assert round(table.loc["MHA", "memory load (MiB)"], -1) == 220
    assert round(table.loc["LN1", "memory load (MiB)"], 2) == 0.14
    assert components.memory_load(10, optimizer="adam") == 120
    with pytest.raises(ValueError, match="valid optimizers: sgd, adam"):
        components.memory_load(10, optimizer="lion")


def test_meta_architecture_matches_real_model(vit_base):
    meta = models.architecture("vit_base_in21k", num_classes=10)
    assert all(p.is_meta for p in meta.parameters())
    for component in RUN_COMPONENTS:
        assert components.trained_parameters(meta, component) == components.trained_parameters(vit_base, component)


def test_vit_huge_is_the_papers_632m():
    huge = models.architecture("vit_huge_in21k")
    assert len(huge.blocks) == 32 and huge.embed_dim == 1280
    assert round(sum(p.numel() for p in huge.parameters()) / 1e6) == 631  # paper Table 2 rounds to 632M
    assert components.component_parameters(huge, "ln1") == 32 * 2 * 1280


def _expected_trainable(model, component):
    """Names that must train, derived from parameter names (not from paperlib's module lists)."""
    names = [n for n, _ in model.named_parameters()]
    if component == "full":
        return set(names)
    keep = {n for n in names if n.startswith("head.")}
    if component != "linear":
        path = components.MODULE_PATHS[component]
        keep |= {n for n in names if n.startswith("blocks.") and n.split(".", 2)[2].startswith(path + ".")}
        keep |= {n for n in names if n.startswith("norm.")}
    return keep


@pytest.mark.parametrize("component", RUN_COMPONENTS)
def test_set_trainable_changes_only_the_chosen_parameters(component, tiny_model):
    model = tiny_model
    components.set_trainable(model, component)
    trainable = {n for n, _ in components.trainable_parameters(model)}
    assert trainable == _expected_trainable(model, component)

    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1, momentum=0.9)
    images, labels = torch.randn(8, 3, 32, 32), torch.randint(0, 3, (8,))
    for _ in range(2):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(images), labels).backward()
        optimizer.step()
    for name, parameter in model.named_parameters():
        if name in trainable:
            continue
        assert torch.equal(parameter, before[name]), f"{name} changed under component {component}"
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert changed, "nothing was trained"
    assert changed <= trainable
    # every trainable weight matrix moved (biases of LayerNorm may stay put by chance only in theory)
    assert "head.weight" in changed


def test_set_trainable_is_reversible(tiny_vit):
    model = tiny_vit()
    components.set_trainable(model, "ln1")
    components.set_trainable(model, "full")
    assert all(p.requires_grad for p in model.parameters())


def test_bad_names_list_the_valid_choices(tiny_vit):
    model = tiny_vit()
    with pytest.raises(ValueError, match="valid configurations: mha, fc1, fc2, ln2, ln1, full, linear"):
        components.set_trainable(model, "attention")
    with pytest.raises(ValueError, match="valid components: mha, fc1, fc2, ln2, ln1"):
        components.component_parameters(model, "full")


def test_non_vit_is_rejected_clearly():
    with pytest.raises(TypeError, match="timm VisionTransformer"):
        components.component_parameters(torch.nn.Linear(3, 3), "mha")


def test_demo_counts_follow_its_architecture(tiny_vit):
    model = tiny_vit()
    assert isinstance(model, VisionTransformer)
    d, depth = model.embed_dim, len(model.blocks)
    assert components.component_parameters(model, "fc1") == depth * (d * 4 * d + 4 * d)
    total = components.count_parameters([model])
    assert math.isclose(components.parameter_table(model).loc["All", "% of total"], 100.0)
    assert components.trained_parameters(model, "full") == total


def test_blocks_are_the_models_transformer_blocks(tiny_vit):
    model = tiny_vit()
    assert components.blocks(model) is model.blocks
    with pytest.raises(TypeError, match="has no transformer blocks"):
        components.blocks(torch.nn.Linear(3, 3))


def test_a_configuration_added_to_the_registry_is_a_row_of_table_3_and_one_a_run_can_train(vit_base, monkeypatch):
    # FC1 and FC2 together, as one configuration: written once, in the registry
    monkeypatch.setitem(names.CONFIGURATIONS, "mlp", names.Configuration("MLP", "#000000", ("fc1", "fc2")))
    table = components.parameter_table(vit_base)
    counts = vit_base_counts()
    assert table.loc["MLP", "parameters"] == counts["fc1"] + counts["fc2"]  # Table 3 from the hand count
    head_and_norm = table.loc["FC1", "trainable"] - counts["fc1"]
    assert table.loc["MLP", "trainable"] == counts["fc1"] + counts["fc2"] + head_and_norm
    components.set_trainable(vit_base, "mlp")
    trained = {name for name, _ in components.trainable_parameters(vit_base)}
    assert "blocks.0.mlp.fc1.weight" in trained and "blocks.11.mlp.fc2.bias" in trained and "head.weight" in trained
    assert not any(".attn." in name or ".norm1." in name for name in trained)
    # and a run's Config takes it by name
    assert Config(component="mlp").component == "mlp"


def test_an_unknown_configuration_is_refused_by_name_everywhere(vit_base):
    for refuse in (
        lambda: components.parameter_table(vit_base, configurations=["mha", "mlp"]),
        lambda: components.set_trainable(vit_base, "mlp"),
        lambda: Config(component="mlp"),
    ):
        with pytest.raises(ValueError, match="unknown finetuning configuration 'mlp'; valid configurations: mha, fc1"):
            refuse()
