"""Propositions 1-4: the bounds hold where their assumptions hold, and are computed right."""

import math

import numpy as np
import pandas as pd
import pytest
import torch
from timm.layers import Mlp
from timm.models.vision_transformer import Attention, VisionTransformer

from paperlib.data import datasets, imagesets
from paperlib.measure import bounds, component_rates
from paperlib.vit import models
from paperlib.vit.components import COMPONENTS


def _attention(d=24, heads=3, seed=0, scale=1.0):
    torch.manual_seed(seed)
    attn = Attention(d, num_heads=heads, qkv_bias=False).eval()  # the propositions' bias-free attention
    with torch.no_grad():
        attn.qkv.weight.mul_(scale * 3)
        attn.proj.weight.mul_(2)
    return attn


def _in_ball(n_pairs, n, d, r, generator):
    """Token sequences with every token norm at most r."""
    x = torch.randn(n_pairs, n, d, generator=generator)
    norms = torch.linalg.vector_norm(x, dim=-1, keepdim=True)
    radii = r * torch.rand(n_pairs, n, 1, generator=generator)
    return x / norms * radii


def _rate(f, x, y):
    flat = lambda t: torch.linalg.vector_norm(t.flatten(1), dim=1)  # noqa: E731
    with torch.no_grad():
        return flat(f(x) - f(y)) / flat(x - y)


def _manual_heads(attn, x, slicing):
    """Attention computed head by head from sliced weights (no fused kernels)."""
    out = 0
    for q, k, v, o in slicing(attn):
        scores = (x @ q.T) @ (x @ k.T).transpose(-2, -1) / math.sqrt(q.shape[0])
        out = out + torch.softmax(scores, dim=-1) @ (x @ v.T) @ o.T
    return out + attn.proj.bias


def _wrong_slicing(attn):
    """A plausible mistake: heads as interleaved rows instead of contiguous blocks."""
    d, heads = attn.qkv.in_features, attn.num_heads
    q, k, v = attn.qkv.weight.detach().reshape(3, d, d)
    o = attn.proj.weight.detach()
    return [(q[h::heads], k[h::heads], v[h::heads], o[:, h::heads]) for h in range(heads)]


def test_head_slicing_reproduces_the_modules_forward():
    attn = _attention()
    x = torch.randn(2, 7, 24)
    with torch.no_grad():
        assert torch.allclose(_manual_heads(attn, x, bounds.head_weights), attn(x), atol=1e-5)
        assert not torch.allclose(_manual_heads(attn, x, _wrong_slicing), attn(x), atol=1e-3)


@pytest.mark.parametrize("seed, d, heads, n", [(0, 24, 3, 5), (1, 32, 4, 9), (2, 16, 1, 3)])
def test_prop3_holds_for_tokens_in_the_ball(seed, d, heads, n):
    attn = _attention(d, heads, seed)
    g = torch.Generator().manual_seed(seed)
    x, y = _in_ball(64, n, d, 2.0, g), _in_ball(64, n, d, 2.0, g)
    r = float(torch.linalg.vector_norm(torch.cat([x, y]), dim=-1).max())
    assert _rate(attn, x, y).max() <= bounds.mha_bound_prop3(attn, n, r)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_prop2_holds_and_is_reached_by_the_top_singular_vector(seed):
    torch.manual_seed(seed)
    mlp = Mlp(16, 64)
    for layer, width in ((mlp.fc1, 16), (mlp.fc2, 64)):
        x, y = torch.randn(32, 5, width), torch.randn(32, 5, width)
        bound = bounds.spectral_norm(layer.weight)
        assert _rate(layer, x, y).max() <= bound * (1 + 1e-6)
        top = torch.linalg.svd(layer.weight.detach())[2][0]  # right singular vector
        assert _rate(layer, x[:1], x[:1] + top).item() == pytest.approx(bound, rel=1e-4)


