"""The step benchmarks and the benchmark command: each figure compared with its target, results kept
on disk, every row of a variant checked against the first, ``--help`` that says what each option is."""

import json
import math
import re
from dataclasses import asdict, replace

import pytest
import torch

from benchmarks import __main__ as bench
from benchmarks import gpu
from benchmarks import step as step_bench
from benchmarks.step import StepSettings, Timing
from paperlib.records.methods import Lora, Subset
from paperlib.records.names import RUN_COMPONENTS
from paperlib.records.step_options import ATTENTION_CHOICES, COMPILE_CHOICES, FUSED_CHOICES, PRECISIONS, StepOptions
from paperlib.speed import step
from paperlib.speed.options import checked
from paperlib.train import step as train_step
from paperlib.train.config import Config


@pytest.fixture
def fake_benchmarks(monkeypatch):
    """Stand-ins for the three benchmarks with chosen figures (the checks, not the timings, are tested)."""
    figures = {"data_speedup": 3.0, "plasticity_speedup": 2.5, "ln1_images": 900.0}

    def data(*args, **kwargs):
        return {
            "dataloader_images_per_s": 100.0,
            "device_path_images_per_s": 100.0 * figures["data_speedup"],
            "speedup": figures["data_speedup"],
        }

    def plasticity(name, pairs, batch, device, repeats=3):
        return {
            "plain_pairs_per_s": 10.0,
            "measure_pairs_per_s": 10.0 * figures["plasticity_speedup"],
            "speedup": figures["plasticity_speedup"],
            "seconds_for_12800_pairs": 12800 / (10.0 * figures["plasticity_speedup"]),
        }

    def finetune(settings, components, timing=Timing(), plain=True, **kwargs):
        out = {}
        for component in components:
            library = figures["ln1_images"] if component == "ln1" else (500.0 if component == "full" else 800.0)
            out.update(
                {
                    f"{component}_library_images_per_s": library,
                    f"{component}_plain_images_per_s": 400.0,
                    f"{component}_speedup": library / 400.0,
                }
            )
        return out

    monkeypatch.setattr(bench, "bench_data", data)
    monkeypatch.setattr(bench, "bench_plasticity", plasticity)
    monkeypatch.setattr(bench, "bench_finetune", finetune)
    return figures


def _met(checks, words):
    return [row["met"] for row in checks if words in row["target"]]


def test_cpu_targets_pass_and_fail_with_the_figures(fake_benchmarks, tmp_path):
    checks = bench.bench_targets("cpu", tmp_path)
    assert _met(checks, "device path >= 1x") == [True]
    assert _met(checks, "measure >= 2x") == [True, True]
    assert _met(checks, "frozen components faster") == [True]
    assert len(_met(checks, "library step vs plain fp32")) == len(RUN_COMPONENTS)
    assert json.loads((tmp_path / "targets.json").read_text()) == checks
    assert {p.name for p in tmp_path.iterdir()} == {"targets.json", "data.json", "plasticity.json", "finetune.json"}

    fake_benchmarks.update(data_speedup=0.9, plasticity_speedup=1.5, ln1_images=450.0)
    checks = bench.bench_targets("cpu", None)
    assert _met(checks, "device path >= 1x") == [False]
    assert _met(checks, "measure >= 2x") == [False, False]
    frozen = next(row for row in checks if "frozen" in row["target"])
    assert frozen["met"] is False and "ln1" in frozen["measured"]


def test_parts_are_chosen_and_checked(fake_benchmarks, capsys):
    checks = bench.bench_targets("cpu", None, ("plasticity",))
    assert len(checks) == 2 and all("measure >= 2x the plain definition" in row["target"] for row in checks)
    assert all(set(row) == {"target", "measured", "met"} for row in checks)
    with pytest.raises(SystemExit) as exit:
        bench.main(["targets", "--parts", "data,speed"])
    assert exit.value.code == 2 and "valid parts: data, plasticity, finetune, compiled" in capsys.readouterr().err


