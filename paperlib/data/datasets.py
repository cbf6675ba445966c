"""Datasets by name, with the paper's splits and transforms (appendix C.2).

``get_dataset(name, split, root=...)`` serves the demo world and the paper's benchmarks alike, so
notebooks never special-case a dataset. Names:

- demo world (offline, scikit-learn's digits): ``digits_source`` (digits 0-4, the pretraining
  distribution of the demo ViT), ``digits`` (digits 5-9, the clean downstream task, labels 0-4)
  and ``digits_c/<corruption>`` (the same images with a CIFAR-10-C corruption at severity 5).
- the paper's 11 benchmarks: ``cifar10``, ``cifar100``, ``cifar10c/<corruption>`` (contrast,
  gaussian_noise, motion_blur, snow, speckle_noise; ``severity`` 1-5, default 5),
  ``domainnet/clipart``, ``domainnet/sketch``, ``flowers102``, ``pets``.
- reference (pretraining) images for plasticity: ``imagenet`` (what the paper used) and
  ``imagenette`` (a 10-class ImageNet subset that torchvision downloads in one command).
- your own images: ``custom/<name>`` reads class folders under ``<root>/custom/<name>/``, either
  ``train/<class>/<image>`` with a held-out ``test/`` (or ``val/``) beside it, or
  ``<class>/<image>`` alone (then split 80/20 like DomainNet). See ``custom_dataset``.

Splits, drawn as the authors' released code draws them (``docs/fidelity.md``): ``test`` is the
official test set (for ImageNet and Imagenette, which have no public test labels, the official
validation images); ``trainval`` is the official training set; ``val`` is the finetuning
protocol's validation set (§5.2, "validation set (20% of the training set)"): 20% of ``trainval``
drawn from the run's ``seed`` (``validation_split``), or, for Flowers102, its official validation
split as in the authors' code (``validation="fraction"``: 20% of its training set, the paper's
words); ``train`` is the rest. Cifar10-C and DomainNet, which have no official test set, get the
authors' fixed 80/20 train/test split (``deterministic_split``, appendix C.2); the demo world's
digits and ``custom/<name>`` folders one by each image's key (``hash_split``). No split reads or
changes global random state.

Data live under one root: the ``root`` argument, else ``$VIT_PLASTICITY_DATA``, else ``data/``.
Files are read from the official layouts; ``VIT_PLASTICITY_DOWNLOAD=1`` in the environment fetches what
can be fetched (through torchvision where it knows the dataset), and a missing dataset raises a
FileNotFoundError that says what to download, from where, and where to put it.
"""

from __future__ import annotations

import pickle
import shutil
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch
import torchvision.datasets as tvd
from torchvision.datasets.folder import IMG_EXTENSIONS, find_classes, make_dataset
from torchvision.datasets.utils import download_and_extract_archive

from paperlib.data.corruptions import CORRUPTIONS, SEVERITIES, check_severity, corrupt
from paperlib.data.imagesets import FileDataset, ImageDataset
from paperlib.data.splits import deterministic_split, hash_split, validation_split
from paperlib.data.transforms import IMAGENET, as_mean_std, paper_transform
from paperlib.records import paths, storage
from paperlib.records.names import SEVERITY, check_choice

SPLITS = ("train", "val", "test", "trainval")
VALIDATIONS = ("official", "fraction")
SOURCE_DIGITS = (0, 1, 2, 3, 4)
DOWNSTREAM_DIGITS = (5, 6, 7, 8, 9)
PAPER_IMAGE_SIZE = 224


@lru_cache(maxsize=1)
def digits_images() -> tuple[np.ndarray, np.ndarray]:
    """All 1,797 scikit-learn digits as (N, 32, 32, 3) uint8 images and their digit labels.

    The 8x8 digits (values 0-16) are scaled to 0-255 and upsampled (bilinear) to 32x32 grey RGB. scikit-learn is
    imported here, by the process that reads them: importing it (and the scipy.stats it loads) takes about a second,
    which every process that imports this module would pay, reading the digits or not.
    """
    from sklearn.datasets import load_digits

    digits = load_digits()
    small = torch.from_numpy(digits.images).float().unsqueeze(1) * (255.0 / 16.0)
    large = torch.nn.functional.interpolate(small, size=(32, 32), mode="bilinear", align_corners=False)
    gray = large.round().clamp(0, 255).to(torch.uint8)
    images = gray.expand(-1, 3, -1, -1).permute(0, 2, 3, 1).contiguous().numpy()
    return images, digits.target.astype(np.int64)


