"""The GPU paths against the CPU ones: transforms, loader, plasticity, finetuning, benchmarks.

Skipped where there is no GPU (CI). On a GPU machine: ``pytest tests/test_cuda.py`` (see
docs/benchmarks.md for the one command that also runs every benchmark). The device is
``$PAPERLIB_TEST_DEVICE`` (default ``cuda``); ``PAPERLIB_TEST_DEVICE=cpu`` runs the same checks
on a CPU, to check the tests themselves.
"""

import os
from dataclasses import replace

import numpy as np
import pytest
import torch
from scipy import stats

from paperlib.data import datasets, imagesets
from paperlib.data import transforms as T
from paperlib.data.loader import DeviceLoader, Transform
from paperlib.measure import component_rates, plasticity
from paperlib.records import runs
from paperlib.records.step_options import StepOptions
from paperlib.speed import layers
from paperlib.speed.options import CPU_ATTENTION, checked
from paperlib.speed.step import OptimizerSettings, compile_model, make_optimizer, make_step, step_context
from paperlib.train import checkpoints, finetune
from paperlib.vit import components, models

DEVICE = torch.device(os.environ.get("PAPERLIB_TEST_DEVICE", "cuda"))
pytestmark = pytest.mark.skipif(DEVICE.type == "cuda" and not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture
def augmentation_drawn_on_the_host(monkeypatch):
    """Crops and flips of a run on the device drawn by a CPU generator of its generator's seed: a CUDA
    generator draws other numbers than a CPU one of the same seed, so only then does a run on the device
    see the CPU run's crops, and their losses can be compared step by step."""
    on_host: dict[int, tuple[torch.Generator, torch.Generator]] = {}  # id -> (device generator kept alive, CPU twin)

    def drawn_on_the_host(draw):
        def draw_there(n, *sizes_generator_device):
            *sizes, generator, device = sizes_generator_device
            if generator.device.type == "cpu":
                return draw(n, *sizes, generator, device)
            _, twin = on_host.setdefault(
                id(generator), (generator, torch.Generator().manual_seed(generator.initial_seed()))
            )
            return draw(n, *sizes, twin, "cpu").to(device)

        return draw_there

    monkeypatch.setattr(T, "sample_crops", drawn_on_the_host(T.sample_crops))
    monkeypatch.setattr(T, "sample_flips", drawn_on_the_host(T.sample_flips))


def _relative_error(value: torch.Tensor, reference: torch.Tensor) -> float:
    value, reference = value.double().cpu(), reference.double().cpu()
    return float(torch.linalg.vector_norm(value - reference) / torch.linalg.vector_norm(reference))


def test_resized_crops_on_the_device_equal_the_cpu():
    images = torch.randint(0, 256, (16, 3, 32, 40), dtype=torch.uint8)
    boxes = T.sample_crops(16, 32, 40, torch.Generator().manual_seed(0))
    flips = T.sample_flips(16, torch.Generator().manual_seed(1))
    cpu = T.resized_crops(images, boxes, 224, flips)
    device = T.resized_crops(images.to(DEVICE), boxes.to(DEVICE), 224, flips.to(DEVICE))
    assert device.device.type == DEVICE.type and (device.cpu() - cpu).abs().max() < 1e-5
    evaluated = T.device_transform(images.to(DEVICE), augment=False, image_size=224)
    assert (evaluated.cpu() - T.device_transform(images, augment=False, image_size=224)).abs().max() < 1e-4


def test_augmentation_statistics_with_a_device_generator():
    generator = torch.Generator(device=DEVICE).manual_seed(0)
    boxes = T.sample_crops(4000, 32, 32, generator, DEVICE).cpu().numpy()
    torch.manual_seed(0)
    reference = np.array(
        [T.v2.RandomResizedCrop.get_params(torch.zeros(3, 32, 32), list(T.SCALE), list(T.RATIO)) for _ in range(4000)],
        float,
    )
    scale = lambda b: b[:, 2] * b[:, 3] / 32**2  # noqa: E731
    assert stats.ks_2samp(scale(boxes), scale(reference)).pvalue > 1e-3
    assert (boxes[:, 0] >= 0).all() and (boxes[:, 0] + boxes[:, 2] <= 32).all()
    flips = T.sample_flips(20000, generator, DEVICE)
    assert flips.device.type == DEVICE.type and stats.binomtest(int(flips.sum()), len(flips), 0.5).pvalue > 1e-3


def test_device_loader_on_the_device():
    digits = datasets.get_dataset("digits", "trainval")
    loader = DeviceLoader(digits, 64, Transform(True, 224), device=DEVICE, seed=3)
    images, labels = loader.batch(5)
    assert images.device.type == DEVICE.type and images.shape == (64, 3, 224, 224) and images.dtype == torch.float32
    again, again_labels = DeviceLoader(digits, 64, Transform(True, 224), device=DEVICE, seed=3).batch(5)
    assert torch.equal(images, again) and torch.equal(labels, again_labels)
    # the batch order is drawn on the host: the same images as the CPU loader's batch
    assert torch.equal(labels.cpu(), DeviceLoader(digits, 64, Transform(True, 224), seed=3).batch(5)[1])
    on_host = DeviceLoader(digits, 64, Transform(True, 224), device=DEVICE, seed=3, images_on="host").batch(5)
    assert torch.equal(images, on_host[0])
    plain = DeviceLoader(digits, 64, Transform(False, 32), device=DEVICE)
    assert (next(iter(plain))[0].cpu() - torch.stack([digits[i][0] for i in range(64)])).abs().max() < 1e-5


def test_host_images_go_through_reused_staging_buffers_unchanged():
    # batches of the host path are gathered into two pinned buffers reused in turn: batches made
    # one after another without waiting (and kept) equal those of images kept on the device
    digits = datasets.get_dataset("digits", "trainval")
    on_device = DeviceLoader(digits, 48, Transform(True, 64), device=DEVICE, seed=1)
    on_host = DeviceLoader(digits, 48, Transform(True, 64), device=DEVICE, seed=1, images_on="host")
    # staged only where the images stay on the host for a GPU (DEVICE is "cuda", the images "cuda:0")
    assert not on_device._staged and on_host._staged == (DEVICE.type == "cuda")
    batches = [on_host.batch(step) for step in range(6)]
    for step, (images, labels) in enumerate(batches):
        expected, expected_labels = on_device.batch(step)
        assert torch.equal(images, expected) and torch.equal(labels, expected_labels), step
    evaluation = DeviceLoader(digits, 100, Transform(False, 32), device=DEVICE, images_on="host")
    reference = DeviceLoader(digits, 100, Transform(False, 32), device=DEVICE)
    assert all(torch.equal(a[0], b[0]) for a, b in zip(evaluation, reference))


@pytest.mark.skipif(DEVICE.type != "cuda", reason="host-device synchronisation exists on CUDA only")
@pytest.mark.parametrize("precision", ["autocast", "bf16"])
def test_a_training_step_never_makes_the_host_wait_for_the_device(precision, tiny_vit):
    # the host must queue step after step: a blocking copy or read-back in the batch or the step
    # would leave the GPU idle while the host prepares the next one
    model = tiny_vit(num_classes=10).to(DEVICE)
    components.set_trainable(model, "full")
    options = checked(StepOptions(precision=precision), DEVICE)
    step = make_step(model, options, optimizer=OptimizerSettings("sgd", 0.01, 0.9), batch_size=32, clip=1.0)
    loader = DeviceLoader(datasets.get_dataset("digits", "trainval"), 32, Transform(True, 32), device=DEVICE)
    for index in range(2):  # first steps: lazy initialisation, allocations
        step(*loader.batch(index))
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for index in range(2, 5):
            step(*loader.batch(index))
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_images_of_different_sizes_on_the_device_equal_the_cpu():
    # whole file images, each its own size (UnevenImages), padded per batch where they are: evaluation
    # batches equal the CPU's; training batches are the same with the images on the device or the host
    generator = torch.Generator().manual_seed(0)
    sizes = [(int(h), int(w)) for h, w in torch.randint(20, 70, (24, 2), generator=generator)]
    pixels = [torch.randint(0, 256, (3, h, w), generator=generator, dtype=torch.uint8) for h, w in sizes]
    images = imagesets.UnevenImages(torch.cat([p.reshape(-1) for p in pixels]), sizes)
    dataset = imagesets.ImageDataset(images, torch.arange(24) % 3, ["a", "b", "c"], "uneven", "train")
    cpu = [batch for batch, _ in DeviceLoader(dataset, 8, Transform(False, 32))]
    device = [batch for batch, _ in DeviceLoader(dataset, 8, Transform(False, 32), device=DEVICE)]
    assert all(d.device.type == DEVICE.type and (d.cpu() - c).abs().max() < 1e-4 for c, d in zip(cpu, device))
    batches = []
    for images_on in ("device", "host"):
        loader = DeviceLoader(dataset, 8, Transform(True, 32), device=DEVICE, seed=2, images_on=images_on)
        batch, labels = loader.batch(4)
        assert batch.shape == (8, 3, 32, 32) and torch.isfinite(batch).all() and labels.device.type == DEVICE.type
        batches.append(batch)
    assert torch.equal(*batches)


@pytest.mark.parametrize("attention", ["flash", "efficient", "cudnn", "math"])
def test_attention_kernels_on_the_device_compute_the_same_function(attention, tiny_vit):
    if DEVICE.type != "cuda" and attention not in CPU_ATTENTION:
        pytest.skip(f"no {attention} kernel on a {DEVICE.type}")
    model = tiny_vit(num_classes=10).to(DEVICE).eval()
    images = torch.randn(8, 3, 32, 32, device=DEVICE)
    with torch.no_grad(), step_context(DEVICE, precision="autocast")():
        reference = model(images).float()
    try:
        with torch.no_grad(), step_context(DEVICE, attention, precision="autocast")():
            output = model(images).float()
    except RuntimeError as error:  # a kernel this GPU (or this PyTorch build) lacks
        pytest.skip(f"{attention}: {error}".splitlines()[0])
    assert _relative_error(output, reference) < 2e-2  # bf16 autocast


def test_finetuning_embeds_patches_with_a_matrix_product_on_the_device(tiny_vit):
    model = tiny_vit(num_classes=10).to(DEVICE).eval()
    images = torch.randn(8, 3, 32, 32, device=DEVICE)
    with torch.no_grad(), step_context(DEVICE, precision="autocast")():
        reference = model(images).float()
        forward = compile_model(model, "none")
        output = forward(images).float()
    assert isinstance(model.patch_embed.proj, layers.PatchLinear) == (DEVICE.type == "cuda")
    assert _relative_error(output, reference) < 2e-2  # bf16 autocast


def test_blocks_compiled_finetuning_on_the_device_follows_the_eager_run(
    results, monkeypatch, tmp_path, move_results, small
):
    assert finetune.run(small(**ON_DEVICE, component="mha"))["status"] == "finished"
    move_results("blocks")
    assert finetune.run(small(**ON_DEVICE, component="mha", compile="blocks"))["status"] == "finished"
    losses = runs.history(small(**ON_DEVICE, component="mha"))["train_loss"].to_numpy()
    compiled_losses = runs.history(small(**ON_DEVICE, component="mha", compile="blocks"))["train_loss"].to_numpy()
    assert np.allclose(compiled_losses, losses, rtol=5e-2, atol=1e-2)


def test_bf16_finetuning_with_master_weights_on_the_device_follows_the_autocast_run(results, small):
    # 40 steps: in 12, full finetuning of the demo ViT need not lower the loss, in any precision
    run = lambda precision: small(**ON_DEVICE, component="full", steps=40, precision=precision)  # noqa: E731
    reference = finetune.run(run("autocast"))
    metrics = finetune.run(run("bf16"))
    assert metrics["status"] == "finished" and metrics["precision"] == "bf16" and reference["precision"] == "autocast"
    losses = runs.history(run("autocast"))["train_loss"].to_numpy()
    bf16_losses = runs.history(run("bf16"))["train_loss"].to_numpy()
    assert np.allclose(bf16_losses[:4], losses[:4], rtol=3e-2)  # later steps drift apart, as any two roundings do
    assert bf16_losses[-4:].mean() < bf16_losses[:4].mean()  # and it trains


@pytest.mark.skipif(DEVICE.type != "cuda", reason="TF32 is CUDA's")
def test_a_tf32_run_has_tf32_inside_its_steps_only_and_follows_the_fp32_run(results, small, monkeypatch):
    seen = []
    create = models.create_model

    def create_and_watch(*args, **kwargs):
        model = create(*args, **kwargs)
        model.head.register_forward_hook(lambda *_: seen.append(torch.backends.cuda.matmul.allow_tf32))
        model.head.register_full_backward_hook(lambda *_: seen.append(torch.backends.cuda.matmul.allow_tf32))
        return model

    monkeypatch.setattr(models, "create_model", create_and_watch)
    run = lambda precision: small(**ON_DEVICE, component="full", steps=12, precision=precision)  # noqa: E731
    reference = finetune.run(run("fp32"))
    fp32_flags, seen[:] = list(seen), []
    metrics = finetune.run(run("tf32"))
    assert metrics["precision"] == "tf32" and run("tf32").folder().name.endswith("+tf32")
    assert fp32_flags and not any(fp32_flags) and seen and all(seen)
    assert not torch.backends.cuda.matmul.allow_tf32  # left as PyTorch's default after the run
    losses = runs.history(run("fp32"))["train_loss"].to_numpy()
    tf32_losses = runs.history(run("tf32"))["train_loss"].to_numpy()
    assert reference["status"] == metrics["status"] == "finished"
    assert np.allclose(tf32_losses[:4], losses[:4], rtol=1e-2)  # TF32 rounds inputs to 10 mantissa bits


@pytest.mark.parametrize("precision", ["autocast", "bf16"])
def test_adamw_finetuning_on_the_device_follows_the_cpu_run(
    precision, results, monkeypatch, tmp_path, move_results, small, augmentation_drawn_on_the_host
):
    # fused AdamW on CUDA (with fp32 masters under bf16) against torch's reference AdamW on the CPU
    config = small(**ON_DEVICE, component="full", optimizer="adamw", lr=1e-3, weight_decay=0.05, precision=precision)
    metrics = finetune.run(config)
    assert metrics["status"] == "finished" and metrics["optimizer"] == "adamw"
    adamw = make_optimizer(torch.nn.Linear(2, 2).to(DEVICE), OptimizerSettings("adamw", 0.1, 0.9, weight_decay=0.05))
    assert bool(adamw.defaults["fused"]) == (DEVICE.type == "cuda")
    losses = runs.history(config)["train_loss"].to_numpy()
    move_results("cpu")
    cpu = replace(config, device="cpu", step=replace(config.step, precision="autocast"))
    finetune.run(cpu)
    # bf16 rounding, then drift
    assert np.allclose(losses[:4], runs.history(cpu)["train_loss"].to_numpy()[:4], rtol=3e-2)
    assert losses[-4:].mean() < losses[:4].mean()


@pytest.mark.parametrize("precision, compile", [("autocast", False), ("bf16", "blocks")])
def test_lora_finetuning_on_the_device_follows_the_cpu_run(
    precision, compile, results, monkeypatch, tmp_path, move_results, small, augmentation_drawn_on_the_host
):
    # peft's LoRA layers under autocast, or in the bf16 copy with fp32 masters, compiled, with the
    # fused ops on the layers that have no LoRA (fused="auto"), against the plain CPU run. At lr 0.01 the CPU run's
    # loss falls over these 12 steps (first four 1.71, last four 1.57); at lr 0.1 it rises (1.66, then 1.74)
    config = small(
        **ON_DEVICE, component="mha", method="lora", lora_rank=4, lr=0.01, precision=precision, compile=compile
    )
    model, metrics = finetune.train(config)
    assert metrics["status"] == "finished"
    torch.manual_seed(0)
    initial = models.create_model("demo", num_classes=5)
    for name, layer in ((n, m) for n, m in model.named_modules() if hasattr(m, "lora_A")):
        assert torch.equal(layer.base_layer.weight.detach().cpu(), initial.get_submodule(name).weight)  # frozen
    losses = runs.history(config)["train_loss"].to_numpy()
    move_results("cpu")
    cpu = replace(config, device="cpu", step=replace(config.step, precision="autocast", compile=False))
    finetune.run(cpu)
    # bf16 rounding, then drift
    assert np.allclose(losses[:4], runs.history(cpu)["train_loss"].to_numpy()[:4], rtol=3e-2)
    assert losses[-4:].mean() < losses[:4].mean()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_bias_gelu_on_the_device_equals_the_cpu_arithmetic(dtype):
    """On CUDA the op runs the Triton kernels; on a CPU, the PyTorch arithmetic they are tested against."""
    from paperlib.speed import kernels

    generator = torch.Generator().manual_seed(0)
    mm = (torch.randn(2, 197, 3072, generator=generator) * 3).to(dtype)  # ViT-Base/16's fc1 output for two images
    bias, grad = torch.randn(3072, generator=generator), torch.randn(2, 197, 3072, generator=generator).to(dtype)
    expected = kernels.bias_gelu_reference(mm, bias)
    expected_mm, expected_bias = kernels.bias_gelu_backward_reference(grad, mm, bias)
    mm_on, bias_on = mm.to(DEVICE).requires_grad_(), bias.to(DEVICE).requires_grad_()
    out = kernels.bias_gelu(mm_on, bias_on)
    out.backward(grad.to(DEVICE))
    # erf differs in its last fp32 bits: one rounding apart at most
    ulp = 2.0**-7 if dtype == torch.bfloat16 else 2.0**-22
    for mine, reference in ((out, expected), (mm_on.grad, expected_mm)):
        assert (
            mine.dtype == dtype
            and (
                (mine.detach().cpu().double() - reference.double()).abs() <= ulp * reference.double().abs() + 1e-6
            ).all()
        )
    assert bias_on.grad.dtype == torch.float32 and _relative_error(bias_on.grad, expected_bias) < 1e-5


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_qkv_stack_on_the_device_equals_the_cpu_arithmetic(dtype):
    from paperlib.speed import kernels

    # ViT-Base/16, two images
    packed = torch.randn(2, 197, 3, 12, 64, generator=torch.Generator().manual_seed(0)).to(dtype)
    expected, expected_sums = kernels.qkv_heads_backward_reference(*packed.permute(2, 0, 3, 1, 4).unbind(0))
    dq, dk, dv = packed.to(DEVICE).permute(2, 0, 3, 1, 4).unbind(0)  # strided as timm's split leaves them
    stacked, sums = kernels.qkv_heads_backward(dq, dk.contiguous(), dv)
    assert torch.equal(stacked.cpu(), expected) and sums.dtype == torch.float32
    assert _relative_error(sums, expected_sums) < 1e-5


def test_fused_ops_keep_float64_on_the_device():
    # the Triton kernels compute in fp32; float64 (plasticity's precision) takes the PyTorch arithmetic
    from paperlib.speed import kernels

    generator = torch.Generator().manual_seed(0)
    mm, bias, grad = (
        torch.randn(shape, dtype=torch.float64, generator=generator) for shape in ((3, 7, 40), (40,), (3, 7, 40))
    )
    expected, (expected_mm, expected_bias) = (
        kernels.bias_gelu_reference(mm, bias),
        kernels.bias_gelu_backward_reference(grad, mm, bias),
    )
    mm_on, bias_on = mm.to(DEVICE).requires_grad_(), bias.to(DEVICE).requires_grad_()
    out = kernels.bias_gelu(mm_on, bias_on)
    out.backward(grad.to(DEVICE))
    for mine, reference in ((out, expected), (mm_on.grad, expected_mm), (bias_on.grad, expected_bias)):
        assert mine.dtype == torch.float64 and _relative_error(mine.detach(), reference) < 1e-12
    packed = torch.randn(2, 5, 3, 4, 8, dtype=torch.float64, generator=generator)
    expected, expected_sums = kernels.qkv_heads_backward_reference(*packed.permute(2, 0, 3, 1, 4).unbind(0))
    stacked, sums = kernels.qkv_heads_backward(*packed.to(DEVICE).permute(2, 0, 3, 1, 4).unbind(0))
    assert (
        torch.equal(stacked.cpu(), expected)
        and sums.dtype == torch.float64
        and _relative_error(sums, expected_sums) < 1e-12
    )


def test_finetuning_with_our_fused_ops_on_the_device_follows_the_plain_run(
    results, monkeypatch, tmp_path, move_results, small
):
    assert finetune.run(small(**ON_DEVICE, component="full", compile="blocks", fused="none"))["status"] == "finished"
    move_results("fused")
    assert finetune.run(small(**ON_DEVICE, component="full", compile="blocks", fused="all"))["status"] == "finished"
    losses = runs.history(small(**ON_DEVICE, component="full", compile="blocks", fused="none"))["train_loss"].to_numpy()
    fused_losses = runs.history(small(**ON_DEVICE, component="full", compile="blocks", fused="all"))[
        "train_loss"
    ].to_numpy()
    # bf16 autocast: kernels fused differently round differently
    assert np.allclose(fused_losses, losses, rtol=5e-2, atol=1e-2)


def test_plasticity_on_the_device_equals_the_plain_definition_on_the_cpu(tiny_vit):
    model = tiny_vit()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.3 * torch.randn(parameter.shape, generator=generator))
    model.eval()
    x, y = torch.randn(12, 3, 32, 32, generator=generator), torch.randn(12, 3, 32, 32, generator=generator)
    with torch.no_grad():
        reference = component_rates.plain_rates(model.double(), x.double(), y.double())
    in_situ = component_rates.rate_tensor(model, x.double(), y.double(), "in_situ")
    model.float()
    # cuDNN may run the patch-embedding convolution in TF32 (PyTorch's default): about 1e-3 apart
    tolerance = 2e-3 if DEVICE.type == "cuda" else 1e-4
    on_device = component_rates.rate_tensor(model.to(DEVICE), x.to(DEVICE), y.to(DEVICE))
    assert on_device.device.type == DEVICE.type and _relative_error(on_device, reference) < tolerance
    table = plasticity.measure(
        model,
        torch.utils.data.TensorDataset(x, torch.zeros(12)),
        torch.utils.data.TensorDataset(y, torch.zeros(12)),
        12,
        running=plasticity.Running(5, DEVICE, progress=False),
    )
    assert np.allclose(table["rate"].to_numpy(), component_rates.to_table(reference)["rate"].to_numpy(), rtol=tolerance)
    assert (
        _relative_error(component_rates.rate_tensor(model, x.to(DEVICE), y.to(DEVICE), "in_situ"), in_situ) < tolerance
    )


