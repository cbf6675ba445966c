"""Linear probing as the authors compute it (Table 6, last column), on the demo world: the last
block's MHA point against the recipe written out here by hand, every block and point, the cache,
clear errors, and hooks that do not outlive the call; on image files in DomainNet's layout, the
augmented training crops against torchvision's cut from each full-resolution image."""

import dataclasses

import numpy as np
import pytest
import timm
import torch
from PIL import Image
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from torchvision.transforms import RandomResizedCrop, v2
from torchvision.transforms.v2 import functional as F

from paperlib.data import augmented, datasets, fixtures
from paperlib.data.imagesets import stack
from paperlib.measure import probe, probe_features
from paperlib.records import paths, probe_tables
from paperlib.records.names import SPLITS_VERSION
from paperlib.vit import models

DEMO_DEPTH = models.DEMO_ARGS["depth"]


@pytest.fixture(scope="module")
def full(tmp_path_factory):
    """Every block and point of the demo ViT on ``digits``, computed once, and its results root."""
    root = tmp_path_factory.mktemp("probe_results")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VIT_PLASTICITY_RESULTS", str(root))
        torch.manual_seed(0)
        return probe.linear_probe(probe.Probe("demo", "digits")), root


def _hooks(model: torch.nn.Module) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


def test_last_block_mha_is_the_authors_recipe_computed_independently(results):
    clean = probe.linear_probe(probe.Probe("demo", "digits", points="mha", blocks=-1, train_features="clean"))
    got = clean["accuracy"].item()

    # the recipe by hand: the pretrained model, the hidden representation after the last block's
    # attention, tokens mean-pooled, unit L2 norm per image, StandardScaler, LogisticRegression(5000),
    # fitted on the 80% training split (the protocol's train split, seed 0; centre crops), scored on the test split
    model = models.create_model("demo").eval()
    captured = []
    handle = model.blocks[-1].attn.register_forward_hook(lambda _m, _i, out: captured.append(out))
    features, labels = {}, {}
    try:
        for split in ("train", "test"):
            images, targets = stack(datasets.get_dataset("digits", split, seed=0))
            captured.clear()
            with torch.no_grad():
                model(images)
            pooled = torch.cat(captured).mean(dim=1).numpy()
            features[split] = pooled / np.linalg.norm(pooled, axis=1, keepdims=True)
            labels[split] = targets.numpy()
    finally:
        handle.remove()
    classifier = make_pipeline(StandardScaler(), LogisticRegression(max_iter=5000))
    expected = classifier.fit(features["train"], labels["train"]).score(features["test"], labels["test"])

    n_test = len(labels["test"])
    assert features["train"].shape == (573, 64) and n_test == 179
    assert abs(got - expected) <= 1 / n_test + 1e-12, (got, expected)


def test_augmented_training_features_are_the_authors_loader_one_epoch(results):
    # one random crop and flip per image, shuffled, batches of 512 with the last incomplete one dropped
    model = models.create_model("demo").eval()
    train = datasets.get_dataset("digits", "train", seed=0)
    wanted = [(DEMO_DEPTH - 1, "mha")]
    first, labels = probe_features.pooled_features(model, train, wanted, augment_seed=0)
    again, labels_again = probe_features.pooled_features(model, train, wanted, augment_seed=0)
    other, other_labels = probe_features.pooled_features(model, train, wanted, augment_seed=42)
    clean, clean_labels = probe_features.pooled_features(model, train, wanted)
    assert len(train) == 573 and first[wanted[0]].shape == (512, 64) and len(clean_labels) == 573
    assert np.array_equal(first[wanted[0]], again[wanted[0]]) and np.array_equal(labels, labels_again)
    assert not np.array_equal(labels, other_labels)  # another order from another seed
    # shuffled: not the first 512 images in order; every label is a training image's
    assert not np.array_equal(labels, clean_labels[:512])
    assert set(np.unique(labels)) <= set(np.unique(clean_labels))
    assert (np.bincount(labels, minlength=5) <= np.bincount(clean_labels, minlength=5)).all()
    # augmented crops are not the centre crops: no augmented feature equals a clean one
    distances = np.linalg.norm(first[wanted[0]][:, None] - clean[wanted[0]][None], axis=-1)
    assert distances.min() > 1e-4
    # a set smaller than a batch is one batch of all it has
    small = train.subset(list(range(100)), "train")
    features, small_labels = probe_features.pooled_features(model, small, wanted, augment_seed=0)
    assert features[wanted[0]].shape == (100, 64) and sorted(small_labels) == sorted(small.targets.tolist())
    with pytest.raises(ValueError, match="train_features"):
        probe.Probe("demo", "digits", points="mha", blocks=-1, train_features="centre")


