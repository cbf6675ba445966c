"""One finetuning run: what trains, determinism, logged gradient norms, best checkpoint, resume, divergence."""

import copy
import json
import math
from dataclasses import fields

import pandas as pd
import pytest
import torch

from paperlib import components, finetune, kernels, models, stats
from paperlib import results as results_module
from paperlib.finetune import Config


@pytest.fixture(autouse=True)
def results(tmp_path, monkeypatch):
    monkeypatch.setenv("VIT_PLASTICITY_RESULTS", str(tmp_path / "results"))
    return tmp_path / "results"


def small(**overrides):
    return Config(**{"steps": 12, "batch_size": 16, "warmup": 2, "eval_every": 4, "lr": 0.05, **overrides})


@pytest.mark.parametrize("config", ["fc2", "ln1", "linear"])
def test_only_the_chosen_parameters_change(config):
    model, metrics = finetune.train(small(config=config))
    torch.manual_seed(0)
    initial = models.create_model("demo", num_classes=5)  # the run's initialisation: same seed, same head
    expected = {n for n, _ in components.trainable_parameters(components.set_trainable(initial, config))}
    changed = {n for n, p in model.named_parameters() if not torch.equal(p.detach(), initial.state_dict()[n])}
    assert changed and changed <= expected
    assert "head.weight" in changed
    assert metrics["trainable_parameters"] == components.config_parameters(initial, config)


def test_same_seed_same_numbers(results, tmp_path, monkeypatch):
    first = finetune.run(small())
    history = finetune.history(small())
    monkeypatch.setenv("VIT_PLASTICITY_RESULTS", str(tmp_path / "again"))
    second = finetune.run(small())
    pd.testing.assert_frame_equal(history, finetune.history(small()))
    assert {k: v for k, v in first.items() if "second" not in k} == {k: v for k, v in second.items() if "second" not in k}


def test_a_file_dataset_decoded_the_first_time_does_not_change_the_numbers(results, tmp_path, monkeypatch):
    # decoding a file dataset the first time runs a DataLoader, which draws from torch's generator;
    # the run's numbers must not depend on whether the decoded cache was there
    first = finetune.run(small())
    history = finetune.history(small())
    original = finetune.uint8_images

    def decoding(dataset, **options):
        torch.rand(3)  # as a first decode's DataLoader does
        return original(dataset, **options)

    monkeypatch.setattr(finetune, "uint8_images", decoding)
    monkeypatch.setenv("VIT_PLASTICITY_RESULTS", str(tmp_path / "decoded"))
    second = finetune.run(small())
    pd.testing.assert_frame_equal(history, finetune.history(small()))
    assert second["test_accuracy"] == first["test_accuracy"]


def interrupted(config: Config, step: int, monkeypatch) -> None:
    """Run ``config`` until it stops with a simulated interruption when it asks for training batch ``step``."""
    from paperlib import loader

    original = loader.DeviceLoader.batch

    def crash(self, index):
        if index == step and self.augment:
            raise KeyboardInterrupt("simulated interruption")
        return original(self, index)

    with monkeypatch.context() as patch:
        patch.setattr(loader.DeviceLoader, "batch", crash)
        with pytest.raises(KeyboardInterrupt):
            finetune.run(config)


def same_metrics(metrics: dict) -> dict:
    """Metrics without the timings, which differ between runs."""
    return {k: v for k, v in metrics.items() if k not in ("wall_seconds", "images_per_second")}


def test_a_run_with_other_parameters_in_the_same_folder_is_not_taken_for_it(results, tmp_path, monkeypatch):
    # steps, batch size and warm-up are not in the folder's name: a longer run started there, then
    # interrupted, must not return the shorter run's metrics when started again
    short = finetune.run(small(steps=4))
    interrupted(small(steps=12), 6, monkeypatch)
    assert not (small().folder() / "metrics.json").exists()
    longer = finetune.run(small(steps=12))
    monkeypatch.setenv("VIT_PLASTICITY_RESULTS", str(tmp_path / "uninterrupted"))
    assert same_metrics(longer) == same_metrics(finetune.run(small(steps=12))) != same_metrics(short)
    assert longer["best_step"] in (4, 8, 12)


def test_logged_gradient_norm_is_what_clipping_saw(monkeypatch):
    seen = []
    original = torch.nn.utils.clip_grad_norm_

    def spy(parameters, max_norm, *args, **kwargs):
        parameters = list(parameters)
        seen.append(float(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in parameters]))))
        return original(parameters, max_norm, *args, **kwargs)

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", spy)
    finetune.run(small(lr=0.01))
    logged = finetune.history(small(lr=0.01))["grad_norm"].tolist()
    assert logged == pytest.approx(seen, rel=1e-5) and len(logged) == 12


@pytest.mark.parametrize("precision", ["autocast", "bf16"])
def test_logged_gradient_norm_is_what_the_fused_update_clipped_with(precision, monkeypatch):
    # fused="update" clips inside its update kernel: each parameter's factor is clipping's for the logged norm
    seen = []
    original = kernels.sgd_update

    def spy(grad, param, buf, lr, scale, momentum, first, copy=None):
        seen.append((float(grad.float().square().sum()), float(scale)))
        return original(grad, param, buf, lr, scale, momentum, first, copy)

    monkeypatch.setattr(kernels, "sgd_update", spy)
    config = small(lr=0.01, precision=precision, fused="update")
    finetune.run(config)
    logged = finetune.history(config)["grad_norm"].tolist()
    per_step = len(seen) // len(logged)
    assert len(logged) == 12 and per_step * len(logged) == len(seen) and per_step > 2
    for step, norm in enumerate(logged):
        squares, scales = zip(*seen[step * per_step : (step + 1) * per_step])
        assert math.sqrt(sum(squares)) == pytest.approx(norm, rel=1e-5)
        assert list(scales) == pytest.approx([min(1.0, 1.0 / (norm + 1e-6))] * per_step, rel=1e-6)
    assert max(logged) > 1.0  # clipping bit on some steps