def test_utilisation_is_checked_against_the_peak_when_known(fake_benchmarks, monkeypatch):
    calls = []

    def fake_finetune(settings, components, timing=Timing(), plain=True, **kwargs):
        options, batch = settings.options, settings.batch_size
        calls.append((options.compile, batch, options.precision, options.fused))
        mfu = 0.41 if options.precision == "bf16" else {"model": 0.45, "blocks": 0.38}.get(options.compile, 0.3)
        # what the real result records: the options as they resolved on its device
        return {
            "batch_size": batch,
            **asdict(checked(options, "cpu")),
            "full_library_mfu": mfu,
            "full_library_tflops": 1,
        }

    monkeypatch.setattr(bench, "bench_finetune", fake_finetune)
    checks = bench.bench_targets("cpu", None, ("compiled",))
    assert calls == [
        ("model", 64, "autocast", "auto"),
        ("blocks", 64, "autocast", "auto"),
        ("blocks", 128, "bf16", "none"),
        ("blocks", 128, "bf16", "all"),
    ]
    assert [row["met"] for row in checks] == [True, False, True, True]
    assert "45.0%" in checks[0]["measured"] and "38.0%" in checks[1]["measured"]
    assert "(compiled (model), bf16 autocast, batch 64)" in checks[0]["target"]
    assert "(compiled (blocks), bf16 autocast, batch 64)" in checks[1]["target"]
    assert "(compiled (blocks, coordinate-descent), bf16 with fp32 masters, batch 128)" in checks[2]["target"]
    assert "bf16 with fp32 masters, fused gelu+qkv, batch 128" in checks[3]["target"]
    monkeypatch.setattr(bench, "bench_finetune", lambda *a, **k: {"batch_size": 64, "full_library_tflops": 0.07})
    checks = bench.bench_targets("cpu", None, ("compiled",))
    assert checks[0]["met"] is None and "no known peak" in checks[0]["measured"]