def test_every_block_and_point_with_accuracies_above_chance_at_the_end(full):
    table, _ = full
    assert list(table.columns) == ["block", "point", "accuracy"]
    assert len(table) == DEMO_DEPTH * len(probe_tables.POINTS)
    assert set(zip(table["block"], table["point"])) == {(b, p) for b in range(DEMO_DEPTH) for p in probe_tables.POINTS}
    assert table["accuracy"].between(0, 1).all()
    chance = 1 / len(datasets.get_dataset("digits", "test").classes)
    last = table[table["block"] == DEMO_DEPTH - 1]
    assert (last["accuracy"] > chance + 0.3).all(), last
    # forward order within a block
    assert list(table[table["block"] == 0]["point"]) == list(probe_tables.POINTS)


def test_the_cache_is_used_on_a_second_call(full, monkeypatch):
    table, root = full
    monkeypatch.setenv("VIT_PLASTICITY_RESULTS", str(root))
    folder = root / "probe" / "demo" / "digits"
    assert folder == probe.Probe("demo", "digits").folder()
    assert (folder / "probe.csv").is_file() and (folder / "metadata.json").is_file()

    def fail(*args, **kwargs):
        raise AssertionError("the model ran although the table is cached")

    create = models.create_model

    def architecture_only(name, pretrained=True, **kwargs):  # the architecture (depth) is read, no weights
        return create(name, pretrained=False, **kwargs) if not pretrained else fail()

    monkeypatch.setattr(timm.models.vision_transformer.VisionTransformer, "forward", fail)
    monkeypatch.setattr(models, "create_model", architecture_only)
    stamp = (folder / "probe.csv").stat().st_mtime_ns
    again = probe.linear_probe(probe.Probe("demo", "digits"))
    assert again.equals(table)
    assert (folder / "probe.csv").stat().st_mtime_ns == stamp
    # a part of the cached table is cached too
    part = probe.linear_probe(probe.Probe("demo", "digits", points="mha", blocks=-1))
    assert (
        len(part) == 1
        and part["accuracy"].item() == again.iloc[(DEMO_DEPTH - 1) * len(probe_tables.POINTS) + 1]["accuracy"]
    )
    column = probe.table6_column("demo", ["digits"])
    assert list(column.columns) == ["dataset", "accuracy"]
    assert column["accuracy"].item() == pytest.approx(100 * part["accuracy"].item())
    # reading only: a cached probe is read, one not cached is left out (nothing fitted)
    assert probe.table6_column("demo", ["digits"], compute=False).equals(column)
    assert probe.linear_probe(probe.Probe("demo", "digits_c/snow", points="mha", blocks=-1), compute=False) is None
    assert probe.table6_column("demo", ["digits_c/snow", "digits"], compute=False).equals(column)


def test_missing_points_are_added_to_the_cache(monkeypatch):
    first = probe.linear_probe(probe.Probe("demo", "digits", points="mha", blocks=-1))
    calls = []
    fit = probe.fit_probe
    monkeypatch.setattr(probe, "fit_probe", lambda *a, **k: calls.append(a) or fit(*a, **k))
    both = probe.linear_probe(probe.Probe("demo", "digits", points=("mha", "block"), blocks=-1))
    assert len(calls) == 1  # only the missing point was fitted
    assert both["point"].tolist() == ["mha", "block"]
    assert both["accuracy"].iloc[0] == first["accuracy"].item()
    cached, metadata = probe_tables.load(probe.Probe("demo", "digits").folder())
    # the authors' training features: one batch of 512 of the 573 training images (drop_last)
    assert len(cached) == 2 and metadata["n_train"] == 512 and metadata["n_test"] == 179


def test_a_module_is_cached_only_under_a_name_and_its_hooks_are_removed(results):
    model = models.create_model("demo")
    model.train()
    table = probe.linear_probe(probe.Probe(model, "digits", points=("ln1", "fc1", "gelu"), blocks=[0, -1]))
    assert table[["block", "point"]].astype(str).values.tolist() == [
        ["0", "ln1"], ["0", "fc1"], ["0", "gelu"], ["5", "ln1"], ["5", "fc1"], ["5", "gelu"]
    ]  # fmt: skip
    assert _hooks(model) == 0
    assert model.training  # its mode restored
    assert not (results / "probe").exists()
    probe.linear_probe(probe.Probe(model, "digits", points="mha", blocks=-1, name="my_vit"))
    assert (results / "probe" / "my_vit" / "digits" / "probe.csv").is_file()


