"""Where things live: one place for every path the package reads or writes.

Generated outputs (``reports/``, ``results/``, data caches) default to folders of the repository
checkout and can be moved with environment variables, so that a sweep on a cluster can write to
scratch space without touching the code.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Iterable

PACKAGE = Path(__file__).resolve().parents[1]
ROOT = PACKAGE.parent
ASSETS = PACKAGE / "assets"

NOTEBOOKS = ROOT / "notebooks"
PARAMETERS = ROOT / "parameters"

DEMO_WEIGHTS = ASSETS / "demo_vit.safetensors"
DEMO_CARD = ASSETS / "demo_vit.json"


def notebook_paths(names: Iterable[str] | None = None) -> list[Path]:
    """The project's notebooks, in paper order, or those named (stem or file name)."""
    available = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    if not names:
        return available
    by_stem = {p.stem: p for p in available}
    chosen = []
    for name in names:
        stem = Path(name).stem
        if stem not in by_stem:
            raise ValueError(f"unknown notebook {name!r}; valid notebooks: {', '.join(by_stem)}")
        chosen.append(by_stem[stem])
    return chosen


def _env_path(variable: str, default: Path) -> Path:
    value = os.environ.get(variable)
    return Path(value).expanduser() if value else default


def reports_dir() -> Path:
    """HTML reports and executed notebooks (``VIT_PLASTICITY_REPORTS``, default ``reports/``)."""
    return _env_path("VIT_PLASTICITY_REPORTS", ROOT / "reports")


def results_dir() -> Path:
    """Run folders with parameters and metrics (``VIT_PLASTICITY_RESULTS``, default ``results/``)."""
    return _env_path("VIT_PLASTICITY_RESULTS", ROOT / "results")


def data_dir() -> Path:
    """Datasets read from or downloaded to disk (``VIT_PLASTICITY_DATA``, default ``data/``)."""
    return _env_path("VIT_PLASTICITY_DATA", ROOT / "data")


def models_dir() -> Path:
    """Your own ViTs, ``custom/<name>`` models (``VIT_PLASTICITY_MODELS``, default ``<data root>/models``)."""
    return _env_path("VIT_PLASTICITY_MODELS", data_dir() / "models")


CUSTOM = "custom/"
"""Prefix of the models and datasets users bring: ``custom/<name>``."""
CUSTOM_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def custom_name(name: object, kind: str) -> str | None:
    """``<name>`` of a ``custom/<name>`` model or dataset, None for other names.

    ``kind`` names the kind in the error: a ValueError if ``<name>`` is not one folder name (it
    becomes part of result paths)."""
    if not (isinstance(name, str) and name.startswith(CUSTOM)):
        return None
    short = name[len(CUSTOM) :]
    if not CUSTOM_NAME.fullmatch(short):
        raise ValueError(
            f"invalid custom {kind} name {name!r}: "
            f"after {CUSTOM!r} comes one folder name of letters, digits, '_', '.' or '-'"
        )
    return short


def download_allowed() -> bool:
    """Whether ``datasets.get_dataset`` downloads missing datasets: ``VIT_PLASTICITY_DOWNLOAD=1``.

    Default: not, nothing leaves the machine."""
    return os.environ.get("VIT_PLASTICITY_DOWNLOAD", "0").strip().lower() in ("1", "true", "yes")


RETRAIN_OLDER = "VIT_PLASTICITY_RETRAIN_OLDER"
"""The environment variable that asks for results written by an older version to be made again (``retrain_older``)."""


def retrain_older() -> bool:
    """Whether results written by an older version are made again (``VIT_PLASTICITY_RETRAIN_OLDER`` 1, true or yes).

    Unset, they are kept and read as they are (``runs.lacks``). ``sweep --retrain-older`` sets it for its runs (the
    notebooks it executes inherit it); nothing else does."""
    return os.environ.get(RETRAIN_OLDER, "0").strip().lower() in ("1", "true", "yes")


