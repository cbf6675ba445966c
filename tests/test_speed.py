"""The speed machinery (``paperlib.speed``): step options, the run's optimizer, compilation, precision,
fused ops and micro-batches each give the step the protocol defines, to rounding."""

import inspect
import math

import pytest
import torch
import yaml
from conftest import interrupted, resumed, same_metrics

from benchmarks import __main__ as bench
from benchmarks import step as step_bench
from paperlib import speed
from paperlib.data.imagesets import random_images
from paperlib.data.loader import DeviceLoader, Transform
from paperlib.records import paths, step_options
from paperlib.records import runs as run_files
from paperlib.speed import options as device_options
from paperlib.speed import step as step_module
from paperlib.sweeps import plan
from paperlib.train import finetune
from paperlib.train import step as train_step
from paperlib.train.config import Config, config_from, configs
from paperlib.vit import components, lora, models


def test_finetune_benchmark_runs(capsys):
    bench.main(
        [
            "finetune",
            "--components",
            "ln1,linear",
            "--batch-size",
            "8",
            "--steps",
            "2",
            "--workers",
            "0",
            "--device",
            "cpu",
        ]
    )
    out = capsys.readouterr().out
    for key in ("ln1_library_images_per_s", "ln1_plain_images_per_s", "linear_speedup", "linear_library_tflops"):
        assert key in out


@pytest.mark.parametrize("how, compiled_calls", [(True, 1), ("blocks", 6)])
def test_compiled_model_trains_like_the_eager_one(
    how, compiled_calls, results, tmp_path, monkeypatch, small, move_results
):
    # torch.compile is stood in for by its eager backend (no compiler needed on CI machines):
    # what is tested is that the run trains, evaluates and checkpoints through the compiled twin
    # (or the model whose 6 blocks were compiled in place)
    compiled = []
    original = torch.compile

    def eager_compile(model, **kwargs):
        compiled.append(model)
        return original(model, backend="eager")

    eager = finetune.run(small(component="fc1"))
    monkeypatch.setattr(torch, "compile", eager_compile)
    move_results("compiled")
    metrics = finetune.run(small(component="fc1", compile=how))
    assert len(compiled) == compiled_calls
    assert metrics["best_step"] == eager["best_step"] and metrics["test_accuracy"] == pytest.approx(
        eager["test_accuracy"]
    )
    assert run_files.history(small(component="fc1", compile=how))["train_loss"].tolist() == pytest.approx(
        run_files.history(small(component="fc1"))["train_loss"].tolist(), rel=1e-5
    )


@pytest.mark.parametrize("how", ["model", "blocks"])
@pytest.mark.parametrize("order", [("linear", "full", "mha"), ("full", "linear", "ln1")])
def test_components_compiled_one_after_another_train_their_own_parameters(order, how, monkeypatch, tiny_vit):
    # Real dynamo guards and AOTAutograd, which fixes at trace time which inputs get gradients
    # (the "aot_eager" backend: no compiler needed; plain "eager" runs autograd at run time and
    # would hide a stale graph). A graph compiled for one set of trainable parameters must not be
    # reused for another, on the same model (the benchmark) or on a fresh one (runs in one
    # notebook): gradients reach exactly the trainable parameters.
    original = torch.compile
    monkeypatch.setattr(torch, "compile", lambda model, **kwargs: original(model, backend="aot_eager"))
    # two blocks, not the demo's six: tracing is most of this test's time, and a block is traced alike
    images, labels = torch.randn(8, 3, 32, 32), torch.randint(0, 3, (8,))
    shared = tiny_vit(num_classes=3, depth=2)
    for component in order:
        for model in (shared, tiny_vit(num_classes=3, depth=2)):
            components.set_trainable(model, component)
            forward = speed.step.compile_model(model, how)
            model.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(forward(images), labels).backward()
            expected = {n for n, p in model.named_parameters() if p.requires_grad}
            assert {n for n, p in model.named_parameters() if p.grad is not None} == expected, component


