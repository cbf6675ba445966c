"""Our fused ops (kernels.bias_gelu, kernels.QkvHeads): the PyTorch arithmetic, the custom ops
(autograd, torch.compile), the Triton kernels (under Triton's interpreter on a CPU), and the models
and finetuning runs that use them (speed.step.fuse)."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from paperlib import components, finetune, models, runs
from paperlib.speed import kernels, layers, options
from paperlib.speed.options import StepOptions, fused_parts, fuses_update, resolve_fused
from paperlib.speed.step import FusedSGD, MasterWeights, fuse, make_forward, step_context, training_step


def _gelu_of_sum(mm: torch.Tensor, bias: torch.Tensor, grad: torch.Tensor):
    """GELU(mm + bias) by nn.functional.gelu, with autograd's gradients of <grad, GELU(mm + bias)>."""
    mm, bias = mm.detach().double().requires_grad_(), bias.detach().double().requires_grad_()
    out = torch.nn.functional.gelu(mm + bias)
    out.backward(grad.double())
    return out.detach(), mm.grad, bias.grad


def test_reference_arithmetic_is_gelu_of_the_sum_and_its_gradients():
    generator = torch.Generator().manual_seed(0)
    mm, bias, grad = (
        torch.randn(shape, dtype=torch.float64, generator=generator) * 3 for shape in ((2, 5, 11), (11,), (2, 5, 11))
    )
    out, grad_mm, grad_bias = _gelu_of_sum(mm, bias, grad)
    assert torch.allclose(kernels.bias_gelu_reference(mm, bias), out, rtol=0, atol=1e-14)
    mine_mm, mine_bias = kernels.bias_gelu_backward_reference(grad, mm, bias)
    assert torch.allclose(mine_mm, grad_mm, rtol=0, atol=1e-13) and torch.allclose(
        mine_bias, grad_bias, rtol=0, atol=1e-12
    )


def test_reference_rounds_once_from_fp32():
    mm, bias = torch.randn(64, 32).bfloat16(), torch.randn(32)
    out = kernels.bias_gelu_reference(mm, bias)
    assert out.dtype == torch.bfloat16
    exact = torch.nn.functional.gelu(mm.double() + bias.double())
    # computed in fp32 and rounded once: within half a bf16 unit in the last place (2^-8, relative) of
    # the exact value, but for fp32's cancellation in 1 + erf(x / sqrt 2) far in the negative tail
    assert ((out.double() - exact).abs() <= 2.0**-8 * exact.abs() * 1.001 + 1e-6).all()


def test_qkv_stack_reference_undoes_timms_split():
    generator = torch.Generator().manual_seed(2)
    batch, heads, tokens, dim = 2, 3, 5, 4
    qkv = torch.randn(batch, tokens, 3 * heads * dim, dtype=torch.float64, generator=generator, requires_grad=True)
    q, k, v = qkv.reshape(batch, tokens, 3, heads, dim).permute(2, 0, 3, 1, 4).unbind(0)  # timm's Attention
    grads = [torch.randn(q.shape, dtype=torch.float64, generator=generator) for _ in range(3)]
    torch.autograd.backward([q, k, v], grads)
    stacked, sums = kernels.qkv_heads_backward_reference(*grads)
    assert torch.equal(stacked, qkv.grad) and torch.allclose(sums, qkv.grad.sum((0, 1)), rtol=0, atol=1e-12)


def test_qkv_heads_gradients_in_float64_and_under_autocast():
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(2, 5, 12, dtype=torch.float64, generator=generator, requires_grad=True)
    weight = torch.randn(36, 12, dtype=torch.float64, generator=generator, requires_grad=True)
    bias = torch.randn(36, dtype=torch.float64, generator=generator, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, w, b: kernels.QkvHeads.apply(a, w, b, 3), (x, weight, bias))
    # under autocast: the projection in the autocast dtype, as nn.Linear would; gradients in the inputs' dtypes
    x, weight, bias = (t.detach().float().requires_grad_() for t in (x, weight, bias))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        q, k, v = kernels.QkvHeads.apply(x, weight, bias, 3)
        expected = torch.nn.functional.linear(x, weight, bias)
    assert q.dtype == torch.bfloat16 and q.shape == (2, 3, 5, 4)
    assert torch.equal(torch.stack([q, k, v]).permute(1, 3, 0, 2, 4).reshape(2, 5, 36), expected)
    (q.float().sum() + 2 * k.float().sum() + 3 * v.float().sum()).backward()
    assert (x.grad.dtype, weight.grad.dtype, bias.grad.dtype) == (torch.float32,) * 3
    assert torch.allclose(bias.grad, torch.tensor([1.0] * 12 + [2.0] * 12 + [3.0] * 12).mul(10))


