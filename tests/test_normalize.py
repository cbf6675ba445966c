"""Normalisation (beyond the paper): the paper's ImageNet statistics, or the model's own; and the
decoded cache's resolution for models above 224."""

import dataclasses
import json

import pandas as pd
import pytest
import torch
from conftest import recorded_difference
from timm.data import (
    IMAGENET_DEFAULT_MEAN,
    IMAGENET_DEFAULT_STD,
    OPENAI_CLIP_MEAN,
    OPENAI_CLIP_STD,
)

from paperlib.analysis import plasticity_table, tables
from paperlib.data import datasets, fixtures, imagesets, loader
from paperlib.data import transforms as T
from paperlib.measure import component_rates, plasticity
from paperlib.records import names, runs_table, storage
from paperlib.records import runs as run_files
from paperlib.train import checkpoints, finetune
from paperlib.train.config import Config
from paperlib.vit import models

HALF = ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))


def save_demo(name: str, mean=None, std=None) -> None:
    """The demo ViT saved as ``custom/<name>``, its pretrained configuration recording ``mean``
    and ``std`` (None: leave the demo's; ``"drop"``: no record of them in its config.json, as a
    folder written by another tool may have)."""
    model = models.create_model("demo")
    model.pretrained_cfg = {
        **model.pretrained_cfg,
        **{k: v for k, v in (("mean", mean), ("std", std)) if v not in (None, "drop")},
    }
    folder = models.save_model(model, f"custom/{name}")
    if "drop" in (mean, std):
        config = json.loads((folder / "config.json").read_text())
        config["pretrained_cfg"] = {k: v for k, v in config["pretrained_cfg"].items() if k not in ("mean", "std")}
        (folder / "config.json").write_text(json.dumps(config))


def affine(images: torch.Tensor, source: tuple, target: tuple) -> torch.Tensor:
    """Images normalised with ``source`` re-normalised with ``target`` (per channel)."""
    view = lambda values: torch.tensor(values).view(3, 1, 1)  # noqa: E731
    return (images * view(source[1]) + view(source[0]) - view(target[0])) / view(target[1])


# --------------------------------------------------------------------------------------------
# the choices and their values


def test_choices_and_bad_values_are_named():
    with pytest.raises(ValueError, match="imagenet, model"):
        names.check_normalize("clip")
    with pytest.raises(ValueError, match="imagenet, model"):
        models.normalization("demo", "inception")
    for mean, std in (
        ((0.5, 0.5), (0.5, 0.5, 0.5)),
        ((0.5,) * 3, (0.5, 0.0, 0.5)),
        (("a",) * 3, (1,) * 3),
        ((float("nan"),) * 3, (1,) * 3),
    ):
        with pytest.raises(ValueError, match="three"):
            T.as_mean_std(mean, std)
    assert T.as_mean_std([1, 2, 3], (4, 5, 6)) == ((1.0, 2.0, 3.0), (4.0, 5.0, 6.0))
    images = torch.rand(2, 3, 4, 4)
    assert torch.allclose(T.normalize(images, ([0.5] * 3, [0.5] * 3)), images * 2 - 1)  # lists as well as tuples


def test_the_paper_normalises_every_model_with_imagenet_statistics_and_model_reads_each_models_own():
    imagenet = (tuple(IMAGENET_DEFAULT_MEAN), tuple(IMAGENET_DEFAULT_STD))
    for name in ("demo", "vit_base_in21k", "vit_base_patch16_clip_224.openai"):
        assert models.normalization(name) == imagenet
    # the original ViTs were pretrained on [-1, 1] inputs
    assert models.normalization("vit_base_in21k", "model") == HALF
    assert models.normalization("vit_huge_patch14_224.orig_in21k", "model") == HALF
    assert models.normalization("vit_base_patch16_clip_224.openai", "model") == T.as_mean_std(
        OPENAI_CLIP_MEAN, OPENAI_CLIP_STD
    )
    assert models.normalization("demo", "model") == imagenet  # the demo ViT was pretrained with ImageNet's


def test_a_saved_model_keeps_its_statistics(home):
    save_demo("half", *HALF)
    assert models.normalization("custom/half", "model") == HALF
    # and the model built from it says so
    assert tuple(models.create_model("custom/half").pretrained_cfg["mean"]) == HALF[0]
    demo = models.create_model("demo")
    # weights trained with statistics of their own
    models.save_model(demo, "custom/given", mean=[0.1, 0.2, 0.3], std=(0.4, 0.5, 0.6))
    assert models.normalization("custom/given", "model") == ((0.1, 0.2, 0.3), (0.4, 0.5, 0.6))
    assert tuple(demo.pretrained_cfg["mean"]) == tuple(IMAGENET_DEFAULT_MEAN)  # the model itself is left as it was
    with pytest.raises(ValueError, match="both mean and std"):
        models.save_model(demo, "custom/half_given", mean=(0.5,) * 3)
    save_demo("bare", "drop", "drop")
    assert models.normalization("custom/bare") == T.IMAGENET
    with pytest.raises(ValueError, match="records no mean and std; use normalize='imagenet'"):
        models.normalization("custom/bare", "model")
    with pytest.raises(ValueError, match="records no mean and std"):  # before any work
        Config(model="custom/bare", normalize="model").validate()
    assert not (home / "results").exists()