@pytest.mark.parametrize(
    "name, group",
    [
        # kernel names from a profile of a ViT-Base/16 training step on an H100 (cuBLAS, cuDNN, Triton, ATen)
        ("nvjet_sm90_tst_192x192_64x4_1x2_h_bz_coopB_bias_TNN", "matrix products"),
        (
            "void cutlass__5x_cudnn::Kernel<cutlass_tensorop_bf16_s16816fprop_optimized_bf16_128x128_32",
            "matrix products",
        ),
        ("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26_64x64x64_1x4x1_cga1x1x", "attention"),
        ("triton_poi_fused_gelu_gelu_backward_view_10", "other"),
        ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float, false>(", "other"),
        # ATen ops, as a CPU profile names them
        ("aten::addmm", "matrix products"),
        ("aten::mm", "matrix products"),
        ("aten::_scaled_dot_product_flash_attention_for_cpu_backward", "attention"),
        ("aten::gelu_backward", "other"),
    ],
)
def test_profile_groups_kernels_and_ops(name, group):
    assert step_bench.profile_group(name) == group


def test_profile_of_a_training_step_on_the_cpu():
    result = step_bench.bench_profile(StepSettings("demo", 8), "ln1", Timing(steps=1, device="cpu"), top=5)
    shares = result["shares"]
    assert set(shares) == set(step_bench.PROFILE_GROUPS) and sum(shares.values()) == pytest.approx(1.0, abs=1e-3)
    # the demo ViT's step multiplies matrices and runs attention (backward too: LN1 is trainable)
    assert shares["matrix products"] > 0.05 and shares["attention"] > 0.0
    assert result["wall_ms_per_step"] > 0 and result["time_ms_per_step"] > 0
    largest = [row["share"] for row in result["largest"]]
    assert len(largest) == 5 and largest == sorted(largest, reverse=True) and result["time_ms_per_step"] > 0


def test_profile_rejects_an_unknown_component(capsys):
    with pytest.raises(SystemExit) as exit:
        bench.main(["profile", "--component", "attention", "--device", "cpu"])
    assert (
        exit.value.code == 2
        and "valid configurations: mha, fc1, fc2, ln2, ln1, full, linear" in capsys.readouterr().err
    )


@pytest.fixture
def aot_eager(monkeypatch):
    """torch.compile through dynamo and AOTAutograd without a compiler (CI machines have none)."""
    import torch

    original = torch.compile
    monkeypatch.setattr(torch, "compile", lambda model, **kwargs: original(model, backend="aot_eager"))


def test_variants_measure_every_combination_and_check_the_first_step(aot_eager, tmp_path, capsys):
    out = tmp_path / "variants.json"
    bench.main(
        [
            "variants",
            "--component",
            "ln1",
            "--batch-sizes",
            "8",
            "--compile",
            "none,blocks",
            "--attention",
            "auto,math",
            "--steps",
            "1",
            "--repeats",
            "1",
            "--device",
            "cpu",
            "--json",
            str(out),
        ]
    )
    rows = json.loads(out.read_text())
    assert [(r["compile"], r["attention"]) for r in rows] == [
        ("none", "auto"),
        ("none", "math"),
        ("blocks", "auto"),
        ("blocks", "math"),
    ]
    assert all("error" not in r and r["images_per_s"] > 0 and r["tflops"] > 0 and r["warmup_seconds"] > 0 for r in rows)
    # same weights, same first batch: the same first step in every row (to float rounding)
    assert [r.get("agrees") for r in rows] == [None, True, True, True]
    assert max(r["first_grad_norm"] for r in rows) == pytest.approx(min(r["first_grad_norm"] for r in rows), rel=1e-4)
    printed = capsys.readouterr().out
    assert "compiled (blocks), attention math" in printed and "eager" in printed


def test_variants_go_on_where_they_stopped_and_record_failures(tmp_path, monkeypatch):
    out = tmp_path / "variants.json"
    done = {
        "batch_size": 4,
        "compile": "none",
        "compile_mode": "default",
        "attention": "auto",
        "first_loss": 2.3,
        "first_grad_norm": 1000.0,
        "images_per_s": 1.0,
    }
    out.write_text(json.dumps([done]))
    measured = []
    original = step_bench.library_steps

    def library_steps(config, model, loader):
        measured.append(config.step.attention)
        if config.step.attention == "flash":
            raise RuntimeError("no kernel for this shape\nsecond line")
        return original(config, model, loader)

    monkeypatch.setattr(step_bench, "library_steps", library_steps)
    choices = {"compile": ("none",), "attention": ("auto", "flash", "math"), "precision": ("autocast",)}
    rows = step_bench.bench_variants("demo", "linear", (4,), choices, Timing(1, 1, "cpu"), out=out)
    # the finished row (written before rows had a precision: they ran under autocast) is kept, not measured again
    assert measured == ["flash", "math"]
    assert rows[0] == done and rows[1]["error"] == "RuntimeError: no kernel for this shape"
    assert rows[2]["agrees"] is False  # its first step differs from the (made-up) kept row's
    assert json.loads(out.read_text()) == rows


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["--compile", "everything"], "valid choices: none, model, blocks"),
        (["--compile", "model", "--modes", "fastest"], "valid modes: default"),
        (["--attention", "cudnn"], "valid choices: auto, flash, math"),
        (["--batch-sizes", "64,big"], "--batch-sizes must be comma-separated integers"),
        (["--component", "attention"], "valid configurations"),
        (["--fused", "none,gelu,all,fast"], "valid choices: auto, none, all, gelu, qkv"),
        (["--fused", "update"], "valid choices: auto, none, all, gelu, qkv"),  # removed unmeasured
    ],
)
def test_variants_reject_bad_choices_before_any_work(arguments, message, capsys, tmp_path):
    with pytest.raises(SystemExit) as exit:
        bench.main(["variants", "--device", "cpu", "--json", str(tmp_path / "v.json"), *arguments])
    assert exit.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "v.json").exists()


def test_the_plain_loop_runs_a_twin_the_library_step_does_not_change(aot_eager, monkeypatch):
    import copy
    from types import SimpleNamespace

    import torch

    from paperlib.vit import models

    twins = []
    monkeypatch.setattr(
        step_bench, "copy", SimpleNamespace(deepcopy=lambda thing: twins.append(copy.deepcopy(thing)) or twins[-1])
    )
    before = {}
    original_create = models.create_model

    def create(*args, **kwargs):
        model = original_create(*args, **kwargs)
        before.update({n: p.detach().clone() for n, p in model.named_parameters()})
        return model

    monkeypatch.setattr(models, "create_model", create)
    settings = StepSettings("demo", 4, StepOptions(compile="blocks"))
    result = step_bench.bench_finetune(settings, ("ln1",), Timing(1, 1, "cpu"), workers=0)
    assert result["ln1_plain_images_per_s"] > 0 and result["ln1_library_images_per_s"] > 0
    twin = twins[0]
    # the library's model was compiled in place
    assert not any(getattr(block, "_compiled_call_impl", None) for block in twin.blocks)
    assert isinstance(twin.patch_embed.proj, torch.nn.Conv2d)
    changed = {n for n, p in twin.named_parameters() if not torch.equal(p.detach(), before[n])}
    # the plain loop trained it
    assert changed and all(".norm1." in n or n.startswith(("head.", "norm.")) for n in changed)