def test_blocks_share_one_compiled_graph_and_go_back_to_eager(monkeypatch, tiny_vit):
    # regional compilation: the six blocks of the demo ViT run one graph (compiled once, not once
    # per block), gradients are those of the eager model, and compile_model(..., "none") undoes it
    from torch._dynamo.utils import counters

    original = torch.compile
    monkeypatch.setattr(torch, "compile", lambda model, **kwargs: original(model, backend="aot_eager"))
    torch.manual_seed(0)
    model = tiny_vit(num_classes=3)
    images, labels = torch.randn(8, 3, 32, 32), torch.randint(0, 3, (8,))

    def gradients(forward):
        model.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(forward(images), labels).backward()
        return {n: p.grad.clone() for n, p in model.named_parameters()}

    eager = gradients(model)
    counters.clear()
    forward = speed.step.compile_model(model, "blocks")
    assert forward is model and all(block._compiled_call_impl is not None for block in model.blocks)
    compiled = gradients(forward)
    assert counters["stats"]["unique_graphs"] == 1 and len(model.blocks) == 6
    assert compiled.keys() == eager.keys()
    for name in eager:
        torch.testing.assert_close(compiled[name], eager[name], rtol=1e-4, atol=1e-6, msg=name)
    assert speed.step.compile_model(model, "none") is model
    assert not any(getattr(m, "_compiled_call_impl", None) is not None for m in model.modules())
    counters.clear()
    gradients(model)
    assert not counters["stats"]  # eager again: nothing traced


@pytest.mark.parametrize(
    "avx512_bf16, amx, native", [(False, False, False), (True, False, True), (False, True, True), (True, True, True)]
)
def test_native_bf16_is_avx512_bf16_or_amx(monkeypatch, avx512_bf16, amx, native):
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    assert device_options.native_bf16() is native


def test_compile_and_attention_choices_fail_before_any_work(results, small):
    with pytest.raises(ValueError, match="valid choices: none, model, blocks"):
        finetune.run(small(compile="everything"))
    with pytest.raises(ValueError, match="valid modes: default.*max-autotune"):
        finetune.run(small(compile=True, compile_mode="fastest"))
    with pytest.raises(ValueError, match="valid choices: auto, flash, math"):
        finetune.run(small(attention="cudnn"))  # a CUDA kernel asked for on a CPU
    with pytest.raises(ValueError, match="valid choices: auto, flash, cudnn, efficient, math"):
        device_options.check_attention("fast", torch.device("cuda"))
    with pytest.raises(ValueError, match="needs a ViT with a `blocks` sequence"):
        speed.step.compile_model(torch.nn.Linear(2, 2), "blocks")
    assert not any(results.rglob("*")) if results.exists() else True


def test_a_runs_step_options_are_its_step_and_its_parameters_checked_once(small):
    config = small(compile=True, compile_mode="coordinate-descent", attention="math", precision="bf16")
    options = config.step
    assert set(step_options.STEP_OPTIONS) <= set(Config.defaults())  # a new option is a run's parameter too
    assert [getattr(options, name) for name in step_options.STEP_OPTIONS] == [
        True,
        "coordinate-descent",
        "math",
        "bf16",
        "auto",
    ]
    checked = device_options.checked(options, "cpu")
    assert (checked.compile, checked.fused) == ("model", "none")  # as compile_model and fuse read them on a CPU
    assert device_options.checked(step_options.StepOptions(), torch.device("cpu")).compile == "none"
    assert device_options.checked(checked, "cpu") == checked  # checking is idempotent
    with pytest.raises(ValueError, match="valid choices: fp32, tf32, autocast, bf16"):
        device_options.checked(step_options.StepOptions(precision="fp16"), "cpu")


