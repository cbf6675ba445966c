"""Your own ViT and your own images: ``custom/<name>`` models and datasets, end to end."""

import dataclasses
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import timm
import torch
from PIL import Image

from paperlib.analysis import plasticity_table
from paperlib.data import datasets, fixtures, imagesets, loader
from paperlib.measure import plasticity
from paperlib.records import paths, runs_table, storage
from paperlib.train import finetune
from paperlib.train.config import Config
from paperlib.vit import models


def _names(dataset):
    return sorted(dataset.keys)


# --------------------------------------------------------------------------------------------
# datasets


def test_train_and_test_folders_are_the_official_split(home):
    base = home / "data" / "custom" / "pets"
    fixtures.write_image_folder(base / "train", ["cat", "dog", "eel"], per_class=10)
    fixtures.write_image_folder(base / "test", ["cat", "eel"], per_class=3)  # a held-out set may lack a class
    test = datasets.get_dataset("custom/pets", "test")
    assert test.classes == ["cat", "dog", "eel"]
    assert _names(test) == sorted(f"test/{c}/{c}_{i:03d}.jpg" for c in ("cat", "eel") for i in range(3))
    for key, target in zip(test.keys, test.targets.tolist()):  # labels are the training classes' indices, by name
        assert test.classes[target] == key.split("/")[1]
    trainval = datasets.get_dataset("custom/pets", "trainval")
    train, val = datasets.get_dataset("custom/pets", "train"), datasets.get_dataset("custom/pets", "val")
    assert len(trainval) == 30 and all(k.startswith("train/") for k in trainval.keys)
    assert set(train.keys).isdisjoint(val.keys) and set(train.keys) | set(val.keys) == set(trainval.keys)
    image, label = test[0]
    assert image.shape == (3, 224, 224) and image.dtype == torch.float32 and 0 <= label < 3


def test_val_folder_is_the_held_out_set_when_there_is_no_test_folder(home):
    base = home / "data" / "custom" / "scans"
    fixtures.write_image_folder(base / "train", ["a", "b"], per_class=5)
    fixtures.write_image_folder(base / "val", ["a", "b"], per_class=2)
    assert all(k.startswith("val/") for k in datasets.get_dataset("custom/scans", "test").keys)
    fixtures.write_image_folder(base / "test", ["a", "b"], per_class=1)  # test/ comes first
    assert all(k.startswith("test/") for k in datasets.get_dataset("custom/scans", "test").keys)


@pytest.mark.parametrize("layout", ["flat", "train_only"])
def test_without_a_held_out_folder_the_split_is_deterministic_and_moves_with_the_folder(home, layout):
    base = home / "data" / "custom" / "leaves"
    fixtures.write_image_folder(base if layout == "flat" else base / "train", ["oak", "elm", "ash"], per_class=20)
    train, test = datasets.get_dataset("custom/leaves", "trainval"), datasets.get_dataset("custom/leaves", "test")
    assert set(train.keys).isdisjoint(test.keys) and len(train) + len(test) == 60
    assert 6 <= len(test) <= 18  # about 20%
    moved = home / "elsewhere"
    shutil.copytree(home / "data", moved)
    assert _names(datasets.get_dataset("custom/leaves", "test", root=moved)) == _names(test)
    other = home / "data" / "custom" / "twigs"  # the same files under another name (a cleaned copy): the same split
    shutil.copytree(base, other)
    assert _names(datasets.get_dataset("custom/twigs", "test")) == _names(test)


def test_custom_datasets_are_listed_and_named_in_errors(home):
    fixtures.write_image_folder(home / "data" / "custom" / "mine", ["a", "b"], per_class=2)
    assert datasets.dataset_names("custom") == ["custom/mine"]
    assert "custom/mine" in datasets.dataset_names() and "cifar10" in datasets.dataset_names()
    with pytest.raises(
        FileNotFoundError, match=r"custom/theirs not found.*train/<class>/<image>.*found under .*: custom/mine"
    ) as error:
        datasets.get_dataset("custom/theirs", "test")
    assert "VIT_PLASTICITY_DOWNLOAD" not in str(error.value)  # nothing to download
    with pytest.raises(ValueError, match="custom/<name>"):
        datasets.check_dataset("my_pictures")
    for bad in ("custom/", "custom/../data", "custom/a/b", "custom/a b"):
        with pytest.raises(ValueError, match="invalid custom dataset name"):
            datasets.check_dataset(bad)
    with pytest.raises(ValueError, match="valid groups: demo, paper, reference, custom"):
        datasets.dataset_names("mine")