def _half(digit_set: Sequence[int]) -> np.ndarray:
    """Positions in scikit-learn's array of the digits in ``digit_set``."""
    _, labels = digits_images()
    return np.flatnonzero(np.isin(labels, digit_set))


@lru_cache(maxsize=None)
def _corrupted(corruption: str, digit_set: tuple[int, ...]) -> np.ndarray:
    """All digits with the half ``digit_set`` corrupted, each image seeded by its position."""
    images, _ = digits_images()
    positions = _half(digit_set)
    out = images.copy()
    out[positions] = corrupt(images[positions], corruption, severity=SEVERITY, seed=0, keys=positions)
    return out


def _digits(name: str, digit_set: tuple[int, ...], corruption: str | None = None):
    def load(root: Path, official: str, download: bool, severity: int) -> ImageDataset:
        images, labels = digits_images()
        positions = _half(digit_set)
        train, test = hash_split(positions.tolist(), salt="digits")
        positions = positions[train if official == "train" else test]
        source = images if corruption is None else _corrupted(corruption, digit_set)
        chosen = torch.from_numpy(source[positions]).permute(0, 3, 1, 2).contiguous()
        targets = torch.from_numpy(labels[positions] - digit_set[0])
        return ImageDataset(chosen, targets, [str(d) for d in digit_set], name, official, positions.tolist())

    return load


# --------------------------------------------------------------------------------------------
# The paper's datasets, read from their official layouts


def _data_root(root: str | Path | None) -> Path:
    """``root``, or the data root (``paths.data_dir()``) when None."""
    return Path(root).expanduser() if root is not None else paths.data_dir()


def _missing(name: str, expected: Path, how: str, downloadable: bool = True) -> FileNotFoundError:
    if downloadable:
        how += " Or get it downloaded with VIT_PLASTICITY_DOWNLOAD=1 in the environment."
    return FileNotFoundError(f"{name} not found: expected {expected}. {how}")


def _torchvision_download(cls_name: str, root: Path, **kwargs) -> None:
    """Fetch a dataset with torchvision's own downloader (it checks the archive's MD5)."""
    root.mkdir(parents=True, exist_ok=True)
    getattr(tvd, cls_name)(str(root), download=True, **kwargs)


def _download_archive(url: str, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    download_and_extract_archive(url, download_root=str(folder))


CIFAR_FILES = {  # folder, train files, test files, meta file, label key, class-name key, torchvision class, URL
    "cifar10": (
        "cifar-10-batches-py",
        [f"data_batch_{i}" for i in range(1, 6)],
        ["test_batch"],
        "batches.meta",
        "labels",
        "label_names",
        "CIFAR10",
        "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",
    ),
    "cifar100": (
        "cifar-100-python",
        ["train"],
        ["test"],
        "meta",
        "fine_labels",
        "fine_label_names",
        "CIFAR100",
        "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz",
    ),
}


class CifarUnpickler(pickle.Unpickler):
    """Reads CIFAR's official pickled batches, admitting only what they hold.

    They hold dicts, lists, strings, numbers and numpy arrays (rebuilt by ``_reconstruct``, by numpy 1's
    name or numpy 2's). Anything else, which a pickle could make run code, is refused."""

    ADMITTED = {
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
    }

    def find_class(self, module: str, name: str):
        if (module, name) not in self.ADMITTED:
            raise pickle.UnpicklingError(f"{module}.{name} is not in CIFAR's official files")
        return super().find_class(module, name)


def read_cifar_batch(path: Path) -> dict:
    """One of CIFAR's pickled files (``CifarUnpickler``); a ValueError naming it if it is not one."""
    try:
        with open(path, "rb") as handle:
            entry = CifarUnpickler(handle, encoding="latin1").load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError) as error:
        raise ValueError(f"{path} is not one of CIFAR's official files ({error})") from None
    if not isinstance(entry, dict):
        raise ValueError(f"{path} is not one of CIFAR's official files (no dict of arrays and labels)")
    return entry


