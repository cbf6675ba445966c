import pytest
import timm
import torch
from safetensors.torch import save_file

from paperlib import speed
from paperlib.records import paths
from paperlib.vit import models


def test_short_names_map_to_the_papers_timm_weights():
    assert models.resolve_name("vit_base_in21k") == "vit_base_patch16_224.orig_in21k"
    assert models.resolve_name("vit_large_in21k") == "vit_large_patch16_224.orig_in21k"
    assert models.resolve_name("vit_huge_in21k") == "vit_huge_patch14_224.orig_in21k"
    for name in models.PAPER_MODELS.values():
        cfg = timm.models.get_pretrained_cfg(name)
        assert cfg is not None and cfg.hf_hub_id, f"{name} has no hub weights in timm"


def test_paper_architectures_without_weights():
    base = models.architecture("vit_base_in21k")
    assert (len(base.blocks), base.embed_dim, base.patch_embed.patch_size) == (12, 768, (16, 16))
    assert base.num_classes == 0  # the ImageNet-21k checkpoints of timm carry no head
    assert models.architecture("vit_base_in21k", num_classes=10).head.out_features == 10


def test_any_timm_vit_and_tags_are_accepted():
    model = models.create_model("vit_tiny_patch16_224.augreg_in21k", pretrained=False, num_classes=3, img_size=32)
    assert model.head.out_features == 3
    assert model(torch.randn(1, 3, 32, 32)).shape == (1, 3)


@pytest.mark.parametrize("name", ["vit_base", "resnet50", "demo2", ""])
def test_unknown_names_list_the_valid_short_names(name):
    with pytest.raises(ValueError, match="valid short names: vit_base_in21k, vit_large_in21k, vit_huge_in21k, demo"):
        models.create_model(name, pretrained=False)


def test_bad_num_classes():
    with pytest.raises(ValueError, match="num_classes"):
        models.create_model("demo", pretrained=False, num_classes=-1)


def test_demo_loads_the_committed_weights():
    assert paths.DEMO_WEIGHTS.is_file()
    assert paths.DEMO_WEIGHTS.stat().st_size <= 2 * 1024 * 1024
    pretrained = models.create_model("demo")
    random = models.create_model("demo", pretrained=False)
    assert pretrained.head.out_features == 5
    assert not torch.equal(pretrained.blocks[0].attn.qkv.weight, random.blocks[0].attn.qkv.weight)


def test_a_head_asked_for_is_new_even_where_the_pretrained_one_has_its_size():
    # the demo ViT was pretrained on 5 classes and the demo datasets have 5: timm would keep the
    # pretrained head; finetuning asks for a new one, drawn from the seed as timm draws new heads
    pretrained = models.create_model("demo")
    torch.manual_seed(0)
    first = models.create_model("demo", num_classes=5)
    torch.manual_seed(1)
    second = models.create_model("demo", num_classes=5)
    torch.manual_seed(0)
    again = models.create_model("demo", num_classes=5)
    assert first.head.out_features == 5 and not torch.equal(first.head.weight, pretrained.head.weight)
    assert not torch.equal(first.head.weight, second.head.weight) and torch.equal(first.head.weight, again.head.weight)
    # the authors' new head, nn.Linear(d, classes) as PyTorch initialises it: weights and biases uniform in
    # +-1/sqrt(d) (d = 64 for the demo ViT), neither all zero
    bound = 1 / 64**0.5
    for tensor in (first.head.weight, first.head.bias):
        assert float(tensor.abs().max()) <= bound and float(tensor.abs().max()) > bound / 2
    # the backbone is the pretrained one
    assert torch.equal(first.blocks[0].attn.qkv.weight, pretrained.blocks[0].attn.qkv.weight)
    # no num_classes: the pretrained head
    assert torch.equal(models.create_model("demo").head.weight, pretrained.head.weight)