def test_bad_custom_layouts_say_what_is_wrong(home):
    base = home / "data" / "custom"
    (base / "empty").mkdir(parents=True)
    with pytest.raises(ValueError, match="custom/empty: .* has 0 class folder.*at least 2. Expected .*<class>/<image>"):
        datasets.get_dataset("custom/empty", "train")
    # Train/ is not train/: one class
    fixtures.write_image_folder(base / "capital" / "Train", ["cat", "dog"], per_class=2)
    with pytest.raises(
        ValueError, match=r"has 1 class folder\(s\) \(Train\); a classification dataset needs at least 2"
    ):
        datasets.get_dataset("custom/capital", "train")
    fixtures.write_image_folder(base / "notebooks", ["a", "b"], per_class=5)
    (base / "notebooks" / ".ipynb_checkpoints").mkdir()  # hidden folders are not classes
    assert datasets.get_dataset("custom/notebooks", "trainval").classes == ["a", "b"]
    (base / "classless").mkdir()
    (base / "classless" / "train").mkdir()
    (base / "classless" / "train" / "a").mkdir()
    (base / "classless" / "train" / "b").mkdir()
    with pytest.raises(FileNotFoundError, match="no images in"):
        datasets.get_dataset("custom/classless", "train")
    fixtures.write_image_folder(base / "extra" / "train", ["cat", "dog"], per_class=2)
    fixtures.write_image_folder(base / "extra" / "test", ["cat", "cow"], per_class=1)
    with pytest.raises(ValueError, match="classes that the training images lack: cow"):
        datasets.get_dataset("custom/extra", "test")


@pytest.mark.parametrize("layout", ["flat", "train_and_test"])
def test_an_empty_class_folder_is_refused_by_name(home, layout):
    """An empty class folder would be a class of its own: a 3-class head for 2 classes of images."""
    base = home / "data" / "custom" / "shapes"
    training = base if layout == "flat" else base / "train"
    for c in ("circle", "square"):
        (training / c).mkdir(parents=True)
        for i in range(3):
            Image.fromarray(np.full((8, 8, 3), 40 * i, np.uint8)).save(training / c / f"{i}.png")
    if layout == "train_and_test":
        (base / "test" / "circle").mkdir(parents=True)  # a held-out set may lack a class: not refused
        Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(base / "test" / "circle" / "0.png")
        (base / "test" / "square").mkdir()
    assert datasets.get_dataset("custom/shapes", "test").classes == ["circle", "square"]
    (training / "triangle").mkdir()
    (training / "triangle" / "notes.txt").write_text("not an image")
    where = "triangle" if layout == "flat" else "train/triangle"
    for split in ("train", "test"):
        with pytest.raises(ValueError, match=rf"^custom/shapes: empty class folder\(s\) {where} \(no image files\)"):
            datasets.get_dataset("custom/shapes", split)


def test_edited_images_get_a_new_decoded_cache(home):
    base = home / "data" / "custom" / "edit"
    fixtures.write_image_folder(base / "train", ["a", "b"], per_class=2)
    fixtures.write_image_folder(base / "test", ["a", "b"], per_class=2)
    first = loader.uint8_images(datasets.get_dataset("custom/edit", "test"), cache_size=16)
    again = loader.uint8_images(datasets.get_dataset("custom/edit", "test"), cache_size=16)
    assert torch.equal(first.images.pixels, again.images.pixels)
    assert len(list((home / "data" / "cache").rglob("*.npy"))) == 2  # the second call read the cache (pixels, sizes)
    edited = base / "test" / "a" / "a_000.jpg"
    Image.fromarray(np.full((20, 20, 3), 255, np.uint8)).save(edited)
    os.utime(edited, ns=(10**18, 10**18))  # a new modification time even on coarse clocks
    now = loader.uint8_images(datasets.get_dataset("custom/edit", "test"), cache_size=16)
    position = now.keys.index("test/a/a_000.jpg")
    assert int(now.images[position].min()) >= 250 and not torch.equal(now.images.pixels, first.images.pixels)