def test_best_validation_checkpoint_is_reported():
    metrics = finetune.run(small())
    history = finetune.history(small()).dropna(subset=["val_accuracy"])
    best = history.loc[history["val_accuracy"].idxmax()]
    assert metrics["best_step"] == best["step"] and metrics["best_val_accuracy"] == best["val_accuracy"]
    assert list(history["step"]) == [4, 8, 12]
    assert 0.0 <= metrics["test_accuracy"] <= 1.0 and metrics["status"] == "finished"


# bf16: the copy is refreshed from the loaded masters; update: FusedSGD's momentum comes back from the checkpoint
@pytest.mark.parametrize("precision, fused", [("autocast", "auto"), ("bf16", "auto"), ("bf16", "update")])
def test_resume_after_interruption_matches_an_uninterrupted_run(precision, fused, results, tmp_path, monkeypatch):
    config = small(precision=precision, fused=fused)
    reference = finetune.run(config)
    monkeypatch.setenv("VIT_PLASTICITY_RESULTS", str(tmp_path / "interrupted"))
    interrupted(config, 9, monkeypatch)
    folder = config.folder()
    assert (folder / "checkpoint.pt").is_file() and not (folder / "metrics.json").exists()
    resumed = finetune.run(config)
    assert same_metrics(resumed) == same_metrics(reference)
    assert not (folder / "checkpoint.pt").exists()
    # a finished run is not repeated
    assert finetune.run(config) == resumed


def test_divergence_is_recorded_not_raised():
    metrics = finetune.run(small(config="full", lr=1e8, steps=30, eval_every=10))
    assert metrics["status"] == "diverged"
    history = finetune.history(small(config="full", lr=1e8, steps=30, eval_every=10))
    # losses are read back from the device in groups of steps; the history still ends at the
    # first non-finite loss
    assert not math.isfinite(history["train_loss"].iloc[-1])
    assert history["train_loss"].iloc[:-1].map(math.isfinite).all()
    assert history["step"].tolist() == list(range(1, len(history) + 1))
    assert json.loads((small(config="full", lr=1e8, steps=30, eval_every=10).folder() / "metrics.json").read_text())["status"] == "diverged"


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"config": "attention"}, "valid configurations: mha, fc1, fc2, ln2, ln1, full, linear"),
        ({"lr": 0.0}, "lr must be a positive number"),
        ({"lr": -1.0}, "lr must be a positive number"),
        ({"steps": 0}, "steps must be a positive integer"),
        ({"dataset": "mnist"}, "valid datasets"),
        ({"model": "resnet50"}, "valid short names"),
        ({"micro_batch": 5}, "must divide batch_size"),
        ({"graph": True}, "needs a CUDA device"),
        ({"graph": "yes"}, "graph must be True or False"),
    ],
)
def test_bad_parameters_fail_before_any_work(results, overrides, message):
    with pytest.raises(ValueError, match=message):
        finetune.run(small(**overrides))
    assert not results.exists()


def test_gradient_accumulation_matches_one_big_batch(results, tmp_path, monkeypatch):
    whole = finetune.history(small()) if finetune.run(small()) else None
    monkeypatch.setenv("VIT_PLASTICITY_RESULTS", str(tmp_path / "micro"))
    finetune.run(small(micro_batch=4))
    accumulated = finetune.history(small(micro_batch=4))
    assert accumulated["train_loss"].tolist() == pytest.approx(whole["train_loss"].tolist(), rel=1e-4)


def test_lr_schedule():
    assert finetune.lr_factor(0, 10, 100) == pytest.approx(0.1)
    assert finetune.lr_factor(9, 10, 100) == pytest.approx(1.0)
    assert finetune.lr_factor(10, 10, 100) == pytest.approx(1.0)
    assert finetune.lr_factor(99, 10, 100) == pytest.approx(0.5 * (1 + math.cos(math.pi * 89 / 90)))


def test_finetune_benchmark_runs(capsys):
    from paperlib import bench

    bench.main(["finetune", "--configs", "ln1,linear", "--batch-size", "8", "--steps", "2", "--workers", "0", "--device", "cpu"])
    out = capsys.readouterr().out
    for key in ("ln1_library_images_per_s", "ln1_plain_images_per_s", "linear_speedup", "linear_library_tflops"):
        assert key in out


@pytest.mark.parametrize("how, compiled_calls", [(True, 1), ("blocks", 6)])
def test_compiled_model_trains_like_the_eager_one(how, compiled_calls, results, tmp_path, monkeypatch):
    # torch.compile is stood in for by its eager backend (no compiler needed on CI machines):
    # what is tested is that the run trains, evaluates and checkpoints through the compiled twin
    # (or the model whose 6 blocks were compiled in place)
    compiled = []
    original = torch.compile

    def eager_compile(model, **kwargs):
        compiled.append(model)
        return original(model, backend="eager")

    eager = finetune.run(small(config="fc1"))
    monkeypatch.setattr(torch, "compile", eager_compile)
    monkeypatch.setenv("VIT_PLASTICITY_RESULTS", str(tmp_path / "compiled"))
    metrics = finetune.run(small(config="fc1", compile=how))
    assert len(compiled) == compiled_calls
    assert metrics["best_step"] == eager["best_step"] and metrics["test_accuracy"] == pytest.approx(eager["test_accuracy"])
    assert finetune.history(small(config="fc1", compile=how))["train_loss"].tolist() == pytest.approx(
        finetune.history(small(config="fc1"))["train_loss"].tolist(), rel=1e-5)


