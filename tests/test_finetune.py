"""One finetuning run: what trains, determinism, logged gradient norms, best checkpoint, resume, divergence."""

import json
import math

import pandas as pd
import pytest
import torch
from conftest import interrupted, recorded_difference, resumed, same_metrics

from paperlib.analysis import tables
from paperlib.measure.probe import Probe, linear_probe
from paperlib.records import paths, runs_table, specs, storage
from paperlib.records import runs as run_files
from paperlib.train import checkpoints, evaluation, finetune, pool
from paperlib.train.config import Config, configs
from paperlib.vit import components, models


@pytest.mark.parametrize("component", ["fc2", "ln1", "linear"])
def test_only_the_chosen_parameters_change(component, small):
    model, metrics = finetune.train(small(component=component))
    torch.manual_seed(0)
    initial = models.create_model("demo", num_classes=5)  # the run's initialisation: same seed, same head
    expected = {n for n, _ in components.trainable_parameters(components.set_trainable(initial, component))}
    changed = {n for n, p in model.named_parameters() if not torch.equal(p.detach(), initial.state_dict()[n])}
    assert changed and changed <= expected
    assert "head.weight" in changed
    assert metrics["trainable_parameters"] == components.trained_parameters(initial, component)


def test_same_seed_same_numbers(results, tmp_path, monkeypatch, small, move_results):
    first = finetune.run(small())
    history = run_files.history(small())
    move_results("again")
    second = finetune.run(small())
    pd.testing.assert_frame_equal(history, run_files.history(small()))
    assert {k: v for k, v in first.items() if "second" not in k} == {
        k: v for k, v in second.items() if "second" not in k
    }


@pytest.mark.parametrize("component", ["mha", "lora"])
def test_the_papers_step_and_speeds_train_the_same_run(component, small, move_results, monkeypatch):
    """A run that asks for nothing beyond the paper trains with ``paper_step.PaperStep``; forced through
    ``speed.step.make_step`` (its default options on a CPU) the same run gives the same history, to rounding."""
    from paperlib.speed.step import Step
    from paperlib.train import paper_step, step

    config = small(component="mha", method="lora", lora_rank=2) if component == "lora" else small()
    built, build = [], finetune.build_step
    monkeypatch.setattr(finetune, "build_step", lambda *args: built.append(build(*args)) or built[-1])
    paper = finetune.run(config)
    history = run_files.history(config)
    move_results("speed")
    monkeypatch.setattr(step, "is_paper_step", lambda *args: False)
    fast = finetune.run(config)
    assert [type(made) for made in built] == [paper_step.PaperStep, Step]
    for column in ("train_loss", "grad_norm", "val_loss", "val_accuracy"):
        assert run_files.history(config)[column].to_numpy() == pytest.approx(
            history[column].to_numpy(), rel=1e-6, nan_ok=True
        )
    assert (fast["best_step"], fast["test_accuracy"]) == (paper["best_step"], paper["test_accuracy"])
    assert not paper_step.is_paper_step("sgd", config.checked_options, micro_batch=8)  # a choice beyond the paper


def test_a_file_dataset_decoded_the_first_time_does_not_change_the_numbers(
    results, tmp_path, monkeypatch, small, move_results
):
    # decoding a file dataset the first time runs a DataLoader, which draws from torch's generator;
    # the run's numbers must not depend on whether the decoded cache was there
    first = finetune.run(small())
    history = run_files.history(small())
    original = finetune.uint8_images

    def decoding(dataset, **options):
        torch.rand(3)  # as a first decode's DataLoader does
        return original(dataset, **options)

    monkeypatch.setattr(finetune, "uint8_images", decoding)
    move_results("decoded")
    second = finetune.run(small())
    pd.testing.assert_frame_equal(history, run_files.history(small()))
    assert second["test_accuracy"] == first["test_accuracy"]


def test_a_run_with_other_parameters_in_the_same_folder_is_not_taken_for_it(
    results, tmp_path, monkeypatch, small, move_results
):
    # steps, batch size and warm-up are not in the folder's name: a longer run started there, then
    # interrupted, must not return the shorter run's metrics when started again
    short = finetune.run(small(steps=4))
    interrupted(small(steps=12), 6, monkeypatch)
    # the shorter run's result stays whole and readable until the longer one replaces it, never taken for it
    assert run_files.finished(small(steps=4)) == short and not run_files.is_finished(small(steps=12))
    longer = finetune.run(small(steps=12))
    assert not run_files.is_finished(small(steps=4))
    move_results("uninterrupted")
    assert same_metrics(longer) == same_metrics(finetune.run(small(steps=12))) != same_metrics(short)
    assert longer["best_step"] in (4, 8, 12)


