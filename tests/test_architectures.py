"""timm's later ViTs beyond the paper's: Eva models (DINOv3, EVA-02, the RoPE ViTs) and ViTs with
RMSNorm and SwiGLU (AIMv2). Tiny random-weight versions of the real timm architectures, built
offline; the paper's definitions are written out by hand here, from the blocks' own layers."""

import copy
import math
import warnings

import pytest
import timm
import torch
from torch import nn

from paperlib import speed
from paperlib.measure import bounds, component_rates, plasticity
from paperlib.records import specs
from paperlib.records.methods import Lora
from paperlib.train import checkpoints, finetune
from paperlib.train.config import Config
from paperlib.vit import components, lora, models
from paperlib.vit.components import COMPONENTS

SMALL = dict(img_size=32, patch_size=4, embed_dim=64, depth=2, num_heads=4)

ARCHITECTURES = {
    # RoPE, LayerScale, register tokens, SwiGLU with separate gate and value layers (fc1_g, fc1_x)
    "dinov3_swiglu": "vit_7b_patch16_dinov3",
    # RoPE, q/v biases applied through F.linear, packed SwiGLU (GluMlp: one fc1)
    "eva02": "eva02_tiny_patch14_224",
    # one rotary embedding per block (mixed RoPE), plain Mlp
    "rope_mixed": "vit_small_patch16_rope_mixed_224",
    # a VisionTransformer with RMSNorm and SwiGLU
    "aimv2": "aimv2_large_patch14_224",
}


def _build(kind: str) -> nn.Module:
    torch.manual_seed(0)
    model = timm.create_model(ARCHITECTURES[kind], pretrained=False, num_classes=5, **SMALL).eval()
    with torch.no_grad():  # random LayerScale and norm gains, so no component is an identity by construction
        for name, parameter in model.named_parameters():
            if "gamma" in name or "norm" in name and name.endswith("weight"):
                parameter.copy_(0.5 + torch.rand_like(parameter))
    return model


@pytest.fixture(params=list(ARCHITECTURES))
def model(request):
    return _build(request.param)


def _pairs(n: int = 3):
    torch.manual_seed(1)
    return torch.randn(n, 3, 32, 32), torch.randn(n, 3, 32, 32)


def _fc1(block, tokens):
    """FC1 by hand: one first layer, or SwiGLU's gate and value layers side by side."""
    mlp = block.mlp
    if hasattr(mlp, "fc1_g"):
        return torch.cat(
            [
                nn.functional.linear(tokens, mlp.fc1_g.weight, mlp.fc1_g.bias),
                nn.functional.linear(tokens, mlp.fc1_x.weight, mlp.fc1_x.bias),
            ],
            dim=-1,
        )
    return nn.functional.linear(tokens, mlp.fc1.weight, mlp.fc1.bias)


def _norm(module, tokens):
    if isinstance(module, nn.LayerNorm):
        return nn.functional.layer_norm(tokens, module.normalized_shape, module.weight, module.bias, module.eps)
    rms = tokens.pow(2).mean(dim=-1, keepdim=True).add(module.eps).rsqrt()
    return tokens * rms * module.weight


def _rope(model, index):
    rope = (
        model._pos_embed(model.patch_embed(torch.zeros(1, 3, 32, 32)))[1]
        if isinstance(model, timm.models.eva.Eva)
        else None
    )
    if rope is not None and getattr(model, "rope_mixed", False):
        rope = rope[index]
    return {} if rope is None else {"rope": rope}


def _definition_1(model, x, y):
    """Every component applied to the two embeddings, written from the blocks' layers."""

    def tokens(images):
        out = model._pos_embed(model.patch_embed(images))
        return out[0] if isinstance(out, tuple) else out

    ex, ey = tokens(x), tokens(y)
    norm = lambda t: torch.linalg.vector_norm(t.double().flatten(1), dim=1)  # noqa: E731
    out = []
    for index, block in enumerate(model.blocks):
        fc2 = block.mlp.fc2
        lift = lambda t: nn.functional.pad(t, (0, fc2.in_features - t.shape[-1]))  # noqa: E731
        maps = {
            "mha": lambda t: block.attn(t, **_rope(model, index)),
            "fc1": lambda t: _fc1(block, t),
            "fc2": lambda t: nn.functional.linear(lift(t), fc2.weight, fc2.bias),
            "ln2": lambda t: _norm(block.norm2, t),
            "ln1": lambda t: _norm(block.norm1, t),
        }
        out.append(torch.stack([norm(maps[c](ex) - maps[c](ey)) / norm(ex - ey) for c in COMPONENTS]))
    return torch.stack(out)


