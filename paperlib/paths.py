"""Where things live: one place for every path the package reads or writes.

Generated outputs (``reports/``, ``results/``, data caches) default to folders of the repository
checkout and can be moved with environment variables, so that a sweep on a cluster can write to
scratch space without touching the code.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Callable

PACKAGE = Path(__file__).resolve().parent
ROOT = PACKAGE.parent
ASSETS = PACKAGE / "assets"

NOTEBOOKS = ROOT / "notebooks"
PARAMETERS = ROOT / "parameters"

DEMO_WEIGHTS = ASSETS / "demo_vit.safetensors"
DEMO_CARD = ASSETS / "demo_vit.json"


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
    """``<name>`` of a ``custom/<name>`` model or dataset (``kind`` for the error), None for other
    names; a ValueError if ``<name>`` is not one folder name (it becomes part of result paths)."""
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
    """Whether missing datasets are downloaded where no ``download=`` is passed, as from notebooks,
    runs and sweeps: ``VIT_PLASTICITY_DOWNLOAD=1`` (default: not, nothing leaves the machine)."""
    return os.environ.get("VIT_PLASTICITY_DOWNLOAD", "0").strip().lower() in ("1", "true", "yes")


def display(path: str | Path) -> str:
    """``path`` relative to the repository when inside it (for notebook output), else as given."""
    path = Path(path)
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)


def figures_dir() -> Path:
    """Figures saved by the notebooks (``reports/figures``)."""
    return reports_dir() / "figures"


def atomic_write(path: str | Path, write: Callable[[str], None], mode: int = 0o644) -> Path:
    """Write ``path`` through ``write(temporary_path)`` and rename: readers never see half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write a text file atomically (UTF-8)."""
    return atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def atomic_folder(folder: str | Path, fill: Callable[[Path], None], overwrite: bool = False) -> Path:
    """Make ``folder`` through ``fill(staging_folder)`` and a rename: whole or not at all.

    An existing ``folder`` is an error unless ``overwrite``; then it is moved aside before the new
    one takes its place and deleted after, so one of the two is always whole on disk.
    """
    folder = Path(folder)
    if folder.exists() and not overwrite:
        raise FileExistsError(f"{folder} exists; pass overwrite=True to replace it")
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}."))
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(staging, 0o777 & ~umask)  # mkdtemp's folders are private (0700); a saved model or dataset is not
        fill(staging)
        if folder.exists():
            aside = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}.old."))
            os.replace(folder, aside / folder.name)
            os.replace(staging, folder)
            shutil.rmtree(aside)
        else:
            os.replace(staging, folder)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    return folder