def test_prop1_holds_and_is_tight_when_its_assumption_holds():
    d, n = 32, 6
    norm = torch.nn.LayerNorm(d, eps=1e-9)
    g = torch.Generator().manual_seed(0)
    mu, sigma = torch.randn(n, 1, generator=g), 0.5 + torch.rand(n, 1, generator=g)

    def tokens(count):  # every token at position i has mean mu_i and standard deviation sigma_i
        z = torch.randn(count, n, d, generator=g)
        z = (z - z.mean(-1, keepdim=True)) / z.std(-1, unbiased=False, keepdim=True)
        return mu + sigma * z

    with torch.no_grad():
        norm.weight.copy_(torch.randn(d, generator=g))
    x, y = tokens(50), tokens(50)
    bound = bounds.layer_norm_bound(norm, float(sigma.min()))
    assert _rate(norm, x, y).max() <= bound
    # equal deviations everywhere and a constant gain: the rate is the bound
    with torch.no_grad():
        norm.weight.fill_(1.7)
    sigma.fill_(0.8)
    x, y = tokens(4), tokens(4)
    assert torch.allclose(_rate(norm, x, y), torch.full((4,), 1.7 / 0.8), rtol=1e-5)


def test_prop4_holds_for_images_of_bounded_energy():
    d, patch, channels, n = 24, 4, 3, 9
    attn = _attention(d, 3, seed=4, scale=0.3)
    g = torch.Generator().manual_seed(4)
    embedding = torch.randn(d, patch * patch * channels, generator=g) / 6
    images = torch.rand(40, n, patch * patch * channels, generator=g)  # n flattened patches per image
    energy = float(images.pow(2).sum(dim=(1, 2)).max())
    tokens = images @ embedding.T
    alpha = bounds.spectral_norm(embedding)
    assert _rate(attn, tokens[:20], tokens[20:]).max() <= bounds.mha_bound_prop4(attn, n, alpha, energy)


def test_bounds_against_numpy_svd():
    model = models.create_model("demo")
    block = model.blocks[2]
    d, heads = model.embed_dim, block.attn.num_heads
    k = d // heads
    w = block.attn.qkv.weight.detach().numpy().astype(np.float64)
    o = block.attn.proj.weight.detach().numpy().astype(np.float64)
    n, r = 65, 3.0
    expected = 0.0
    for h in range(heads):
        q_h, k_h, v_h = (w[i * d + h * k : i * d + (h + 1) * k] for i in range(3))
        a_h = q_h.T @ k_h / math.sqrt(k)
        top = lambda m: np.linalg.svd(m, compute_uv=False)[0]  # noqa: E731
        expected += top(o[:, h * k : (h + 1) * k]) * top(v_h) * math.sqrt(3 * n + (12 * n + 3) * r**4 * top(a_h) ** 2)
    table = bounds.upper_bounds(model, r=r, sigma=0.5, n=n)
    got = table[(table.block == 2) & (table.component == "mha")]["bound"].item()
    assert got == pytest.approx(expected, rel=1e-9)
    fc1 = table[(table.block == 2) & (table.component == "fc1")]["bound"].item()
    assert fc1 == pytest.approx(
        np.linalg.svd(block.mlp.fc1.weight.detach().numpy().astype(np.float64), compute_uv=False)[0], rel=1e-9
    )
    ln1 = table[(table.block == 2) & (table.component == "ln1")]["bound"].item()
    assert ln1 == pytest.approx(np.abs(block.norm1.weight.detach().numpy()).max() / 0.5, rel=1e-6)