def _cifar(name: str):
    folder, train_files, test_files, meta_file, label_key, names_key, tv_class, url = CIFAR_FILES[name]

    def load(root: Path, official: str, download: bool, severity: int) -> ImageDataset:
        base = root / folder
        files = train_files if official == "train" else test_files
        needed = files + [meta_file]
        if download and not all((base / f).is_file() for f in needed):
            _torchvision_download(tv_class, root, train=official == "train")
        missing = [f for f in needed if not (base / f).is_file()]
        if missing:
            raise _missing(
                name,
                base / missing[0],
                f"Download {url} and extract it into {root} "
                f"(giving {base}/ with {', '.join(train_files + test_files + [meta_file])}).",
            )
        data, targets = [], []
        for file in files:
            entry = read_cifar_batch(base / file)
            data.append(np.asarray(entry["data"], dtype=np.uint8).reshape(-1, 3, 32, 32))
            targets.extend(entry[label_key])
        classes = read_cifar_batch(base / meta_file)[names_key]
        return ImageDataset(torch.from_numpy(np.concatenate(data)), torch.tensor(targets), classes, name, official)

    return load


CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
CIFAR10C_URL = "https://zenodo.org/record/2535967/files/CIFAR-10-C.tar"


def _cifar10c(corruption: str):
    name = f"cifar10c/{corruption}"

    def load(root: Path, official: str, download: bool, severity: int) -> ImageDataset:
        base = root / "CIFAR-10-C"
        files = [base / f"{corruption}.npy", base / "labels.npy"]
        if download and not all(f.is_file() for f in files):
            _download_archive(CIFAR10C_URL, root)
        for file in files:
            if not file.is_file():
                raise _missing(
                    name,
                    file,
                    f"Download {CIFAR10C_URL} (Hendrycks & Dietterich, 2019) and extract it into {root}, "
                    f"giving {base}/<corruption>.npy (50,000 x 32 x 32 x 3 uint8: severities 1-5 stacked, "
                    f"10,000 images each) and {base}/labels.npy.",
                )
        images = np.load(files[0], mmap_mode="r")
        labels = np.load(files[1], mmap_mode="r")
        per_severity = len(images) // len(SEVERITIES)
        if len(images) != len(labels) or per_severity * len(SEVERITIES) != len(images):
            raise ValueError(
                f"{files[0]} holds {len(images)} images and {files[1]} {len(labels)} labels: "
                "expected the same number, 5 severities stacked"
            )
        # The 10,000 images of one severity, split as the authors split them: the same image index
        # falls in the same split for every corruption and severity.
        train, test = deterministic_split(per_severity)
        positions = train if official == "train" else test
        offset = (severity - 1) * per_severity
        chosen = np.asarray(images[offset + positions], dtype=np.uint8)
        return ImageDataset(
            torch.from_numpy(chosen).permute(0, 3, 1, 2).contiguous(),
            torch.from_numpy(np.asarray(labels[offset + positions], dtype=np.int64)),
            CIFAR10_CLASSES,
            name,
            official,
            positions.tolist(),
        )

    return load


def _image_folder(folder: Path) -> tuple[list[Path], list[int], list[str], list[str]]:
    """Files, labels, class names and keys of a class-folder layout (torchvision's ImageFolder rules).

    A file's key is its path inside ``folder``."""
    classes, class_to_idx = find_classes(str(folder))
    samples = make_dataset(str(folder), class_to_idx, extensions=IMG_EXTENSIONS)
    files = [Path(p) for p, _ in samples]
    return files, [t for _, t in samples], classes, [f.relative_to(folder).as_posix() for f in files]


DOMAINNET_URLS = {
    "clipart": "http://csr.bu.edu/ftp/visda/2019/multi-source/groundtruth/clipart.zip",
    "sketch": "http://csr.bu.edu/ftp/visda/2019/multi-source/sketch.zip",
}