# --------------------------------------------------------------------------------------------
# the transforms


def test_both_transform_paths_normalise_with_the_statistics_given():
    image = torch.full((3, 8, 8), 255, dtype=torch.uint8)
    for pair in (T.IMAGENET, HALF, ((0.1, 0.2, 0.3), (0.4, 0.5, 0.6))):
        expected = (1 - torch.tensor(pair[0])) / torch.tensor(pair[1])
        for augment in (False, True):
            out = T.paper_transform(augment, 8, pair)(image)
            assert torch.allclose(out, expected.view(3, 1, 1).expand(3, 8, 8), atol=1e-6)
    images = torch.randint(0, 256, (4, 3, 8, 8), dtype=torch.uint8)  # square, as the cache's
    for pair in (T.IMAGENET, HALF):
        ours = T.device_transform(images, augment=False, image_size=16, mean_std=pair)
        # upsampled, as Cifar to 224
        plain = torch.stack([T.paper_transform(False, 16, pair)(image) for image in images])
        assert (ours - plain).abs().max() < (1 / 255 + 1e-4) / min(pair[1])
    assert not torch.allclose(T.device_transform(images, False, 8), T.device_transform(images, False, 8, mean_std=HALF))


def test_datasets_and_the_device_loader_carry_the_statistics():
    imagenet, half = datasets.get_dataset("digits", "test"), datasets.get_dataset("digits", "test", mean_std=HALF)
    assert torch.allclose(half[3][0], affine(imagenet[3][0], T.IMAGENET, HALF), atol=1e-5)
    assert torch.allclose(half.tensors()[0], (imagenet.images.float() / 255 - 0.5) / 0.5)
    assert half.subset([0, 1], "test").mean_std == HALF
    resized = datasets.get_dataset("digits", "test", image_size=16, mean_std=HALF)  # through the torchvision transform
    assert torch.allclose(
        resized[0][0], affine(datasets.get_dataset("digits", "test", image_size=16)[0][0], T.IMAGENET, HALF), atol=1e-5
    )
    train = datasets.get_dataset("digits", "trainval")
    for augment in (True, False):
        a = DeviceBatch(train, augment, T.IMAGENET)
        b = DeviceBatch(train, augment, HALF)
        assert torch.equal(a[1], b[1]) and torch.allclose(b[0], affine(a[0], T.IMAGENET, HALF), atol=1e-5)


def test_decoded_file_datasets_keep_the_statistics_they_were_read_with(home):
    fixtures.write_image_folder(home / "data" / "custom" / "photos", ["a", "b"], per_class=3)
    read = datasets.get_dataset("custom/photos", "test", mean_std=HALF)
    decoded = loader.uint8_images(read, cache_size=16)
    assert decoded.mean_std == HALF
    image, _ = decoded[0]
    assert torch.allclose(image, decoded.images[0].float() / 255 * 2 - 1)
    batch, _ = loader.DeviceLoader(decoded, 2, loader.Transform(False, 16)).batch(0)  # the dataset's, unless given
    assert batch.min() >= -1 - 1e-6 and batch.max() <= 1 + 1e-6
    given, _ = loader.DeviceLoader(decoded, 2, loader.Transform(False, 16, T.IMAGENET)).batch(0)
    assert torch.allclose(given, affine(batch, HALF, T.IMAGENET), atol=1e-5)


def DeviceBatch(dataset, augment, pair):
    """Batch 2 of a seeded DeviceLoader normalising with ``pair`` (the same crops for any pair)."""
    return loader.DeviceLoader(dataset, 16, loader.Transform(augment, 24, pair), seed=3).batch(2)


# --------------------------------------------------------------------------------------------
# finetuning and plasticity

LN2 = {"component": "ln2", "steps": 4, "warmup": 1, "eval_every": 2}  # a quick run of the small ones