def test_a_run_holds_its_step_options_as_one_value_and_records_them_flat():
    # in Python a StepOptions; in a run's parameters, its record and its folder, each option under its own name
    value = Config(step=step_options.StepOptions(precision="bf16", compile="blocks"))
    flat = config_from({"precision": "bf16", "compile": "blocks"})
    assert value == flat and value.folder() == flat.folder() and value.folder().name == "seed=0+bf16"
    record = run_files.run_record(value)
    assert (record["precision"], record["compile"]) == ("bf16", "blocks") and "step" not in record
    assert Config(**run_files.run_fields(value.parameters())) == value  # and back
    with pytest.raises(ValueError, match="step must be a StepOptions"):
        Config(step={"precision": "bf16"})


def test_attention_kernel_is_the_only_one_allowed_while_stepping(tiny_vit):
    cpu = torch.device("cpu")
    assert speed.step.step_context(cpu, "auto") is not None
    before = torch.backends.cuda.flash_sdp_enabled(), torch.backends.cuda.math_sdp_enabled()
    with speed.step.step_context(cpu, "math")():
        assert torch.backends.cuda.math_sdp_enabled() and not torch.backends.cuda.flash_sdp_enabled()
    with speed.step.step_context(cpu, "flash")():
        assert torch.backends.cuda.flash_sdp_enabled() and not torch.backends.cuda.math_sdp_enabled()
    assert (torch.backends.cuda.flash_sdp_enabled(), torch.backends.cuda.math_sdp_enabled()) == before
    # in bf16 on a CPU, "auto" is the math kernel: PyTorch's CPU flash attention is slow backwards in bf16
    for precision in ("autocast", "bf16"):
        with speed.step.step_context(cpu, "auto", precision=precision)():
            assert torch.backends.cuda.math_sdp_enabled() and not torch.backends.cuda.flash_sdp_enabled()
    with speed.step.step_context(cpu, "auto", precision="fp32")():
        assert (torch.backends.cuda.flash_sdp_enabled(), torch.backends.cuda.math_sdp_enabled()) == before
    model = tiny_vit(num_classes=3).eval()
    images = torch.randn(4, 3, 32, 32)
    outputs = {}
    for attention in device_options.CPU_ATTENTION:
        with torch.no_grad(), speed.step.step_context(cpu, attention, precision="fp32")():
            outputs[attention] = model(images)
    torch.testing.assert_close(outputs["math"], outputs["auto"], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(outputs["flash"], outputs["auto"], rtol=1e-4, atol=1e-5)


def test_a_step_returns_device_tensors_and_updates_only_trainable_weights(tiny_model):
    model = tiny_model
    components.set_trainable(model, "ln2")
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    sgd = speed.step.OptimizerSettings("sgd", 0.1, 0.9)
    options = device_options.checked(step_options.StepOptions(), "cpu")  # a step is made of checked options
    step = speed.step.make_step(model, options, optimizer=sgd, batch_size=8, clip=1.0, micro_batch=4)
    assert step.trainable == [p for _, p in components.trainable_parameters(model)]
    loss, norm = step(torch.randn(8, 3, 32, 32), torch.randint(0, 3, (8,)))
    assert isinstance(loss, torch.Tensor) and loss.ndim == 0 and float(norm) > 0
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and all(".norm2." in n or n.startswith(("head.", "norm.")) for n in changed)


def test_out_of_memory_splits_the_batch_into_micro_batches(results, tmp_path, monkeypatch, small, move_results):
    # a stand-in GPU that holds at most 4 images per forward pass
    original = speed.step.Step.once
    tried = []

    def small_gpu(step, images, labels):
        tried.append(step.micro)
        if step.micro > 4:
            step.forward(images[:1])  # some work done before memory runs out
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")
        return original(step, images, labels)

    monkeypatch.setattr(train_step, "is_paper_step", lambda *args: False)  # speed's step, whose batches can split
    reference = finetune.run(small(micro_batch=4))
    reference_losses = run_files.history(small(micro_batch=4))["train_loss"].tolist()
    move_results("small-gpu")
    monkeypatch.setattr(speed.step.Step, "once", small_gpu)
    metrics = finetune.run(small())
    assert tried[:3] == [16, 8, 4] and set(tried[3:]) == {4}  # split once, then kept
    assert metrics["micro_batch"] == 4 and metrics["status"] == "finished"
    assert run_files.history(small())["train_loss"].tolist() == pytest.approx(reference_losses, rel=1e-5)
    assert metrics["test_accuracy"] == reference["test_accuracy"]
    # a micro-batch the user chose is not changed behind their back
    with pytest.raises(torch.cuda.OutOfMemoryError):
        finetune.run(small(micro_batch=8, seed=1))
    assert (
        speed.step.smaller_micro_batch(512, 512) == 256
        and speed.step.smaller_micro_batch(48, 48) == 24
        and speed.step.smaller_micro_batch(20, 5) == 2
    )


def _fp32_logits(state, images):
    model = models.create_model("demo", pretrained=False, num_classes=3)
    model.load_state_dict(state)
    return model(images)


def test_bf16_precision_updates_fp32_master_weights_from_the_copys_gradients(tiny_model):
    model = tiny_model
    components.set_trainable(model, "fc1")
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    sgd = speed.step.OptimizerSettings("sgd", 1e-4, 0.9)
    bf16 = device_options.checked(step_options.StepOptions(precision="bf16"), "cpu")
    step = speed.step.make_step(model, bf16, optimizer=sgd, batch_size=8, clip=1e9)
    assert isinstance(step.forward, speed.step.MasterWeights) and step.trainable == step.forward.masters
    images, labels = torch.randn(8, 3, 32, 32), torch.randint(0, 3, (8,))
    loss, norm = step(images, labels)

    copies = dict(step.forward.module.named_parameters())
    assert all(p.dtype == torch.float32 for p in model.parameters()) and all(
        p.dtype == torch.bfloat16 for p in copies.values()
    )
    for name, p in model.named_parameters():
        if p.requires_grad:  # first SGD step (no clipping): p - lr * gradient, the bf16 gradient taken in fp32
            expected = before[name] - 1e-4 * copies[name].grad.float()
            torch.testing.assert_close(p.detach(), expected, rtol=0, atol=1e-7)
            assert p.grad.dtype == torch.float32
        else:
            assert torch.equal(p, before[name]) and copies[name].grad is None
        assert torch.equal(copies[name], p.detach().to(torch.bfloat16))  # the copy holds the rounded masters
    # updates below bf16's resolution are kept by the fp32 masters (bf16 weights would lose them)
    lost_in_bf16 = [
        ((p != before[n]) & (p.to(torch.bfloat16) == before[n].to(torch.bfloat16))).any()
        for n, p in model.named_parameters()
        if p.requires_grad
    ]
    assert any(lost_in_bf16)
    with torch.no_grad():  # the same loss as the fp32 model, to bf16 rounding
        reference = torch.nn.functional.cross_entropy(_fp32_logits(before, images), labels)
    assert float(loss) == pytest.approx(float(reference), rel=3e-2) and math.isfinite(float(norm))


def test_bf16_precision_runs_in_its_own_folder_and_follows_the_protocol(results, small, tiny_data):
    full = {"component": "full", "dataset": "cifar10", "data_root": tiny_data}  # a tiny set: bf16 may be emulated
    fp32 = finetune.run(small(**full))
    bf16 = finetune.run(small(**full, precision="bf16"))
    assert bf16["status"] == "finished" and bf16["precision"] == "bf16" and fp32["precision"] == "fp32"
    assert small(precision="bf16").folder() != small().folder()  # its own folder: the protocol's run is kept
    losses = run_files.history(small(**full, precision="bf16"))["train_loss"]
    # bf16 rounding: the first steps follow the fp32 run (later ones drift apart, as any two roundings do)
    assert losses[:4].tolist() == pytest.approx(run_files.history(small(**full))["train_loss"][:4].tolist(), rel=3e-2)
    with pytest.raises(ValueError, match="valid choices: fp32, tf32, autocast, bf16"):
        finetune.run(small(precision="fp16"))


def test_own_compile_modes_pass_their_inductor_options(monkeypatch, tiny_vit):
    calls = []
    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: calls.append(kwargs) or fn)
    model = tiny_vit(num_classes=3)
    assert "coordinate-descent" in device_options.compile_modes()
    speed.step.compile_model(model, "model", "coordinate-descent")
    speed.step.compile_model(model, "blocks", "coordinate-descent")
    speed.step.compile_model(model, "model", "max-autotune-no-cudagraphs")
    speed.step.compile_model(model, "model")
    assert calls[0] == {"options": {"coordinate_descent_tuning": True}} and len(calls) == 1 + len(model.blocks) + 2
    assert (
        all(c == calls[0] for c in calls[1:-2])
        and calls[-2] == {"mode": "max-autotune-no-cudagraphs"}
        and calls[-1] == {}
    )
    with pytest.raises(ValueError, match="unknown torch.compile mode 'pdl'; valid modes: .*coordinate-descent"):
        device_options.checked(step_options.StepOptions(compile_mode="pdl"), "cpu")  # removed unmeasured