def test_table_layout_and_propositions():
    model = models.create_model("demo")
    table = bounds.upper_bounds(model, r=2.0, sigma=0.1)
    assert list(table.columns) == ["block", "depth", "component", "proposition", "bound"]
    assert len(table) == len(model.blocks) * 5 and set(table["proposition"]) == {"1", "2", "3"}
    with_energy = bounds.upper_bounds(model, r=2.0, sigma=0.1, energy=100.0)
    assert set(with_energy.loc[with_energy.proposition == "4", "component"]) == {"mha"}
    assert set(table["component"]) == set(COMPONENTS) and table["depth"].max() == 100
    assert bounds.sequence_length(model) == 65  # 8 x 8 patches + class token
    with pytest.raises(ValueError, match="positive"):
        bounds.upper_bounds(model, r=0, sigma=0.1)


def test_data_helpers():
    model = models.create_model("demo")
    images = torch.randn(5, 3, 32, 32)
    tokens = component_rates.embed(model, images).detach().double()
    norms = torch.linalg.vector_norm(tokens, dim=-1)
    assert bounds.token_radius(model, images, "max") == pytest.approx(float(norms.max()))
    assert bounds.token_radius(model, images, "rms") == pytest.approx(float(norms.pow(2).mean().sqrt()))
    assert bounds.token_radius(model, images, "rms") <= bounds.token_radius(model, images, "max")
    assert bounds.token_sigma(model, images, "min") <= bounds.token_sigma(model, images, "mean")
    assert bounds.max_energy(images) == pytest.approx(float(images.pow(2).sum(dim=(1, 2, 3)).max()))
    weight = model.patch_embed.proj.weight.detach().numpy().reshape(model.embed_dim, -1)
    assert bounds.patch_embedding_norm(model) == pytest.approx(np.linalg.svd(weight, compute_uv=False)[0], rel=1e-6)
    with pytest.raises(ValueError, match="valid kinds: rms, max"):
        bounds.token_radius(model, images, "mean")


def test_tightness_and_violations():
    bounds_table = pd.DataFrame(
        {
            "block": [0] * 6,
            "depth": 0.0,
            "component": ["mha", "mha", "fc1", "fc2", "ln2", "ln1"],
            "proposition": ["3", "4", "2", "2", "1", "1"],
            "bound": [10.0, 50.0, 2.0, 2.0, 1.0, 1.0],
        }
    )
    rates = pd.DataFrame(
        {
            "block": 0,
            "depth": 0.0,
            "component": ["mha", "mha", "fc1", "fc2", "ln2", "ln1"],
            "pair": [0, 1, 0, 0, 0, 0],
            "rate": [5.0, 15.0, 1.0, 4.0, 0.5, 0.5],
        }
    )
    tight = bounds.tightness(bounds_table, rates).set_index("component")
    assert tight.loc["mha", "plasticity"] == 10.0 and tight.loc["mha", "bound / plasticity"] == 1.0
    assert tight.loc["fc2", "bound / plasticity"] == 0.5
    share = bounds.violations(bounds_table, rates)
    assert share["mha"] == 0.5 and share["fc2"] == 1.0 and share["fc1"] == 0.0
    assert bounds.violations(bounds_table, rates, mha_proposition="4")["mha"] == 0.0


def _random_vit(seed, reg_tokens):
    """A whole timm ViT with every parameter random: query/key/value, projection, feedforward and
    LayerNorm biases, LayerNorm gains far from 1 (some negative), LayerScale, position embeddings,
    and a class token (and register tokens) of small deviation, as on the demo ViT."""
    torch.manual_seed(seed)
    model = VisionTransformer(
        img_size=16, patch_size=4, embed_dim=32, depth=3, num_heads=4, init_values=0.5, reg_tokens=reg_tokens
    ).eval()
    g = torch.Generator().manual_seed(seed)
    prefix = model.num_prefix_tokens
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("bias", "gamma")) or name == "pos_embed":
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
            elif "norm" in name:  # LayerNorm gains
                p.copy_(torch.empty(p.shape).uniform_(0.3, 2.5, generator=g) * torch.randn(p.shape, generator=g).sign())
        for token in (model.cls_token, model.reg_token):
            if token is not None:
                token.copy_(0.02 * torch.randn(token.shape, generator=g))
        model.pos_embed[:, :prefix].mul_(0.04)
    assert model.blocks[0].attn.qkv.bias is not None and model.blocks[0].ls1.gamma.abs().min() > 0
    return model