def test_hooks_are_removed_when_the_forward_pass_fails(monkeypatch):
    model = models.create_model("demo")

    def fail(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(model.head, "forward", fail)
    with pytest.raises(RuntimeError, match="boom"):
        probe.linear_probe(probe.Probe(model, "digits", points="mha", blocks=-1))
    assert _hooks(model) == 0


def test_pooled_features_are_unit_vectors_of_each_point_width():
    model = models.create_model("demo")
    dataset = datasets.get_dataset("digits", "test")
    wanted = [(0, p) for p in probe_tables.POINTS]
    features, labels = probe_features.pooled_features(model, dataset, wanted)
    assert labels.tolist() == dataset.targets.tolist()
    hidden = model.blocks[0].mlp.fc1.out_features
    for (_, point), values in features.items():
        assert values.shape == (len(dataset), hidden if point in ("fc1", "gelu") else 64), point
        assert np.allclose(np.linalg.norm(values, axis=1), 1, atol=1e-5)
    # the residual stream after attention is the block's input plus the attention's output
    images, _ = stack(dataset)
    with torch.no_grad():
        tokens = model._pos_embed(model.patch_embed(images))
        block = model.blocks[0]
        residual = tokens + block.attn(block.norm1(tokens))
    pooled = residual.mean(dim=1).numpy()
    assert np.allclose(features[0, "attn_residual"], pooled / np.linalg.norm(pooled, axis=1, keepdims=True), atol=1e-5)


def test_the_fc1_point_of_a_swiglu_block_is_its_gate_and_value_layers():
    torch.manual_seed(0)
    model = timm.create_model(
        "vit_7b_patch16_dinov3", pretrained=False, num_classes=5, img_size=32, patch_size=4, embed_dim=64, depth=2,
        num_heads=4,
    )  # fmt: skip
    features, _ = probe_features.pooled_features(
        model, datasets.get_dataset("digits", "test"), [(1, "fc1"), (1, "gelu")]
    )
    mlp = model.blocks[1].mlp
    assert features[1, "fc1"].shape[1] == mlp.fc1_g.out_features + mlp.fc1_x.out_features
    assert features[1, "gelu"].shape[1] == mlp.fc1_g.out_features


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"points": "attention"}, "valid points: ln1, mha, attn_residual, ln2, fc1, gelu, fc2, block"),
        ({"points": ("mha", "lnx")}, "valid points: ln1, mha"),
        ({"blocks": 6}, "the model has 6 blocks"),
        ({"pool": "max"}, "valid choices: mean, patches, cls"),
        ({"train_split": "val"}, "valid choices: train, trainval"),
        ({"normalize": "cifar"}, "valid choices: imagenet, model"),
    ],
)
def test_bad_arguments_name_the_valid_choices(kwargs, message, monkeypatch):
    monkeypatch.setattr(probe, "pooled_features", lambda *a, **k: pytest.fail("work started before the check"))
    with pytest.raises(ValueError, match=message):
        probe.Probe("demo", "digits", **kwargs)
    with pytest.raises(ValueError, match=message):  # the notebooks' entry, options by keyword
        probe.probe_datasets("demo", ["digits"], **kwargs)


def test_a_bad_dataset_names_the_valid_datasets():
    with pytest.raises(ValueError, match="valid datasets: digits_source, digits"):
        probe.Probe("demo", "digitz")
    with pytest.raises(ValueError, match="valid points"):
        probe.table6_column("demo", ["digits"], point="attn")
    with pytest.raises(TypeError, match="batch"):  # neither a field of Probe nor a keyword of linear_probe
        probe.probe_datasets("demo", ["digits"], batch=8)