ON_DEVICE = {"batch_size": 32, "device": str(DEVICE)}  # the shared small runs, on the device


def test_finetuning_on_the_device_trains_only_the_chosen_component(results, small):
    model, metrics = finetune.train(small(**ON_DEVICE, component="fc2"))
    torch.manual_seed(0)
    initial = models.create_model("demo", num_classes=5)
    expected = {n for n, _ in components.trainable_parameters(components.set_trainable(initial, "fc2"))}
    changed = {n for n, p in model.named_parameters() if not torch.equal(p.detach().cpu(), initial.state_dict()[n])}
    assert changed and changed <= expected and "head.weight" in changed
    assert metrics["status"] == "finished" and 0 <= metrics["test_accuracy"] <= 1
    assert metrics["device"] == (torch.cuda.get_device_name(DEVICE) if DEVICE.type == "cuda" else "cpu")
    history = runs.history(small(**ON_DEVICE, component="fc2"))
    assert history["train_loss"].map(np.isfinite).all() and history["grad_norm"].gt(0).all()
    optimizer = make_optimizer(torch.nn.Linear(2, 2).to(DEVICE), OptimizerSettings("sgd", 0.1, 0.9))
    assert bool(optimizer.defaults["fused"]) == (DEVICE.type == "cuda")


def test_compiled_finetuning_on_the_device_follows_the_eager_run(results, monkeypatch, tmp_path, move_results, small):
    assert finetune.run(small(**ON_DEVICE, component="full"))["status"] == "finished"
    move_results("compiled")
    compiled = finetune.run(small(**ON_DEVICE, component="full", compile=True))
    assert compiled["status"] == "finished"
    losses = runs.history(small(**ON_DEVICE, component="full"))["train_loss"].to_numpy()
    compiled_losses = runs.history(small(**ON_DEVICE, component="full", compile=True))["train_loss"].to_numpy()
    # bf16 autocast: kernels fused differently round differently
    assert np.allclose(compiled_losses, losses, rtol=5e-2, atol=1e-2)