def test_the_protocols_precision_is_fp32_and_other_precisions_get_their_own_folders(small, monkeypatch):
    # the paper trains in FP32 (Table 4's text); bf16 autocast and bf16 master weights are speed options
    assert Config().step.precision == "fp32" and step_options.StepOptions().precision == "fp32"
    assert small().folder().name == "seed=0"
    assert small(precision="autocast").folder().name == "seed=0+autocast"
    assert small(precision="bf16").folder().name == "seed=0+bf16"
    for file in sorted((paths.PARAMETERS / "finetune").glob("*.yaml")):
        assert config_from(yaml.safe_load(file.read_text())).step.precision == "fp32", file.name
    # on CUDA only the fast options run under bf16 autocast: what the context factories ask of torch.autocast
    monkeypatch.setattr(torch, "autocast", lambda device, **options: (device, options))
    cuda = torch.device("cuda")
    assert speed.step.autocast_for(cuda, precision="fp32")() == ("cuda", {"enabled": False})
    for precision in ("autocast", "bf16"):
        assert speed.step.autocast_for(cuda, precision=precision)() == ("cuda", {"dtype": torch.bfloat16})
    with pytest.raises(ValueError, match="valid choices: fp32, tf32, autocast, bf16"):
        small(precision="fp16")


def test_every_step_and_benchmark_defaults_to_the_protocols_fp32(monkeypatch):
    # one precision default: what a context factory, a step option or a benchmark is given when nothing is said
    monkeypatch.setattr(torch, "autocast", lambda device, **options: (device, options))
    cuda = torch.device("cuda")
    assert speed.step.autocast_for(cuda)() == ("cuda", {"enabled": False})
    assert inspect.signature(speed.step.step_context).parameters["precision"].default == "fp32"
    for function in (step_bench.bench_finetune, step_bench.bench_profile):
        assert inspect.signature(function).parameters["settings"].default.options.precision == "fp32"
    assert step_bench.variant_options((8,), {}, torch.device("cpu"))[0][1].precision == "fp32"
    parser = bench.make_parser()
    for command in ("finetune", "profile", "variants"):
        assert parser.parse_args([command]).precision == "fp32", command
    assert parser.parse_args(["presets"]).precisions.split(",")[0] == "fp32"