def test_finetuning_with_the_models_statistics_is_a_run_of_its_own(home, small):
    save_demo("half", *HALF)
    save_demo("same")  # the demo's own statistics: ImageNet's
    paper = finetune.run(small(model="custom/half", **LN2))
    own = small(model="custom/half", normalize="model", **LN2)
    assert (
        own.folder().name == "seed=0+norm-model"
        and own.folder().parent == small(model="custom/half", **LN2).folder().parent
    )
    metrics = finetune.run(own)
    assert (metrics["normalize"], metrics["mean"], metrics["std"]) == ("model", [0.5] * 3, [0.5] * 3)
    assert paper["normalize"] == "imagenet" and paper["mean"] == list(IMAGENET_DEFAULT_MEAN)
    assert (
        run_files.history(own)["train_loss"].tolist()
        != run_files.history(small(model="custom/half", **LN2))["train_loss"].tolist()
    )
    # the finetuned model records the statistics its run used, for normalize="model" once saved
    for config, pair in ((own, HALF), (small(model="custom/half", **LN2), T.IMAGENET)):
        finetune.run(dataclasses.replace(config, save_weights=True))
        models.save_model(checkpoints.load_model(config), "custom/tuned", overwrite=True)
        assert models.normalization("custom/tuned", "model") == pair
    # a model pretrained with ImageNet's statistics: "model" is the paper's run, number for number
    same_model, same_paper = small(model="custom/same", normalize="model", **LN2), small(model="custom/same", **LN2)
    finetune.run(same_model), finetune.run(same_paper)
    pd.testing.assert_frame_equal(run_files.history(same_model), run_files.history(same_paper))

    runs = runs_table.load()
    assert sorted(runs["normalize"]) == ["imagenet", "imagenet", "model", "model"]
    with pytest.raises(ValueError, match="one normalize"):
        tables.table6(runs[runs["model"] == "custom/half"])
    assert len(tables.table6(runs[(runs["model"] == "custom/half") & (runs["normalize"] == "model")])) == 1


def test_a_run_recorded_before_the_option_is_kept_and_read_as_its_default(home, small):
    config = small(**LN2)
    finetune.run(config)
    params = json.loads((config.folder() / "params.json").read_text())
    del params["normalize"]
    storage.write_json(config.folder() / "params.json", params)
    assert runs_table.load()["normalize"].tolist() == ["imagenet"]  # as its metrics.json says
    # and the field its record lacks is read as its default, what runs did before it: the run is kept, labelled
    assert recorded_difference(config) == [] and run_files.is_finished(config)
    assert runs_table.load()["lacks"].tolist() == ["no normalize (read as its default)"]


def test_plasticity_with_the_models_statistics_is_a_result_of_its_own(home):
    save_demo("half", *HALF)
    paper, paper_folder = plasticity.run(plasticity.Measurement("custom/half", n_pairs=12), progress=False)
    own_measurement = plasticity.Measurement("custom/half", n_pairs=12, normalize="model")
    own, own_folder = plasticity.run(own_measurement, progress=False)
    assert own_folder == paper_folder.with_name("digits+norm-model") == own_measurement.folder()
    assert json.loads((own_folder / "metadata.json").read_text())["mean"] == [0.5] * 3
    assert not torch.allclose(torch.tensor(own["rate"].values), torch.tensor(paper["rate"].values))
    assert set(plasticity_table.collect()["normalize"]) == {"imagenet"} and len(plasticity_table.collect()) == 5
    assert set(plasticity_table.collect(normalize="model")["normalize"]) == {"model"}
    assert len(plasticity_table.collect(normalize=None)) == 10
    # the rates are the plain definition's on the images normalised with the model's statistics
    network = models.create_model("custom/half").eval()
    x, _ = imagesets.stack(datasets.get_dataset("digits_source", "test", mean_std=HALF), 12)
    y, _ = imagesets.stack(datasets.get_dataset("digits", "test", mean_std=HALF), 12)
    with torch.no_grad():
        plain = component_rates.plain_rates(network, x, y)  # (blocks, components, pairs)
    by_hand = plain.mean(dim=(0, 2))
    measured = own.groupby("component", observed=True)["rate"].mean()
    for index, component in enumerate(plasticity.COMPONENTS):
        assert measured[component] == pytest.approx(by_hand[index].item(), rel=1e-4)
    with pytest.raises(ValueError, match="imagenet, model"):
        plasticity.Measurement(normalize="own")


# --------------------------------------------------------------------------------------------
# the decoded cache of a model above 224


def test_cache_side_keeps_the_models_resolution():
    # 225 * 256 / 224 = 257.1
    assert [loader.cache_side(s) for s in (32, 224, 225, 384, 448)] == [256, 256, 258, 439, 512]
    with pytest.raises(ValueError, match="positive integer"):
        loader.cache_side(0)


def test_a_model_above_224_trains_on_images_cached_at_its_resolution(home, small):
    vit = models.create_model(
        "vit_demo_patch4_32",
        pretrained=False,
        img_size=240,
        patch_size=40,
        embed_dim=16,
        depth=1,
        num_heads=2,
        num_classes=2,
    )
    models.save_model(
        vit, "custom/big", model_args=dict(img_size=240, patch_size=40, embed_dim=16, depth=1, num_heads=2)
    )
    fixtures.write_image_folder(home / "data" / "custom" / "photos", ["a", "b"], per_class=6, size=(300, 320))
    metrics = finetune.run(
        small(**{**LN2, "steps": 2, "warmup": 0}, model="custom/big", dataset="custom/photos", batch_size=4)
    )
    assert metrics["status"] == "finished"
    cached = {p.name.split("-")[0] for p in (home / "data" / "cache").rglob("*.npy")}
    assert cached == {"275short"}  # ceil(240 * 256 / 224), not 256