@pytest.mark.parametrize("suffix", [".safetensors", ".pth"])
def test_local_weights_round_trip_through_timm(tmp_path, suffix):
    source = models.create_model("demo", pretrained=False)
    path = tmp_path / f"weights{suffix}"
    state = {k: v.contiguous() for k, v in source.state_dict().items()}
    save_file(state, path) if suffix == ".safetensors" else torch.save(state, path)

    loaded = models.create_model("demo", weights=path)
    for key, value in source.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key

    # A new head: the backbone is loaded, the head is new and sized for the task.
    fresh = models.create_model("demo", weights=path, num_classes=7)
    assert fresh.head.out_features == 7
    assert torch.equal(fresh.blocks[-1].mlp.fc2.weight, source.blocks[-1].mlp.fc2.weight)


def test_local_weights_for_a_paper_architecture(tmp_path):
    # The same code path loads a ViT-Base checkpoint from disk (here a random one, at a small image size).
    source = models.create_model("vit_base_in21k", pretrained=False, img_size=32)
    path = tmp_path / "vit_base.safetensors"
    save_file({k: v.contiguous() for k, v in source.state_dict().items()}, path)
    loaded = models.create_model("vit_base_in21k", weights=path, img_size=32, num_classes=4)
    assert torch.equal(loaded.blocks[3].norm1.weight, source.blocks[3].norm1.weight)
    assert loaded.head.out_features == 4


def test_missing_weight_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="weight file not found"):
        models.create_model("demo", weights=tmp_path / "nope.safetensors")


def test_hub_download_offline_gives_a_clear_error(monkeypatch, tmp_path):
    # The real hub path (timm -> huggingface_hub), with the hub switched to offline mode.
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))  # an empty cache
    with pytest.raises(
        RuntimeError, match="https://huggingface.co/timm/vit_base_patch16_224.orig_in21k.*weights="
    ) as info:
        models.create_model("vit_base_in21k", img_size=32)
    assert info.value.__cause__ is not None


def test_patch_embedding_as_a_matrix_product_is_the_same_function():
    torch.manual_seed(0)
    model = models.create_model(
        "vit_tiny_patch16_224.augreg_in21k", pretrained=False, num_classes=3, img_size=32, patch_size=8
    ).double()
    conv = model.patch_embed.proj
    images = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    expected_out = model(images)
    expected_out.square().sum().backward()
    expected = {name: p.grad.clone() for name, p in model.named_parameters()}
    keys = list(model.state_dict())
    model.zero_grad(set_to_none=True)

    assert speed.layers.linear_patch_embed(model) is model
    proj = model.patch_embed.proj
    assert isinstance(proj, speed.layers.PatchLinear) and proj.weight is conv.weight and proj.bias is conv.bias
    # same parameters under the same names: checkpoints and bounds are unchanged
    assert list(model.state_dict()) == keys
    out = model(images)
    out.square().sum().backward()
    assert torch.allclose(out, expected_out, rtol=0, atol=1e-12)
    for name, p in model.named_parameters():
        assert torch.allclose(p.grad, expected[name], rtol=1e-10, atol=1e-12), name
    speed.layers.linear_patch_embed(model)  # done already: nothing changes
    assert model.patch_embed.proj is proj


def test_patch_linear_drops_the_pixels_that_fill_no_patch_like_the_convolution():
    conv = torch.nn.Conv2d(3, 8, kernel_size=(4, 5), stride=(4, 5)).double()
    images = torch.randn(2, 3, 19, 23, dtype=torch.float64)
    out = speed.layers.PatchLinear(conv)(images)
    assert out.shape == (2, 8, 4, 4) and torch.allclose(out, conv(images), rtol=0, atol=1e-12)


def test_patch_linear_refuses_convolutions_that_are_not_patchings():
    with pytest.raises(ValueError, match="stride = kernel"):
        speed.layers.PatchLinear(torch.nn.Conv2d(3, 8, kernel_size=4, stride=2))
    with pytest.raises(ValueError, match="stride = kernel"):
        speed.layers.PatchLinear(torch.nn.Conv2d(3, 8, kernel_size=4, stride=4, padding=1))
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3))
    assert speed.layers.linear_patch_embed(model) is model  # no patch embedding: left as it is