@pytest.mark.parametrize("how", ["model", "blocks"])
@pytest.mark.parametrize("order", [("linear", "full", "mha"), ("full", "linear", "ln1")])
def test_configurations_compiled_one_after_another_train_their_own_parameters(order, how, monkeypatch):
    # Real dynamo guards and AOTAutograd, which fixes at trace time which inputs get gradients
    # (the "aot_eager" backend: no compiler needed; plain "eager" runs autograd at run time and
    # would hide a stale graph). A graph compiled for one set of trainable parameters must not be
    # reused for another, on the same model (the benchmark) or on a fresh one (runs in one
    # notebook): gradients reach exactly the trainable parameters.
    original = torch.compile
    monkeypatch.setattr(torch, "compile", lambda model, **kwargs: original(model, backend="aot_eager"))
    images, labels = torch.randn(8, 3, 32, 32), torch.randint(0, 3, (8,))
    shared = models.create_model("demo", pretrained=False, num_classes=3)
    for config in order:
        for model in (shared, models.create_model("demo", pretrained=False, num_classes=3)):
            components.set_trainable(model, config)
            forward = finetune.compile_model(model, how)
            model.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(forward(images), labels).backward()
            expected = {n for n, p in model.named_parameters() if p.requires_grad}
            assert {n for n, p in model.named_parameters() if p.grad is not None} == expected, config


def test_blocks_share_one_compiled_graph_and_go_back_to_eager(monkeypatch):
    # regional compilation: the six blocks of the demo ViT run one graph (compiled once, not once
    # per block), gradients are those of the eager model, and compile_model(..., "none") undoes it
    from torch._dynamo.utils import counters

    original = torch.compile
    monkeypatch.setattr(torch, "compile", lambda model, **kwargs: original(model, backend="aot_eager"))
    torch.manual_seed(0)
    model = models.create_model("demo", pretrained=False, num_classes=3)
    images, labels = torch.randn(8, 3, 32, 32), torch.randint(0, 3, (8,))

    def gradients(forward):
        model.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(forward(images), labels).backward()
        return {n: p.grad.clone() for n, p in model.named_parameters()}

    eager = gradients(model)
    counters.clear()
    forward = finetune.compile_model(model, "blocks")
    assert forward is model and all(block._compiled_call_impl is not None for block in model.blocks)
    compiled = gradients(forward)
    assert counters["stats"]["unique_graphs"] == 1 and len(model.blocks) == 6
    assert compiled.keys() == eager.keys()
    for name in eager:
        torch.testing.assert_close(compiled[name], eager[name], rtol=1e-4, atol=1e-6, msg=name)
    assert finetune.compile_model(model, "none") is model
    assert not any(getattr(m, "_compiled_call_impl", None) is not None for m in model.modules())
    counters.clear()
    gradients(model)
    assert not counters["stats"]  # eager again: nothing traced


def test_compile_and_attention_choices_fail_before_any_work(results):
    with pytest.raises(ValueError, match="valid choices: none, model, blocks"):
        finetune.run(small(compile="everything"))
    with pytest.raises(ValueError, match="valid modes: default.*max-autotune"):
        finetune.run(small(compile=True, compile_mode="fastest"))
    with pytest.raises(ValueError, match="valid choices: auto, flash, math"):
        finetune.run(small(attention="cudnn"))  # a CUDA kernel asked for on a CPU
    with pytest.raises(ValueError, match="valid choices: auto, flash, cudnn, efficient, math"):
        finetune.check_attention("fast", torch.device("cuda"))
    with pytest.raises(ValueError, match="needs a ViT with a `blocks` sequence"):
        finetune.compile_model(torch.nn.Linear(2, 2), "blocks")
    assert not any(results.rglob("*")) if results.exists() else True


def test_a_runs_step_options_are_its_config_fields_checked_once(monkeypatch):
    config = small(compile=True, compile_mode="coordinate-descent", attention="math", precision="bf16")
    options = config.step_options()
    assert set(finetune.STEP_OPTIONS) <= {field.name for field in fields(finetune.Config)}  # a new option is a Config field too
    assert [getattr(options, name) for name in finetune.STEP_OPTIONS] == [True, "coordinate-descent", "math", "bf16", "auto", False]
    checked = options.checked("cpu")
    assert (checked.compile, checked.fused) == ("model", "none")  # as compile_model and fuse read them on a CPU
    assert finetune.StepOptions().checked(torch.device("cpu")).compile == "none"
    assert checked.checked("cpu") == checked  # checking is idempotent
    with pytest.raises(ValueError, match="valid choices: autocast, bf16"):
        finetune.StepOptions(precision="fp16").checked("cpu")
    monkeypatch.setattr(finetune, "check_graph", lambda graph, device=None: graph)  # as on a GPU
    for mode in ("reduce-overhead", "max-autotune"):  # inductor's own CUDA graphs cannot go inside ours
        with pytest.raises(ValueError, match="records CUDA graphs of its own"):
            finetune.StepOptions(compile="blocks", compile_mode=mode, graph=True).checked("cpu")
    for mode in ("default", "coordinate-descent", "max-autotune-no-cudagraphs"):
        assert finetune.StepOptions(compile="blocks", compile_mode=mode, graph=True).checked("cpu").graph
    assert finetune.StepOptions(compile_mode="reduce-overhead", graph=True).checked("cpu").graph  # not compiled: no mode applies