def test_bf16_precision_variant_follows_the_protocols_first_step(tmp_path):
    choices = {"compile": ("none",), "precision": ("autocast", "bf16")}
    rows = step_bench.bench_variants("demo", "full", (8,), choices, Timing(1, 1, "cpu"))
    assert [r["precision"] for r in rows] == ["autocast", "bf16"] and all("error" not in r for r in rows)
    assert rows[1]["agrees"] is True  # bf16 rounding, the same first step
    assert "bf16 with fp32 masters" in step_bench.variant_words(rows[1])


def test_fused_variants_follow_the_plain_first_step(tmp_path, capsys):
    bench.main(
        [
            "variants",
            "--component",
            "full",
            "--batch-sizes",
            "8",
            "--compile",
            "none",
            "--fused",
            "none,gelu,qkv,all",
            "--steps",
            "1",
            "--repeats",
            "1",
            "--device",
            "cpu",
            "--json",
            str(tmp_path / "v.json"),
        ]
    )
    rows = json.loads((tmp_path / "v.json").read_text())
    # all: every op, written as its parts
    assert [r["fused"] for r in rows] == ["none", "gelu", "qkv", "gelu+qkv"] and all("error" not in r for r in rows)
    for row in rows[1:]:
        assert row["agrees"] is True and row["first_grad_norm"] == pytest.approx(rows[0]["first_grad_norm"], rel=1e-5)
    assert "fused gelu" in capsys.readouterr().out


def test_fused_auto_rows_record_what_ran(tmp_path):
    choices = {"compile": ("none",), "fused": ("auto", "none")}
    rows = step_bench.bench_variants("demo", "full", (8,), choices, Timing(1, 1, "cpu"))
    assert [r["fused"] for r in rows] == ["none"]  # auto on a CPU is none: one row, not two


def test_kernel_benchmark_times_each_op_against_a_copy(capsys, tmp_path):
    result = step_bench.bench_kernels("demo", batch_size=2, device="cpu", min_run_time=0.01)
    # the demo ViT: 64 patches + class token
    assert result["rows"] == 2 * 65 and result["hidden"] == 256 and result["heads"] == 4
    assert result["ops"] == "PyTorch reference"
    names = (
        "copy (the memory-bound limit)",
        "bias_gelu forward",
        "bias_gelu backward (+ bias gradient)",
        "qkv_heads_backward (+ bias gradient)",
    )
    assert all(result[f"{name}: ms"] > 0 and result[f"{name}: GB/s"] > 0 for name in names)
    with pytest.raises(SystemExit):
        bench.main(["kernels", "--model", "demo", "--batch-size", "0", "--device", "cpu"])
    assert "batch_size must be a positive integer" in capsys.readouterr().err
    with pytest.raises(ValueError, match="has not the layers they compute"):  # a SwiGLU ViT with RMSNorm (AIMv2)
        step_bench.bench_kernels("aimv2_large_patch14_224", batch_size=1, device="cpu", min_run_time=0.01)


def test_a_row_without_fused_ops_gets_none_where_auto_means_all(monkeypatch):
    # on CUDA "auto" means "all"; counting a row's FLOPs must not put the ops into its model
    fused_into = []
    monkeypatch.setattr(step, "MODEL_FUSIONS", {"gelu": fused_into.append, "qkv": fused_into.append})
    resolve = step.resolve_fused
    monkeypatch.setattr(
        step, "resolve_fused", lambda fused, device: "all" if fused == "auto" else resolve(fused, device)
    )
    choices = {"compile": ("none",), "fused": ("none", "all")}
    rows = step_bench.bench_variants("demo", "full", (4,), choices, Timing(1, 1, "cpu"))
    # the "all" row's model only, once per op
    assert [row["fused"] for row in rows] == ["none", "gelu+qkv"] and len(fused_into) == 2