def _top_direction_pair(model, image):
    """The image and a copy changed in its first patch so that their tokens differ there by the top
    right singular vector of block 0's FC1, and nowhere else: FC1's rate on them is its bound."""
    weight = model.patch_embed.proj.weight.detach()  # (d, C, P, P)
    top = torch.linalg.svd(model.blocks[0].mlp.fc1.weight.detach())[2][0]
    patch = torch.linalg.pinv(weight.reshape(weight.shape[0], -1)) @ top
    size = weight.shape[-1]
    other = image.clone()
    other[:, :size, :size] += patch.reshape(weight.shape[1:])
    return image, other


def _bound_tensor(table, mha_proposition):
    """(blocks, components) bounds in ``COMPONENTS`` order, MHA's by the given proposition."""
    rows = table[(table.component != "mha") | (table.proposition == mha_proposition)]
    wide = rows.pivot(index="block", columns="component", values="bound")
    return torch.tensor(wide[list(COMPONENTS)].to_numpy(), dtype=torch.float64)


def _check_whole_model(model, x, y):
    """Rates of every component and pair, and the bounds of Props. 1-4 per reading of sigma, with r,
    sigma and E as the paper defines them on the images of the pairs: r the largest token norm
    (Prop. 3 rigorous), sigma the smallest per-token deviation (over the positions of the reading),
    E the largest image energy. Asserts no rate is above its bound; returns rates, bounds, sigmas."""
    images = torch.cat([x, y])
    r, energy = bounds.token_radius(model, images, "max"), bounds.max_energy(images)
    rates = component_rates.rate_tensor(model, x, y)  # (blocks, components, pairs)
    assert not rates.isnan().any()
    sigma, by_reading = {}, {}
    for positions in bounds.SIGMA_POSITIONS:
        sigma[positions] = bounds.token_sigma(model, images, "min", positions)
        table = bounds.upper_bounds(model, r=r, sigma=sigma[positions], energy=energy)
        by_reading[positions] = {prop: _bound_tensor(table, prop) for prop in ("3", "4")}
        for bound in by_reading[positions].values():  # Prop. 3, then Prop. 4 for MHA
            assert (rates <= bound[..., None] * (1 + 1e-6)).all(), (positions, (rates.amax(2) / bound).max(0))
    return rates, by_reading, sigma


@pytest.mark.parametrize("seed, reg_tokens", [(0, 0), (1, 2), (2, 0), (3, 1)])
def test_props_1_to_4_bound_every_component_of_a_whole_random_vit(seed, reg_tokens):
    model = _random_vit(seed, reg_tokens)
    g = torch.Generator().manual_seed(seed)
    images = torch.randn(40, 3, 16, 16, generator=g)
    first, second = _top_direction_pair(model, images[0])
    x, y = torch.cat([images[:20], first[None]]), torch.cat([images[20:], second[None]])
    prefix, patches = model.num_prefix_tokens, model.patch_embed.num_patches
    assert bounds.varying_positions(model, torch.cat([x, y])).tolist() == [False] * prefix + [True] * patches
    rates, by_reading, sigma = _check_whole_model(model, x, y)
    assert sigma["varying"] > 5 * sigma["all"]  # the prefix tokens' small deviation sets the literal sigma
    ln = [COMPONENTS.index("ln2"), COMPONENTS.index("ln1")]
    tight, loose = by_reading["varying"]["3"], by_reading["all"]["3"]
    assert (tight[:, ln] < loose[:, ln] / 5).all()
    # the check can fail: the constructed pair reaches FC1's bound, so half the bounds are exceeded
    fc1 = COMPONENTS.index("fc1")
    assert rates[0, fc1, -1].item() == pytest.approx(tight[0, fc1].item(), rel=1e-4)
    assert not (rates <= tight[..., None] / 2).all()