def test_attention_kernel_is_the_only_one_allowed_while_stepping():
    cpu = torch.device("cpu")
    assert finetune.step_context(cpu, "auto") is not None
    before = torch.backends.cuda.flash_sdp_enabled(), torch.backends.cuda.math_sdp_enabled()
    with finetune.step_context(cpu, "math")():
        assert torch.backends.cuda.math_sdp_enabled() and not torch.backends.cuda.flash_sdp_enabled()
    with finetune.step_context(cpu, "flash")():
        assert torch.backends.cuda.flash_sdp_enabled() and not torch.backends.cuda.math_sdp_enabled()
    assert (torch.backends.cuda.flash_sdp_enabled(), torch.backends.cuda.math_sdp_enabled()) == before
    model = models.create_model("demo", pretrained=False, num_classes=3).eval()
    images = torch.randn(4, 3, 32, 32)
    outputs = {}
    for attention in finetune.CPU_ATTENTION:
        with torch.no_grad(), finetune.step_context(cpu, attention)():
            outputs[attention] = model(images)
    torch.testing.assert_close(outputs["math"], outputs["auto"], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(outputs["flash"], outputs["auto"], rtol=1e-4, atol=1e-5)


def test_training_step_returns_device_tensors_and_updates_only_trainable_weights():
    model = models.create_model("demo", pretrained=False, num_classes=3)
    components.set_trainable(model, "ln2")
    trainable = [p for _, p in components.trainable_parameters(model)]
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer = finetune.make_optimizer(trainable, 0.1, 0.9, torch.device("cpu"))
    images, labels = torch.randn(8, 3, 32, 32), torch.randint(0, 3, (8,))
    loss, norm = finetune.training_step(model, trainable, optimizer, images, labels, 4, 1.0, finetune.autocast_for(torch.device("cpu")))
    assert isinstance(loss, torch.Tensor) and loss.ndim == 0 and float(norm) > 0
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and all(".norm2." in n or n.startswith(("head.", "norm.")) for n in changed)


def test_deterministic_mode_is_restored_after_a_run():
    # a CPU run switches PyTorch's deterministic algorithms on while it trains, not for the rest
    # of the process (on CUDA that mode would make cuBLAS calls fail without CUBLAS_WORKSPACE_CONFIG)
    seen = []
    original = finetune._train

    def spy(config, progress):
        seen.append(torch.are_deterministic_algorithms_enabled())
        return original(config, progress)

    torch.use_deterministic_algorithms(False)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(finetune, "_train", spy)
        finetune.train(small(steps=4, eval_every=2))
    assert seen == [True] and not torch.are_deterministic_algorithms_enabled()


def test_a_file_dataset_is_decoded_once_in_parallel_then_trained_on(tmp_path, monkeypatch):
    # Pets in its official layout: the images are decoded by DataLoader workers into the uint8
    # cache under the data root, and the run trains on the cached images
    from paperlib import fixtures

    fixtures.write_pets(tmp_path / "data")
    calls = []
    original = finetune.uint8_images

    def spy(dataset, *args, workers=0, **kwargs):
        calls.append((dataset.split, workers))
        return original(dataset, *args, workers=workers, **kwargs)

    monkeypatch.setattr(finetune, "uint8_images", spy)
    config = small(dataset="pets", data_root=str(tmp_path / "data"), steps=4, batch_size=4, eval_every=2, warmup=1)
    metrics = finetune.run(config)
    assert metrics["status"] == "finished" and metrics["num_classes"] == 3
    assert [split for split, _ in calls] == ["train", "val", "test"] and all(workers >= 1 for _, workers in calls)
    assert len(list((tmp_path / "data" / "cache").rglob("*.npy"))) == 2  # the official training split (train and val share it) and test


def test_out_of_memory_splits_the_batch_into_micro_batches(results, tmp_path, monkeypatch):
    # a stand-in GPU that holds at most 4 images per forward pass
    original = finetune.training_step
    tried = []

    def small_gpu(forward, trainable, optimizer, images, labels, micro, *args):
        tried.append(micro)
        if micro > 4:
            forward(images[:1])  # some work done before memory runs out
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")
        return original(forward, trainable, optimizer, images, labels, micro, *args)

    reference = finetune.run(small(micro_batch=4))
    reference_losses = finetune.history(small(micro_batch=4))["train_loss"].tolist()
    monkeypatch.setenv("VIT_PLASTICITY_RESULTS", str(tmp_path / "small-gpu"))
    monkeypatch.setattr(finetune, "training_step", small_gpu)
    metrics = finetune.run(small())
    assert tried[:3] == [16, 8, 4] and set(tried[3:]) == {4}  # split once, then kept
    assert metrics["micro_batch"] == 4 and metrics["status"] == "finished"
    assert finetune.history(small())["train_loss"].tolist() == pytest.approx(reference_losses, rel=1e-5)
    assert metrics["test_accuracy"] == reference["test_accuracy"]
    # a micro-batch the user chose is not changed behind their back
    with pytest.raises(torch.cuda.OutOfMemoryError):
        finetune.run(small(micro_batch=8, seed=1))
    assert finetune.smaller_micro_batch(512, 512) == 256 and finetune.smaller_micro_batch(48, 48) == 24 and finetune.smaller_micro_batch(20, 5) == 2


def test_bf16_precision_updates_fp32_master_weights_from_the_copys_gradients():
    torch.manual_seed(0)
    model = models.create_model("demo", pretrained=False, num_classes=3)
    components.set_trainable(model, "fc1")
    trainable = [p for _, p in components.trainable_parameters(model)]
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    master = finetune.MasterWeights(model)
    optimizer = finetune.make_optimizer(trainable, 1e-4, 0.9, torch.device("cpu"))
    images, labels = torch.randn(8, 3, 32, 32), torch.randint(0, 3, (8,))
    loss, norm = finetune.training_step(master, trainable, optimizer, images, labels, 8, 1e9, finetune.autocast_for(torch.device("cpu")))

    copies = dict(master.module.named_parameters())
    assert all(p.dtype == torch.float32 for p in model.parameters()) and all(p.dtype == torch.bfloat16 for p in copies.values())
    for name, p in model.named_parameters():
        if p.requires_grad:  # first SGD step (no clipping): p - lr * gradient, the bf16 gradient taken in fp32
            expected = before[name] - 1e-4 * copies[name].grad.float()
            torch.testing.assert_close(p.detach(), expected, rtol=0, atol=1e-7)
            assert p.grad.dtype == torch.float32
        else:
            assert torch.equal(p, before[name]) and copies[name].grad is None
        assert torch.equal(copies[name], p.detach().to(torch.bfloat16))  # the copy holds the rounded masters
    # updates below bf16's resolution are kept by the fp32 masters (bf16 weights would lose them)
    lost_in_bf16 = [((p != before[n]) & (p.to(torch.bfloat16) == before[n].to(torch.bfloat16))).any()
                    for n, p in model.named_parameters() if p.requires_grad]
    assert any(lost_in_bf16)
    with torch.no_grad():  # the same loss as the fp32 model, to bf16 rounding
        reference = torch.nn.functional.cross_entropy(_fp32_logits(before, images), labels)
    assert float(loss) == pytest.approx(float(reference), rel=3e-2) and math.isfinite(float(norm))


def _fp32_logits(state, images):
    model = models.create_model("demo", pretrained=False, num_classes=3)
    model.load_state_dict(state)
    return model(images)


def test_bf16_precision_runs_in_its_own_folder_and_follows_the_protocol(results):
    fp32 = finetune.run(small(config="full"))
    bf16 = finetune.run(small(config="full", precision="bf16"))
    assert bf16["status"] == "finished" and bf16["precision"] == "bf16" and fp32["precision"] == "autocast"
    assert small(precision="bf16").folder() != small().folder()  # its own folder: the protocol's run is kept
    losses = finetune.history(small(config="full", precision="bf16"))["train_loss"]
    # bf16 rounding: the first steps follow the fp32 run (later ones drift apart, as any two roundings do)
    assert losses[:4].tolist() == pytest.approx(finetune.history(small(config="full"))["train_loss"][:4].tolist(), rel=3e-2)
    with pytest.raises(ValueError, match="valid choices: autocast, bf16"):
        finetune.run(small(precision="fp16"))


def test_own_compile_modes_pass_their_inductor_options(monkeypatch):
    calls = []
    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: calls.append(kwargs) or fn)
    model = models.create_model("demo", pretrained=False, num_classes=3)
    assert "coordinate-descent" in finetune.compile_modes()
    finetune.compile_model(model, "model", "coordinate-descent")
    finetune.compile_model(model, "blocks", "coordinate-descent")
    finetune.compile_model(model, "model", "max-autotune-no-cudagraphs")
    finetune.compile_model(model, "model")
    assert calls[0] == {"options": {"coordinate_descent_tuning": True}} and len(calls) == 1 + len(model.blocks) + 2
    assert all(c == calls[0] for c in calls[1:-2]) and calls[-2] == {"mode": "max-autotune-no-cudagraphs"} and calls[-1] == {}
    calls.clear()
    finetune.compile_model(model, "model", "coordinate-descent-pdl")
    assert calls == [{"options": {"coordinate_descent_tuning": True, "triton.enable_pdl": True}}]
    # a mode whose options this PyTorch's inductor lacks is not offered, and is refused before any work
    monkeypatch.setitem(finetune.OWN_COMPILE_MODES, "future", {"triton.no_such_option": True})
    assert "future" not in finetune.compile_modes() and "pdl" in finetune.compile_modes()
    with pytest.raises(ValueError, match="unknown torch.compile mode 'future'; valid modes: .*coordinate-descent"):
        finetune.compile_model(model, "model", "future")