def _domainnet(domain: str):
    name = f"domainnet/{domain}"

    def load(root: Path, official: str, download: bool, severity: int) -> FileDataset:
        folder = root / "domainnet" / domain
        if download and not folder.is_dir():
            _download_archive(DOMAINNET_URLS[domain], root / "domainnet")
        if not folder.is_dir():
            raise _missing(
                name,
                folder,
                f"Download {DOMAINNET_URLS[domain]} (DomainNet, Peng et al. 2019) and extract it into "
                f"{root / 'domainnet'}, giving {folder}/<class>/<image>.jpg (345 class folders).",
            )
        files, targets, classes, keys = _image_folder(folder)
        train, test = deterministic_split(len(keys))  # files in ImageFolder order, as the authors read them
        chosen = train if official == "train" else test
        return FileDataset(
            [files[i] for i in chosen], [targets[i] for i in chosen], classes, name, official, [keys[i] for i in chosen]
        )

    return load


def _flowers102(root: Path, official: str, download: bool, severity: int) -> FileDataset:
    base = root / "flowers-102"
    needed = [base / "imagelabels.mat", base / "setid.mat", base / "jpg"]
    if download and not all(p.exists() for p in needed):
        _torchvision_download("Flowers102", root)
    for path in needed:
        if not path.exists():
            raise _missing(
                "flowers102",
                path,
                "Download 102flowers.tgz, imagelabels.mat and setid.mat from "
                f"https://www.robots.ox.ac.uk/~vgg/data/flowers/102/ into {base} "
                f"(giving {base}/jpg/image_00001.jpg, ..., imagelabels.mat, setid.mat).",
            )
    from scipy.io import loadmat  # imported by the process that reads Flowers102, as scikit-learn by digits_images

    labels = loadmat(base / "imagelabels.mat", squeeze_me=True)["labels"]
    setid = loadmat(base / "setid.mat", squeeze_me=True)
    # official: train (1,020 images), val (1,020), test (6,149), or trainval (train and val)
    parts = {"train": ["trnid"], "val": ["valid"], "test": ["tstid"], "trainval": ["trnid", "valid"]}[official]
    ids = [int(i) for part in parts for i in np.atleast_1d(setid[part])]
    files = [base / "jpg" / f"image_{i:05d}.jpg" for i in ids]
    return FileDataset(
        files, [int(labels[i - 1]) - 1 for i in ids], [str(c) for c in range(1, 103)], "flowers102", official, ids
    )


def _pets(root: Path, official: str, download: bool, severity: int) -> FileDataset:
    base = root / "oxford-iiit-pet"
    listing = base / "annotations" / ("trainval.txt" if official == "train" else "test.txt")
    if download and not listing.is_file():
        _torchvision_download("OxfordIIITPet", root, split="trainval" if official == "train" else "test")
    if not listing.is_file():
        raise _missing(
            "pets",
            listing,
            "Download images.tar.gz and annotations.tar.gz from "
            f"https://www.robots.ox.ac.uk/~vgg/data/pets/ and extract both into {base} "
            f"(giving {base}/images/*.jpg and {base}/annotations/trainval.txt, test.txt).",
        )
    ids, targets = [], []
    for line in listing.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            image_id, label, *_ = line.split()
            ids.append(image_id)
            targets.append(int(label) - 1)
    # class names as torchvision forms them: the image prefix, title-cased
    names = {t: " ".join(p.title() for p in i.rsplit("_", 1)[0].split("_")) for i, t in zip(ids, targets)}
    classes = [names[t] for t in sorted(names)]
    return FileDataset([base / "images" / f"{i}.jpg" for i in ids], targets, classes, "pets", official, ids)


CUSTOM_HELD_OUT = ("test", "val")  # the first of these beside train/ is the official test split
CUSTOM_LAYOUT = (
    "{folder}/train/<class>/<image> with a held-out {folder}/test/<class>/<image> (or val/), "
    "or {folder}/<class>/<image> alone for a deterministic 80/20 train/test split"
)


