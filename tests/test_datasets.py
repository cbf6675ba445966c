"""The paper's datasets, read from tiny fixtures written in their official on-disk formats."""

import socket

import numpy as np
import pytest
import torch

from paperlib.data import datasets, fixtures
from paperlib.data.corruptions import CORRUPTIONS
from paperlib.data.transforms import paper_transform


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    """Any attempt to open a connection fails the test."""

    def refuse(*args, **kwargs):
        raise AssertionError("a test tried to use the network")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return fixtures.write_all(tmp_path_factory.mktemp("data"))


# official (trainval, test) sizes of the fixtures, from the writers' arguments
SIZES = {
    "cifar10": (60, 20),
    "cifar100": (200, 50),
    **{f"cifar10c/{c}": (40, 10) for c in CORRUPTIONS},  # 50 images per severity, 80/20
    "domainnet/clipart": (16, 4),  # 4 classes x 5 images, 80/20
    "domainnet/sketch": (16, 4),
    "flowers102": (20, 10),  # 30 images: a third train, a third val (official, together trainval), a third test
    "pets": (12, 6),  # 3 breeds x 6 images: 4 trainval + 2 test each
    "imagenet": (12, 12),  # 3 classes x 4 images, train and val folders
    "imagenette": (20, 20),  # 10 classes x 2 images
}
N_CLASSES = {
    "cifar10": 10,
    "cifar100": 100,
    "domainnet/clipart": 4,
    "domainnet/sketch": 4,
    "flowers102": 102,
    "pets": 3,
    "imagenet": 3,
    "imagenette": 10,
}


def test_every_paper_and_reference_dataset_is_covered():
    assert set(SIZES) == set(datasets.dataset_names("paper")) | set(datasets.dataset_names("reference"))
    assert len(datasets.PAPER_DATASETS) == 11  # appendix C.2


@pytest.mark.parametrize("name", list(SIZES))
def test_sizes_labels_and_items(root, name):
    trainval, test = SIZES[name]
    sets = {split: datasets.get_dataset(name, split, root=root) for split in datasets.SPLITS}
    assert len(sets["trainval"]) == trainval and len(sets["test"]) == test
    n_train = trainval // 2 if name == "flowers102" else int(0.8 * trainval)  # Flowers102: the official val split
    assert len(sets["train"]) == n_train and len(sets["val"]) == trainval - n_train
    n_classes = N_CLASSES.get(name, 10)
    for dataset in sets.values():
        assert len(dataset.classes) == n_classes
        assert 0 <= int(dataset.targets.min()) and int(dataset.targets.max()) < n_classes
    image, label = sets["test"][0]
    assert image.shape == (3, 224, 224) and image.dtype == torch.float32 and isinstance(label, int)


@pytest.mark.parametrize("name", list(SIZES))
def test_val_split_is_deterministic_disjoint_and_seeded(root, name):
    train = datasets.get_dataset(name, "train", root=root)
    val = datasets.get_dataset(name, "val", root=root)
    trainval = datasets.get_dataset(name, "trainval", root=root)
    np.random.seed(5)
    torch.manual_seed(5)
    assert datasets.get_dataset(name, "val", root=root).keys == val.keys
    assert not set(train.keys) & set(val.keys)
    assert set(train.keys) | set(val.keys) == set(trainval.keys)
    test = datasets.get_dataset(name, "test", root=root)
    if name.startswith(("cifar10c", "domainnet")):  # no official split: ours must not overlap
        assert not set(test.keys) & set(trainval.keys)
    other_seeds = [datasets.get_dataset(name, "val", root=root, seed=s).keys for s in (42, 3407)]
    if name == "flowers102":  # its official validation split, the same for every seed
        assert all(keys == val.keys for keys in other_seeds)
    else:
        assert any(keys != val.keys for keys in other_seeds)