def test_a_probe_is_a_value_holding_the_blocks_and_points_it_selects():
    last = probe.Probe("demo", "digits", points=("block", "mha"), blocks=-1)
    assert last == probe.Probe("demo", "digits", points=["mha", "block"], blocks=[DEMO_DEPTH - 1])
    assert last.points == ("mha", "block") and last.blocks == (DEMO_DEPTH - 1,) and last.name == "demo"
    assert last.wanted() == [(DEMO_DEPTH - 1, "mha"), (DEMO_DEPTH - 1, "block")]
    assert probe.Probe("demo", "digits").blocks == tuple(range(DEMO_DEPTH))
    assert len({last, probe.Probe("demo", "digits", points="mha", blocks=-1), last}) == 2
    with pytest.raises(dataclasses.FrozenInstanceError):
        last.pool = "cls"
    assert last.augment_seed == 0 and probe.Probe("demo", "digits", train_features="clean").augment_seed is None
    module = models.create_model("demo", pretrained=False)
    assert probe.Probe(module, "digits").folder() is None  # a module without a name is not cached
    with pytest.raises(ValueError, match="is for a module"):
        probe.Probe("demo", "digits", name="my_vit")
    with pytest.raises(ValueError, match="invalid custom model name"):
        probe.Probe(module, "digits", name="custom/my vit")


def test_the_cache_key_is_what_a_table_is_computed_from(tmp_path):
    # written out from the key's documented fields: tables cached before keep being found
    mean, std = models.normalization("demo", "model")
    other = probe.Probe(
        "demo", "digits_c/snow", points="mha", blocks=-1, pool="cls", train_split="trainval", split_seed=42,
        normalize="model",
    )  # fmt: skip
    assert other.key() == {
        "model": "demo", "dataset": "digits_c/snow", "split_seed": 42, "train_split": "trainval",
        "train_features": "augmented", "crops": "full_image", "splits": SPLITS_VERSION, "pool": "cls",
        "normalize": "model", "mean": list(mean), "std": list(std), "model_fingerprint": None,
        "data_fingerprint": None,
    }  # fmt: skip
    # centre-cropped training features: no crops; a named module: its name, no saved model's fingerprint
    module = models.create_model("demo", pretrained=False)
    assert probe.Probe(module, "digits", train_features="clean", name="my_vit").key() == {
        "model": "my_vit", "dataset": "digits", "split_seed": 0, "train_split": "train", "train_features": "clean",
        "splits": SPLITS_VERSION, "pool": "mean", "normalize": "imagenet", "mean": [0.485, 0.456, 0.406],
        "std": [0.229, 0.224, 0.225], "model_fingerprint": None, "data_fingerprint": None,
    }  # fmt: skip
    # a custom dataset: the digest of its files under the probe's data root
    fixtures.write_image_folder(tmp_path / "custom" / "mine", ["a", "b"], per_class=2, size=(8, 8))
    custom = probe.Probe("demo", "custom/mine", root=tmp_path)
    assert custom.root == str(tmp_path)
    assert custom.key()["data_fingerprint"] == paths.dataset_fingerprint("custom/mine", tmp_path) is not None


def test_result_folders_keep_other_choices_apart():
    base = paths.results_dir() / "probe" / "demo"
    assert probe.Probe("demo", "digits_c/snow").folder() == base / "digits_c" / "snow"
    assert probe.Probe("demo", "digits", split_seed=42).folder() == base / "digits+seed-42"
    assert probe.Probe("demo", "digits", train_split="trainval").folder() == base / "digits+trainval"
    assert probe.Probe("demo", "digits", pool="cls", normalize="model").folder() == base / "digits+pool-cls+norm-model"
    assert probe.Probe("demo", "digits", train_features="clean").folder() == base / "digits+clean"
    # the seed in the folder where it draws the training images: the 80% split, or the augmented crops
    trainval = {"train_split": "trainval", "split_seed": 42}
    assert probe.Probe("demo", "digits", **trainval).folder() == base / "digits+trainval+seed-42"
    assert probe.Probe("demo", "digits", train_features="clean", **trainval).folder() == base / "digits+trainval+clean"
    clean = probe.Probe("demo", "digits", split_seed=42, train_features="clean")
    assert clean.folder() == base / "digits+seed-42+clean"
    assert probe.Probe("demo", "digits", name=None).folder() == base / "digits"


# --------------------------------------------------------------------------------------------
# Augmented training features: crops of each image at its full resolution, as torchvision cuts them

FULL = (360, 280)  # width, height of the test's image files: larger than the decoded cache (shorter side 256)


@pytest.fixture
def clipart(tmp_path):
    """The training split of a small DomainNet clipart in its official layout, images of ``FULL``."""
    root = tmp_path / "data"
    classes = [f"class_{i:03d}" for i in range(3)]
    fixtures.write_image_folder(root / "domainnet" / "clipart", classes, per_class=5, size=FULL)
    return datasets.get_dataset("domainnet/clipart", "train", root=root)