def _flags_seen(model) -> list[tuple[str, bool, bool]]:
    """Hooks on ``model`` that record (pass, matmul TF32, cuDNN TF32) in each forward and backward of its head."""
    seen = []

    def flags(name):
        return name, torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32

    model.head.register_forward_hook(lambda *_: seen.append(flags("forward")))
    model.head.register_full_backward_hook(lambda *_: seen.append(flags("backward")))
    return seen


def test_an_fp32_run_computes_its_matrix_products_without_tf32_whatever_the_callers_flags(results, small, monkeypatch):
    # the paper's fp32 is PyTorch's defaults, as the authors' code ran: matmul TF32 off, cuDNN TF32 on
    seen = []
    create = models.create_model

    def create_and_watch(*args, **kwargs):
        model = create(*args, **kwargs)
        seen.append(_flags_seen(model))
        return model

    monkeypatch.setattr(models, "create_model", create_and_watch)
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    before = matmul.allow_tf32, cudnn.allow_tf32
    matmul.allow_tf32, cudnn.allow_tf32 = True, False  # a caller that turned TF32 on globally, and cuDNN's off
    try:
        finetune.run(small(steps=4, eval_every=2, warmup=1))
        after = matmul.allow_tf32, cudnn.allow_tf32
    finally:
        matmul.allow_tf32, cudnn.allow_tf32 = before
    recorded = [flags for model in seen for flags in model]
    assert {name for name, _, _ in recorded} == {"forward", "backward"} and len(recorded) > 8  # steps, evaluations
    assert all(matmul is False and cudnn is True for _, matmul, cudnn in recorded)
    assert after == (True, False)  # the caller's flags come back after the run: no global flag left behind