def display(path: str | Path) -> str:
    """``path`` relative to the repository when inside it (for notebook output), else as given."""
    path = Path(path)
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)


def suffixes(*choices: tuple[str, object, object]) -> str:
    """A result folder's suffixes: ``+<name>-<value>`` for each (name, value, default) whose value is not its default.

    ``+<value>`` for a choice without a name, in the order given, a ``/`` of a value as ``_``: a measurement's
    (``measurements.Measurement.folder``), a probe table's (``probe.Probe.folder``) and a finetuning run's
    (``runs.run_folder``), so that a result that is not the paper's never replaces one."""
    return "".join(
        "+" + "-".join(part for part in (name, str(value).replace("/", "_")) if part)
        for name, value, default in choices
        if value != default
    )


def figures_dir() -> Path:
    """Figures saved by the notebooks (``reports/figures``)."""
    return reports_dir() / "figures"


CUSTOM_WEIGHTS = ("model.safetensors", "pytorch_model.bin")
"""The weight files a saved ``custom/<name>`` model may hold, in the order they are looked for."""


def dataset_fingerprint(name: str, root: str | Path | None = None) -> str | None:
    """A digest of what dataset ``custom/<name>`` holds now.

    Every file's path, size and modification time under its folder (None for the built-in datasets, which do
    not change, and for a folder not there). A finetuning run records it, so that editing the images is a
    new run."""
    if not custom_name(name, "dataset"):
        return None
    folder = (Path(root).expanduser() if root is not None else data_dir()) / name
    if not folder.is_dir():
        return None
    entries = sorted(
        f"{f.relative_to(folder).as_posix()}:{stat.st_size}:{stat.st_mtime_ns}"
        for f in folder.rglob("*")
        if f.is_file()
        for stat in [f.stat()]
    )
    return hashlib.sha256("\n".join(entries).encode()).hexdigest()[:16]


def custom_model_names() -> list[str]:
    """The ``custom/<name>`` models in ``models_dir()`` (folders with a ``config.json``)."""
    base = models_dir()
    if not base.is_dir():
        return []
    return sorted(
        CUSTOM + p.name for p in base.iterdir() if (p / "config.json").is_file() and CUSTOM_NAME.fullmatch(p.name)
    )


def saved_model(name: str) -> tuple[dict, Path] | None:
    """(its ``config.json``, its weight file) of model ``custom/<name>`` as saved; None for other names.

    The weight file is the first of ``CUSTOM_WEIGHTS`` in its folder (``<models dir>/<name>``). A model not saved whole
    is a FileNotFoundError that says what is missing and how to save one; a damaged ``config.json``, a ValueError that
    says to save it again."""
    short = custom_name(name, "model")
    if short is None:
        return None
    folder = models_dir() / short
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(
            f"model {name!r} not found: expected {config_file}. Save a model there with "
            f"paperlib.vit.models.save_model(model, {name!r}) (or timm.models.save_for_hf(model, folder)); "
            f"custom models found in {models_dir()}: {', '.join(custom_model_names()) or 'none'}."
        )
    try:
        config = json.loads(config_file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ValueError(f"{config_file} is not whole JSON: save the model again (models.save_model)") from None
    weights = next((folder / f for f in CUSTOM_WEIGHTS if (folder / f).is_file()), None)
    if weights is None:
        raise FileNotFoundError(
            f"model {name!r} has no weights: expected {' or '.join(str(folder / f) for f in CUSTOM_WEIGHTS)}"
        )
    return config, weights


def model_fingerprint(name: str) -> str | None:
    """A digest of model ``custom/<name>`` as saved now (``saved_model``); None for other names.

    Of its ``config.json`` and its weight file's size and modification time; other names' weights do not change under
    them."""
    saved = saved_model(name)
    if saved is None:
        return None
    config, weights = saved
    stat = weights.stat()
    text = json.dumps(config, sort_keys=True) + f"\n{weights.name}:{stat.st_size}:{stat.st_mtime_ns}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]