def test_augmented_crops_are_torchvision_crops_of_the_full_resolution_image(clipart, monkeypatch):
    seed, size = 3, 32
    seen = []  # the size of every image that RandomResizedCrop draws a box in
    draw = v2.RandomResizedCrop.make_params
    monkeypatch.setattr(
        v2.RandomResizedCrop,
        "make_params",
        lambda self, inputs: seen.append(tuple(F.get_size(inputs[0]))) or draw(self, inputs),
    )
    state = torch.get_rng_state()
    (images, labels), *more = augmented.augmented_batches(clipart, size, torch.device("cpu"), seed)
    assert seen == [(FULL[1], FULL[0])] * len(clipart)  # boxes drawn in the full image, not in a 256-pixel copy
    assert not more  # one batch of all
    order = augmented.augmented_order(len(clipart), seed)
    assert sorted(order) == list(range(len(clipart))) and order != sorted(order)
    assert labels.tolist() == [int(clipart.targets[i]) for i in order]
    # each crop: torchvision's RandomResizedCrop box (its get_params, from the image's seeded generator)
    # and flip cut from the decoded file at its full resolution, resized bilinearly with antialiasing
    mean, std = clipart.mean_std
    flips, beyond_cache = [], []
    for position, index in enumerate(order):
        with Image.open(clipart.files[index]) as file:
            full = file.convert("RGB")
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(augmented.image_seed(seed, index))
            top, left, height, width = RandomResizedCrop.get_params(full, scale=[0.08, 1.0], ratio=[3 / 4, 4 / 3])
            flips.append(torch.rand(1).item() < 0.5)
        crop = F.resized_crop(F.pil_to_tensor(full), top, left, height, width, [size, size], antialias=True)
        crop = F.horizontal_flip(crop) if flips[-1] else crop
        expected = F.normalize(crop.float() / 255, list(mean), list(std))
        assert torch.allclose(images[position], expected, atol=1e-5), (position, index)
        beyond_cache.append(top + height > 256 or left + width > 256 * FULL[0] // FULL[1])
    assert 0 < sum(flips) < len(flips)  # flipped and not flipped both checked
    assert any(beyond_cache)  # some crops reach parts of the image a 256-pixel copy has no pixels of
    assert torch.equal(torch.get_rng_state(), state)  # the caller's random state untouched


def test_augmented_features_of_image_files_depend_on_the_seed_alone(clipart, tiny_vit):
    model = tiny_vit().eval()
    wanted = [(DEMO_DEPTH - 1, "mha")]
    first, labels = probe_features.pooled_features(model, clipart, wanted, augment_seed=0)
    torch.manual_seed(1234)  # another global random state, and workers that transform the images
    again, labels_again = probe_features.pooled_features(model, clipart, wanted, augment_seed=0, num_workers=2)
    other, _ = probe_features.pooled_features(model, clipart, wanted, augment_seed=42)
    assert first[wanted[0]].shape == (len(clipart), 64)  # fewer than a batch: one batch of all
    assert np.array_equal(first[wanted[0]], again[wanted[0]]) and np.array_equal(labels, labels_again)
    assert not np.allclose(first[wanted[0]], other[wanted[0]])


def test_a_table_cached_before_full_resolution_crops_is_computed_again(monkeypatch):
    first = probe.linear_probe(probe.Probe("demo", "digits", points="mha", blocks=-1))
    folder = probe.Probe("demo", "digits").folder()
    table, metadata = probe_tables.load(folder)
    assert metadata["key"]["crops"] == probe.AUGMENTED_CROPS == "full_image"
    # a table of the crops cut from the decoded cache: its key had no "crops"
    old = {name: value for name, value in metadata["key"].items() if name != "crops"}
    probe_tables.save(table.assign(accuracy=0.0), folder, {**metadata, "key": old})
    calls = []
    fit = probe.fit_probe
    monkeypatch.setattr(probe, "fit_probe", lambda *a, **k: calls.append(a) or fit(*a, **k))
    again = probe.linear_probe(probe.Probe("demo", "digits", points="mha", blocks=-1))
    assert len(calls) == 1 and again["accuracy"].item() == first["accuracy"].item() > 0
    assert probe_tables.load(folder)[1]["key"]["crops"] == "full_image"
    # centre-cropped training features have no random crops: their key records none
    clean = probe.Probe("demo", "digits", points="mha", blocks=-1, train_features="clean")
    assert len(probe.linear_probe(clean)) == 1
    assert "crops" not in probe_tables.load(clean.folder())[1]["key"]