def test_custom_op_autograd_and_registration():
    generator = torch.Generator().manual_seed(1)
    mm = torch.randn(3, 4, 7, dtype=torch.float64, generator=generator, requires_grad=True)
    bias = torch.randn(7, dtype=torch.float64, generator=generator, requires_grad=True)
    assert torch.autograd.gradcheck(kernels.bias_gelu, (mm, bias))
    torch.library.opcheck(kernels.bias_gelu, (mm, bias))  # fake tensors, schema, autograd registration
    heads = torch.randn(2, 3, 5, 4, dtype=torch.float64, generator=generator)
    torch.library.opcheck(kernels.qkv_heads_backward, (heads, heads.clone(), heads.clone()))
    frozen_bias = bias.detach()
    kernels.bias_gelu(mm, frozen_bias).sum().backward()  # a frozen bias (configs other than fc1/full) gets no gradient
    assert frozen_bias.grad is None and mm.grad is not None
    with pytest.raises(ValueError, match="bias of the last dimension's size"):
        kernels.bias_gelu(mm, torch.zeros(6, dtype=torch.float64))


TRITON_CHECK = textwrap.dedent("""
    import json, torch
    from paperlib.speed import kernels
    results = []
    generator = torch.Generator().manual_seed(0)
    # rows and columns that do and do not fill the kernels' tiles (BLOCK, BLOCK_M, BLOCK_N, ROWS)
    for shape in [(2, 197, 64), (300, 130), (1, 5), (257, 256), (600, 70)]:
        for dtype in (torch.float32, torch.bfloat16):
            mm = (torch.randn(shape, generator=generator) * 3).to(dtype)
            bias = torch.randn(shape[-1], generator=generator)
            grad = torch.randn(shape, generator=generator).to(dtype)
            out = kernels.bias_gelu_triton(mm, bias)
            grad_mm, grad_bias = kernels.bias_gelu_backward_triton(grad, mm, bias)
            again = kernels.bias_gelu_backward_triton(grad, mm, bias)
            results.append({"shape": list(shape), "dtype": str(dtype),
                            "out": out.double().tolist(), "grad_mm": grad_mm.double().tolist(),
                            "grad_bias": grad_bias.double().tolist(),
                            "out_dtype": str(out.dtype), "grad_mm_dtype": str(grad_mm.dtype),
                            "grad_bias_dtype": str(grad_bias.dtype),
                            "deterministic": bool(torch.equal(again[0], grad_mm) and torch.equal(again[1], grad_bias)),
                            "inputs": [mm.double().tolist(), bias.double().tolist(), grad.double().tolist()]})
    stacks = []
    for batch, heads, tokens, dim in [(2, 3, 37, 16), (1, 12, 197, 64), (3, 2, 200, 40)]:
        for dtype in (torch.float32, torch.bfloat16):
            packed = torch.randn(batch, tokens, 3, heads, dim, generator=generator).to(dtype)
            dq, dk, dv = packed.permute(2, 0, 3, 1, 4).unbind(0)  # timm's split: strided views
            dk = dk.contiguous()  # and a contiguous [B, H, N, D] gradient
            stacked, sums = kernels.qkv_heads_backward_triton(dq, dk, dv)
            expected = kernels.qkv_heads_backward_reference(dq, dk, dv)
            stacks.append({"shape": [batch, heads, tokens, dim], "dtype": str(dtype),
                           "stacked_equal": bool(torch.equal(stacked, expected[0])),
                           "stacked_dtype": str(stacked.dtype), "sums": sums.double().tolist(),
                           "exact_sums": packed.double().reshape(batch * tokens, -1).sum(0).tolist(),
                           "scale": packed.double().abs().reshape(batch * tokens, -1).sum(0).tolist()})
    updates = []
    # SGD updates: sizes that do and do not fill BLOCK, bf16 (master weights) or fp32 gradients, first step or not
    for size, grad_dtype, first, copy in [(5000, torch.bfloat16, False, True), (1, torch.bfloat16, True, True),
                                          (4096, torch.float32, False, False), (2049, torch.float32, True, False)]:
        grad = torch.randn(size, generator=generator).to(grad_dtype)
        param, buf = torch.randn(size, generator=generator), torch.randn(size, generator=generator)
        lr, scale = torch.tensor(0.3), torch.tensor(0.7)
        inputs = [grad.double().tolist(), param.double().tolist(), buf.double().tolist()]
        out = torch.empty(size, dtype=torch.bfloat16) if copy else None
        kernels.sgd_update_triton(grad, param, buf, lr, scale, 0.9, first, out)
        updates.append({"first": first, "inputs": inputs, "param": param.double().tolist(),
                        "buf": buf.double().tolist(), "copy": out.double().tolist() if copy else None})
    print(json.dumps({"bias_gelu": results, "qkv": stacks, "sgd": updates}))
""")