def test_benchmarks_run_on_the_device(capsys):
    from benchmarks import data as data_bench
    from benchmarks import step as step_bench

    result = data_bench.bench_data("digits", batch_size=64, image_size=224, batches=2, workers=2, device=str(DEVICE))
    assert result["device_path_images_per_s"] > 0 and result["device"].startswith(DEVICE.type)
    result = data_bench.bench_plasticity("demo", pairs=64, batch_size=32, device=str(DEVICE), repeats=1)
    assert result["measure_pairs_per_s"] > 0
    timing = step_bench.Timing(steps=2, repeats=1, device=str(DEVICE))
    result = step_bench.bench_finetune(step_bench.StepSettings("demo", 32), ("full", "linear"), timing, workers=0)
    assert result["linear_library_images_per_s"] > 0
    assert result["fused"] == ("gelu+qkv" if DEVICE.type == "cuda" else "none")  # the default, auto, as it resolved
    if DEVICE.type == "cuda" and any(name in torch.cuda.get_device_name(DEVICE) for name in step_bench.PEAK_TFLOPS):
        assert 0 < result["full_library_mfu"] < 1
    result = step_bench.bench_kernels("demo", batch_size=32, device=str(DEVICE), min_run_time=0.05)
    assert (
        result["ops"] == ("Triton kernels" if DEVICE.type == "cuda" else "PyTorch reference")
        and result["bias_gelu forward: ms"] > 0
    )
    result = step_bench.bench_profile(
        step_bench.StepSettings("demo", 32), "full", step_bench.Timing(1, device=str(DEVICE))
    )
    assert result["device"].startswith(DEVICE.type) and sum(result["shares"].values()) == pytest.approx(1.0, abs=1e-3)
    assert result["shares"]["matrix products"] > 0 and result["time_ms_per_step"] > 0
    choices = {"compile": ("none", "blocks"), "precision": ("autocast",), "fused": ("none", "all")}
    rows = step_bench.bench_variants("demo", "full", (32,), choices, timing)
    assert [row.get("error") for row in rows] == [None] * 4 and all(row["agrees"] for row in rows[1:])
    assert all(
        (row["peak_memory_gib"] > 0) if DEVICE.type == "cuda" else row["peak_memory_gib"] is None for row in rows
    )