def test_logged_gradient_norm_is_what_clipping_saw(monkeypatch, small):
    seen = []
    original = torch.nn.utils.clip_grad_norm_

    def spy(parameters, max_norm, *args, **kwargs):
        parameters = list(parameters)
        seen.append(float(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in parameters]))))
        return original(parameters, max_norm, *args, **kwargs)

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", spy)
    finetune.run(small(lr=0.01))
    logged = run_files.history(small(lr=0.01))["grad_norm"].tolist()
    assert logged == pytest.approx(seen, rel=1e-5) and len(logged) == 12


def test_best_validation_checkpoint_is_reported(small):
    metrics = finetune.run(small())
    history = run_files.history(small()).dropna(subset=["val_accuracy"])
    best = history.loc[history["val_accuracy"].idxmax()]
    assert metrics["best_step"] == best["step"] and metrics["best_val_accuracy"] == best["val_accuracy"]
    assert list(history["step"]) == [4, 8, 12]
    assert 0.0 <= metrics["test_accuracy"] <= 1.0 and metrics["status"] == "finished"
    from paperlib.data import datasets

    test_images = len(datasets.get_dataset(small().dataset, "test"))  # one image is worth 100 / this points
    correct = metrics["test_accuracy_exact"] * test_images
    assert metrics["test_images"] == test_images and correct == pytest.approx(round(correct), abs=1e-9)
    assert runs_table.load()["test_images"].tolist() == [test_images]


def test_resume_after_interruption_matches_an_uninterrupted_run(results, tmp_path, monkeypatch, small, move_results):
    # in the protocol's fp32; the other precisions: tests/test_speed.py
    config = small()
    reference = finetune.run(config)
    move_results("interrupted")
    interrupted(config, 9, monkeypatch)
    folder = config.folder()
    assert (folder / "checkpoint.pt").is_file() and not (folder / "metrics.json").exists()
    metrics = resumed(config, monkeypatch)
    assert same_metrics(metrics) == same_metrics(reference)
    assert not (folder / "checkpoint.pt").exists()
    # a finished run is not repeated
    assert finetune.run(config) == metrics


def test_divergence_is_recorded_not_raised(small):
    config = small(component="full", lr=1e8, steps=30, eval_every=10)
    metrics = finetune.run(config)
    assert metrics["status"] == "diverged"
    history = run_files.history(config)
    # losses are read back from the device in groups of steps; diverged_step is the first loss that is not
    # finite or above EXPLODED times chance level's (log of the 5 classes); only a loss that is not finite
    # ends the run there (the authors' loop never stops one, and nothing changes after a NaN)
    limit = finetune.EXPLODED * math.log(metrics["num_classes"])
    exploded = history["train_loss"].map(lambda loss: not math.isfinite(loss) or loss > limit)
    assert metrics["diverged_step"] == history.loc[exploded, "step"].iloc[0]
    finite = history["train_loss"].map(math.isfinite)
    assert finite.iloc[:-1].all() and (not finite.iloc[-1] or history["step"].iloc[-1] == 30)
    assert history["step"].tolist() == list(range(1, len(history) + 1))
    assert json.loads((config.folder() / "metrics.json").read_text())["status"] == "diverged"


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"component": "attention"}, "valid configurations: mha, fc1, fc2, ln2, ln1, full, linear"),
        ({"lr": 0.0}, "lr must be a positive number"),
        ({"lr": -1.0}, "lr must be a positive number"),
        ({"steps": 0}, "steps must be a positive integer"),
        ({"dataset": "mnist"}, "valid datasets"),
        ({"model": "resnet50"}, "valid short names"),
        ({"micro_batch": 5}, "must divide batch_size"),
    ],
)
def test_bad_parameters_fail_before_any_work(results, overrides, message, small):
    with pytest.raises(ValueError, match=message):
        finetune.run(small(**overrides))
    assert not results.exists()