def test_tf32_is_its_own_precision_on_cuda_and_a_one_line_error_elsewhere(small):
    assert small(precision="tf32", device="cuda").folder().name == "seed=0+tf32"
    with pytest.raises(ValueError) as error:
        small(precision="tf32")
    message = str(error.value)
    assert "\n" not in message and "valid precisions on cpu: fp32, autocast, bf16" in message
    # the flags are set inside the context only, and restored after (also when the step fails)
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    with speed.step.tf32_flags("tf32"):
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    with pytest.raises(RuntimeError), speed.step.tf32_flags("tf32"):
        raise RuntimeError("a failed step")
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == before


def test_no_speed_preset_is_offered_in_a_precision_it_was_not_measured_faster_in():
    files = sorted((paths.PARAMETERS / "speed").glob("*.yaml"))
    assert files
    for file in files:
        chosen = step_options.preset(file.stem)
        assert chosen.get("measured_on") and chosen.get("gain"), f"{file.name} says where and what it measured"
        for precision in step_options.PRECISIONS:
            asked = {"speed": file.stem, "precision": precision, "device": "cuda"}
            if chosen["gain"].get(precision, 0) > 1:
                config = config_from(asked)
                assert (config.step.compile, config.step.fused) == (chosen["compile"], chosen["fused"]), file.name
            else:
                with pytest.raises(ValueError, match=f"not offered for precision '{precision}'"):
                    config_from(asked)
    # the reason and the precisions it is offered for, in one line (h100's gains as its file records them)
    gains = step_options.preset("h100")["gain"]
    refused = [precision for precision in step_options.PRECISIONS if gains.get(precision, 0) <= 1]
    offered = [precision for precision in step_options.PRECISIONS if gains.get(precision, 0) > 1]
    assert refused and len(offered) >= 2, "h100 is offered in some precisions and refused in others"
    with pytest.raises(ValueError) as error:
        config_from({"speed": "h100", "precision": refused[0], "device": "cuda"})
    message = str(error.value)
    assert "\n" not in message and f"measured no faster than 'none' there ({gains[refused[0]]:.2f}x)" in message
    assert all(f"{precision} ({gains[precision]:.2f}x)" in message for precision in offered)
    # a sweep spec's precision and step options, flat beside its preset, are checked alike
    spec = {
        "notebook": "notebooks/05_finetune.ipynb",
        "parameters": {"speed": "h100", "device": "cuda"},
        "grid": {"precision": [offered[0], refused[0]]},
    }
    with pytest.raises(ValueError, match=f"not offered for precision '{refused[0]}'"):
        configs(spec)
    spec["grid"]["precision"] = offered[:2]
    assert [config.step.compile for config in configs(spec)] == ["blocks", "blocks"]
    # presets without recorded gains (auto, none, a mapping of options) are offered in every precision
    assert config_from({"speed": "none", "precision": "autocast"}).step.fused == "none"


