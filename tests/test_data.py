import random

import numpy as np
import pytest
import torch

from paperlib.data import datasets, imagesets, splits, transforms
from paperlib.data.corruptions import CORRUPTIONS


def _disturb_global_rngs():
    random.seed(123)
    np.random.seed(123)
    torch.manual_seed(123)
    np.random.rand(1000)
    torch.rand(1000)


def test_deterministic_split_is_the_authors_seed_42_permutation():
    # the authors' code: np.random.seed(42), np.random.permutation(range(n)), the first int(0.8 n) for training
    for n in (10, 1000, 2001, 48833):
        np.random.seed(42)
        order = np.random.permutation(range(n))
        n_train = int(0.8 * n)
        _disturb_global_rngs()
        state = np.random.get_state()[1].copy()
        train, test = splits.deterministic_split(n)
        assert np.array_equal(np.random.get_state()[1], state)  # global state neither read nor changed
        assert train.tolist() == sorted(order[:n_train]) and test.tolist() == sorted(order[n_train:])
    # numpy's legacy permutation of 10 under seed 42 is a fixed fact: 8 1 5 0 7 2 9 4 | 3 6
    assert splits.deterministic_split(10)[1].tolist() == [3, 6]


def test_validation_split_is_random_split_under_the_runs_seed():
    dataset = list(range(737))
    for seed in (0, 42, 3407):
        torch.manual_seed(seed)  # the authors: set_seed(seed), then random_split with the global generator
        train_part, val_part = torch.utils.data.random_split(dataset, [int(0.8 * 737), 737 - int(0.8 * 737)])
        _disturb_global_rngs()
        train, val = splits.validation_split(737, seed)
        assert train.tolist() == sorted(train_part.indices)
        assert val.tolist() == list(val_part.indices) != sorted(val_part.indices)  # the permutation's order
    assert splits.validation_split(737, 0)[1].tolist() != splits.validation_split(737, 42)[1].tolist()