def test_lr_schedule():
    # the authors' warm-up: step / warmup, so the first step's rate is 0
    assert finetune.lr_factor(0, 10, 100) == 0.0
    assert finetune.lr_factor(9, 10, 100) == pytest.approx(0.9)
    assert finetune.lr_factor(10, 10, 100) == pytest.approx(1.0)
    assert finetune.lr_factor(99, 10, 100) == pytest.approx(0.5 * (1 + math.cos(math.pi * 89 / 90)))


def test_deterministic_mode_is_restored_after_a_run(small):
    # a CPU run switches PyTorch's deterministic algorithms on while it trains, not for the rest
    # of the process (on CUDA that mode would make cuBLAS calls fail without CUBLAS_WORKSPACE_CONFIG)
    seen = []
    original = finetune._train

    def spy(*args):
        seen.append(torch.are_deterministic_algorithms_enabled())
        return original(*args)

    torch.use_deterministic_algorithms(False)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(finetune, "_train", spy)
        finetune.train(small(steps=4, eval_every=2))
    assert seen == [True] and not torch.are_deterministic_algorithms_enabled()


def test_a_file_dataset_is_decoded_once_in_parallel_then_trained_on(tmp_path, monkeypatch, small):
    # Pets in its official layout: the images are decoded by DataLoader workers into the uint8
    # cache under the data root, and the run trains on the cached images
    from paperlib.data import fixtures

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
    # the official training split (train and val share it) and test, each pixels and sizes
    assert len(list((tmp_path / "data" / "cache").rglob("*.npy"))) == 4


def test_a_run_recorded_before_a_new_field_is_read_as_its_default_and_kept(small):
    metrics = finetune.run(small())
    params_file = small().folder() / "params.json"
    params = json.loads(params_file.read_text())
    assert run_files.is_finished(small()) and recorded_difference(small()) == []
    del params["fused"], params["precision"]  # as a run written before Config had these fields
    storage.write_json(params_file, params)
    # a field is added with the default that does what runs did before it: the run is this one, of an older version
    assert recorded_difference(small()) == [] and run_files.finished(small()) == metrics
    assert run_files.lacks(run_files.read_params(small().folder())) == ["no fused, precision (read as their default)"]
    # not another precision's run, though
    assert recorded_difference(small(precision="bf16")) is None  # another folder: nothing there


def test_adamw_runs_in_its_own_folder_and_trains_only_the_chosen_component(results, small):
    sgd = finetune.run(small(component="ln2"))
    model, adamw = finetune.train(small(component="ln2", optimizer="adamw", lr=1e-3, weight_decay=0.05))
    assert adamw["status"] == "finished" and adamw["optimizer"] == "adamw" and sgd["optimizer"] == "sgd"
    assert small(optimizer="adamw", weight_decay=0.05).folder().name == "seed=0+adamw-wd0.05"
    assert small(optimizer="adamw", precision="bf16").folder().name == "seed=0+bf16+adamw"
    torch.manual_seed(0)
    initial = components.set_trainable(models.create_model("demo", num_classes=5), "ln2")
    changed = {n for n, p in model.named_parameters() if not torch.equal(p.detach(), initial.state_dict()[n])}
    assert changed and changed <= {n for n, _ in components.trainable_parameters(initial)}
    runs = runs_table.load()
    assert sorted(runs["optimizer"]) == ["adamw", "sgd"] and sorted(runs["weight_decay"]) == [0.0, 0.05]


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"optimizer": "adam"}, "valid optimizers: sgd, adamw"),
        ({"weight_decay": 0.05}, "weight_decay is for optimizer='adamw'"),
        ({"optimizer": "adamw", "weight_decay": -1.0}, "weight_decay must be a non-negative number"),
        ({"optimizer": "adamw", "momentum": 0.5}, "momentum is SGD's; adamw has its own"),
        ({"validation": "paper"}, "valid choices: official, fraction"),
    ],
)
def test_bad_optimizer_parameters_fail_before_any_work(results, overrides, message, small):
    with pytest.raises(ValueError, match=message):
        finetune.run(small(**overrides))
    assert not results.exists()


def test_adamw_resumes_after_an_interruption_as_if_uninterrupted(results, tmp_path, monkeypatch, small, move_results):
    config = small(component="fc1", optimizer="adamw", lr=1e-3, weight_decay=0.01)
    reference = finetune.run(config)
    move_results("interrupted")
    interrupted(config, 9, monkeypatch)
    assert (config.folder() / "checkpoint.pt").is_file()
    assert same_metrics(resumed(config, monkeypatch)) == same_metrics(reference)


