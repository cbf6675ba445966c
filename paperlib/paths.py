"""Where things live: one place for every path the package reads or writes.

Generated outputs (``reports/``, ``results/``, data caches) default to folders of the repository
checkout and can be moved with environment variables, so that a sweep on a cluster can write to
scratch space without touching the code.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

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
    """Whether ``data.get_dataset`` downloads missing datasets: ``VIT_PLASTICITY_DOWNLOAD=1``.

    Default: not, nothing leaves the machine."""
    return os.environ.get("VIT_PLASTICITY_DOWNLOAD", "0").strip().lower() in ("1", "true", "yes")


def display(path: str | Path) -> str:
    """``path`` relative to the repository when inside it (for notebook output), else as given."""
    path = Path(path)
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)


def figures_dir() -> Path:
    """Figures saved by the notebooks (``reports/figures``)."""
    return reports_dir() / "figures"