def test_warmup_steps_cover_compilation():
    assert speed.step.warmup_steps(step_options.StepOptions()) == 1
    assert speed.step.warmup_steps(step_options.StepOptions(compile="blocks")) == 3
    assert speed.step.warmup_steps(step_options.StepOptions(compile=True)) == 3


def test_the_protocol_the_plan_and_the_benchmarks_build_their_step_with_the_runs_builder(monkeypatch, small, tiny_vit):
    # one builder of a run's step (train.step.build_step: the model adapted, its optimizer, then Step), which finetune
    # trains with and the sweep's cost estimate and the benchmarks time; make_step is called by it alone
    made = []
    original = train_step.make_step

    def spy(model, options, *, optimizer, **settings):
        trained = {name.split(".")[-2] for name, p in model.named_parameters() if p.requires_grad}
        made.append((optimizer.optimizer, optimizer.lr, optimizer.momentum, trained))
        return original(model, options, optimizer=optimizer, **settings)

    monkeypatch.setattr(train_step, "make_step", spy)
    monkeypatch.setattr(train_step, "is_paper_step", lambda *args: False)  # the speed step's builder, for each
    finetune.run(small(component="ln2", steps=2, warmup=1, eval_every=2))
    config = step_bench.StepSettings("demo", 8).config("ln2", torch.device("cpu"))
    loader = DeviceLoader(random_images(8, 32), 8, Transform(True, 32))
    loss, norm = step_bench.library_steps(config, tiny_vit(num_classes=10), loader)(0, 1)
    plan.time_step(Config(component="ln2", optimizer="adamw", lr=0.2, batch_size=8), timing_steps=1)
    adapted = {"norm2", "head", "norm"}  # LN2 in every block, the head, the final norm: adapted by the builder
    assert made == [("sgd", 0.05, 0.9, adapted), ("sgd", 1e-3, 0.9, adapted), ("adamw", 0.2, 0.9, adapted)]
    assert math.isfinite(float(loss))


def test_make_step_trains_the_parameters_the_caller_left_trainable_with_the_runs_optimizer(tiny_model):
    model = components.set_trainable(tiny_model, "mha")
    options = device_options.checked(step_options.StepOptions(), "cpu")
    sgd = step_module.OptimizerSettings("sgd", lr=0.1, momentum=0.9)
    step = step_module.make_step(model, options, optimizer=sgd, batch_size=8, clip=1.0)
    trainable = [p for _, p in components.trainable_parameters(model)]
    assert [id(p) for p in step.trainable] == [id(p) for p in trainable]
    group = step.optimizer.param_groups[0]
    assert isinstance(step.optimizer, torch.optim.SGD) and (group["momentum"], group["weight_decay"]) == (0.9, 0.0)
    assert not step.optimizer.defaults["fused"] and step.micro == 8 and not step.fixed  # fused on CUDA only
    adamw_settings = step_module.OptimizerSettings("adamw", lr=1e-3, momentum=0.9, weight_decay=0.1)
    adamw = step_module.make_step(model, options, optimizer=adamw_settings, batch_size=8, clip=1.0)
    assert isinstance(adamw.optimizer, torch.optim.AdamW) and len(adamw.optimizer.param_groups) == 2
    with pytest.raises(ValueError, match="valid optimizers: sgd, adamw"):  # the settings say so when they are made
        step_module.OptimizerSettings("adam", lr=0.1, momentum=0.9)