def test_official_datasets_are_not_stat_keyed(home):
    fixtures.write_domainnet(home / "data")
    assert not datasets.get_dataset("domainnet/clipart", "test").stat_keyed
    assert datasets.get_dataset("digits", "test").__class__ is imagesets.ImageDataset


# --------------------------------------------------------------------------------------------
# models


def test_a_saved_model_comes_back_bit_identical_with_its_head(home):
    source = models.create_model("demo")
    folder = models.save_model(source, "custom/copy")
    assert folder == home / "data" / "models" / "copy"
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors"]
    assert paths.custom_model_names() == ["custom/copy"]
    assert models.resolve_name("custom/copy") == "custom/copy"
    loaded = models.create_model("custom/copy")
    for key, value in source.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key
    fresh = models.create_model("custom/copy", num_classes=3)  # a task's new head, the saved backbone
    assert fresh.head.out_features == 3 and not torch.equal(fresh.head.weight[:3], source.head.weight[:3])
    assert torch.equal(fresh.blocks[2].attn.qkv.weight, source.blocks[2].attn.qkv.weight)


def test_saved_architecture_arguments_rebuild_the_model(home):
    source = models.create_model("vit_small_patch16_224", pretrained=False, img_size=48, depth=2, num_classes=7)
    models.save_model(source, "custom/small", model_args={"img_size": 48, "depth": 2})
    shape = models.architecture("custom/small")  # no weights read, on the meta device
    assert (shape.patch_embed.img_size, len(shape.blocks), shape.num_classes) == ((48, 48), 2, 7)
    loaded = models.create_model("custom/small")
    assert torch.equal(loaded.pos_embed, source.pos_embed) and torch.equal(loaded.head.weight, source.head.weight)


def test_a_folder_written_by_timm_itself_loads(home, tiny_vit):
    source = tiny_vit(num_classes=4)
    # pytorch_model.bin
    timm.models.save_for_hf(source, str(home / "data" / "models" / "byhand"), safe_serialization=False)
    loaded = models.create_model("custom/byhand")
    assert torch.equal(loaded.blocks[5].mlp.fc2.weight, source.blocks[5].mlp.fc2.weight) and loaded.num_classes == 4


def test_models_folder_from_the_environment(home, monkeypatch):
    monkeypatch.setenv("VIT_PLASTICITY_MODELS", str(home / "weights"))
    assert models.save_model(models.create_model("demo"), "custom/here") == home / "weights" / "here"


def test_saving_replaces_only_when_asked_and_never_leaves_half_a_folder(home, monkeypatch):
    first = models.create_model("demo")
    models.save_model(first, "custom/kept")
    with pytest.raises(FileExistsError, match="overwrite=True"):
        models.save_model(first, "custom/kept")

    def broken(model, folder, **kwargs):
        (Path(folder) / "model.safetensors").write_bytes(b"half")
        raise OSError("disk full")

    with monkeypatch.context() as patched:
        patched.setattr(timm.models, "save_for_hf", broken)
        with pytest.raises(OSError, match="disk full"):
            models.save_model(models.create_model("demo", num_classes=2), "custom/kept", overwrite=True)
        with pytest.raises(OSError, match="disk full"):
            models.save_model(first, "custom/new")
    assert sorted(p.name for p in (home / "data" / "models").iterdir()) == ["kept"]  # no staging folders left
    assert torch.equal(models.create_model("custom/kept").head.weight, first.head.weight)