def test_step_flops_counted_on_one_image_are_the_whole_batchs(tiny_vit):
    from torch.utils.flop_counter import FlopCounterMode

    from paperlib.vit import components

    torch.manual_seed(0)
    model = components.set_trainable(tiny_vit(num_classes=10), "mha")
    images, labels = torch.randn(6, 3, 32, 32), torch.randint(0, 10, (6,))
    counter = FlopCounterMode(display=False)
    with counter:
        torch.nn.functional.cross_entropy(model(images), labels).backward()
    model.zero_grad(set_to_none=True)
    assert step_bench.step_flops(model, images, labels) == counter.get_total_flops() > 0


def test_a_row_says_how_its_step_ran():
    row = {"compile": "blocks", "compile_mode": "coordinate-descent", "precision": "bf16", "fused": "gelu+qkv"}
    assert (
        step_bench.variant_words(row) == "compiled (blocks, coordinate-descent), bf16 with fp32 masters, fused gelu+qkv"
    )
    assert step_bench.variant_words({"compile": "none", "precision": "fp32", "fused": "none"}) == "eager, fp32"
    # rows written before rows recorded their precision ran under autocast
    assert step_bench.variant_words({"compile": "model"}) == "compiled (model), bf16 autocast"


def test_a_variant_whose_updates_differ_is_flagged_even_when_its_first_step_agrees(tmp_path, monkeypatch):
    # the first step's loss and norm come before any update: a broken update (or a graph replaying
    # stale learning rates) shows only in the later step that every row also records
    made = []
    original = train_step.make_step

    def make_step(model, options, optimizer, **settings):
        made.append(optimizer.lr)
        faster = replace(optimizer, lr=optimizer.lr * (1 if len(made) == 1 else 300))
        return original(model, options, optimizer=faster, **settings)

    monkeypatch.setattr(train_step, "make_step", make_step)  # what the run's builder, and so every benchmark, calls
    choices = {"compile": ("none",), "attention": ("auto", "math")}
    rows = step_bench.bench_variants("demo", "full", (8,), choices, Timing(1, 1, "cpu"))
    assert len(made) == 2 and all("error" not in r for r in rows)
    assert rows[1]["first_grad_norm"] == pytest.approx(rows[0]["first_grad_norm"], rel=1e-5)  # the same first step
    assert rows[1]["check_loss"] != pytest.approx(rows[0]["check_loss"], rel=0.05) and rows[1]["agrees"] is False


def test_finetune_benchmark_trains_lora_updates_in_both_loops(monkeypatch):
    from paperlib.vit import lora

    seen = []
    original = lora.updates
    monkeypatch.setattr(lora, "updates", lambda model: seen.append(model) or original(model))
    result = step_bench.bench_finetune(
        StepSettings("demo", 4, method=Lora(rank=2)), ("mha", "fc2"), Timing(1, 1, "cpu"), workers=0
    )
    assert result["lora_rank"] == 2 and result["fc2_library_images_per_s"] > 0 and result["mha_plain_images_per_s"] > 0
    models_seen = list({id(model): model for model in seen}.values())
    assert len(models_seen) == 4  # a fresh LoRA model per component and loop
    for model in models_seen:
        layers = lora.adapted_layers(model)
        assert layers and any(layer.lora_B.default.weight.abs().sum() > 0 for layer in layers)  # its updates trained
    with pytest.raises(ValueError, match="method 'lora' trains mha, fc1, fc2, full, not 'ln1'"):
        step_bench.bench_finetune(
            StepSettings("demo", 4, method=Lora(rank=2)), ("ln1",), Timing(1, 1, "cpu"), workers=0
        )