def test_table6_refuses_runs_of_two_optimizers(results, small):
    finetune.run(small(component="ln2", steps=4, eval_every=2))
    finetune.run(small(component="ln2", steps=4, eval_every=2, optimizer="adamw", lr=1e-3))
    runs = runs_table.load()
    with pytest.raises(ValueError, match="one optimizer, got adamw, sgd"):
        tables.table6(runs)
    assert len(tables.table6(runs[runs["optimizer"] == "sgd"])) == 1


# --------------------------------------------------------------------------------------------
# the finetuned model, kept (save_weights) and rebuilt (load_model)


def _test_accuracy(model) -> tuple[float, float]:
    """Test accuracy of ``model`` on the demo's test split, computed here: the evaluation transform
    (the digits are at the model's resolution), ImageNet's statistics, one batch (179 images, under the authors'
    512): exactly, and as the authors' ``run_evaluation`` computes a batch's (float32)."""
    from paperlib.data import datasets

    images, labels = datasets.get_dataset("digits", "test").tensors()
    with torch.no_grad():
        right = model(images).argmax(dim=1) == labels
    return right.double().mean().item(), right.float().mean().item()


@pytest.mark.parametrize("component", ["mha", "linear"])
def test_kept_weights_rebuild_the_model_of_the_reported_test_accuracy(component, small):
    run = small(component=component, save_weights=True)
    metrics = finetune.run(run)
    assert metrics["weights"] == "weights.safetensors" and (run.folder() / "weights.safetensors").is_file()
    model = checkpoints.load_model(run)
    exact, theirs = _test_accuracy(model)
    assert not model.training and exact == pytest.approx(metrics["test_accuracy_exact"], abs=1e-12)
    assert theirs == metrics["test_accuracy"]
    # only what the run trained differs from the pretrained model; the file holds exactly that
    from safetensors.torch import load_file

    pretrained = models.create_model("demo", num_classes=5).state_dict()
    trained = {
        n
        for n, _ in components.trainable_parameters(
            components.set_trainable(models.create_model("demo", num_classes=5), component)
        )
    }
    assert set(load_file(str(run.folder() / "weights.safetensors"))) == trained
    for name, tensor in model.state_dict().items():
        if name not in trained:
            assert torch.equal(tensor, pretrained[name]), name
    # the best checkpoint's, not the last step's: a run that trains on keeps its best
    history = run_files.history(run).dropna(subset=["val_accuracy"])
    assert metrics["best_step"] == int(history.loc[history["val_accuracy"].idxmax(), "step"])


def test_asking_for_weights_a_finished_run_did_not_keep_trains_it_again_to_the_same_numbers(small):
    plain = finetune.run(small())
    assert plain["weights"] is None and not (small().folder() / "weights.safetensors").exists()
    with pytest.raises(FileNotFoundError, match="save_weights=True"):
        checkpoints.load_model(small())
    kept = finetune.run(small(save_weights=True))
    assert same_metrics({**kept, "weights": None}) == same_metrics(plain)
    assert finetune.run(small()) == kept  # the same run: save_weights is not part of what it is
    assert _test_accuracy(checkpoints.load_model(small()))[1] == kept["test_accuracy"]
    with pytest.raises(ValueError, match="save_weights must be True or False"):
        small(save_weights="yes").validate()
    # rebuilt whatever ran it (device, micro-batches, compilation...), but not from a run of other steps
    assert _test_accuracy(checkpoints.load_model(small(micro_batch=8, fused="none")))[1] == kept["test_accuracy"]
    with pytest.raises(ValueError, match="differs from this configuration in steps"):
        checkpoints.load_model(small(steps=8))
    # a run of other parameters in the folder: its weights go with its record
    finetune.run(small(steps=8))
    assert not (small().folder() / "weights.safetensors").exists()


def test_weights_asked_of_a_run_that_diverged_before_any_checkpoint_do_not_train_it_again(monkeypatch, small):
    diverged = finetune.run(small(lr=1e9, steps=3, warmup=0, eval_every=3))
    # tested as the authors' NaN model at their first validation: no weights to keep
    assert diverged["status"] == "diverged" and diverged["best_step"] == 3 and diverged["nan_model"]
    monkeypatch.setattr(finetune, "train", lambda *args, **kwargs: pytest.fail("trained again"))
    again = finetune.run(small(lr=1e9, steps=3, warmup=0, eval_every=3, save_weights=True))
    assert json.dumps(again, sort_keys=True) == json.dumps(diverged, sort_keys=True)  # NaNs too