def test_the_pdl_mode_compiles_for_real():
    # its option is one inductor accepts (coordinate-descent's is compiled by the finetuning tests);
    # on a CPU it changes nothing
    model = models.create_model("demo", pretrained=False, num_classes=3)
    images = torch.randn(2, 3, 32, 32)
    expected = model(images)
    torch.testing.assert_close(finetune.compile_model(model, "model", "pdl")(images), expected, rtol=1e-4, atol=1e-5)


def test_runs_recorded_before_a_new_option_are_not_repeated(monkeypatch):
    metrics = finetune.run(small())
    params_file = small().folder() / "params.json"
    params = json.loads(params_file.read_text())
    del params["fused"], params["precision"]  # as a run written before Config had these fields
    params_file.write_text(json.dumps(params))
    monkeypatch.setattr(finetune, "train", lambda *a, **k: pytest.fail("a finished run was trained again"))
    assert finetune.run(small()) == metrics  # the missing fields count as their defaults
    assert finetune.same_params(params, small()) and not finetune.same_params(params, small(fused="all"))


CAPTURES = []


def recorded_capture(step, run):
    """A stand-in for ``GraphedStep._capture`` where the "graph" is the recorded Python function:
    capturing runs nothing and replaying runs it into the same output tensors, as a CUDA graph
    does (CPUs have no graphs)."""
    CAPTURES.append(step)
    outputs = (torch.zeros(()), torch.zeros(()))

    def replay():
        for output, value in zip(outputs, run()):
            output.copy_(value)

    return replay, outputs