def test_props_1_to_4_bound_every_component_of_the_demo_vit_on_demo_images():
    model = models.create_model("demo").eval()
    images, _ = imagesets.stack(datasets.get_dataset("digits", "test", image_size=32))
    half = len(images) // 2
    x, y = images[:half], images[half : 2 * half]
    # the class token is the only position that is the same in every image
    assert bounds.varying_positions(model, images).tolist() == [False] + [True] * model.patch_embed.num_patches
    rates, by_reading, sigma = _check_whole_model(model, x, y)
    ln = [COMPONENTS.index("ln2"), COMPONENTS.index("ln1")]
    tight, loose = by_reading["varying"]["3"], by_reading["all"]["3"]
    # over the varying positions sigma is larger and the LayerNorm bound smaller, and it still holds
    assert sigma["varying"] > 5 * sigma["all"]
    assert (tight[:, ln] < loose[:, ln] / 5).all()
    # the check can fail: half the varying-positions LayerNorm bound is below some measured rate
    assert (rates[:, ln] > tight[:, ln, None] / 2).any()
    # the notebook's table: the same sigmas and bounds, every rate within them
    readings = bounds.sigma_readings(model, torch.cat([x, y]), component_rates.to_table(rates), kind="min")
    readings = readings.set_index(["positions", "component"])
    for positions in bounds.SIGMA_POSITIONS:
        for component, column in (("ln2", ln[0]), ("ln1", ln[1])):
            row = readings.loc[(positions, component)]
            assert row["sigma"] == pytest.approx(sigma[positions], rel=1e-12)
            bound = by_reading[positions]["3"][:, column]
            assert row["bound"] == pytest.approx(float(np.median(bound.numpy())), rel=1e-12)
            assert row["largest rate"] == pytest.approx(float(rates[:, column].max()), rel=1e-12)
            assert row["bound / rate"] == pytest.approx(float((bound / rates[:, column].amax(1)).min()), rel=1e-9)
            assert row["bound / rate"] >= 1 and row["above bound"] == 0


def test_sigma_positions_are_decided_from_the_data():
    model = models.create_model("demo")
    g = torch.Generator().manual_seed(0)
    images = torch.randn(6, 3, 32, 32, generator=g)
    images[:, :, :4, :8] = 0.3  # the first two patches are the same in every image
    tokens = component_rates.embed(model, images).detach().double()
    std = tokens.std(dim=-1, unbiased=False)
    mask = bounds.varying_positions(model, images)
    assert mask.tolist() == [False] * 3 + [True] * 62
    assert bounds.token_sigma(model, images) == pytest.approx(float(std[:, 3:].mean(0).min()), rel=1e-12)
    assert bounds.token_sigma(model, images, "min") == pytest.approx(float(std[:, 3:].min()), rel=1e-12)
    assert bounds.token_sigma(model, images, positions="all") == pytest.approx(float(std.mean(0).min()), rel=1e-12)
    assert bounds.token_sigma(model, images, positions="all") <= bounds.token_sigma(model, images)
    constants = bounds.data_constants(model, images)
    assert constants["sigma_positions"] == 62 and constants["sigma"] == bounds.token_sigma(model, images)
    assert bounds.data_constants(model, images, positions="all")["sigma_positions"] == 65
    with pytest.raises(ValueError, match="valid positions: varying, all"):
        bounds.token_sigma(model, images, positions="patches")
    with pytest.raises(ValueError, match="valid positions: varying, all"):
        bounds.data_constants(model, images, positions="patches")
    with pytest.raises(ValueError, match="no token position varies"):
        bounds.token_sigma(model, images[:1])
    with pytest.raises(ValueError, match="valid kinds: mean, min"):
        bounds.token_sigma(model, images, "max")