def _listed(names: Sequence[str]) -> str:
    return ", ".join(names[:10]) + (" ..." if len(names) > 10 else "")


def _class_files(folder: Path, classes: Sequence[str] | None = None) -> tuple[list[Path], list[int], list[str]]:
    """Files, labels and classes of a custom dataset's class folders.

    By torchvision's ``ImageFolder`` rules, hidden folders such as ``.ipynb_checkpoints`` skipped, with the class
    indices of ``classes`` (a training folder's) when given: a held-out folder may lack some, never add one."""
    if not folder.is_dir():
        raise FileNotFoundError(f"no folder {folder}")
    found = sorted(entry.name for entry in folder.iterdir() if entry.is_dir() and not entry.name.startswith("."))
    if classes is None:
        if len(found) < 2:
            raise ValueError(
                f"{folder} has {len(found)} class folder(s){' (' + _listed(found) + ')' if found else ''}; "
                "a classification dataset needs at least 2"
            )
        classes = found
    unknown = sorted(set(found) - set(classes))
    if unknown:
        raise ValueError(
            f"{folder} has classes that the training images lack: {_listed(unknown)}; "
            f"the training classes are {_listed(list(classes))}"
        )
    samples = make_dataset(
        str(folder), {c: i for i, c in enumerate(classes)}, extensions=IMG_EXTENSIONS, allow_empty=True
    )
    if not samples:
        raise FileNotFoundError(f"no images in {folder} (extensions: {', '.join(IMG_EXTENSIONS)})")
    return [Path(p) for p, _ in samples], [t for _, t in samples], list(classes)


def custom_dataset(name: str, root: str | Path | None = None, official: str = "train") -> FileDataset:
    """Your own images as a dataset of the paper's kind: ``custom/<name>``.

    The official split ``train`` or ``test``; ``get_dataset`` adds ``val`` and ``trainval`` as for every
    dataset.

    Layouts under ``<root>/custom/<name>/`` (class folders as torchvision's ``ImageFolder`` reads
    them; any image format PIL opens, converted to RGB):

    - ``train/<class>/<image>`` and ``test/<class>/<image>`` (or ``val/`` when there is no
      ``test/``): the official split. The classes are the training folder's; a held-out class
      that has no training images is an error, as is an empty training class folder (a class with no images).
    - ``train/`` alone, or ``<class>/<image>`` with no ``train/``: a deterministic 80/20 split
      by each file's path (``hash_split``).

    Samples are keyed by their path inside the folder, so the splits stay the same when the
    folder moves. Decoded caches (``loader.uint8_images``) are keyed by each file's size and
    modification time too, so editing the images invalidates them.
    """
    check_dataset(name)
    if official not in ("train", "test"):
        raise ValueError(f"official split must be 'train' or 'test', got {official!r}")
    root = _data_root(root)
    folder = root / name
    layout = CUSTOM_LAYOUT.format(folder=folder)
    if not folder.is_dir():
        found = ", ".join(custom_names(root)) or "none"
        raise _missing(
            name,
            folder,
            f"Put your images there in class folders: {layout}. "
            f"Custom datasets found under {root / 'custom'}: {found}.",
            downloadable=False,
        )
    train_dir = folder / "train"
    held_out = (
        next((folder / s for s in CUSTOM_HELD_OUT if (folder / s).is_dir()), None) if train_dir.is_dir() else None
    )
    training = train_dir if train_dir.is_dir() else folder
    try:
        files, targets, classes = _class_files(training)
        # an empty class folder would still be a class: one more output of the head, a higher divergence threshold
        labelled = {classes[t] for t in targets}
        empty = [(training / c).relative_to(folder).as_posix() for c in classes if c not in labelled]
        if empty:
            raise ValueError(f"empty class folder(s) {_listed(empty)} (no image files): add images or remove them")
        if held_out is not None and official == "test":
            files, targets, classes = _class_files(held_out, classes)
    except FileNotFoundError as error:
        raise FileNotFoundError(f"{name}: {str(error).rstrip('.')}. Expected {layout}.") from error
    except ValueError as error:  # too few classes (a misnamed Train/ folder reads as one class), an empty one
        raise ValueError(f"{name}: {error}. Expected {layout}.") from error
    keys = [f.relative_to(folder).as_posix() for f in files]
    if held_out is None:
        # by path alone: a copy of the folder (cleaned, renamed) keeps the split
        train, test = hash_split(keys, salt="custom")
        chosen = (train if official == "train" else test).tolist()
        files, targets, keys = [files[i] for i in chosen], [targets[i] for i in chosen], [keys[i] for i in chosen]
    return FileDataset(files, targets, classes, name, official, keys, stat_keyed=True)