class RecordedStep(finetune.GraphedStep):
    _capture = recorded_capture


@pytest.mark.parametrize("precision, fused", [("autocast", "none"), ("bf16", "none"), ("bf16", "update")])
def test_a_graphed_step_replays_the_step_with_each_new_batch_and_learning_rate(precision, fused):
    # what a CUDA graph changes (one capture, then replays of recorded inputs, learning rates and
    # outputs) checked on the CPU against ordinary steps under a changing learning rate
    torch.manual_seed(0)
    model = models.create_model("demo", pretrained=False, num_classes=3)
    components.set_trainable(model, "mha")
    twin = copy.deepcopy(model)
    cpu = torch.device("cpu")
    batches = [(torch.randn(8, 3, 32, 32), torch.randint(0, 3, (8,))) for _ in range(7)]
    runs = []
    for network, graphed in ((model, False), (twin, True)):
        trainable = [p for _, p in components.trainable_parameters(network)]
        options = finetune.StepOptions(precision=precision)
        forward = finetune.make_forward(network, options)
        if precision == "bf16":
            trainable = forward.masters
        # the graphed step with FusedSGD (reading its learning rates from GraphedStep's tensors) against plain SGD
        optimizer = finetune.make_optimizer(trainable, 0.05, 0.9, cpu, graphed and fused == "update")
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: finetune.lr_factor(step, 2, 7))
        context = finetune.step_context(cpu)
        step = RecordedStep(forward, trainable, optimizer, 4, 1.0, context, warmup=2) if graphed else finetune.make_step(
            forward, trainable, optimizer, 4, 1.0, context)
        outputs = []
        for images, labels in batches:
            outputs.append(step(images, labels))
            schedule.step()
            assert isinstance(optimizer.param_groups[0]["lr"], float)  # the schedule's and the checkpoints' number, kept
        runs.append((outputs, [p.detach().clone() for p in network.parameters()]))
    (plain, plain_weights), (replayed, replayed_weights) = runs
    assert CAPTURES[-1] is step and step.calls == 2
    losses = torch.tensor([[float(loss), float(norm)] for loss, norm in plain])
    assert len(set(losses[:, 0].tolist())) == 7  # every batch gives its own loss, so a stale batch would show
    torch.testing.assert_close(torch.tensor([[float(loss), float(norm)] for loss, norm in replayed]), losses, rtol=1e-5, atol=1e-6)
    for replayed_weight, plain_weight in zip(replayed_weights, plain_weights):
        torch.testing.assert_close(replayed_weight, plain_weight, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="replays one batch shape"):
        step(torch.randn(4, 3, 32, 32), torch.randint(0, 3, (4,)))


def test_a_step_that_cannot_be_recorded_says_what_to_do():
    model = components.set_trainable(models.create_model("demo", pretrained=False, num_classes=3), "mha")
    trainable = [p for _, p in components.trainable_parameters(model)]
    optimizer = finetune.make_optimizer(trainable, 0.05, 0.9, torch.device("cpu"))

    class Unrecordable(finetune.GraphedStep):
        def _capture(self, run):
            raise RuntimeError("operation not permitted when stream is capturing")

    step = Unrecordable(model, trainable, optimizer, 4, 1.0, finetune.step_context(torch.device("cpu")), warmup=2)
    images, labels = torch.randn(4, 3, 32, 32), torch.randint(0, 3, (4,))
    step(images, labels)  # the ordinary warm-up steps
    step(images, labels)
    with pytest.raises(RuntimeError, match=r"CUDA graph failed \(operation not permitted.*run with graph=False"):
        step(images, labels)

    class OutOfMemoryWhileRecording(finetune.GraphedStep):
        def _capture(self, run):  # the allocator's error inside a capture can come as a plain RuntimeError
            raise RuntimeError("CUDA error: out of memory")

    step = OutOfMemoryWhileRecording(model, trainable, optimizer, 4, 1.0, finetune.step_context(torch.device("cpu")), warmup=2)
    step(images, labels)
    step(images, labels)
    with pytest.raises(torch.cuda.OutOfMemoryError, match="out of memory"):  # train() then retries with micro-batches
        step(images, labels)


def test_warmup_steps_cover_compilation_and_a_graphs_capture():
    assert finetune.warmup_steps(finetune.StepOptions()) == 1
    assert finetune.warmup_steps(finetune.StepOptions(compile="blocks")) == 3
    assert finetune.warmup_steps(finetune.StepOptions(compile="blocks", graph=True)) == finetune.GRAPH_WARMUP + 1
    assert finetune.make_step(None, [], None, 4, 1.0, None).__name__ == "<lambda>"
    with pytest.raises(ValueError, match="needs trainable parameters"):
        finetune.make_step(None, [], None, 4, 1.0, None, graph=True)
    weight = torch.zeros(2, requires_grad=True)  # a capture of the first step would record the momentum's initialisation
    with pytest.raises(ValueError, match="at least 2 ordinary steps before its capture, got warmup=1"):
        finetune.GraphedStep(None, [weight], torch.optim.SGD([weight], lr=0.1, momentum=0.9), 4, 1.0, None, warmup=1)