def test_flowers102_uses_the_official_validation_split(root):
    from scipy.io import loadmat

    setid = loadmat(root / "flowers-102" / "setid.mat", squeeze_me=True)
    ids = {split: datasets.get_dataset("flowers102", split, root=root).keys for split in datasets.SPLITS}
    assert ids["train"] == setid["trnid"].tolist() and ids["val"] == setid["valid"].tolist()
    assert ids["test"] == setid["tstid"].tolist() and ids["trainval"] == ids["train"] + ids["val"]
    # the paper's words instead: 20% of the official training images, drawn from the seed
    paper = {
        split: datasets.read_split("flowers102", split, root=root, validation="fraction").keys
        for split in datasets.SPLITS
    }
    assert sorted(paper["train"] + paper["val"]) == sorted(setid["trnid"].tolist()) == sorted(paper["trainval"])
    assert len(paper["val"]) == 10 - int(0.8 * 10) and paper["test"] == ids["test"]
    with pytest.raises(ValueError, match="valid choices: official, fraction"):
        datasets.read_split("flowers102", "val", root=root, validation="paper")


def test_no_official_split_is_the_authors_seed_42_permutation(root):
    np.random.seed(42)  # the authors' deterministic_split, over the 50 images of one severity in file order
    order = np.random.permutation(range(50))
    cifar10c = datasets.get_dataset("cifar10c/contrast", "test", root=root)
    assert cifar10c.keys == sorted(order[int(0.8 * 50) :].tolist())
    # the fixture marks pixel (0, 0, 0) of image i with i: the test images are those, in file order
    assert cifar10c.images[:, 0, 0, 0].tolist() == cifar10c.keys
    np.random.seed(42)  # DomainNet: the 20 files of the domain in ImageFolder order (class, then file name)
    order = np.random.permutation(range(20))
    folder = root / "domainnet" / "clipart"
    files = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*.jpg"))
    test = [files[i] for i in sorted(order[int(0.8 * 20) :])]
    assert datasets.get_dataset("domainnet/clipart", "test", root=root).keys == test


def test_cifar10c_severity_selects_its_block(root):
    for severity in (1, 5):
        dataset = datasets.get_dataset("cifar10c/snow", "test", root=root, severity=severity)
        # the fixture fills severity s with value 40 * s (pixel 0, 0, 0 carries an index mark)
        assert int(dataset.images[0, 1, 5, 5]) == 40 * severity
    with pytest.raises(ValueError, match="severity must be one of"):
        datasets.get_dataset("cifar10c/snow", "test", root=root, severity=0)


def test_cifar10c_split_is_shared_by_all_corruptions(root):
    keys = {c: datasets.get_dataset(f"cifar10c/{c}", "test", root=root).keys for c in CORRUPTIONS}
    assert len({tuple(k) for k in keys.values()}) == 1


def test_cifar_reads_the_pickled_batches_exactly(root):
    import pickle

    dataset = datasets.get_dataset("cifar10", "test", root=root)
    with open(root / "cifar-10-batches-py" / "test_batch", "rb") as handle:
        entry = pickle.load(handle, encoding="latin1")  # Python 2's strings, as in the official files
    assert torch.equal(dataset.images.reshape(len(dataset), -1), torch.from_numpy(entry["data"]))
    assert dataset.targets.tolist() == entry["labels"] and dataset.classes[0] == "class_0"


def test_augmented_items_vary_and_resolution_is_a_parameter(root):
    # the training transform is set on the dataset get_dataset returns
    dataset = datasets.get_dataset("cifar10", "train", root=root, image_size=64)
    dataset.transform = paper_transform(True, 64, dataset.mean_std)
    torch.manual_seed(0)
    first = dataset[0][0]
    assert first.shape == (3, 64, 64)
    assert any(not torch.equal(first, dataset[0][0]) for _ in range(5))


