"""Tiny datasets written in the official on-disk formats, for tests and benchmarks.

Each writer produces the layout that ``paperlib.data.datasets`` reads for the real dataset (and that the
dataset's own release uses), filled with random images, so that the real reading code runs
offline. Used by the test-suite and by ``python -m benchmarks data``.
"""

from __future__ import annotations

import io
import pickle
import struct
from pathlib import Path

import numpy as np
from PIL import Image
from scipy.io import savemat

from paperlib.data.corruptions import CORRUPTIONS
from paperlib.data.datasets import CIFAR_FILES

IMAGENETTE_WNIDS = tuple(
    "n01440764 n02102040 n02979186 n03000684 n03028079 n03394916 n03417042 n03425413 n03445777 n03888257".split()
)


def _jpeg(path: Path, rng: np.random.Generator, size: tuple[int, int] = (48, 40)) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = rng.integers(0, 256, size=(size[1], size[0], 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path, format="JPEG", quality=90)


class Python2Pickler(pickle._Pickler):
    """Pickles as CIFAR's official files were pickled (Python 2's cPickle, protocol 2).

    Bytes as Python 2's strings (``BINSTRING``), not as Python 3 writes them at protocol 2 (through
    ``_codecs.encode``)."""

    dispatch = dict(pickle._Pickler.dispatch)

    def save_bytes(self, obj: bytes) -> None:
        size = len(obj)
        self.write(pickle.SHORT_BINSTRING + bytes([size]) if size < 256 else pickle.BINSTRING + struct.pack("<i", size))
        self.write(obj)
        self.memoize(obj)

    dispatch[bytes] = save_bytes


def python2_pickle(entry) -> bytes:
    """``entry`` pickled as in CIFAR's official files.

    The pickler is ``Python2Pickler``; numpy's arrays are rebuilt by numpy 1's name,
    ``numpy.core.multiarray._reconstruct``, as the files name it."""
    buffer = io.BytesIO()
    Python2Pickler(buffer, protocol=2).dump(entry)
    return buffer.getvalue().replace(b"cnumpy._core.multiarray\n", b"cnumpy.core.multiarray\n")


def write_cifar(root: Path, name: str = "cifar10", n_train: int = 60, n_test: int = 20, seed: int = 0) -> Path:
    """Pickled batches as in cifar-10-python.tar.gz / cifar-100-python.tar.gz (``python2_pickle``)."""
    if name not in CIFAR_FILES:
        raise ValueError(f"unknown CIFAR name {name!r}; valid: cifar10, cifar100")
    folder, train_files, test_files, meta_file, label_key, names_key, *_ = CIFAR_FILES[name]
    n_classes = {"cifar10": 10, "cifar100": 100}[name]
    rng = np.random.default_rng(seed)
    base = Path(root) / folder
    base.mkdir(parents=True, exist_ok=True)
    chunks = np.array_split(np.arange(n_train), len(train_files))
    for file, chunk in zip(train_files + test_files, chunks + [np.arange(n_test)]):
        entry = {
            "data": rng.integers(0, 256, size=(len(chunk), 3072), dtype=np.uint8),
            label_key: rng.integers(0, n_classes, size=len(chunk)).tolist(),
            "filenames": [f"img_{i}.png" for i in chunk],
        }
        (base / file).write_bytes(python2_pickle(entry))
    (base / meta_file).write_bytes(python2_pickle({names_key: [f"class_{i}" for i in range(n_classes)]}))
    return base


def write_cifar10c(root: Path, corruptions=("contrast",), per_severity: int = 50, seed: int = 0) -> Path:
    """CIFAR-10-C/<corruption>.npy (5 severities stacked, NHWC uint8) and labels.npy."""
    rng = np.random.default_rng(seed)
    base = Path(root) / "CIFAR-10-C"
    base.mkdir(parents=True, exist_ok=True)
    labels = np.tile(rng.integers(0, 10, size=per_severity), 5).astype(np.uint8)
    np.save(base / "labels.npy", labels)
    for corruption in corruptions:
        # severity s has pixel values around 40*s, so tests can tell severities apart
        images = np.concatenate([np.full((per_severity, 32, 32, 3), 40 * s, np.uint8) for s in range(1, 6)])
        images[:, 0, 0, 0] = np.tile(np.arange(per_severity) % 256, 5)  # an index mark
        np.save(base / f"{corruption}.npy", images)
    return base


def write_image_folder(
    folder: Path, classes, per_class: int = 3, seed: int = 0, suffix: str = ".jpg", size: tuple[int, int] = (48, 40)
) -> Path:
    """Write ``folder/<class>/<image>`` JPEGs (ImageNet, Imagenette, DomainNet layouts) of ``size`` (width, height)."""
    rng = np.random.default_rng(seed)
    for c in classes:
        for i in range(per_class):
            _jpeg(Path(folder) / c / f"{c}_{i:03d}{suffix}", rng, size)
    return Path(folder)


def write_domainnet(root: Path, domain: str = "clipart", n_classes: int = 4, per_class: int = 5, seed: int = 0) -> Path:
    """domainnet/<domain>/<class>/<image>.jpg, as the official per-domain zips extract."""
    return write_image_folder(
        Path(root) / "domainnet" / domain, [f"class_{i:03d}" for i in range(n_classes)], per_class, seed
    )


def write_imagenet(root: Path, n_classes: int = 3, per_class: int = 4, seed: int = 0) -> Path:
    """imagenet/{train,val}/<wnid>/<image>.JPEG class folders."""
    wnids = [f"n{10000000 + i:08d}" for i in range(n_classes)]
    for split in ("train", "val"):
        write_image_folder(Path(root) / "imagenet" / split, wnids, per_class, seed, suffix=".JPEG")
    return Path(root) / "imagenet"


def write_imagenette(root: Path, per_class: int = 2, seed: int = 0) -> Path:
    """imagenette2-320/{train,val}/<wnid>/<image>.JPEG, as the 320px archive extracts."""
    for split in ("train", "val"):
        write_image_folder(Path(root) / "imagenette2-320" / split, IMAGENETTE_WNIDS, per_class, seed, suffix=".JPEG")
    return Path(root) / "imagenette2-320"


def write_flowers102(root: Path, n_images: int = 30, seed: int = 0) -> Path:
    """flowers-102/{jpg/image_NNNNN.jpg, imagelabels.mat, setid.mat} as torchvision expects."""
    rng = np.random.default_rng(seed)
    base = Path(root) / "flowers-102"
    for i in range(1, n_images + 1):
        _jpeg(base / "jpg" / f"image_{i:05d}.jpg", rng)
    savemat(base / "imagelabels.mat", {"labels": rng.integers(1, 103, size=(1, n_images))})
    ids = rng.permutation(np.arange(1, n_images + 1))
    third = n_images // 3
    savemat(
        base / "setid.mat",
        {"trnid": ids[:third][None], "valid": ids[third : 2 * third][None], "tstid": ids[2 * third :][None]},
    )
    return base


def write_pets(
    root: Path, breeds=("Abyssinian", "american_bulldog", "Bengal"), per_breed: int = 6, seed: int = 0
) -> Path:
    """oxford-iiit-pet/{images/*.jpg, annotations/trainval.txt, test.txt}."""
    rng = np.random.default_rng(seed)
    base = Path(root) / "oxford-iiit-pet"
    lines = {"trainval": ["#Image CLASS-ID SPECIES BREED ID"], "test": []}
    for label, breed in enumerate(breeds, start=1):
        for i in range(1, per_breed + 1):
            image_id = f"{breed}_{i}"
            _jpeg(base / "images" / f"{image_id}.jpg", rng)
            species = 1 if breed[0].isupper() else 2  # cats are capitalised in the release
            lines["trainval" if i <= per_breed * 2 // 3 else "test"].append(f"{image_id} {label} {species} {label}")
    (base / "annotations").mkdir(parents=True, exist_ok=True)
    for split, rows in lines.items():
        (base / "annotations" / f"{split}.txt").write_text("\n".join(rows) + "\n")
    return base


def write_all(root: Path, seed: int = 0) -> Path:
    """Every paper and reference dataset, tiny, under ``root``."""
    write_cifar(root, "cifar10", seed=seed)
    write_cifar(root, "cifar100", n_train=200, n_test=50, seed=seed)
    write_cifar10c(root, CORRUPTIONS, seed=seed)
    for domain in ("clipart", "sketch"):
        write_domainnet(root, domain, seed=seed)
    write_flowers102(root, seed=seed)
    write_pets(root, seed=seed)
    write_imagenet(root, seed=seed)
    write_imagenette(root, seed=seed)
    return Path(root)