def test_finetune_benchmark_times_an_equal_capacity_runs_step_which_trains_its_subset_alone(monkeypatch):
    from paperlib.vit import components, equal_capacity, models

    built, plain = [], []  # (config, model) of each library step, and each plain loop's model
    original_build, original_adapt = step_bench.build_step, step_bench.adapt
    monkeypatch.setattr(step_bench, "build_step", lambda c, m: built.append((c, m)) or original_build(c, m))
    monkeypatch.setattr(step_bench, "adapt", lambda m, c: plain.append(m) or original_adapt(m, c))
    settings = StepSettings("demo", 4, method=Subset())
    result = step_bench.bench_finetune(settings, ("mha", "fc1"), Timing(1, 1, "cpu"), workers=0)
    assert result["method"] == "subset" and result["fc1_library_images_per_s"] > 0
    assert [(config.component, config.method.name) for config, _ in built] == [("mha", "subset"), ("fc1", "subset")]
    fresh = models.create_model("demo", pretrained=False, num_classes=10)
    k = equal_capacity.per_block(fresh)
    head_and_norm = components.count_parameters(components.head_modules(fresh) + components.final_norm_modules(fresh))
    for (config, timed), twin in zip(built, plain):
        # the step timed trains what a run of the same configuration trains: its subset (k per block), head, final norm
        a_run = Config(component=config.component, method="subset")
        run = train_step.adapt(models.create_model("demo", pretrained=False, num_classes=10), a_run)
        trainable = sum(p.numel() for p in run.parameters() if p.requires_grad)
        assert result[f"{config.component}_trainable_parameters"] == trainable == k * len(fresh.blocks) + head_and_norm
        for model in (timed, twin):  # the library step's model and the plain loop's: the run's subset, trained
            assert equal_capacity.digest(model) == equal_capacity.digest(run)
            assert sum(p.numel() for p in model.parameters() if p.requires_grad) == trainable
            assert any(update.delta.abs().sum() > 0 for update in equal_capacity.subset_updates(model))
    whole = step_bench.bench_finetune(StepSettings("demo", 4), ("mha",), Timing(1, 1, "cpu"), plain=False)
    assert whole["mha_trainable_parameters"] > 10 * result["mha_trainable_parameters"]  # a component's own weights


def test_presets_are_measured_against_none_in_each_precision_with_a_plain_loop_beside(tmp_path):
    faster = tmp_path / "faster.yaml"
    faster.write_text("gain: {fp32: 1.5}\nfused: none\n")
    rows = step_bench.bench_presets(
        "demo", ("ln2",), 8, Timing(2, 1, "cpu"), presets=(str(faster),), precisions=("fp32", "autocast")
    )
    assert [(r["precision"], r["preset"]) for r in rows] == [
        ("fp32", "none"),
        ("fp32", str(faster)),
        ("autocast", "none"),
        ("autocast", str(faster)),
    ]
    assert all(r["images_per_s"] > 0 and math.isfinite(r["gain"]) for r in rows)
    for row in rows:  # the gain is against none in the same precision
        none = next(r for r in rows if r["precision"] == row["precision"] and r["preset"] == "none")
        assert row["gain"] == pytest.approx(row["images_per_s"] / none["images_per_s"], rel=1e-2)
    assert ["plain_images_per_s" in r for r in rows] == [True, False, True, False]
    with pytest.raises(ValueError, match="valid precisions on cpu: fp32, autocast, bf16"):
        step_bench.bench_presets("demo", ("ln2",), 8, Timing(1, 1, "cpu"), precisions=("tf32",))


def test_help_gives_every_option_its_meaning_type_default_and_choices(capsys):
    commands = ("data", "plasticity", "finetune", "profile", "variants", "kernels", "presets", "targets", "gpu")
    with pytest.raises(SystemExit):
        bench.main(["--help"])
    listed = capsys.readouterr().out
    assert all(f"    {name}" in listed for name in commands)
    for name in commands:
        with pytest.raises(SystemExit):
            bench.main([name, "--help"])
        text = capsys.readouterr().out
        options = re.split(r"\n  (?=--)", text.split("options:", 1)[1])[1:]  # one entry per option but --help
        assert options, name
        for option in options:  # the package's one formatter (cli.Help): meaning, then (type; default)
            flag, _, meaning = option.partition("  ")
            described = " ".join(meaning.split())
            facts = described.rpartition(" (")[2]
            if flag.split()[1:] == []:  # a flag without a value says what it does
                assert described.endswith(" (flag)"), (name, flag)
                continue
            assert facts.split(";")[0] in ("int", "str", "path"), (name, flag, facts)  # its type
            assert "; default" in facts, (name, flag, facts)
        if name in ("finetune", "profile"):
            for choices in (PRECISIONS, COMPILE_CHOICES, ATTENTION_CHOICES, FUSED_CHOICES, RUN_COMPONENTS):
                assert all(choice in text for choice in choices), (name, choices)


def test_the_sharing_benchmark_sweeps_the_demo_plasticity_spec_over_four_datasets(tmp_path):
    from benchmarks import sharing
    from paperlib.records import specs

    cells = specs.cells(specs.load_spec(sharing.spec(tmp_path)))
    assert [parameters["dataset"] for _, _, parameters in cells] == sharing.DATASETS
    assert {notebook.name for _, notebook, _ in cells} == {"02_plasticity.ipynb"}