def test_the_device_loader_normalises_with_other_statistics_on_the_device():
    half = ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
    digits = datasets.get_dataset("digits", "trainval")
    for augment in (False, True):
        cpu, _ = DeviceLoader(digits, 32, Transform(augment, 48, half), seed=1).batch(3)
        on_device, _ = DeviceLoader(digits, 32, Transform(augment, 48, half), device=DEVICE, seed=1).batch(3)
        # the same crops only without augmentation: a device generator draws other numbers than the CPU's
        if not augment:
            assert (on_device.cpu() - cpu).abs().max() < 1e-4
        assert on_device.min() >= -1 - 1e-4 and on_device.max() <= 1 + 1e-4  # (x - 0.5) / 0.5 of [0, 1]


@pytest.mark.parametrize("precision", ["autocast", "bf16"])
def test_weights_kept_on_the_device_rebuild_the_model_on_the_cpu(precision, results, small):
    # the fp32 masters are what a bf16 run keeps; the model rebuilt on the CPU evaluates in fp32
    config = small(**ON_DEVICE, component="mha", precision=precision, save_weights=True)
    metrics = finetune.run(config)
    model = checkpoints.load_model(config)
    assert next(model.parameters()).device.type == "cpu" and next(model.parameters()).dtype == torch.float32
    images, labels = datasets.get_dataset("digits", "test").tensors()
    with torch.no_grad():
        accuracy = (model(images).argmax(dim=1) == labels).double().mean().item()
    # bf16 on the device against fp32 here: a few of 180 images may flip
    assert abs(accuracy - metrics["test_accuracy"]) <= 0.03