def test_a_run_trained_again_for_its_weights_is_partial_until_it_ends(monkeypatch, small):
    finetune.run(small())
    interrupted(small(save_weights=True), 6, monkeypatch)
    # the run without weights stays readable beside the one training again; a partial run is no row of the table
    assert runs_table.load()["status"].tolist() == ["finished"] and not run_files.is_finished(small(save_weights=True))
    assert finetune.run(small(save_weights=True))["weights"] == "weights.safetensors"
    assert runs_table.load()["status"].tolist() == ["finished"]


def test_a_tag_keeps_a_run_of_other_steps_beside_the_protocols(small):
    protocol = finetune.run(small(steps=8))
    longer = small(steps=12, tag="steps12")
    assert longer.folder().name == "seed=0+tag-steps12" and longer.folder().parent == small().folder().parent
    for clash in ("bf16", "adamw", "norm-model", "lora-r8"):  # no tag spells another suffix
        assert small(tag=clash).folder() not in {small(precision="bf16").folder(), small(optimizer="adamw").folder()}
        assert small(tag=clash).folder().name == f"seed=0+tag-{clash}"
    assert small(tag=2000).tag == "2000"  # a sweep spec's number
    assert small(validation="fraction").folder().name == "seed=0+val-fraction"  # the paper's reading of Flowers' val
    finetune.run(longer)
    assert finetune.run(small(steps=8)) == protocol  # still there: not replaced by the longer run
    runs = runs_table.load()
    assert sorted(runs["tag"]) == ["", "steps12"]
    with pytest.raises(ValueError, match="one tag"):
        tables.table6(runs)
    assert len(tables.table6(runs[runs["tag"] == "steps12"])) == 1
    for bad in ("a/b", "-x", "two words", ["x"]):
        with pytest.raises(ValueError, match="tag must be"):
            small(tag=bad).validate()


def test_a_lora_runs_kept_updates_merge_into_a_plain_vit(small):
    run = small(component="mha", method="lora", lora_rank=2, save_weights=True)
    metrics = finetune.run(run)
    unmerged, merged = checkpoints.load_model(run, merge=False), checkpoints.load_model(run)
    assert _test_accuracy(unmerged)[1] == metrics["test_accuracy"]
    assert type(merged.blocks[0].attn.qkv) is torch.nn.Linear
    assert set(merged.state_dict()) == set(models.create_model("demo", num_classes=5).state_dict())
    images = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        assert torch.allclose(merged(images), unmerged(images), atol=1e-5)


def test_the_pool_starts_the_costliest_runs_first(monkeypatch, capsys, results):
    # on a CPU that emulates bf16, the precision demo's autocast runs (7 times an fp32 run) start first, linear
    # probing (no backward through the blocks) last; the order is what the workers are handed
    monkeypatch.setattr(pool, "native_bf16", lambda: False)
    spec = {
        "notebook": "notebooks/05_finetune.ipynb",
        "parameters": {"model": "demo", "steps": 4, "batch_size": 8, "warmup": 1, "eval_every": 2, "device": "cpu"},
        "grid": [
            {"dataset": ["digits"], "component": ["linear", "mha", "ln1"], "lr": [0.03], "seed": [0]},
            {"dataset": ["digits"], "component": ["fc1"], "lr": [0.03], "seed": [0], "precision": ["autocast"]},
            {"dataset": ["digits"], "component": ["fc2"], "lr": [0.03], "seed": [0], "steps": [6]},
        ],
    }
    started = []
    monkeypatch.setattr(pool, "_timed_run", lambda config: started.append(config) or ("finished", 0.0))
    shared = Probe("demo", "digits", points="mha", blocks=-1)
    pool.run_spec(spec, probes=[shared], workers=1)
    assert started.pop() is shared  # a probe after every run
    order = [(c.component, c.step.precision) for c in started]
    assert order == [("fc1", "autocast"), ("fc2", "fp32"), ("mha", "fp32"), ("ln1", "fp32"), ("linear", "fp32")]
    monkeypatch.setattr(pool, "native_bf16", lambda: True)  # where bf16 is native it costs what fp32 does
    assert pool.expected_cost(started[0]) == pool.expected_cost(started[2])
    capsys.readouterr()