def test_custom_model_errors(home):
    models.save_model(models.create_model("demo"), "custom/there")
    with pytest.raises(FileNotFoundError, match=r"'custom/gone' not found.*save_model.*found in .*: custom/there"):
        models.resolve_name("custom/gone")
    with pytest.raises(ValueError, match="custom/<name> for your own ViT"):
        models.resolve_name("my_vit")
    with pytest.raises(ValueError, match="invalid custom model name"):
        models.resolve_name("custom/a/b")
    config_file = home / "data" / "models" / "there" / "config.json"
    config = json.loads(config_file.read_text())
    config_file.write_text(json.dumps({**config, "architecture": "resnet50"}))
    with pytest.raises(ValueError, match="'resnet50', which is not a timm VisionTransformer"):
        models.create_model("custom/there")
    config_file.write_text(json.dumps(config))
    (config_file.parent / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="has no weights: expected .*model.safetensors or .*pytorch_model.bin"):
        models.create_model("custom/there")
    with pytest.raises(ValueError, match="named custom/<name>"):
        models.save_model(models.create_model("demo"), "mine")


# --------------------------------------------------------------------------------------------
# the analyses on them


def test_finetuning_and_plasticity_run_on_a_custom_model_and_dataset(home):
    models.save_model(models.create_model("demo"), "custom/vit")
    fixtures.write_image_folder(home / "data" / "custom" / "shots" / "train", ["cat", "dog", "eel"], per_class=12)
    fixtures.write_image_folder(home / "data" / "custom" / "shots" / "test", ["cat", "dog", "eel"], per_class=2)
    fixtures.write_image_folder(home / "data" / "custom" / "pretraining", ["x", "y"], per_class=10)

    config = Config(
        model="custom/vit", dataset="custom/shots", component="fc1", steps=4, warmup=1, eval_every=2, batch_size=8
    )
    metrics = finetune.run(config)
    assert metrics["num_classes"] == 3 and 0.0 <= metrics["test_accuracy"] <= 1.0
    assert (
        config.folder()
        == home / "results" / "finetune" / "custom" / "vit" / "custom" / "shots" / "fc1" / "lr=0.03" / "seed=0"
    )
    runs = runs_table.load()
    assert runs[["model", "dataset", "component"]].values.tolist() == [["custom/vit", "custom/shots", "fc1"]]

    measurement = plasticity.Measurement("custom/vit", "custom/shots", "custom/pretraining", n_pairs=5)
    table, folder = plasticity.run(measurement, progress=False)
    # not ImageNet, the default
    assert folder == home / "results" / "plasticity" / "custom" / "vit" / "custom" / "shots+ref-custom_pretraining"
    # the pretraining folder's test split has 4 images: the authors' pairs repeat them to the 5 asked for
    metadata = json.loads((folder / "metadata.json").read_text())
    assert table["pair"].nunique() == 5 and metadata["distinct_reference"] == 4
    assert plasticity_table.collect(reference="custom/pretraining")[
        ["model", "dataset"]
    ].drop_duplicates().values.tolist() == [["custom/vit", "custom/shots"]]
    assert plasticity_table.collect().empty  # against each dataset's default reference: none here


def test_a_run_on_a_missing_custom_model_fails_before_any_work(home):
    with pytest.raises(FileNotFoundError, match="custom/absent"):
        finetune.run(Config(model="custom/absent", dataset="digits"))
    assert not (home / "results").exists()


def test_exported_class_folders_read_back_as_the_same_images(home):
    base = home / "data" / "custom" / "digits_copy"
    for split in ("trainval", "test"):
        datasets.export_class_folders(
            datasets.get_dataset("digits", split), base / ("train" if split == "trainval" else "test")
        )
    for split in ("trainval", "test"):
        original = datasets.get_dataset("digits", split)
        copy = loader.uint8_images(datasets.get_dataset("custom/digits_copy", split), cache_size=32)
        assert copy.classes == original.classes == ["5", "6", "7", "8", "9"]
        by_key = {int(Path(key).stem): i for i, key in enumerate(copy.keys)}
        order = [by_key[key] for key in original.keys]
        images = torch.stack([copy.images[i] for i in order])
        assert torch.equal(images, original.images) and torch.equal(copy.targets[order], original.targets)
    with pytest.raises(FileExistsError, match="overwrite=True"):
        datasets.export_class_folders(datasets.get_dataset("digits", "test"), base / "test")
    files = datasets.get_dataset("custom/digits_copy", "test")  # files are copied as they are
    datasets.export_class_folders(files, home / "copied")
    first, key = files.files[0], files.keys[0]  # named by key (file names alone may repeat across folders)
    assert key == f"test/{first.parent.name}/{first.name}"
    assert (
        home / "copied" / first.parent.name / f"test_{first.parent.name}_{first.name}"
    ).read_bytes() == first.read_bytes()