def export_class_folders(dataset: ImageDataset | FileDataset, folder: str | Path, overwrite: bool = False) -> Path:
    """Write a dataset split as ``folder/<class>/<image>``, the layout ``custom/<name>`` reads.

    The folder is one ``train/`` or ``test/`` folder of that layout, or the whole of a flat one. Array
    images become PNG files (lossless), files are copied as they are; each is named by its key. Written
    whole or not at all (``storage.atomic_folder``). Read back, classes are indexed in sorted-name order, as
    torchvision's ``ImageFolder`` indexes them."""
    from PIL import Image

    def safe(text) -> str:
        return str(text).replace("/", "_").replace("\\", "_")

    def fill(staging: Path) -> None:
        for index, (target, key) in enumerate(zip(dataset.targets.tolist(), dataset.keys)):
            target_folder = staging / safe(dataset.classes[target])
            target_folder.mkdir(exist_ok=True)
            if isinstance(dataset, ImageDataset):
                Image.fromarray(dataset.images[index].permute(1, 2, 0).numpy()).save(target_folder / f"{safe(key)}.png")
            else:
                shutil.copyfile(
                    dataset.files[index],
                    target_folder / f"{safe(Path(key).with_suffix(''))}{dataset.files[index].suffix}",
                )

    return storage.atomic_folder(folder, fill, overwrite)


def custom_names(root: str | Path | None = None) -> list[str]:
    """The ``custom/<name>`` datasets found under ``<root>/custom/`` (default root: the data root)."""
    base = _data_root(root) / "custom"
    if not base.is_dir():
        return []
    return sorted(paths.CUSTOM + p.name for p in base.iterdir() if p.is_dir() and paths.CUSTOM_NAME.fullmatch(p.name))


def _imagenet(root: Path, official: str, download: bool, severity: int) -> FileDataset:
    folder = root / "imagenet" / ("train" if official == "train" else "val")
    if not folder.is_dir():
        raise _missing(
            "imagenet",
            folder,
            "ImageNet cannot be downloaded automatically (its licence requires an account): "
            "download ILSVRC2012_img_val.tar from https://image-net.org/download-images "
            f"and arrange it in class folders as {folder}/<wnid>/<image>.JPEG (1,000 folders). "
            "For a downloadable stand-in use 'imagenette'.",
            downloadable=False,
        )
    files, targets, classes, keys = _image_folder(folder)
    return FileDataset(files, targets, classes, "imagenet", official, keys)


def _imagenette(root: Path, official: str, download: bool, severity: int) -> FileDataset:
    folder = root / "imagenette2-320" / ("train" if official == "train" else "val")
    if download and not folder.is_dir():
        _torchvision_download("Imagenette", root, split="train" if official == "train" else "val", size="320px")
    if not folder.is_dir():
        raise _missing(
            "imagenette",
            folder,
            "Download https://s3.amazonaws.com/fast-ai-imageclas/imagenette2-320.tgz "
            f"and extract it into {root} (giving {folder}/<wnid>/<image>.JPEG, 10 folders).",
        )
    files, targets, classes, keys = _image_folder(folder)
    return FileDataset(files, targets, classes, "imagenette", official, keys)


@dataclass(frozen=True)
class Source:
    """How to read one dataset: ``load(root, official_split, download, severity)``."""

    load: Callable
    image_size: int  # default resolution of get_dataset (the paper's 224, the demo's 32)
    group: str  # "demo", "paper", "reference" or "custom"
    # it has an official validation split: load also takes "val" and "trainval" (train and val)
    official_val: bool = False