@torch.no_grad()
def test_rates_are_definition_1_on_later_vits(model):
    x, y = _pairs()
    expected = _definition_1(model, x, y)
    assert torch.allclose(component_rates.rate_tensor(model, x, y), expected, rtol=1e-5)
    assert torch.allclose(component_rates.plain_rates(model, x, y), expected, rtol=1e-5)


@torch.no_grad()
def test_rope_reaches_the_attention():
    model = _build("dinov3_swiglu")
    with torch.no_grad():  # sharp attention, so that where a token is matters
        model.blocks[0].attn.qkv.weight[: 2 * SMALL["embed_dim"]] *= 8
    x, y = _pairs()
    ex, ey = component_rates.embed(model, x), component_rates.embed(model, y)
    without = torch.linalg.vector_norm((model.blocks[0].attn(ex) - model.blocks[0].attn(ey)).flatten(1), dim=1)
    ours = component_rates.rate_tensor(model, x, y)[0, COMPONENTS.index("mha")]
    assert not torch.allclose(
        ours, (without / torch.linalg.vector_norm((ex - ey).flatten(1), dim=1)).double(), rtol=1e-3
    )


def _in_situ_by_hand(model, x, y):
    """A hand-written forward pass of an Eva or ViT block (LayerScale, RoPE, SwiGLU), recording
    each component's input and output."""

    def seq(images):
        out = model._pos_embed(model.patch_embed(images))
        h = model.norm_pre(out[0] if isinstance(out, tuple) else out)
        records = []
        for index, block in enumerate(model.blocks):
            scale1 = getattr(block, "gamma_1", None)
            scale2 = getattr(block, "gamma_2", None)
            if scale1 is None and hasattr(block, "ls1"):
                scale1 = getattr(block.ls1, "gamma", None)
                scale2 = getattr(block.ls2, "gamma", None)
            n1 = _norm(block.norm1, h)
            a = block.attn(n1, **_rope(model, index))
            h2 = h + (a if scale1 is None else scale1 * a)
            n2 = _norm(block.norm2, h2)
            hidden = _fc1(block, n2)
            mlp = block.mlp
            if hasattr(mlp, "fc1_g"):
                act = mlp.norm(mlp.act(hidden[..., : mlp.fc1_g.out_features]) * hidden[..., mlp.fc1_g.out_features :])
            elif isinstance(mlp, timm.layers.GluMlp):
                gate, value = hidden.chunk(2, dim=-1)
                act = mlp.norm(mlp.act(gate) * value)
            else:
                act = mlp.norm(mlp.act(hidden))
            m = mlp.fc2(act)
            records.append({"ln1": (h, n1), "mha": (n1, a), "ln2": (h2, n2), "fc1": (n2, hidden), "fc2": (act, m)})
            h = h2 + (m if scale2 is None else scale2 * m)
        return records

    norm = lambda t: torch.linalg.vector_norm(t.double().flatten(1), dim=1)  # noqa: E731
    rx, ry = seq(x), seq(y)
    return torch.stack(
        [
            torch.stack([norm(bx[c][1] - by[c][1]) / norm(bx[c][0] - by[c][0]) for c in COMPONENTS])
            for bx, by in zip(rx, ry)
        ]
    )


@torch.no_grad()
def test_in_situ_rates_follow_the_blocks_own_forward_pass(model):
    x, y = _pairs()
    expected = _in_situ_by_hand(model, x, y)
    ours = component_rates.rate_tensor(model, x, y, inputs="in_situ")
    assert torch.allclose(ours, expected, rtol=1e-4)


def test_fc1_of_a_swiglu_block_is_its_gate_and_value_layers():
    model = _build("dinov3_swiglu")
    block = model.blocks[0]
    fc1 = components.block_component(block, "fc1")
    assert [id(p) for p in components.component_parts(fc1)] == [id(block.mlp.fc1_g), id(block.mlp.fc1_x)]
    assert components.component_parameters(model, "fc1") == sum(
        p.numel() for b in model.blocks for p in [*b.mlp.fc1_g.parameters(), *b.mlp.fc1_x.parameters()]
    )

    components.set_trainable(model, "fc1")
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    head_and_norm = {name for name, _ in model.named_parameters() if name.startswith(("head.", "norm.", "fc_norm."))}
    fc1 = {name for name, _ in model.named_parameters() if ".mlp.fc1_" in name}
    assert fc1 and head_and_norm and trainable == fc1 | head_and_norm

    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    model.train()
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5)
    nn.functional.cross_entropy(model(torch.randn(4, 3, 32, 32)), torch.arange(4)).backward()
    optimizer.step()
    changed = {name for name, p in model.named_parameters() if not torch.equal(p, before[name])}
    assert (
        changed <= trainable
        and any(".mlp.fc1_g." in name for name in changed)
        and any(".mlp.fc1_x." in name for name in changed)
    )