def test_a_run_of_graphed_steps_records_what_an_ordinary_run_does(results, tmp_path, monkeypatch):
    # train() with graph=True: warm-up, capture, replays between evaluations and checkpoints
    reference = finetune.run(small(config="full"))
    losses = finetune.history(small(config="full"))
    monkeypatch.setattr(finetune, "check_graph", lambda graph, device=None: graph)  # the CPU stands in for a GPU
    monkeypatch.setattr(finetune.GraphedStep, "_capture", recorded_capture)
    monkeypatch.setenv("VIT_PLASTICITY_RESULTS", str(tmp_path / "graphed"))
    CAPTURES.clear()
    metrics = finetune.run(small(config="full", graph=True))
    assert len(CAPTURES) == 1 and CAPTURES[0].calls == finetune.GRAPH_WARMUP
    graphed = finetune.history(small(config="full", graph=True))
    assert graphed["lr"].tolist() == losses["lr"].tolist()
    assert graphed["train_loss"].tolist() == pytest.approx(losses["train_loss"].tolist(), rel=1e-5)
    assert graphed["val_accuracy"].dropna().tolist() == pytest.approx(losses["val_accuracy"].dropna().tolist(), abs=1e-9)
    assert metrics["best_step"] == reference["best_step"] and metrics["status"] == "finished"


def test_adamw_runs_in_its_own_folder_and_trains_only_the_chosen_component(results):
    sgd = finetune.run(small(config="ln2"))
    model, adamw = finetune.train(small(config="ln2", optimizer="adamw", lr=1e-3, weight_decay=0.05))
    assert adamw["status"] == "finished" and adamw["optimizer"] == "adamw" and sgd["optimizer"] == "sgd"
    assert small(optimizer="adamw", weight_decay=0.05).folder().name == "seed=0-adamw-wd0.05"
    assert small(optimizer="adamw", precision="bf16").folder().name == "seed=0-bf16-adamw"
    torch.manual_seed(0)
    initial = components.set_trainable(models.create_model("demo", num_classes=5), "ln2")
    changed = {n for n, p in model.named_parameters() if not torch.equal(p.detach(), initial.state_dict()[n])}
    assert changed and changed <= {n for n, _ in components.trainable_parameters(initial)}
    runs, _ = results_module.load()
    assert sorted(runs["optimizer"]) == ["adamw", "sgd"] and sorted(runs["weight_decay"]) == [0.0, 0.05]


def test_adamw_decays_weight_matrices_only_and_steps_as_torch_does():
    model = components.set_trainable(models.create_model("demo", num_classes=5), "full")
    groups = finetune.decay_groups(model, 0.1)
    names = {id(p): n for n, p in model.named_parameters()}
    decayed = {names[id(p)] for g in groups if g["weight_decay"] for p in g["params"]}
    kept = {names[id(p)] for g in groups if not g["weight_decay"] for p in g["params"]}
    assert "blocks.0.attn.qkv.weight" in decayed and "head.weight" in decayed
    assert {"blocks.0.attn.qkv.bias", "blocks.0.norm1.weight", "pos_embed", "cls_token", "norm.weight"} <= kept
    assert decayed.isdisjoint(kept) and decayed | kept == {n for n, p in model.named_parameters() if p.requires_grad}
    optimizer = finetune.make_optimizer(groups, 1e-3, 0.9, torch.device("cpu"), optimizer="adamw", weight_decay=0.1)
    assert isinstance(optimizer, torch.optim.AdamW) and optimizer.defaults["betas"] == (0.9, 0.999)
    weight, bias = model.head.weight, model.head.bias
    before_w, before_b = weight.detach().clone(), bias.detach().clone()
    weight.grad, bias.grad = torch.zeros_like(weight), torch.zeros_like(bias)  # no gradient: only the decay moves a weight
    optimizer.step()
    assert torch.allclose(weight, before_w * (1 - 1e-3 * 0.1)) and torch.equal(bias, before_b)


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"optimizer": "adam"}, "valid optimizers: sgd, adamw"),
        ({"weight_decay": 0.05}, "weight_decay is for optimizer='adamw'"),
        ({"optimizer": "adamw", "weight_decay": -1.0}, "weight_decay must be a non-negative number"),
        ({"optimizer": "adamw", "fused": "update"}, "fused SGD update, which adamw does not have"),
        ({"optimizer": "adamw", "momentum": 0.5}, "momentum is SGD's; adamw has its own"),
    ],
)
def test_bad_optimizer_parameters_fail_before_any_work(results, overrides, message):
    with pytest.raises(ValueError, match=message):
        finetune.run(small(**overrides))
    assert not results.exists()


def test_adamw_resumes_after_an_interruption_as_if_uninterrupted(results, tmp_path, monkeypatch):
    config = small(config="fc1", optimizer="adamw", lr=1e-3, weight_decay=0.01)
    reference = finetune.run(config)
    monkeypatch.setenv("VIT_PLASTICITY_RESULTS", str(tmp_path / "interrupted"))
    interrupted(config, 9, monkeypatch)
    assert (config.folder() / "checkpoint.pt").is_file()
    assert same_metrics(finetune.run(config)) == same_metrics(reference)


def test_table6_refuses_runs_of_two_optimizers(results):
    finetune.run(small(config="ln2", steps=4, eval_every=2))
    finetune.run(small(config="ln2", steps=4, eval_every=2, optimizer="adamw", lr=1e-3))
    runs, _ = results_module.load()
    with pytest.raises(ValueError, match="one optimizer, got adamw, sgd"):
        stats.table6(runs)
    assert len(stats.table6(runs[runs["optimizer"] == "sgd"])) == 1


# --------------------------------------------------------------------------------------------
# the finetuned model, kept (save_weights) and rebuilt (load_model)