DATASETS: dict[str, Source] = {
    "digits_source": Source(_digits("digits_source", SOURCE_DIGITS), 32, "demo"),
    "digits": Source(_digits("digits", DOWNSTREAM_DIGITS), 32, "demo"),
    **{f"digits_c/{c}": Source(_digits(f"digits_c/{c}", DOWNSTREAM_DIGITS, c), 32, "demo") for c in CORRUPTIONS},
    "cifar10": Source(_cifar("cifar10"), PAPER_IMAGE_SIZE, "paper"),
    "cifar100": Source(_cifar("cifar100"), PAPER_IMAGE_SIZE, "paper"),
    **{f"cifar10c/{c}": Source(_cifar10c(c), PAPER_IMAGE_SIZE, "paper") for c in CORRUPTIONS},
    "domainnet/clipart": Source(_domainnet("clipart"), PAPER_IMAGE_SIZE, "paper"),
    "domainnet/sketch": Source(_domainnet("sketch"), PAPER_IMAGE_SIZE, "paper"),
    "flowers102": Source(_flowers102, PAPER_IMAGE_SIZE, "paper", official_val=True),
    "pets": Source(_pets, PAPER_IMAGE_SIZE, "paper"),
    "imagenet": Source(_imagenet, PAPER_IMAGE_SIZE, "reference"),
    "imagenette": Source(_imagenette, PAPER_IMAGE_SIZE, "reference"),
}
"""Every dataset by the name users type."""

PAPER_DATASETS = tuple(name for name, source in DATASETS.items() if source.group == "paper")
"""The paper's 11 downstream benchmarks (appendix C.2)."""


DATASET_GROUPS = ("demo", "paper", "reference", "custom")


def dataset_names(group: str | None = None, root: str | Path | None = None) -> list[str]:
    """Valid names for ``get_dataset``: all, or one group of ``DATASET_GROUPS``.

    ``custom``: the ``custom/<name>`` folders found under the data root, ``root`` or the default."""
    if group is not None and group not in DATASET_GROUPS:
        raise ValueError(f"unknown dataset group {group!r}; valid groups: {', '.join(DATASET_GROUPS)}")
    names = [name for name, source in DATASETS.items() if group is None or source.group == group]
    return names + custom_names(root) if group in (None, "custom") else names


def check_dataset(name: str) -> str:
    """Return ``name`` or raise a ValueError that names the valid datasets.

    ``custom/<name>`` is valid for any folder name (letters, digits, ``_.-``); whether the folder exists is
    checked when the dataset is read, where the error says where to put it."""
    if name in DATASETS or paths.custom_name(name, "dataset"):
        return name
    raise ValueError(
        f"unknown dataset {name!r}; valid datasets: {', '.join(DATASETS)}; "
        f"or custom/<name> for your own class folders under <data root>/custom/<name>/"
    )


def dataset_source(name: str) -> Source:
    """How dataset ``name`` is read (``Source``), for the built-in datasets and ``custom/<name>``."""
    if name in DATASETS:
        return DATASETS[name]
    check_dataset(name)
    return Source(
        lambda root, official, download, severity: custom_dataset(name, root, official), PAPER_IMAGE_SIZE, "custom"
    )


def check_validation(validation: str) -> str:
    """Return ``validation`` or raise a ValueError that names the valid choices."""
    return check_choice(validation, VALIDATIONS, "validation")