def test_adamw_decays_weight_matrices_only_and_steps_as_torch_does():
    model = components.set_trainable(models.create_model("demo", num_classes=5), "full")
    groups = speed.step.decay_groups(model, 0.1)
    names = {id(p): n for n, p in model.named_parameters()}
    decayed = {names[id(p)] for g in groups if g["weight_decay"] for p in g["params"]}
    kept = {names[id(p)] for g in groups if not g["weight_decay"] for p in g["params"]}
    assert "blocks.0.attn.qkv.weight" in decayed and "head.weight" in decayed
    assert {"blocks.0.attn.qkv.bias", "blocks.0.norm1.weight", "pos_embed", "cls_token", "norm.weight"} <= kept
    assert decayed.isdisjoint(kept) and decayed | kept == {n for n, p in model.named_parameters() if p.requires_grad}
    optimizer = speed.step.make_optimizer(model, speed.step.OptimizerSettings("adamw", 1e-3, 0.9, weight_decay=0.1))
    assert isinstance(optimizer, torch.optim.AdamW) and optimizer.defaults["betas"] == (0.9, 0.999)
    weight, bias = model.head.weight, model.head.bias
    before_w, before_b = weight.detach().clone(), bias.detach().clone()
    # no gradient: only the decay moves a weight
    weight.grad, bias.grad = (torch.zeros_like(weight), torch.zeros_like(bias))
    optimizer.step()
    assert torch.allclose(weight, before_w * (1 - 1e-3 * 0.1)) and torch.equal(bias, before_b)


def test_gradient_accumulation_matches_one_big_batch(results, tmp_path, monkeypatch, small, move_results):
    whole = run_files.history(small()) if finetune.run(small()) else None
    move_results("micro")
    finetune.run(small(micro_batch=4))
    accumulated = run_files.history(small(micro_batch=4))
    assert accumulated["train_loss"].tolist() == pytest.approx(whole["train_loss"].tolist(), rel=1e-4)


# bf16: the copy that runs is refreshed from the loaded masters
@pytest.mark.parametrize("precision", ["autocast", "bf16"])
def test_a_run_in_another_precision_resumes_as_if_uninterrupted(
    precision, results, tmp_path, monkeypatch, small, move_results, tiny_data
):
    # 8 steps of 4 images on a tiny CIFAR-10, interrupted after the first of two checkpoints (bf16 is emulated on AVX2
    # alone)
    config = small(precision=precision, steps=8, batch_size=4, dataset="cifar10", data_root=tiny_data)
    reference = finetune.run(config)
    move_results("interrupted")
    interrupted(config, 6, monkeypatch)
    assert (config.folder() / "checkpoint.pt").is_file() and not (config.folder() / "metrics.json").exists()
    assert same_metrics(resumed(config, monkeypatch)) == same_metrics(reference)


@pytest.mark.parametrize("how", ["model", "blocks"])
def test_a_compiled_lora_model_trains_like_the_eager_one(how, monkeypatch):
    # real dynamo and AOTAutograd (the "aot_eager" backend: no compiler needed) through peft's layers:
    # the same loss, and gradients for exactly the LoRA updates, the head and the final norm
    original = torch.compile
    monkeypatch.setattr(torch, "compile", lambda model, **kwargs: original(model, backend="aot_eager"))
    generator = torch.Generator().manual_seed(1)
    x, labels = torch.randn(8, 3, 32, 32, generator=generator), torch.randint(0, 5, (8,), generator=generator)
    grads = []
    for compiled in (False, True):
        torch.manual_seed(0)
        model = lora.add_lora(models.create_model("demo", num_classes=5).eval(), "full", 2)
        components.set_trainable(model, "full", lora.updates(model))
        with torch.no_grad():
            for layer in lora.adapted_layers(model):
                layer.lora_B.default.weight.normal_(generator=torch.Generator().manual_seed(3))
        forward = speed.step.compile_model(model, how) if compiled else model
        torch.nn.functional.cross_entropy(forward(x), labels).backward()
        grads.append({n: p.grad for n, p in model.named_parameters() if p.grad is not None})
        assert set(grads[-1]) == {n for n, p in model.named_parameters() if p.requires_grad}
    for name, grad in grads[0].items():
        assert torch.allclose(grads[1][name], grad, atol=1e-5, rtol=1e-4), name