def _test_accuracy(model) -> float:
    """Test accuracy of ``model`` on the demo's test split, computed here: the evaluation transform
    (the digits are at the model's resolution), ImageNet's statistics, one batch."""
    from paperlib import data

    images, labels = data.get_dataset("digits", "test").tensors()
    with torch.no_grad():
        return (model(images).argmax(dim=1) == labels).double().mean().item()


@pytest.mark.parametrize("config", ["mha", "linear"])
def test_kept_weights_rebuild_the_model_of_the_reported_test_accuracy(config):
    run = small(config=config, save_weights=True)
    metrics = finetune.run(run)
    assert metrics["weights"] == "weights.safetensors" and (run.folder() / "weights.safetensors").is_file()
    model = finetune.load_model(run)
    assert not model.training and _test_accuracy(model) == pytest.approx(metrics["test_accuracy"], abs=1e-12)
    # only what the run trained differs from the pretrained model; the file holds exactly that
    from safetensors.torch import load_file

    pretrained = models.create_model("demo", num_classes=5).state_dict()
    trained = {n for n, _ in components.trainable_parameters(components.set_trainable(models.create_model("demo", num_classes=5), config))}
    assert set(load_file(str(run.folder() / "weights.safetensors"))) == trained
    for name, tensor in model.state_dict().items():
        if name not in trained:
            assert torch.equal(tensor, pretrained[name]), name
    # the best checkpoint's, not the last step's: a run that trains on keeps its best
    history = finetune.history(run).dropna(subset=["val_accuracy"])
    assert metrics["best_step"] == int(history.loc[history["val_accuracy"].idxmax(), "step"])


def test_asking_for_weights_a_finished_run_did_not_keep_trains_it_again_to_the_same_numbers():
    plain = finetune.run(small())
    assert plain["weights"] is None and not (small().folder() / "weights.safetensors").exists()
    with pytest.raises(FileNotFoundError, match="save_weights=True"):
        finetune.load_model(small())
    kept = finetune.run(small(save_weights=True))
    assert same_metrics({**kept, "weights": None}) == same_metrics(plain)
    assert finetune.run(small()) == kept  # the same run: save_weights is not part of what it is
    assert _test_accuracy(finetune.load_model(small())) == pytest.approx(kept["test_accuracy"], abs=1e-12)
    with pytest.raises(ValueError, match="save_weights must be True or False"):
        small(save_weights="yes").validate()
    # rebuilt whatever ran it (device, micro-batches, compilation...), but not from a run of other steps
    assert _test_accuracy(finetune.load_model(small(micro_batch=8, fused="none"))) == pytest.approx(kept["test_accuracy"], abs=1e-12)
    with pytest.raises(ValueError, match="differs from this configuration in steps"):
        finetune.load_model(small(steps=8))
    # a run of other parameters in the folder: its weights go with its record
    finetune.run(small(steps=8))
    assert not (small().folder() / "weights.safetensors").exists()


def test_weights_asked_of_a_run_that_diverged_before_any_checkpoint_do_not_train_it_again(monkeypatch):
    diverged = finetune.run(small(lr=1e9, steps=3, warmup=0, eval_every=3))
    assert diverged["status"] == "diverged" and diverged["best_step"] is None
    monkeypatch.setattr(finetune, "train", lambda *args, **kwargs: pytest.fail("trained again"))
    again = finetune.run(small(lr=1e9, steps=3, warmup=0, eval_every=3, save_weights=True))
    assert json.dumps(again, sort_keys=True) == json.dumps(diverged, sort_keys=True)  # NaNs too


def test_a_run_trained_again_for_its_weights_is_partial_until_it_ends(monkeypatch):
    finetune.run(small())
    interrupted(small(save_weights=True), 6, monkeypatch)
    assert not (small().folder() / "metrics.json").exists()
    assert results_module.load()[0]["status"].tolist() == ["partial"]


def test_a_tag_keeps_a_run_of_other_steps_beside_the_protocols():
    protocol = finetune.run(small(steps=8))
    longer = small(steps=12, tag="steps12")
    assert longer.folder().name == "seed=0+steps12" and longer.folder().parent == small().folder().parent
    for clash in ("bf16", "adamw", "norm-model", "lora-r8"):  # no tag spells another suffix
        assert small(tag=clash).folder() not in {small(precision="bf16").folder(), small(optimizer="adamw").folder()}
        assert small(tag=clash).folder().name == f"seed=0+{clash}"
    assert small(tag=2000).tag == "2000"  # a sweep spec's number
    finetune.run(longer)
    assert finetune.run(small(steps=8)) == protocol  # still there: not replaced by the longer run
    runs, _ = results_module.load()
    assert sorted(runs["tag"]) == ["", "steps12"]
    with pytest.raises(ValueError, match="one tag"):
        stats.table6(runs)
    assert len(stats.table6(runs[runs["tag"] == "steps12"])) == 1
    for bad in ("a/b", "-x", "two words", ["x"]):
        with pytest.raises(ValueError, match="tag must be"):
            small(tag=bad).validate()


def test_a_lora_runs_kept_updates_merge_into_a_plain_vit():
    run = small(config="mha", lora_rank=2, save_weights=True)
    metrics = finetune.run(run)
    unmerged, merged = finetune.load_model(run, merge=False), finetune.load_model(run)
    assert _test_accuracy(unmerged) == pytest.approx(metrics["test_accuracy"], abs=1e-12)
    assert type(merged.blocks[0].attn.qkv) is torch.nn.Linear
    assert set(merged.state_dict()) == set(models.create_model("demo", num_classes=5).state_dict())
    images = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        assert torch.allclose(merged(images), unmerged(images), atol=1e-5)