def test_the_grid_benchmark_writes_runs_that_look_like_real_ones(results):
    from benchmarks import grid
    from paperlib.analysis import tables
    from paperlib.records import runs_table

    assert grid.build(results, dataset=["pets"], lr=[0.001, 0.03], seed=[0, 42]) == 7 * 2 * 2
    runs = runs_table.load(results)
    # ViT-Base/16 counted by hand: width 768, MLP 3072, 12 blocks, 197 tokens; a head of Pets' 37 classes
    head, final_norm, blocks = 768 * 37 + 37, 2 * 768, 12
    mha, fc1, fc2, norm = 768 * 3 * 768 + 3 * 768 + 768 * 768 + 768, 768 * 3072 + 3072, 3072 * 768 + 768, 2 * 768
    embedding = 768 * 3 * 16 * 16 + 768 + 768 + 197 * 768
    trained = {c: blocks * n + final_norm + head for c, n in {"mha": mha, "fc1": fc1, "fc2": fc2}.items()}
    trained |= {"ln1": blocks * norm + final_norm + head, "ln2": blocks * norm + final_norm + head, "linear": head}
    trained["full"] = embedding + blocks * (mha + fc1 + fc2 + 2 * norm) + final_norm + head
    assert runs.groupby("component")["trainable_parameters"].unique().map(list).to_dict() == {
        c: [n] for c, n in trained.items()
    }
    # the best step: a validation step of the run's history, its highest accuracy, not always the last
    assert runs["best_step"].nunique() > 3 and (runs["best_step"] % 200 == 0).all()
    histories = runs_table.histories_of(runs)
    for row in runs.itertuples():
        validated = histories[(histories["component"] == row.component) & (histories["lr"] == row.lr)]
        validated = validated[validated["seed"] == row.seed].dropna(subset=["val_accuracy"])
        assert validated.loc[validated["val_accuracy"].idxmax(), "step"] == row.best_step
    # gradient norms in the plasticity order at every learning rate and seed, larger at the larger rate
    early = tables.early_gradient_norm(histories, runs).pivot_table("grad_norm", ["lr", "seed"], "component")
    assert (early["mha"] > early["ln1"]).all() and (early["fc1"] > early["ln2"]).all()
    assert (early.loc[0.03] > early.loc[0.001]).all().all()


def test_the_gpu_check_without_a_gpu_is_a_dry_run_that_lists_what_it_would_measure(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    measured = []
    for name in ("cuda_tests", "presets", "plasticity", "protocol_step"):
        monkeypatch.setattr(gpu, name, lambda *args, name=name: measured.append(name) or [])
    bench.main(["gpu", "--out", str(tmp_path / "out")])  # returns: exit status 0
    out = capsys.readouterr().out
    assert "no GPU: a dry run, nothing measured" in out and "| part | setting | figure |" in out
    rows = [line for line in out.splitlines() if line.startswith("| ") and "dry run: no GPU here" in line]
    assert [row.split(" | ")[0] for row in rows] == ["| tests", "| presets", "| plasticity", "| protocol"]
    assert "batch 512" in rows[1] and "batch 512" in rows[3] and "12,800" in rows[2]
    assert "pytest -rA --tb=long" in rows[0] and all(p in rows[1] for p in PRECISIONS)
    assert not measured and not (tmp_path / "out").exists()
    with pytest.raises(SystemExit) as exit_:
        bench.main(["gpu", "--parts", "tests,speed"])
    assert exit_.value.code == 2 and "valid parts: tests, presets, plasticity, protocol" in capsys.readouterr().err


def test_a_gpu_check_part_that_fails_is_a_row_with_its_error_and_the_others_still_run(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)

    def broken():
        raise RuntimeError("CUDA out of memory")

    monkeypatch.setattr(gpu, "presets", broken)
    monkeypatch.setattr(gpu, "plasticity", lambda: [{"part": "plasticity", "setting": "s", "figure": "1 pairs/s"}])
    rows = gpu.bench_gpu(parts=("presets", "plasticity"))
    assert [row["part"] for row in rows] == ["presets", "plasticity"]
    assert rows[0]["figure"] == "failed: RuntimeError: CUDA out of memory" and rows[1]["figure"] == "1 pairs/s"
