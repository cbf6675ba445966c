import random

import numpy as np
import pytest
import torch

from paperlib import data, imagesets, transforms
from paperlib.corruptions import CORRUPTIONS


def _disturb_global_rngs():
    random.seed(123)
    np.random.seed(123)
    torch.manual_seed(123)
    np.random.rand(1000)
    torch.rand(1000)


def test_deterministic_split_ignores_global_random_state():
    keys = list(range(1000))
    first = data.deterministic_split(keys)
    _disturb_global_rngs()
    second = data.deterministic_split(keys)
    assert all(np.array_equal(a, b) for a, b in zip(first, second))
    train, test = first
    assert len(test) == 200 and len(train) == 800
    assert not set(train) & set(test) and set(train) | set(test) == set(keys)


def test_deterministic_split_is_not_a_prefix_split():
    train, test = data.deterministic_split(list(range(1000)))
    assert test.min() < 100 and test.max() > 900  # spread over the whole set, not its tail


def test_split_rejects_bad_fraction():
    with pytest.raises(ValueError, match="test_fraction"):
        data.deterministic_split([1, 2, 3], test_fraction=1.5)


def _identity(dataset):
    """Image bytes identify samples across datasets."""
    return {bytes(image.numpy()) for image in dataset.images}


def test_dataset_splits_are_deterministic_and_disjoint():
    train = data.get_dataset("digits", "trainval")
    test = data.get_dataset("digits", "test")
    _disturb_global_rngs()
    data.digits_images.cache_clear()  # rebuild from scratch under the disturbed state
    again = data.get_dataset("digits", "test")
    assert torch.equal(test.images, again.images) and torch.equal(test.targets, again.targets)
    assert not _identity(train) & _identity(test)
    assert len(train) + len(test) == 896  # the digits 5-9 of scikit-learn
    assert len(data.get_dataset("digits", "val")) + len(data.get_dataset("digits", "train")) == len(train)


def test_source_and_downstream_halves_are_disjoint():
    source = data.get_dataset("digits_source", "train")
    downstream = data.get_dataset("digits", "train")
    assert not _identity(source) & _identity(downstream)
    # the halves split the classes: 0-4 for pretraining, 5-9 downstream, both relabelled 0-4
    assert source.classes == ["0", "1", "2", "3", "4"] and downstream.classes == ["5", "6", "7", "8", "9"]
    assert set(source.targets.tolist()) == set(downstream.targets.tolist()) == set(range(5))


def test_items_are_normalised_chw_tensors_with_int_labels():
    dataset = data.get_dataset("digits_source", "test")
    image, label = dataset[0]
    assert image.shape == (3, 32, 32) and image.dtype == torch.float32 and isinstance(label, int)
    raw = dataset.images[0].float() / 255
    mean, std = torch.tensor(transforms.MEAN).view(3, 1, 1), torch.tensor(transforms.STD).view(3, 1, 1)
    assert torch.allclose(image * std + mean, raw, atol=1e-6)
    batch, labels = dataset.tensors()
    assert batch.shape == (len(dataset), 3, 32, 32) and torch.equal(batch[0], image)


@pytest.mark.parametrize("corruption", CORRUPTIONS)
def test_corrupted_sets_pair_with_the_clean_set(corruption):
    clean = data.get_dataset("digits", "test")
    corrupted = data.get_dataset(f"digits_c/{corruption}", "test")
    _disturb_global_rngs()
    data._corrupted.cache_clear()
    assert torch.equal(data.get_dataset(f"digits_c/{corruption}", "test").images, corrupted.images)
    assert corrupted.images.shape == clean.images.shape and corrupted.images.dtype == torch.uint8
    assert torch.equal(corrupted.targets, clean.targets)
    assert not torch.equal(corrupted.images, clean.images)


def test_bad_names_and_splits_list_the_valid_ones():
    with pytest.raises(ValueError, match="valid datasets: digits_source, digits, digits_c/contrast"):
        data.get_dataset("cifar10-c", "train")
    with pytest.raises(ValueError, match="valid splits: train, val, test, trainval"):
        data.get_dataset("digits", "validation")
    with pytest.raises(ValueError, match="expected uint8 images"):
        imagesets.ImageDataset(torch.zeros(2, 32, 32, 3), torch.zeros(2), ["a"], "x", "train")


def test_stack_returns_the_first_items():
    dataset = data.get_dataset("digits", "test")
    images, labels = imagesets.stack(dataset, 10, batch_size=4)
    assert images.shape == (10, 3, 32, 32) and torch.equal(labels, dataset.targets[:10])
    assert torch.equal(images[7], dataset[7][0])
    with pytest.raises(ValueError, match="n must be in 1..179"):
        imagesets.stack(dataset, 500)