def test_blocks_without_the_five_components_are_refused_before_any_download():
    with pytest.raises(TypeError, match="ParallelScalingBlock has no 'attn'"):
        models.create_model("vit_base_patch16_xp_224", pretrained=False)
    # pretrained: the architecture is refused first, so no fetch is tried (there is no internet here)
    with pytest.raises(TypeError, match="does not have the paper's five components"):
        models.create_model("vit_base_patch16_xp_224")
    assert "vit_base_patch16_dinov3" in models.vit_names() and "eva02_base_patch14_224" in models.vit_names()


def test_bounds_are_empty_where_the_propositions_do_not_reach(model):
    x, _ = _pairs(4)
    reasons = bounds.outside_propositions(model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        table = bounds.upper_bounds(model, r=10.0, sigma=1.0, energy=100.0)
    rope = getattr(model, "rope", None) is not None
    assert ("mha" in reasons) == (
        rope or not isinstance(model.blocks[0].attn, timm.models.vision_transformer.Attention)
    )
    if rope:
        assert "RoPE" in reasons["mha"]
    rms = not isinstance(model.blocks[0].norm1, nn.LayerNorm)
    assert ("ln1" in reasons) == rms and ("ln2" in reasons) == rms
    assert {str(w.message).split(":")[0] for w in caught} >= {f"no bound for {c.upper()}" for c in reasons}
    for component in COMPONENTS:
        values = table.loc[table.component == component, "bound"]
        assert values.isna().all() if component in reasons else values.notna().all()
    # Prop. 2 holds for any linear map: FC1's bound is the spectral norm of the stacked weights
    stacked = torch.cat(
        [p.weight.detach() for p in components.component_parts(components.block_component(model.blocks[1], "fc1"))]
    )
    fc1 = table[(table.block == 1) & (table.component == "fc1")]["bound"].item()
    assert fc1 == pytest.approx(float(torch.linalg.matrix_norm(stacked.double(), ord=2)))
    with torch.no_grad():
        rates = plasticity.rates(model, x, x.flip(0))
    shares = bounds.violations(table, rates)
    for component in COMPONENTS:
        assert math.isnan(shares[component]) == (component in reasons)
    assert shares["fc1"] == 0.0 and shares["fc2"] == 0.0  # a linear map never exceeds its spectral norm


def test_the_papers_vits_are_inside_the_propositions(tiny_vit):
    assert bounds.outside_propositions(tiny_vit()) == {}


def test_lora_finds_the_projections_each_block_has():
    dinov3, eva02, aimv2 = _build("dinov3_swiglu"), _build("eva02"), _build("aimv2")
    assert lora.target_names(dinov3, "fc1")[:2] == ["blocks.0.mlp.fc1_g", "blocks.0.mlp.fc1_x"]
    assert lora.target_names(dinov3, "mha")[:2] == ["blocks.0.attn.qkv", "blocks.0.attn.proj"]
    assert lora.target_names(aimv2, "full")[:4] == [
        "blocks.0.attn.qkv",
        "blocks.0.attn.proj",
        "blocks.0.mlp.fc1_g",
        "blocks.0.mlp.fc1_x",
    ]
    eva02_q = timm.create_model("eva02_base_patch14_224", pretrained=False, **SMALL)  # separate q/k/v projections
    assert lora.target_names(eva02_q, "mha")[:4] == [
        "blocks.0.attn.q_proj",
        "blocks.0.attn.k_proj",
        "blocks.0.attn.v_proj",
        "blocks.0.attn.proj",
    ]
    assert lora.target_names(eva02, "fc1") == ["blocks.0.mlp.fc1", "blocks.1.mlp.fc1"]
    with pytest.raises(ValueError, match="would bypass LoRA"):
        lora.target_names(eva02, "mha")


def _randomise_lora(model):
    with torch.no_grad():
        for layer in lora.adapted_layers(model):
            for b in layer.lora_B.values():
                b.weight.normal_()


@torch.no_grad()
def test_lora_updates_change_what_each_model_computes():
    x = torch.randn(2, 3, 32, 32)
    for kind, component in (("dinov3_swiglu", "full"), ("eva02", "fc1"), ("aimv2", "full")):
        model = _build(kind)
        before = model.forward_features(x)
        lora.add_lora(model, component, rank=2)
        assert torch.allclose(model.forward_features(x), before, atol=1e-5)  # B starts at zero
        _randomise_lora(model)
        assert not torch.allclose(model.forward_features(x), before, atol=1e-2)


@torch.no_grad()
def test_the_refused_lora_would_indeed_be_bypassed():
    """Why LoRA on EVA-02's attention is refused: peft's update on qkv never reaches the output,
    because the attention multiplies by qkv.weight itself."""
    from peft import LoraConfig, inject_adapter_in_model

    model, x = _build("eva02"), torch.randn(2, 3, 32, 32)
    before = model.forward_features(x)
    inject_adapter_in_model(LoraConfig(r=2, target_modules=["blocks.0.attn.qkv"]), model)
    _randomise_lora(model)
    assert len(lora.adapted_layers(model)) == 1
    assert torch.equal(model.forward_features(x), before)


def test_finetuning_and_plasticity_run_on_a_saved_dinov3_style_model(home):
    saved = _build("dinov3_swiglu")
    models.save_model(saved, "custom/tiny_dinov3")
    back = models.create_model("custom/tiny_dinov3")
    assert type(back).__name__ == "Eva"
    assert all(torch.equal(p, saved.state_dict()[n]) for n, p in back.state_dict().items())

    config = Config(
        model="custom/tiny_dinov3",
        dataset="digits",
        component="fc1",
        steps=6,
        warmup=1,
        eval_every=3,
        batch_size=16,
        lr=0.1,
        save_weights=True,
    )
    metrics = finetune.run(config)
    assert metrics["trainable_parameters"] == components.trained_parameters(
        models.create_model("custom/tiny_dinov3", num_classes=5), "fc1"
    )
    tuned, start = checkpoints.load_model(config), models.create_model("custom/tiny_dinov3", num_classes=5).state_dict()
    changed = {name for name, p in tuned.state_dict().items() if name in start and not torch.equal(p, start[name])}
    assert {name.split(".mlp.")[1].split(".")[0] for name in changed if ".mlp." in name} == {"fc1_g", "fc1_x"}
    assert {name for name in changed if ".mlp." not in name} <= {
        name for name in start if name.startswith(("head.", "norm."))
    }

    lora_config = Config(
        model="custom/tiny_dinov3",
        dataset="digits",
        component="mha",
        steps=4,
        warmup=1,
        eval_every=2,
        batch_size=16,
        lr=0.1,
        method=Lora(rank=2),
    )
    assert 0.0 <= finetune.run(lora_config)["test_accuracy"] <= 1.0

    table, folder = plasticity.run(plasticity.Measurement("custom/tiny_dinov3", n_pairs=8), progress=False)
    assert folder.is_dir() and set(table["component"]) == set(COMPONENTS) and table["rate"].notna().all()


def test_blocks_of_an_eva_model_compile_in_place():
    model = _build("dinov3_swiglu")
    assert isinstance(model.blocks, nn.ModuleList)  # not VisionTransformer's Sequential
    assert speed.step.compile_model(model, "blocks", fused="none") is model
    assert all(getattr(block, "_compiled_call_impl", None) is not None for block in model.blocks)


def test_the_later_vits_sweep_names_models_that_build_and_normalise():
    from paperlib.sweeps import sweep

    spec = specs.load_spec("parameters/sweeps/plasticity_later_vits.yaml")
    runs = sweep.expand(spec)
    names = spec["grid"]["model"]
    assert len(runs) == len(names) * 11 and {r.parameters["normalize"] for r in runs} == {"model"}
    for name in names:
        model = models.architecture(name)  # the meta device: shapes only, nothing fetched
        assert components.check_model(model) is model
        mean, std = models.normalization(name, "model")
        assert len(mean) == len(std) == 3


# --------------------------------------------------------------------------------------------
# what a review found: fused ops, LoRA, shared blocks, EVA-01, mixed RoPE, patch dropout


@torch.no_grad()
def test_the_papers_vit_with_fused_ops_measures_and_bounds_as_without(tiny_vit):
    plain = tiny_vit().eval()
    fused = speed.step.fuse(copy.deepcopy(plain), "gelu+qkv")
    assert type(fused.blocks[0].mlp).__name__ == "BiasGeluMlp"  # fc1 is read, not called
    x, y = _pairs()
    assert torch.allclose(
        component_rates.rate_tensor(fused, x, y, inputs="in_situ"),
        component_rates.rate_tensor(plain, x, y, inputs="in_situ"),
        rtol=1e-4,
    )
    ours, theirs = (bounds.upper_bounds(m, r=10.0, sigma=1.0) for m in (fused, plain))
    assert ours["bound"].notna().all() and torch.allclose(
        torch.tensor(ours["bound"].values), torch.tensor(theirs["bound"].values)
    )


def test_unmerged_lora_updates_are_refused_by_the_measures_that_would_miss_them(tiny_vit):
    model = tiny_vit()
    lora.add_lora(model, "fc1", rank=2)
    x, y = _pairs()
    with pytest.raises(TypeError, match=r"lora.merge\(model\) first"):
        component_rates.rate_tensor(model, x, y)
    with pytest.raises(TypeError, match=r"lora.merge\(model\) first"):
        bounds.upper_bounds(model, r=10.0, sigma=1.0)
    lora.merge(model)
    assert torch.isfinite(component_rates.rate_tensor(model, x, y)).all()


@torch.no_grad()
def test_blocks_sharing_weights_have_no_in_situ_rate(tiny_vit):
    model = tiny_vit().eval()
    model.blocks[1] = model.blocks[0]
    x, y = _pairs()
    with pytest.raises(TypeError, match="called mha of block 0 2 times"):
        component_rates.rate_tensor(model, x, y, inputs="in_situ")
    # Definition 1 applies each block to e(x) alone
    assert torch.isfinite(component_rates.rate_tensor(model, x, y)).all()


def test_eva01_attention_is_the_papers_and_gets_its_bound():
    eva01 = timm.create_model("eva_giant_patch14_224", pretrained=False, **SMALL).eval()
    assert getattr(eva01, "rope", None) is None and "mha" not in bounds.outside_propositions(eva01)
    attn = eva01.blocks[0].attn
    paper = timm.models.vision_transformer.Attention(64, num_heads=4, qkv_bias=True)
    with torch.no_grad():
        paper.qkv.weight.copy_(attn.qkv.weight)
        paper.proj.weight.copy_(attn.proj.weight)
    assert bounds.mha_bound_prop3(attn, 65, 10.0) == pytest.approx(bounds.mha_bound_prop3(paper, 65, 10.0))
    # and EVA-02-Base's three projections are read as one q/k/v weight
    eva02_base = timm.create_model("eva02_base_patch14_224", pretrained=False, **SMALL)
    attn = eva02_base.blocks[0].attn
    q, k, v, _ = bounds.head_weights(attn)[1]
    assert (
        torch.equal(q, attn.q_proj.weight[16:32])
        and torch.equal(k, attn.k_proj.weight[16:32])
        and torch.equal(v, attn.v_proj.weight[16:32])
    )


def test_mixed_rope_frequencies_train_with_the_attention():
    model = _build("rope_mixed")
    frequencies = {name for name, _ in model.named_parameters() if name.startswith("rope.")}
    assert frequencies
    components.set_trainable(model, "mha")
    assert all(p.requires_grad for name, p in model.named_parameters() if name in frequencies)
    components.set_trainable(model, "fc1")
    assert not any(p.requires_grad for name, p in model.named_parameters() if name in frequencies)
    per_block = sum(p.numel() for b in model.blocks for p in b.attn.parameters())
    assert components.component_parameters(model, "mha") == per_block + sum(p.numel() for p in model.rope.parameters())


def test_token_constants_are_taken_without_patch_dropout():
    model = timm.create_model("vit_small_patch16_dinov3", pretrained=False, patch_drop_rate=0.5, **SMALL).train()
    images = torch.randn(4, 3, 32, 32)
    radius = bounds.token_radius(model, images, "max")
    assert model.training  # left as it was
    assert radius == bounds.token_radius(model.eval(), images, "max")
    with torch.no_grad():
        assert (
            model.train()._pos_embed(model.patch_embed(images))[0].shape[1]
            < component_rates.embed(model.eval(), images).shape[1]
        )


@torch.no_grad()
def test_the_gpu_rewrites_keep_each_models_function(model):
    """What finetuning does to a model on CUDA (the patch embedding as one matrix product, our fused
    ops where a layer has their form), here on the CPU: the same function."""
    x = torch.randn(2, 3, 32, 32)
    before = model.forward_features(x)
    rewritten = speed.step.fuse(speed.layers.linear_patch_embed(copy.deepcopy(model)), "gelu+qkv")
    assert type(rewritten.patch_embed.proj).__name__ == "PatchLinear"
    assert torch.allclose(rewritten.forward_features(x), before, atol=1e-4, rtol=1e-4)
