"""Our fused ops (kernels.bias_gelu, kernels.QkvHeads): the PyTorch arithmetic, the custom ops
(autograd, torch.compile), the Triton kernels (under Triton's interpreter on a CPU), and the models
and finetuning runs that use them (speed.step.fuse), LoRA's included."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from paperlib.records import runs
from paperlib.records.step_options import StepOptions, fused_parts
from paperlib.speed import kernels, layers, options
from paperlib.speed.options import resolve_fused
from paperlib.speed.step import fuse
from paperlib.train import finetune
from paperlib.train.config import Config
from paperlib.vit import components, lora


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
    print(json.dumps({"bias_gelu": results, "qkv": stacks}))
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


def test_fused_feedforward_is_the_same_function_with_the_same_parameters(tiny_vit):
    torch.manual_seed(0)
    model = tiny_vit(num_classes=3).double()
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
def test_each_fusion_alone(fused, fused_types, tiny_vit):
    model = fuse(tiny_vit(), fused)
    kinds = {type(block.mlp) for block in model.blocks} | {type(block.attn) for block in model.blocks}
    assert {kind for kind in kinds if kind in (layers.BiasGeluMlp, layers.QkvFusedAttention)} == set(fused_types)


def test_only_the_forms_the_ops_compute_are_fused(tiny_vit):
    model = tiny_vit(act_layer=lambda: torch.nn.GELU(approximate="tanh"))
    layers.fuse_bias_gelu(model)
    assert not any(isinstance(block.mlp, layers.BiasGeluMlp) for block in model.blocks)  # another function: left alone
    with pytest.raises(ValueError, match="biased nn.Linear fc1 and nn.GELU"):
        layers.BiasGeluMlp(model.blocks[0].mlp)
    model = tiny_vit(qkv_bias=False)
    layers.fuse_qkv(model)
    # no bias to sum: left alone
    assert not any(isinstance(block.attn, layers.QkvFusedAttention) for block in model.blocks)
    with pytest.raises(ValueError, match="biased nn.Linear qkv and no gate"):
        layers.QkvFusedAttention(model.blocks[0].attn)
    assert layers.fuse_bias_gelu(torch.nn.Linear(2, 2)) is not None  # no blocks: left as it is


def test_fused_block_compiles_into_one_graph(tiny_vit):
    torch.manual_seed(0)
    block = tiny_vit().blocks[0]
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
    model, plain = finetune.train(Config(**small))
    fused_model, fused = finetune.train(Config(**small, step=StepOptions(fused="all")))
    assert all(isinstance(block.mlp, layers.BiasGeluMlp) for block in fused_model.blocks)
    assert fused["best_val_accuracy"] == pytest.approx(plain["best_val_accuracy"], abs=0.05)
    plain_history = runs.history(Config(**small))
    fused_history = runs.history(Config(**small, step=StepOptions(fused="all")))
    assert fused_history["train_loss"].tolist() == pytest.approx(plain_history["train_loss"].tolist(), rel=1e-4)
    # the component (with its bias, whose gradient comes from a fused op) trains; the other components stay as they were
    trained = {n for n, _ in components.trainable_parameters(model)}
    assert any(name.endswith(bias) for name in trained)
    for name, p in fused_model.named_parameters():
        assert torch.allclose(p, dict(model.named_parameters())[name], rtol=1e-4, atol=1e-5), name
    with pytest.raises(ValueError, match="valid choices: auto, none, all, gelu, qkv"):
        Config(step=StepOptions(fused="yes"))  # validated when made


def test_fused_ops_on_cuda_need_triton(monkeypatch):
    monkeypatch.setattr(options, "triton_available", lambda: False)  # what the checks call

    def checked(fused, device):
        return options.checked(StepOptions(fused=fused), torch.device(device)).fused

    with pytest.raises(ValueError, match="Triton is not installed"):
        checked("all", "cuda")
    assert checked("none", "cuda") == "none"
    assert checked("all", "cpu") == "gelu+qkv"  # PyTorch arithmetic there
    assert checked("auto", "cuda") == "none"  # auto never fails
    assert resolve_fused("auto", torch.device("cuda")) == "none"  # and without Triton it means none


def test_auto_uses_the_fused_ops_on_cuda_only(monkeypatch):
    assert Config().step.fused == "auto"
    monkeypatch.setattr(options, "triton_available", lambda: True)  # what the checks call
    assert resolve_fused("auto", torch.device("cuda")) == "gelu+qkv"  # the measured ones
    assert resolve_fused("auto", torch.device("cuda", 0)) == "gelu+qkv"
    assert resolve_fused("auto", torch.device("cpu")) == "none"
    for choice in ("none", "gelu", "qkv", "gelu+qkv"):
        assert resolve_fused(choice, torch.device("cuda")) == choice == resolve_fused(choice, torch.device("cpu"))
    # combinations are written one way: their parts in FUSED_PARTS' order ("all" is every part)
    assert resolve_fused("qkv+gelu", torch.device("cpu")) == "gelu+qkv" == resolve_fused("all", torch.device("cpu"))
    assert fused_parts("all") == ("gelu", "qkv") and fused_parts("none") == ()
    for bad in ("fastest", "gelu+gelu", "gelu+", "", "all+gelu", "update", "gelu+update", None):
        with pytest.raises(
            ValueError, match="valid choices: auto, none, all, gelu, qkv, or several of gelu, qkv joined by"
        ):
            resolve_fused(bad, torch.device("cpu"))


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


def test_fused_ops_leave_layers_with_lora_alone(tiny_model):
    # the fused attention reads qkv's weight itself: on a LoRA layer it would skip the update
    model = lora.add_lora(tiny_model.eval(), "mha", rank=2)
    images = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        for layer in lora.adapted_layers(model):
            layer.lora_B.default.weight.normal_()
        before = model(images)
    fuse(model, "gelu+qkv")
    assert not isinstance(model.blocks[0].attn, layers.QkvFusedAttention)
    assert isinstance(model.blocks[0].mlp, layers.BiasGeluMlp)  # the feedforward layer has no LoRA: fused
    with torch.no_grad():
        assert torch.allclose(model(images), before, atol=1e-5)


def test_lora_refuses_layers_that_already_run_fused_ops(tiny_vit):
    model = fuse(tiny_vit(), "gelu+qkv")  # fused layers read their weights
    with pytest.raises(ValueError, match="add LoRA before speed.step.fuse"):
        lora.add_lora(model, "fc1", rank=2)
    assert not any(hasattr(m, "lora_A") for m in model.modules())
    lora.add_lora(model, "fc2", rank=2)  # fc2 and proj are called as modules, even in the fused layers: fine
    lora.add_lora(fuse(tiny_vit(), "qkv"), "fc1", rank=2)


def test_the_run_fuses_after_adding_lora(results, monkeypatch, small, tiny_vit):
    from paperlib import speed

    seen = []
    original = speed.step._fuse

    def spy(model, parts):
        seen.append(len(lora.adapted_layers(model)))
        return original(model, parts)

    monkeypatch.setattr(speed.step, "_fuse", spy)
    finetune.run(small(component="fc1", method="lora", lora_rank=2, steps=2, warmup=0, eval_every=2, fused="all"))
    assert seen and seen[0] == len(lora.target_names(tiny_vit(), "fc1"))