def test_a_run_on_edited_custom_data_or_a_resaved_model_is_a_new_run(home):
    models.save_model(models.create_model("demo"), "custom/vit")
    base = home / "data" / "custom" / "shots"
    fixtures.write_image_folder(base / "train", ["cat", "dog"], per_class=8)
    fixtures.write_image_folder(base / "test", ["cat", "dog"], per_class=2)
    config = Config(
        model="custom/vit", dataset="custom/shots", component="ln2", steps=2, warmup=0, eval_every=2, batch_size=8
    )
    first = finetune.run(config)
    assert first["num_classes"] == 2 and finetune.run(config) == first  # unchanged inputs: not repeated
    params = json.loads((config.folder() / "params.json").read_text())
    assert set(params["fingerprints"]) == {"dataset", "model"}
    fixtures.write_image_folder(base / "train", ["eel"], per_class=8, seed=1)  # a class more
    fixtures.write_image_folder(base / "test", ["eel"], per_class=2, seed=1)
    assert finetune.run(config)["num_classes"] == 3
    again = finetune.run(config)
    # other weights, same name
    models.save_model(models.create_model("demo", num_classes=2), "custom/vit", overwrite=True)
    assert (
        finetune.run(config)["test_accuracy"] is not None
        and json.loads((config.folder() / "params.json").read_text())["fingerprints"] != params["fingerprints"]
    )
    assert again["num_classes"] == 3


def test_a_run_that_cannot_start_keeps_the_finished_run_in_its_folder(home):
    fixtures.write_image_folder(home / "data" / "custom" / "shots", ["cat", "dog"], per_class=6)
    config = Config(dataset="custom/shots", component="ln2", steps=2, warmup=0, eval_every=2, batch_size=4)
    finished = finetune.run(config)
    (home / "empty").mkdir()
    elsewhere = dataclasses.replace(config, data_root=str(home / "empty"))  # the same folder, data that are not there
    assert elsewhere.folder() == config.folder()
    with pytest.raises(FileNotFoundError, match="custom/shots not found"):
        finetune.run(elsewhere)
    assert storage.read_json(config.folder() / "metrics.json") == finished
    assert finetune.run(config) == finished


def test_a_run_interrupted_on_another_cache_size_starts_again_instead_of_resuming_on_other_images(
    home, monkeypatch, move_results
):
    # a run's crops come from its decoded cache; a checkpoint made on another cache (a 384-px run
    # started before the cache grew with the model) must not be continued on these images
    base = home / "data" / "custom" / "shots"
    fixtures.write_image_folder(base / "train", ["cat", "dog"], per_class=12, size=(72, 60))
    fixtures.write_image_folder(base / "test", ["cat", "dog"], per_class=3, size=(72, 60))
    config = Config(dataset="custom/shots", component="fc1", steps=6, warmup=1, eval_every=2, batch_size=8, lr=0.1)
    original = loader.DeviceLoader.batch

    def crash(self, index):
        if index == 4 and self.augment:
            raise KeyboardInterrupt("simulated interruption")
        return original(self, index)

    with monkeypatch.context() as patch:
        patch.setattr(finetune, "cache_side", lambda size: 48)  # the checkpoint's cache
        patch.setattr(loader.DeviceLoader, "batch", crash)
        with pytest.raises(KeyboardInterrupt):
            finetune.run(config)
    assert torch.load(config.folder() / "checkpoint.pt", weights_only=False)["cache_side"] == 48
    resumed = finetune.run(config)  # now on the default cache of 256
    move_results("uninterrupted")
    fresh = finetune.run(config)
    assert resumed["cache_side"] == fresh["cache_side"] == 256
    timings = ("wall_seconds", "images_per_second")
    assert {k: v for k, v in resumed.items() if k not in timings} == {
        k: v for k, v in fresh.items() if k not in timings
    }