def test_run_spec_shares_its_runs_between_worker_processes(capsys, move_results):
    """Two worker processes (one thread each) give the metrics one process gives, one line per run."""
    spec = {
        "notebook": "notebooks/05_finetune.ipynb",
        "parameters": {"model": "demo", "steps": 4, "batch_size": 8, "warmup": 1, "eval_every": 2, "device": "cpu"},
        "grid": {"dataset": ["digits"], "component": ["mha", "ln1"], "lr": [0.03], "seed": [0]},
    }

    def results():
        return {c.component: storage.read_json(c.folder() / run_files.METRICS) for c in configs(spec)}

    pool.run_spec(spec, workers=2)
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2 and all(line.startswith(("[1/2]", "[2/2]")) and " finished in " in line for line in lines)
    together = results()
    pool.run_spec(spec)  # finished: nothing runs, nothing printed
    assert capsys.readouterr().out == ""
    move_results("alone")
    pool.run_spec(spec, workers=1)
    alone = results()
    for component in ("mha", "ln1"):
        assert together[component]["test_accuracy"] == alone[component]["test_accuracy"]
        assert together[component]["best_val_accuracy"] == alone[component]["best_val_accuracy"]


def test_the_demo_runs_are_the_demo_sweeps_notebook_05s_run_and_the_probes_notebooks_04_and_07_both_read(monkeypatch):
    handed = {}
    monkeypatch.setattr(pool, "run_spec", lambda *specs, probes, workers: handed.update(specs=specs, probes=probes))
    pool.demo_runs()
    *sweeps, own = handed["specs"]
    assert [spec["name"] for spec in sweeps] == [
        specs.load_spec(paths.PARAMETERS / "sweeps" / name)["name"] for name in pool.DEMO_SWEEPS
    ]
    # notebook 05's one run at its defaults, 100 steps in an untagged folder: none of the demo sweeps' (60, tagged)
    assert configs(own) == [Config()] and all(Config().folder() != c.folder() for s in sweeps for c in configs(s))
    # notebook 04's probes at its defaults, of which notebook 07's (the last block's attention output) is one
    parameters = specs.notebook_parameters(paths.NOTEBOOKS / "04_linear_probe.ipynb")
    assert [p.dataset for p in handed["probes"]] == parameters["datasets"] and len(handed["probes"]) == 6
    read_by_07 = Probe("demo", "digits", points="mha", blocks=-1)
    assert handed["probes"][0].folder() == read_by_07.folder() and handed["probes"][0].key() == read_by_07.key()
    assert set(read_by_07.wanted()) < set(handed["probes"][0].wanted())


def test_the_landing_pages_demo_settings_are_the_demo_specs_and_notebook_05s_run():
    said = pool.demo_settings()
    for name, spec in pool.demo_specs().items():  # each spec's grid size, steps and validation period, as its file says
        runs, given = len(configs(spec)), spec["parameters"]
        every = given["eval_every"]
        assert f"{name} {runs} runs of {given['steps']} steps of 32 images, validated every {every}" in said
    assert said.endswith("Notebook 05's own run: 100 steps of 32 images.")


def test_the_pool_fits_the_probes_it_is_given_once(capsys, results):
    """A probe handed to the pool is fitted by a worker and cached: the notebook that reads it, or a second pool, finds
    it there and fits nothing."""
    shared = Probe("demo", "digits", points="mha", blocks=-1)
    assert linear_probe(shared, compute=False) is None
    pool.run_spec(probes=[shared], workers=1)
    line = capsys.readouterr().out
    assert line.startswith("[1/1] ") and "probe/demo/digits: probed in " in line
    cached = linear_probe(shared, compute=False)
    assert cached is not None and len(cached) == 1 and 0.0 <= cached["accuracy"].iloc[0] <= 1.0
    pool.run_spec(probes=[shared], workers=1)
    assert capsys.readouterr().out == ""