@pytest.fixture(scope="module")
def triton_results():
    pytest.importorskip("triton")
    environment = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    done = subprocess.run(
        [sys.executable, "-c", TRITON_CHECK], capture_output=True, text=True, env=environment, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_triton_qkv_stack_matches_the_split_it_undoes(triton_results):
    """The head gradients, strided as timm's split leaves them or contiguous, stacked exactly (a copy),
    with the bias gradient summed in fp32 within summation error."""
    assert len(triton_results["qkv"]) == 6
    for case in triton_results["qkv"]:
        assert case["stacked_equal"] and case["stacked_dtype"] == case["dtype"], case["shape"]
        error = (torch.tensor(case["sums"]) - torch.tensor(case["exact_sums"], dtype=torch.float64)).abs()
        assert (error <= 1e-5 * (torch.tensor(case["scale"], dtype=torch.float64) + 1)).all(), case["shape"]


def test_triton_kernels_match_autograd_of_gelu(triton_results):
    """The Triton kernels, run by Triton's interpreter, against float64 autograd of F.gelu(mm + bias):
    within one rounding of the output dtype (fp32 or bf16) for the values, and for the bias gradient
    (summed in fp32 from unrounded values) within fp32 summation error."""
    assert len(triton_results["bias_gelu"]) == 10
    for case in triton_results["bias_gelu"]:
        mm, bias, grad = (torch.tensor(values, dtype=torch.float64) for values in case["inputs"])
        out, grad_mm, grad_bias = _gelu_of_sum(mm, bias, grad)
        bf16 = case["dtype"] == "torch.bfloat16"
        assert (
            case["out_dtype"] == case["grad_mm_dtype"] == case["dtype"] and case["grad_bias_dtype"] == "torch.float32"
        )
        rounding = 2.0**-8 if bf16 else 2.0**-23  # half a unit in the last place, relative
        for name, mine, expected in (("out", case["out"], out), ("grad_mm", case["grad_mm"], grad_mm)):
            error = (torch.tensor(mine, dtype=torch.float64) - expected).abs()
            assert (error <= 2 * rounding * expected.abs() + 1e-6).all(), (
                case["shape"],
                case["dtype"],
                name,
                float(error.max()),
            )
        error = (torch.tensor(case["grad_bias"], dtype=torch.float64) - grad_bias).abs()
        scale = grad_mm.abs().sum(dim=tuple(range(grad_mm.dim() - 1))) + 1
        assert (error <= 1e-5 * scale).all(), (case["shape"], case["dtype"], float(error.max()))
        assert case["deterministic"]


def _sgd_exact(grad, param, buf, lr, scale, momentum, first):
    """The SGD update with clipping's factor in float64: (parameter, momentum)."""
    g = grad.double() * scale
    buf = g if first else momentum * buf.double() + g
    return param.double() - lr * buf, buf


def test_triton_sgd_update_is_the_update_in_one_pass(triton_results):
    """The update kernel, run by Triton's interpreter, against the float64 update: the parameter and
    momentum within fp32 rounding, the copy within one bf16 unit of the updated parameter (the
    interpreter rounds toward zero; on a GPU it rounds to nearest, which tests/test_cuda.py checks exactly)."""
    assert len(triton_results["sgd"]) == 4
    for case in triton_results["sgd"]:
        grad, param, buf = (torch.tensor(values, dtype=torch.float64) for values in case["inputs"])
        expected_param, expected_buf = _sgd_exact(grad, param, buf, 0.3, 0.7, 0.9, case["first"])
        mine_param, mine_buf = (
            torch.tensor(case["param"], dtype=torch.float64),
            torch.tensor(case["buf"], dtype=torch.float64),
        )
        assert ((mine_buf - expected_buf).abs() <= 2.0**-22 * (expected_buf.abs() + 1)).all(), case["first"]
        assert ((mine_param - expected_param).abs() <= 2.0**-22 * (expected_param.abs() + 1)).all(), case["first"]
        if case["copy"] is not None:
            copy = torch.tensor(case["copy"], dtype=torch.float64)
            assert ((copy - mine_param).abs() <= 2.0**-7 * mine_param.abs()).all()


@pytest.mark.parametrize("first", [True, False])
def test_sgd_update_reference_is_torchs_sgd_after_clipping(first):
    generator = torch.Generator().manual_seed(4)
    grad = torch.randn(300, generator=generator).bfloat16()
    param, buf = torch.randn(300, generator=generator), torch.randn(300, generator=generator)
    mine_param, mine_buf, copy = param.clone(), buf.clone(), torch.empty(300, dtype=torch.bfloat16)
    kernels.sgd_update(grad, mine_param, mine_buf, torch.tensor(0.3), torch.tensor(0.7), 0.9, first, copy)
    expected_param, expected_buf = _sgd_exact(grad, param, buf, 0.3, 0.7, 0.9, first)
    assert torch.allclose(mine_param.double(), expected_param, rtol=1e-6, atol=1e-6)
    assert torch.allclose(mine_buf.double(), expected_buf, rtol=1e-6, atol=1e-6)
    assert torch.equal(copy, mine_param.bfloat16())
    with pytest.raises(ValueError, match="contiguous gradient, parameter, momentum and copy of one shape"):
        kernels.sgd_update(grad[:10], param, buf, torch.tensor(0.3), torch.tensor(0.7), 0.9, first)
    with pytest.raises(ValueError, match="momentum in the parameter's dtype"):
        kernels.sgd_update(grad, param, buf.double(), torch.tensor(0.3), torch.tensor(0.7), 0.9, first)


def _sgd_run(fused_update: bool, precision: str, steps: int = 4, state: dict | None = None):
    """A few training steps of the demo ViT (fc1 trainable, a learning rate that changes each step,
    clipping that bites on the first steps): (losses, norms, fp32 weights, the run's bf16 copy or None, optimizer)."""
    torch.manual_seed(0)
    model = components.set_trainable(models.create_model("demo", pretrained=False, num_classes=5), "fc1")
    options = StepOptions(precision=precision, fused="update" if fused_update else "none").checked(torch.device("cpu"))
    forward = make_forward(model, options)
    trainable = (
        forward.masters if isinstance(forward, MasterWeights) else [p for p in model.parameters() if p.requires_grad]
    )
    optimizer = finetune.make_optimizer(
        trainable, 0.05, 0.9, torch.device("cpu"), fuses_update(options.fused, torch.device("cpu"))
    )
    if state is not None:
        optimizer.load_state_dict(state)
    context = step_context(torch.device("cpu"), precision=precision)
    generator = torch.Generator().manual_seed(1)
    losses, norms = [], []
    for step in range(steps):
        for group in optimizer.param_groups:
            group["lr"] = 0.05 * (step + 1)
        images, labels = torch.randn(8, 3, 32, 32, generator=generator), torch.randint(0, 5, (8,), generator=generator)
        loss, norm = training_step(forward, trainable, optimizer, images, labels, 4, 1.0, context)
        losses.append(float(loss))
        norms.append(float(norm))
    copy = dict(forward.module.named_parameters()) if isinstance(forward, MasterWeights) else None
    return losses, norms, dict(model.named_parameters()), copy, optimizer


@pytest.mark.parametrize("precision", ["autocast", "bf16"])
def test_fused_update_trains_as_clipping_then_sgd(precision):
    """``FusedSGD`` (fused="update") against clip_grad_norm_ then torch.optim.SGD: the same norms
    (clipping bites on the first steps), losses and weights to fp32 rounding, frozen weights
    untouched, with bf16 master weights a copy that is the masters rounded, and an optimizer state
    that torch's SGD takes over."""
    losses, norms, weights, copy, optimizer = _sgd_run(False, precision)
    fused_losses, fused_norms, fused_weights, fused_copy, fused_optimizer = _sgd_run(True, precision)
    assert isinstance(fused_optimizer, FusedSGD) and not isinstance(optimizer, FusedSGD)
    assert norms[0] > 1.0  # the first steps are clipped
    assert torch.allclose(torch.tensor(fused_norms), torch.tensor(norms), rtol=1e-5)
    assert torch.allclose(torch.tensor(fused_losses), torch.tensor(losses), rtol=1e-5)
    torch.manual_seed(0)  # the runs' initial weights
    initial = dict(models.create_model("demo", pretrained=False, num_classes=5).named_parameters())
    for name, weight in fused_weights.items():
        assert torch.allclose(weight, weights[name], rtol=1e-5, atol=1e-6), name
        if not weight.requires_grad:
            assert torch.equal(weight, initial[name]), name  # frozen: bit-identical
        elif copy is not None:
            assert torch.equal(fused_copy[name], weight.detach().bfloat16()), name
    if precision == "bf16":  # no fp32 gradients for the masters: the kernel reads the copy's bf16 ones
        assert all(weight.grad is None for weight in fused_weights.values())
    assert fused_optimizer.state_dict()["state"].keys() == optimizer.state_dict()["state"].keys()
    # torch's SGD resumes from the fused optimizer's state, and the other way round, where the other would be
    again = _sgd_run(False, precision, steps=2, state=fused_optimizer.state_dict())[4]
    assert isinstance(again, torch.optim.SGD) and not isinstance(again, FusedSGD)
    assert isinstance(_sgd_run(True, precision, steps=2, state=optimizer.state_dict())[4], FusedSGD)


def test_fused_feedforward_is_the_same_function_with_the_same_parameters():
    torch.manual_seed(0)
    model = models.create_model("demo", pretrained=False, num_classes=3).double()
    images = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    expected_out = model(images)
    expected_out.square().sum().backward()
    expected = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    keys, fc1, qkv = list(model.state_dict()), model.blocks[0].mlp.fc1, model.blocks[0].attn.qkv

    assert fuse(model, "all") is model
    assert all(
        isinstance(block.mlp, layers.BiasGeluMlp) and isinstance(block.attn, layers.QkvFusedAttention)
        for block in model.blocks
    )
    assert model.blocks[0].mlp.fc1 is fc1 and model.blocks[0].attn.qkv is qkv
    assert list(model.state_dict()) == keys  # checkpoints, components and bounds unchanged
    out = model(images)
    out.square().sum().backward()
    assert torch.allclose(out, expected_out, rtol=0, atol=1e-12)
    for name, p in model.named_parameters():
        assert torch.allclose(p.grad, expected[name], rtol=1e-10, atol=1e-12), name
    mlp, attn = model.blocks[0].mlp, model.blocks[0].attn
    fuse(model, "all")  # done already: nothing changes
    assert model.blocks[0].mlp is mlp and model.blocks[0].attn is attn


@pytest.mark.parametrize(
    "fused, fused_types",
    [("gelu", (layers.BiasGeluMlp,)), ("qkv", (layers.QkvFusedAttention,)), ("none", ()), ("auto", ())],
)  # auto on a CPU: none (inductor's own code is faster there)
def test_each_fusion_alone(fused, fused_types):
    model = fuse(models.create_model("demo", pretrained=False), fused)
    kinds = {type(block.mlp) for block in model.blocks} | {type(block.attn) for block in model.blocks}
    assert {kind for kind in kinds if kind in (layers.BiasGeluMlp, layers.QkvFusedAttention)} == set(fused_types)


def test_only_the_forms_the_ops_compute_are_fused():
    model = models.create_model("demo", pretrained=False, act_layer=lambda: torch.nn.GELU(approximate="tanh"))
    layers.fuse_bias_gelu(model)
    assert not any(isinstance(block.mlp, layers.BiasGeluMlp) for block in model.blocks)  # another function: left alone
    with pytest.raises(ValueError, match="biased nn.Linear fc1 and nn.GELU"):
        layers.BiasGeluMlp(model.blocks[0].mlp)
    model = models.create_model("demo", pretrained=False, qkv_bias=False)
    layers.fuse_qkv(model)
    # no bias to sum: left alone
    assert not any(isinstance(block.attn, layers.QkvFusedAttention) for block in model.blocks)
    with pytest.raises(ValueError, match="biased nn.Linear qkv and no gate"):
        layers.QkvFusedAttention(model.blocks[0].attn)
    assert layers.fuse_bias_gelu(torch.nn.Linear(2, 2)) is not None  # no blocks: left as it is


def test_fused_block_compiles_into_one_graph():
    torch.manual_seed(0)
    block = models.create_model("demo", pretrained=False).blocks[0]
    tokens = torch.randn(2, 65, 64)
    expected = block(tokens)
    expected.square().sum().backward()
    expected_grads = {name: p.grad.clone() for name, p in block.named_parameters()}
    block.zero_grad(set_to_none=True)
    block.mlp, block.attn = layers.BiasGeluMlp(block.mlp), layers.QkvFusedAttention(block.attn)
    explained = torch._dynamo.explain(block)(tokens.clone().requires_grad_())
    assert explained.graph_count == 1 and explained.graph_break_count == 0
    out = torch.compile(block)(tokens.clone().requires_grad_())
    out.square().sum().backward()
    assert torch.allclose(out, expected, rtol=1e-5, atol=1e-5)
    for name, p in block.named_parameters():
        assert torch.allclose(p.grad, expected_grads[name], rtol=1e-4, atol=1e-4), name


@pytest.mark.parametrize("component, bias", [("fc1", "mlp.fc1.bias"), ("mha", "attn.qkv.bias")])
def test_finetuning_with_the_fused_ops_follows_the_plain_run(component, bias, tmp_path, monkeypatch, move_results):
    move_results("results")
    small = dict(steps=6, batch_size=8, warmup=1, eval_every=3, lr=0.05, component=component)
    model, plain = finetune.train(runs.Config(**small))
    fused_model, fused = finetune.train(runs.Config(**small, fused="all"))
    assert all(isinstance(block.mlp, layers.BiasGeluMlp) for block in fused_model.blocks)
    assert fused["best_val_accuracy"] == pytest.approx(plain["best_val_accuracy"], abs=0.05)
    plain_history = runs.history(runs.Config(**small))
    fused_history = runs.history(runs.Config(**small, fused="all"))
    assert fused_history["train_loss"].tolist() == pytest.approx(plain_history["train_loss"].tolist(), rel=1e-4)
    # the component (with its bias, whose gradient comes from a fused op) trains; the other components stay as they were
    trained = {n for n, _ in components.trainable_parameters(model)}
    assert any(name.endswith(bias) for name in trained)
    for name, p in fused_model.named_parameters():
        assert torch.allclose(p, dict(model.named_parameters())[name], rtol=1e-4, atol=1e-5), name
    with pytest.raises(ValueError, match="valid choices: auto, none, all, gelu, qkv, update"):
        runs.Config(fused="yes")  # validated when made


def test_fused_ops_on_cuda_need_triton(monkeypatch):
    monkeypatch.setattr(options, "triton_available", lambda: False)  # what the checks call

    def checked(fused, device):
        return StepOptions(fused=fused).checked(torch.device(device)).fused

    with pytest.raises(ValueError, match="Triton is not installed"):
        checked("all", "cuda")
    assert checked("none", "cuda") == "none"
    assert checked("all", "cpu") == "all"  # PyTorch arithmetic there
    assert checked("auto", "cuda") == "none"  # auto never fails
    assert resolve_fused("auto", torch.device("cuda")) == "none"  # and without Triton it means none


def test_auto_uses_the_fused_ops_on_cuda_only(monkeypatch):
    assert runs.Config().fused == "auto"
    monkeypatch.setattr(options, "triton_available", lambda: True)  # what the checks call
    assert resolve_fused("auto", torch.device("cuda")) == "gelu+qkv"  # the measured ones; not yet the update
    assert resolve_fused("auto", torch.device("cuda", 0)) == "gelu+qkv"
    assert resolve_fused("auto", torch.device("cpu")) == "none"
    for choice in ("none", "all", "gelu", "qkv", "update", "gelu+qkv", "qkv+update"):
        assert resolve_fused(choice, torch.device("cuda")) == choice == resolve_fused(choice, torch.device("cpu"))
    # combinations are written one way: in FUSED_PARTS' order, and "all" for all of them
    assert resolve_fused("qkv+gelu", torch.device("cpu")) == "gelu+qkv"
    assert resolve_fused("update+qkv+gelu", torch.device("cpu")) == "all"
    assert fused_parts("all") == ("gelu", "qkv", "update") and fused_parts("none") == ()
    assert fuses_update("all", torch.device("cpu")) and fuses_update("gelu+update", torch.device("cpu"))
    assert not fuses_update("auto", torch.device("cuda")) and not fuses_update("gelu+qkv", torch.device("cpu"))
    for bad in ("fastest", "gelu+gelu", "gelu+", "", "all+update", None):
        with pytest.raises(
            ValueError,
            match="valid choices: auto, none, all, gelu, qkv, update, or several of gelu, qkv, update joined by",
        ):
            resolve_fused(bad, torch.device("cpu"))


def test_fusing_a_model_puts_in_only_its_own_parts():
    model = fuse(models.create_model("demo", pretrained=False), "qkv+update")  # the update is the optimizer's
    assert all(
        isinstance(block.attn, layers.QkvFusedAttention) and not isinstance(block.mlp, layers.BiasGeluMlp)
        for block in model.blocks
    )


def test_the_cuda_kernels_leave_float64_to_the_pytorch_arithmetic(monkeypatch):
    # the Triton kernels compute in fp32: float64 inputs (plasticity's precision) on CUDA must not
    # reach them; the CUDA registrations are called here directly on CPU tensors
    monkeypatch.setattr(kernels, "_triton_kernels", lambda: pytest.fail("float64 reached a Triton kernel"))
    generator = torch.Generator().manual_seed(0)
    mm, bias, grad = (
        torch.randn(shape, dtype=torch.float64, generator=generator) for shape in ((2, 5, 11), (11,), (2, 5, 11))
    )
    assert torch.equal(kernels._bias_gelu_cuda(mm, bias), kernels.bias_gelu_reference(mm, bias))
    for mine, reference in zip(
        kernels._bias_gelu_backward_cuda(grad, mm, bias), kernels.bias_gelu_backward_reference(grad, mm, bias)
    ):
        assert mine.dtype == torch.float64 and torch.equal(mine, reference)
    heads = torch.randn(2, 5, 3, 4, 8, dtype=torch.float64, generator=generator).permute(2, 0, 3, 1, 4).unbind(0)
    for mine, reference in zip(kernels._qkv_heads_backward_cuda(*heads), kernels.qkv_heads_backward_reference(*heads)):
        assert mine.dtype == torch.float64 and torch.equal(mine, reference)
