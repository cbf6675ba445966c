"""Results that outlive the code: a run records what it saw, readings come from the records, an upgrade keeps results.

``tests/fixtures/older_results`` is a results root written by two older versions of the package (its README).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import interrupted

from paperlib.data import datasets
from paperlib.measure import plasticity
from paperlib.records import paths, readings, runs, runs_table, storage
from paperlib.sweeps import sweep
from paperlib.train import checkpoints, evaluation, finetune
from paperlib.train.config import Config

ROOT = Path(__file__).resolve().parents[1]
OLDER = ROOT / "tests" / "fixtures" / "older_results"
SPEC = OLDER / "spec.yaml"
KEPT = Config(component="mha", steps=20, batch_size=32, warmup=2, eval_every=10)  # written by record 5
UPGRADED = Config(component="ln1", steps=20, batch_size=32, warmup=2, eval_every=10)  # written by record 4
READ_AGAIN = Config(component="fc1", steps=20, batch_size=32, warmup=2, eval_every=10)  # written by record 6


def older_root(results: Path) -> None:
    """The fixture's runs, copied into the test's results root."""
    shutil.copytree(OLDER / "finetune", results / "finetune")


def files_of(folder: Path) -> dict[str, bytes]:
    return {file.name: file.read_bytes() for file in sorted(folder.iterdir()) if file.is_file()}


def command(*arguments: str, results: Path) -> subprocess.CompletedProcess:
    """``python -m paperlib <arguments>`` on the results root ``results``, from the repository."""
    env = os.environ | {"VIT_PLASTICITY_RESULTS": str(results), "VIT_PLASTICITY_REPORTS": str(results / "reports")}
    return subprocess.run(
        [sys.executable, "-m", "paperlib", *arguments], cwd=ROOT, env=env, capture_output=True, text=True
    )


READ_WITHOUT_TORCH = """
import json, sys
from paperlib.records import readings
seen = readings.read(sys.argv[1])
print(json.dumps({
    "authors": readings.choose(seen).__dict__,
    "at 128": readings.choose(seen, batch=128).__dict__,
    "exact": readings.choose(seen, batch=None).__dict__,
    "shape": [list(seen.val.shape), list(seen.test.shape)],
    "torch": "torch" in sys.modules,
}))
"""


def test_a_run_keeps_what_it_saw_and_its_metrics_are_read_from_it_without_torch(small, results):
    config = small(save_weights=True)
    metrics = finetune.run(config)
    folder = config.folder()
    assert readings.OUTCOMES in metrics["files"]
    env = os.environ | {"VIT_PLASTICITY_RESULTS": str(results)}
    said = subprocess.run(
        [sys.executable, "-c", READ_WITHOUT_TORCH, str(folder)], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert said.returncode == 0, said.stderr
    read = json.loads(said.stdout)
    assert not read["torch"]
    validations = config.steps // config.eval_every
    assert read["shape"] == [[validations, 144], [validations, metrics["test_images"]]]  # digits 5-9: 144 val
    for name in finetune.READ:  # metrics.json is the reading of its records, to the last digit
        assert read["authors"][name] == metrics[name], name
    # the exact reading picks its own checkpoint, by the exact validation accuracy
    assert (
        read["exact"]["best_val_accuracy"] == metrics["best_val_accuracy_exact"]
        or read["exact"]["best_step"] != (metrics["best_step"])
    )
    # and the records agree with a live evaluation of the kept checkpoint on the test split
    model = checkpoints.load_model(config)
    splits = datasets.read_splits(config.dataset, seed=config.seed)
    loaders, _ = finetune._loaders(config, splits, model.patch_embed.img_size[0], torch.device("cpu"))
    live = evaluation.evaluate(model, loaders["test"])
    assert live.accuracy == pytest.approx(metrics["test_accuracy"], abs=1e-12)
    assert live.exact == pytest.approx(metrics["test_accuracy_exact"], abs=1e-12)
    assert live.loss == pytest.approx(metrics["test_loss"], rel=1e-6)


def test_readings_take_any_batch_and_order():
    hits = np.array([[True] * 5 + [False] * 2])  # 7 images, batches of 4: (4/4 + 1/3) / 2
    assert readings.accuracy(hits, 4)[0] == pytest.approx((1 + 1 / 3) / 2)
    assert readings.accuracy(hits, None)[0] == pytest.approx(5 / 7)
    order = np.array([5, 6, 0, 1, 2, 3, 4])  # the wrong ones first: (2/4 + 3/3) / 2
    assert readings.accuracy(hits, 4, order)[0] == pytest.approx((0.5 + 1) / 2)
    seen = readings.Outcomes(
        steps=np.array([10, 20, 30]),
        val=np.array([[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 0, 0]], bool),
        test=np.array([[1, 0], [1, 1], [0, 0]], bool),
        val_loss=np.zeros(3),
        test_loss=np.array([3.0, 2.0, 1.0]),
        nan_model=np.zeros(3, bool),
    )
    chosen = readings.choose(seen)  # strictly greater: the first of two equal bests
    assert (chosen.best_step, chosen.test_accuracy, chosen.test_loss) == (20, 1.0, 2.0)
    nothing = dataclasses.replace(seen, val=np.zeros((3, 4), bool))  # no validation above their starting best of 0
    assert readings.choose(nothing).best_step is None and readings.choose(nothing, batch=None).best_step is None
    with pytest.raises(ValueError, match="batch must be a positive integer"):
        readings.accuracy(hits, 0)


def test_the_authors_validation_batch_follows_their_scripts_from_the_runs_parameters():
    """``finetuning.sh`` validates Cifar10-C speckle noise at 128, ``ablation/model_size.sh`` ViT-Large at 128 and
    ViT-Huge at 64, every other run at 512 (their configs' ``val_batch_size``): read from the params.json records the
    specs' runs write."""
    from paperlib.records import specs

    def batches(name: str) -> dict:
        records = runs_table.spec_records(specs.load_spec(ROOT / "parameters" / "sweeps" / name)).values()
        found = {}
        for record in records:
            found.setdefault((record["model"], record["dataset"]), set()).add(readings.validation_batch(record))
        return found

    paper = batches("finetune_paper.yaml")
    assert len(paper) == 11 and all(len(found) == 1 for found in paper.values())
    assert {key[1] for key, found in paper.items() if found == {128}} == {"cifar10c/speckle_noise"}
    assert {found.pop() for key, found in paper.items() if key[1] != "cifar10c/speckle_noise"} == {512}
    assert batches("ablation_model_size.yaml") == {
        ("vit_large_in21k", "domainnet/clipart"): {128},
        ("vit_huge_in21k", "domainnet/clipart"): {64},
    }
    assert {batch for found in batches("ablation_adam.yaml").values() for batch in found} == {512}
    # a smaller batch weighs the last partial batch less: speckle noise's 1,600 validation images in 13 batches
    hits = np.ones((1, 1600), bool)
    hits[0, -64:] = False  # the last 64 wrong, the last partial batch: exact 96%; 1 of 4 batches at 512, 1 of 13 at 128
    assert readings.accuracy(hits, 512)[0] == pytest.approx(3 / 4)
    assert readings.accuracy(hits, 128)[0] == pytest.approx(12 / 13)


def test_the_authors_per_batch_accuracies_are_float32_added_in_order():
    """Their ``run_evaluation``: ``(pred == y).float().mean().item()`` per batch, added one after another to a
    Python float, divided by the number of batches; emulated here with torch itself."""
    rng = np.random.default_rng(3)
    hits = rng.random((5, 1700)) < 0.83
    for batch in (64, 128, 512):
        theirs = []
        for row in hits:
            total, count = 0.0, 0
            for start in range(0, len(row), batch):
                total += torch.from_numpy(row[start : start + batch]).float().mean().item()
                count += 1
            theirs.append(total / count)
        assert readings.accuracy(hits, batch).tolist() == theirs, batch


def test_the_plan_and_the_dry_run_name_runs_of_older_versions(results):
    older_root(results)
    plan = command("sweep", str(SPEC), "--plan", results=results)
    assert plan.returncode == 0, plan.stderr
    line = "3 runs of an older version: 2 upgraded in place, 1 kept as they are; --retrain-older would train them again"
    assert line in plan.stdout and "nothing to run: 0 device-hours" in plan.stdout
    dry = command("sweep", str(SPEC), "--dry-run", results=results)
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.count("(older version: ") == 3 and line in dry.stdout
    assert "3 finished, 0 to run" in dry.stdout


def test_a_sweep_over_older_results_deletes_and_trains_nothing_and_stats_reads_them(results, tmp_path, monkeypatch):
    older_root(results)
    monkeypatch.setenv("VIT_PLASTICITY_REPORTS", str(tmp_path / "reports"))
    monkeypatch.setattr(finetune, "_train", lambda *args: pytest.fail("trained"))
    kept, upgraded = files_of(KEPT.folder()), files_of(UPGRADED.folder())
    assert sweep.main([str(SPEC)]) == 0
    assert files_of(KEPT.folder()) == kept  # as it was, byte for byte
    now = files_of(UPGRADED.folder())
    assert now.keys() == upgraded.keys() and now["history.csv"] == upgraded["history.csv"]
    assert json.loads(now["params.json"])["record"] == 5 and "sha256" in json.loads(now["metrics.json"])
    before, after = json.loads(upgraded["metrics.json"]), json.loads(now["metrics.json"])
    assert {k: v for k, v in after.items() if k not in ("files", "sha256")} == {
        k: v for k, v in before.items() if k != "files"
    }
    said = command("stats", str(SPEC), results=results)
    assert said.returncode == 0, said.stderr
    assert f"3 runs of {SPEC}: 3 finished; 0 missing" in said.stdout
    warning = [line for line in said.stderr.splitlines() if "older version" in line]
    assert len(warning) == 1 and "2 no per-image outcomes" in warning[0] and "Traceback" not in said.stderr
    assert runs.lacks(runs.read_params(READ_AGAIN.folder())) == []  # read again: today's record


def test_a_record_6_is_read_again_into_the_run_today_s_version_trains(results, move_results):
    """The record 6 of the fixture, upgraded as a sweep upgrades it, is the run a record 7 trains: its outcomes in the
    authors' validation order, its history's validation accuracies and its metrics' readings read again, the same to
    the last digit (the training is the same, ``runs.TRAINING``: its numbers to the rounding of this CPU's kernels).
    Its validation outcomes were sorted: the upgrade reorders them, it does not copy them."""
    older_root(results)
    before = readings.read(READ_AGAIN.folder())
    assert runs.upgrade(READ_AGAIN.folder()) is False  # without its validation order, kept as it is
    older = (READ_AGAIN.dataset, None, READ_AGAIN.seed, READ_AGAIN.validation)
    assert runs.upgrade(READ_AGAIN.folder(), lambda: datasets.older_validation_order(*older))
    upgraded = runs.read_params(READ_AGAIN.folder()), runs.finished(READ_AGAIN), readings.read(READ_AGAIN.folder())
    history = runs.history(READ_AGAIN)
    move_results("fresh")
    fresh = finetune.run(READ_AGAIN)
    fresh_seen, fresh_history = readings.read(READ_AGAIN.folder()), runs.history(READ_AGAIN)
    assert upgraded[0] == runs.read_params(READ_AGAIN.folder())
    assert {name: upgraded[1][name] for name in finetune.READ} == {name: fresh[name] for name in finetune.READ}
    for split in ("val", "test"):
        assert np.array_equal(getattr(upgraded[2], split), getattr(fresh_seen, split)), split
    assert not np.array_equal(upgraded[2].val, before.val)  # reordered
    assert history["val_accuracy"].equals(fresh_history["val_accuracy"])
    assert np.allclose(history["train_loss"], fresh_history["train_loss"], rtol=1e-4)


def test_a_checkpoint_of_an_older_record_is_not_resumed(small, monkeypatch):
    """What a checkpoint saw is held in its version's order (record 6: the validation split sorted): a run interrupted
    under another record starts again, with a warning, rather than mix two orders in one record."""
    from paperlib.data import loader

    config = small()
    interrupted(config, 6, monkeypatch)  # after its first checkpoint (step 4)
    checkpoint = config.folder() / runs.CHECKPOINT
    saved = torch.load(checkpoint, weights_only=True)
    torch.save(saved | {"params": saved["params"] | {"record": 6}}, checkpoint)
    asked, original = [], loader.DeviceLoader.batch

    def spy(self, index):
        if self.augment:
            asked.append(index)
        return original(self, index)

    monkeypatch.setattr(loader.DeviceLoader, "batch", spy)
    with pytest.warns(UserWarning, match="written by an older version: the run starts from the beginning"):
        finetune.run(config)
    assert asked[0] == 0


def test_retraining_an_older_run_leaves_it_readable_until_the_new_one_is_whole(results, monkeypatch):
    older_root(results)
    before = files_of(KEPT.folder())
    monkeypatch.setenv(paths.RETRAIN_OLDER, "1")  # sweep --retrain-older
    interrupted(KEPT, 15, monkeypatch)  # killed mid-training, after its first checkpoint
    assert files_of(KEPT.folder()) == before  # the older result, whole and readable
    assert (runs.staging(KEPT.folder()) / runs.CHECKPOINT).is_file()
    table = runs_table.load()  # the run training beside it is no row of the table
    assert table["status"].tolist() == ["finished"] * 3 and set(table["lacks"]) != {""}
    monkeypatch.delenv(paths.RETRAIN_OLDER)
    assert runs.finished(KEPT)["test_accuracy"] == json.loads(before["metrics.json"])["test_accuracy"]
    monkeypatch.setenv(paths.RETRAIN_OLDER, "1")
    metrics = finetune.run(KEPT)  # resumes beside it, then replaces it in one step
    assert readings.OUTCOMES in files_of(KEPT.folder()) and not runs.staging(KEPT.folder()).exists()
    assert [p.name for p in KEPT.folder().parent.iterdir() if p.name.endswith(".replaced")] == []
    assert runs.finished(KEPT) == metrics and runs.lacks(runs.read_params(KEPT.folder())) == []


def test_a_replacement_cut_between_its_two_renames_is_finished_by_the_next_reader(results, monkeypatch):
    older_root(results)
    monkeypatch.setenv(paths.RETRAIN_OLDER, "1")
    rename = os.replace

    def killed_before_the_second(source, target):  # the old result moved aside, the new one not yet in its place
        if Path(source) == runs.staging(KEPT.folder()):
            raise KeyboardInterrupt("killed between the renames")
        rename(source, target)

    monkeypatch.setattr(os, "replace", killed_before_the_second)
    with pytest.raises(KeyboardInterrupt):
        finetune.run(KEPT)
    monkeypatch.setattr(os, "replace", rename)
    assert not KEPT.folder().exists()  # the old result aside, the new one whole beside it
    metrics = runs.finished(KEPT)
    assert metrics is not None and readings.OUTCOMES in metrics["files"]
    assert sorted(p.name for p in KEPT.folder().parent.iterdir() if p.is_dir()) == ["seed=0"]


def test_a_damaged_or_mistyped_metrics_json_is_named_in_one_line_and_left_out(results):
    older_root(results)
    metrics_file = KEPT.folder() / runs.METRICS
    payload = json.loads(metrics_file.read_text())
    del payload["sha256"]  # a record of the checksums' era without its own: damaged, whatever it says
    metrics_file.write_text(json.dumps(payload | {"test_accuracy": 0.99}))
    said = command("stats", str(SPEC), results=results)
    assert said.returncode == 0, said.stderr
    assert f"3 runs of {SPEC}: 2 finished, 1 partial" in said.stdout
    damaged = [line for line in said.stderr.splitlines() if "carries no checksum" in line]
    assert len(damaged) == 1 and damaged[0].startswith("warning: ") and "99.00" not in said.stdout
    upgraded_file = UPGRADED.folder() / runs.METRICS  # a record 4: no checksum to require, but its values checked
    upgraded_file.write_text(json.dumps(json.loads(upgraded_file.read_text()) | {"test_accuracy": "0.99"}))
    said = command("stats", str(SPEC), results=results)
    assert (
        said.returncode == 0
        and "Traceback" not in said.stderr
        and f"3 runs of {SPEC}: 2 partial, 1 finished" in said.stdout
    )
    assert any("holds values of the wrong kind (test_accuracy '0.99'" in line for line in said.stderr.splitlines())


def test_a_symbolic_link_out_of_the_results_root_is_refused_and_what_it_points_to_unchanged(results, tmp_path, small):
    outside = tmp_path / "elsewhere"
    shutil.copytree(OLDER / "finetune" / "demo" / "digits" / "mha" / "lr=0.03" / "seed=0", outside)
    before = files_of(outside)
    config = small()
    config.folder().parent.mkdir(parents=True)
    config.folder().symlink_to(outside, target_is_directory=True)
    with pytest.raises(ValueError, match=r"leads out of the results root .*\(a symbolic link\): refused"):
        finetune.run(config)
    assert files_of(outside) == before
    config.folder().unlink()
    config.folder().mkdir()
    (config.folder() / runs.METRICS).symlink_to(outside / runs.METRICS)  # a file, this time
    with pytest.raises(ValueError, match="leads out of the results root"):
        finetune.train(config)
    said = command("finetune", "--steps", "12", "--batch-size", "16", "--lr", "0.05", results=results)
    assert said.returncode == 2 and said.stderr.count("\n") == 1 and "leads out of the results root" in said.stderr
    assert files_of(outside) == before


def test_the_dry_run_names_plasticity_results_of_an_older_version(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("VIT_PLASTICITY_REPORTS", str(tmp_path / "reports"))
    measurement = plasticity.Measurement(n_pairs=4)
    _, folder = plasticity.run(measurement, batch_size=4, progress=False)
    metadata = json.loads((folder / "metadata.json").read_text())
    del metadata["splits"]  # a result from before the authors' splits
    storage.write_json(folder / "metadata.json", metadata)
    spec = tmp_path / "spec.yaml"
    spec.write_text("notebook: notebooks/02_plasticity.ipynb\nname: '{dataset}'\ngrid:\n  dataset: [digits]\n")
    assert sweep.main([str(spec), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "finished  digits" in out and "(older version: splits 1)" in out
    assert "1 results of an older version, kept as they are; --retrain-older would make them again" in out