MISSING = {
    "cifar10": ("cifar-10-batches-py", "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"),
    "cifar100": ("cifar-100-python", "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz"),
    "cifar10c/contrast": ("CIFAR-10-C/contrast.npy", "https://zenodo.org/record/2535967/files/CIFAR-10-C.tar"),
    "domainnet/clipart": ("domainnet/clipart", "http://csr.bu.edu/ftp/visda/2019/multi-source/groundtruth/clipart.zip"),
    "domainnet/sketch": ("domainnet/sketch", "http://csr.bu.edu/ftp/visda/2019/multi-source/sketch.zip"),
    "flowers102": ("flowers-102", "https://www.robots.ox.ac.uk/~vgg/data/flowers/102/"),
    "pets": ("oxford-iiit-pet/annotations/trainval.txt", "https://www.robots.ox.ac.uk/~vgg/data/pets/"),
    "imagenet": ("imagenet/train", "https://image-net.org/download-images"),
    "imagenette": ("imagenette2-320/train", "https://s3.amazonaws.com/fast-ai-imageclas/imagenette2-320.tgz"),
}


@pytest.mark.parametrize("name", list(MISSING))
def test_missing_dataset_says_what_to_download_and_where(tmp_path, name):
    where, url = MISSING[name]
    with pytest.raises(FileNotFoundError) as info:
        datasets.get_dataset(name, "train", root=tmp_path)
    message = str(info.value)
    assert url in message and str(tmp_path) in message and where in message


def test_datasets_download_when_the_environment_says_so(tmp_path, monkeypatch):
    # VIT_PLASTICITY_DOWNLOAD=1 lets get_dataset fetch (here a stand-in downloader that writes the
    # official files, as there is no internet), and the error says how
    fetched = []

    def fake_download(cls_name, root, **kwargs):
        fetched.append(cls_name)
        fixtures.write_cifar(root, "cifar10", n_train=20, n_test=10)

    monkeypatch.setattr(datasets, "_torchvision_download", fake_download)
    monkeypatch.delenv("VIT_PLASTICITY_DOWNLOAD", raising=False)
    with pytest.raises(FileNotFoundError, match="with VIT_PLASTICITY_DOWNLOAD=1 in the environment"):
        datasets.get_dataset("cifar10", "test", root=tmp_path)
    assert fetched == []
    monkeypatch.setenv("VIT_PLASTICITY_DOWNLOAD", "1")
    assert len(datasets.get_dataset("cifar10", "test", root=tmp_path)) == 10 and fetched == ["CIFAR10"]
    with pytest.raises(FileNotFoundError) as info:  # ImageNet cannot be downloaded: nothing said about the variable
        datasets.get_dataset("imagenet", "test", root=tmp_path)
    assert "VIT_PLASTICITY_DOWNLOAD" not in str(info.value)


def test_a_missing_file_inside_a_dataset(tmp_path):
    fixtures.write_cifar10c(tmp_path, ["snow"])
    (tmp_path / "CIFAR-10-C" / "labels.npy").unlink()
    with pytest.raises(FileNotFoundError, match="labels.npy"):
        datasets.get_dataset("cifar10c/snow", "train", root=tmp_path)


def test_data_root_from_the_environment(tmp_path, monkeypatch):
    fixtures.write_cifar(tmp_path, "cifar10")
    monkeypatch.setenv("VIT_PLASTICITY_DATA", str(tmp_path))
    assert len(datasets.get_dataset("cifar10", "test")) == 20


def test_bad_arguments(root):
    with pytest.raises(ValueError, match="valid datasets: .*cifar10c/snow.*imagenette"):
        datasets.get_dataset("cifar10-c/snow", "train", root=root)
    with pytest.raises(ValueError, match="valid splits: train, val, test, trainval"):
        datasets.get_dataset("cifar10", "validation", root=root)
    with pytest.raises(ValueError, match="image_size"):
        datasets.get_dataset("cifar10", "train", root=root, image_size=0)