def test_validation_batches_are_the_authors_batch_by_batch():
    """Their ``random_split`` of the training set under the run's seed, read by a loader that does not shuffle, in
    batches of 32: each batch holds the images (keys) and labels the package's validation split holds there, as the
    run's loader yields them."""
    from paperlib.data import datasets
    from paperlib.train import finetune
    from paperlib.train.config import Config
    from paperlib.vit import models

    whole = datasets.read_split("digits", "trainval")
    for seed in (0, 42, 3407):
        torch.manual_seed(seed)
        n_train = int(0.8 * len(whole))
        _, val_part = torch.utils.data.random_split(list(range(len(whole))), [n_train, len(whole) - n_train])
        theirs = list(torch.utils.data.DataLoader(val_part, batch_size=32, shuffle=False, drop_last=False))
        _disturb_global_rngs()
        ours = datasets.read_split("digits", "val", seed=seed)
        assert len(theirs) == -(-len(ours) // 32) > 1 and len(ours) % 32  # a last partial batch
        config = Config(seed=seed)
        size = models.architecture(config.model).patch_embed.img_size[0]
        loaders, _ = finetune._loaders(config, datasets.read_splits("digits", seed=seed), size, torch.device("cpu"))
        labels = torch.cat([labels for _, labels in loaders["val"]])  # in the order the run evaluates them
        for k, batch in enumerate(theirs):
            positions = batch.tolist()
            assert ours.keys[32 * k : 32 * (k + 1)] == [whole.keys[i] for i in positions]
            assert labels[32 * k : 32 * (k + 1)].tolist() == whole.targets[positions].tolist()


def test_hash_split_ignores_global_random_state_and_is_not_a_prefix_split():
    keys = list(range(1000))
    first = splits.hash_split(keys)
    _disturb_global_rngs()
    second = splits.hash_split(keys)
    assert all(np.array_equal(a, b) for a, b in zip(first, second))
    train, test = first
    assert len(test) == 200 and len(train) == 800
    assert not set(train) & set(test) and set(train) | set(test) == set(keys)
    assert test.min() < 100 and test.max() > 900  # spread over the whole set, not its tail


def test_splits_reject_bad_fractions():
    with pytest.raises(ValueError, match="test_fraction"):
        splits.hash_split([1, 2, 3], test_fraction=1.5)
    with pytest.raises(ValueError, match="train_fraction"):
        splits.deterministic_split(3, train_fraction=0.0)


def _identity(dataset):
    """Image bytes identify samples across datasets."""
    return {bytes(image.numpy()) for image in dataset.images}


def test_dataset_splits_are_deterministic_and_disjoint():
    train = datasets.get_dataset("digits", "trainval")
    test = datasets.get_dataset("digits", "test")
    _disturb_global_rngs()
    datasets.digits_images.cache_clear()  # rebuild from scratch under the disturbed state
    again = datasets.get_dataset("digits", "test")
    assert torch.equal(test.images, again.images) and torch.equal(test.targets, again.targets)
    assert not _identity(train) & _identity(test)
    assert len(train) + len(test) == 896  # the digits 5-9 of scikit-learn
    assert len(datasets.get_dataset("digits", "val")) + len(datasets.get_dataset("digits", "train")) == len(train)


def test_source_and_downstream_halves_are_disjoint():
    source = datasets.get_dataset("digits_source", "train")
    downstream = datasets.get_dataset("digits", "train")
    assert not _identity(source) & _identity(downstream)
    # the halves split the classes: 0-4 for pretraining, 5-9 downstream, both relabelled 0-4
    assert source.classes == ["0", "1", "2", "3", "4"] and downstream.classes == ["5", "6", "7", "8", "9"]
    assert set(source.targets.tolist()) == set(downstream.targets.tolist()) == set(range(5))


def test_items_are_normalised_chw_tensors_with_int_labels():
    dataset = datasets.get_dataset("digits_source", "test")
    image, label = dataset[0]
    assert image.shape == (3, 32, 32) and image.dtype == torch.float32 and isinstance(label, int)
    raw = dataset.images[0].float() / 255
    mean, std = torch.tensor(transforms.MEAN).view(3, 1, 1), torch.tensor(transforms.STD).view(3, 1, 1)
    assert torch.allclose(image * std + mean, raw, atol=1e-6)
    batch, labels = dataset.tensors()
    assert batch.shape == (len(dataset), 3, 32, 32) and torch.equal(batch[0], image)


@pytest.mark.parametrize("corruption", CORRUPTIONS)
def test_corrupted_sets_pair_with_the_clean_set(corruption):
    clean = datasets.get_dataset("digits", "test")
    corrupted = datasets.get_dataset(f"digits_c/{corruption}", "test")
    _disturb_global_rngs()
    datasets._corrupted.cache_clear()
    assert torch.equal(datasets.get_dataset(f"digits_c/{corruption}", "test").images, corrupted.images)
    assert corrupted.images.shape == clean.images.shape and corrupted.images.dtype == torch.uint8
    assert torch.equal(corrupted.targets, clean.targets)
    assert not torch.equal(corrupted.images, clean.images)


def test_bad_names_and_splits_list_the_valid_ones():
    with pytest.raises(ValueError, match="valid datasets: digits_source, digits, digits_c/contrast"):
        datasets.get_dataset("cifar10-c", "train")
    with pytest.raises(ValueError, match="valid splits: train, val, test, trainval"):
        datasets.get_dataset("digits", "validation")
    with pytest.raises(ValueError, match="expected uint8 images"):
        imagesets.ImageDataset(torch.zeros(2, 32, 32, 3), torch.zeros(2), ["a"], "x", "train")


def test_stack_returns_the_first_items():
    dataset = datasets.get_dataset("digits", "test")
    images, labels = imagesets.stack(dataset, 10, batch_size=4)
    assert images.shape == (10, 3, 32, 32) and torch.equal(labels, dataset.targets[:10])
    assert torch.equal(images[7], dataset[7][0])
    with pytest.raises(ValueError, match="n must be in 1..179"):
        imagesets.stack(dataset, 500)