def read_split(
    name: str,
    split: str = "train",
    root: str | Path | None = None,
    severity: int = SEVERITY,
    seed: int = 0,
    validation: str = "official",
) -> ImageDataset | FileDataset:
    """A dataset split by name, its images as read (no transform): what ``get_dataset`` transforms.

    The finetuning runs read their splits here, as the device path decodes and transforms them
    (``loader.uint8_images``). Missing files are fetched where possible when ``$VIT_PLASTICITY_DOWNLOAD``
    is 1 (``paths.download_allowed``).

    Args:
        name: see ``dataset_names()``.
        split: ``train``, ``val``, ``test`` or ``trainval`` (module docstring).
        root: data root (default ``$VIT_PLASTICITY_DATA`` or ``data/``).
        severity: Cifar10-C severity, 1-5 (the paper: 5).
        seed: seed of the validation split (the protocol's seeds are 0, 42, 3407).
        validation: ``official`` (a dataset's official validation split where it has one,
            Flowers102, as the authors' code; elsewhere 20% of the training set) or ``fraction``
            (20% of the training set everywhere, the paper's words).
    """
    root = _data_root(root)
    source = dataset_source(name)
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r} for dataset {name!r}; valid splits: {', '.join(SPLITS)}")
    check_validation(validation)
    check_severity(severity)
    download = paths.download_allowed()
    if source.official_val and validation == "official":
        dataset = source.load(root, split, download, severity)
    else:
        dataset = source.load(root, "test" if split == "test" else "train", download, severity)
        if split in ("train", "val"):
            train, val = validation_split(len(dataset), seed)
            dataset = dataset.subset(train if split == "train" else val, split)
    dataset.split = split
    dataset.root = root  # where caches of this dataset go (loader.uint8_images)
    return dataset


def read_splits(name: str, root: str | Path | None = None, seed: int = 0, validation: str = "official") -> dict:
    """A finetuning run's ``train``, ``val`` and ``test`` splits of dataset ``name``, as ``read_split`` reads them."""
    splits = ("train", "val", "test")
    return {split: read_split(name, split, root, seed=seed, validation=validation) for split in splits}


@lru_cache(maxsize=None)  # a sweep upgrading a grid asks once per dataset and seed, not once per run
def older_validation_order(
    name: str, root: str | Path | None = None, seed: int = 0, validation: str = "official"
) -> np.ndarray | None:
    """Where each image of ``read_split(name, "val", ...)``, in its order, stands in the sorted order of before.

    Runs of ``runs.RECORD`` 6 and earlier held their validation split sorted by position; since, it keeps the order
    of the authors' ``random_split`` (``validation_split``). A record 6's per-image outcomes read in this order
    (``readings.accuracy``'s ``order``) are what the run would record today (``runs.upgrade``). None where the order
    did not change (a dataset's official validation split)."""
    source = dataset_source(name)
    check_validation(validation)
    if source.official_val and validation == "official":
        return None
    whole = source.load(_data_root(root), "train", paths.download_allowed(), SEVERITY)
    _, val = validation_split(len(whole), seed)
    return np.argsort(np.argsort(val))


def get_dataset(
    name: str,
    split: str = "train",
    root: str | Path | None = None,
    image_size: int | None = None,
    severity: int = SEVERITY,
    seed: int = 0,
    mean_std: tuple = IMAGENET,
) -> ImageDataset | FileDataset:
    """A dataset split by name: a torch Dataset of (normalised CHW float tensor, int label).

    The split as ``read_split`` reads it (``name``, ``split``, ``root``, ``severity`` and ``seed`` are
    its; the validation split the dataset's official one where it has one), its images through the
    paper's evaluation transform (resize + centre crop). For its training one (random resized crop +
    flip), or any other, set the returned dataset's ``transform``:
    ``dataset.transform = transforms.paper_transform(True, size, dataset.mean_std)``; a transform
    receives a PIL image for file datasets and a uint8 CHW tensor for array datasets.

    Args:
        image_size: output resolution (default 224 for the paper's datasets, 32 for the demo's).
        mean_std: (mean, std) per RGB channel that images are normalised with: ImageNet's, as in
            the paper, by default (``models.normalization`` gives a model's own).
    """
    if image_size is not None and (not isinstance(image_size, int) or image_size < 1):
        raise ValueError(f"image_size must be a positive integer, got {image_size!r}")
    mean_std = as_mean_std(*mean_std)
    dataset = read_split(name, split, root, severity, seed)
    dataset.mean_std = mean_std
    size = image_size or dataset_source(name).image_size
    if isinstance(dataset, FileDataset) or tuple(dataset.images.shape[-2:]) != (size, size):
        dataset.transform = paper_transform(False, size, mean_std)
    return dataset