def test_validation_runs_every_eval_every_steps_and_not_after_the_last_step(small):
    # the authors' loop validates when the step is a multiple of the period, not after the last step
    finetune.run(small(steps=7, warmup=1, eval_every=3))
    history = run_files.history(small(steps=7, warmup=1, eval_every=3))
    assert history.dropna(subset=["val_accuracy"])["step"].tolist() == [3, 6]
    # a run shorter than its period validates once, at its end (the authors clamp the period to the steps)
    finetune.run(small(steps=4, warmup=1, eval_every=10))
    history = run_files.history(small(steps=4, warmup=1, eval_every=10))
    assert history.dropna(subset=["val_accuracy"])["step"].tolist() == [4]


def test_image_size_sets_the_models_resolution_too(small):
    # the demo ViT is 32 px (patches of 4): at 48 px its position embedding is resampled to a 12 x 12 grid
    config = small(image_size=48, steps=4, eval_every=2, save_weights=True)
    assert finetune.run(config)["status"] == "finished"
    model = checkpoints.load_model(config)
    assert model.patch_embed.img_size == (48, 48) and model.pos_embed.shape[1] == 1 + 12 * 12


class _Split:
    """A split of ``len(labels)`` images for ``evaluation.evaluate``, in forward batches of 256; image i is i."""

    device = torch.device("cpu")

    def __init__(self, labels):
        self.labels = torch.as_tensor(labels)

    def __iter__(self):
        for start in range(0, len(self.labels), 256):
            yield torch.arange(start, min(start + 256, len(self.labels))), self.labels[start : start + 256]


def test_accuracy_is_the_authors_mean_over_batches_of_512_the_last_partial_one_counted_whole():
    labels = torch.zeros(1030, dtype=torch.long)  # 512 + 512 + 6 images, all of class 0
    wrong = set(range(12)) | {1027, 1028, 1029}  # 12 wrong in the first batch of 512, 3 of the last 6

    def forward(images):
        logits = torch.zeros(len(images), 3)
        logits[:, 0] = torch.tensor([-1.0 if int(i) in wrong else 1.0 for i in images])
        return logits

    evaluated = evaluation.evaluate(torch.nn.Identity(), _Split(labels), forward=forward)
    assert evaluated.accuracy == pytest.approx((500 / 512 + 512 / 512 + 3 / 6) / 3, abs=1e-12)
    assert evaluated.exact == pytest.approx(1015 / 1030, abs=1e-12)


def _class_zero_share(labels: torch.Tensor) -> float:
    """The authors' accuracy of a model that answers class 0 for every image: per batch of 512 (float32, as their
    ``run_evaluation``), then averaged."""
    shares = [(labels[start : start + 512] == 0).float().mean().item() for start in range(0, len(labels), 512)]
    return sum(shares) / len(shares)


def test_a_run_that_is_nan_from_its_first_step_is_scored_as_the_authors_nan_model(monkeypatch, small):
    from paperlib.data import datasets

    made = finetune.network

    def nan_head(config, num_classes, pretrained=True):
        model = made(config, num_classes, pretrained)
        with torch.no_grad():
            model.head.bias.fill_(math.nan)  # the first step's loss is NaN, and its update makes the weights NaN
        return model

    monkeypatch.setattr(finetune, "network", nan_head)
    config = small(component="ln1")
    metrics = finetune.run(config)
    labels = {split: datasets.get_dataset(config.dataset, split, seed=config.seed).targets for split in ("val", "test")}
    # their loop trains on and validates at step 4 (eval_every): the NaN model predicts class 0 for every image
    assert metrics["status"] == "diverged" and metrics["diverged_step"] == 1
    assert metrics["best_step"] == 4 and metrics["nan_model"] and math.isnan(metrics["test_loss"])
    assert metrics["best_val_accuracy"] == pytest.approx(_class_zero_share(labels["val"]), abs=1e-12)
    assert metrics["test_accuracy"] == pytest.approx(_class_zero_share(labels["test"]), abs=1e-12)
    assert metrics["test_accuracy_exact"] == pytest.approx(float((labels["test"] == 0).double().mean()), abs=1e-12)
    assert 0 < metrics["test_accuracy"] < 0.5
    # kept by Table 6 and the grid's spread, with that score
    runs = runs_table.load()
    assert tables.table6(runs)["mean"].tolist() == pytest.approx([100 * metrics["test_accuracy"]])
    spread = tables.grid_spread(runs, components=["ln1"])
    assert spread["runs"].tolist() == [1] and spread["diverged"].tolist() == [1]
