import os

import pytest
import torch

os.environ.setdefault("MPLBACKEND", "Agg")


@pytest.fixture(autouse=True)
def _seeded():
    """Every test starts from the same global random state."""
    torch.manual_seed(0)


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A data root (and so a models folder) and a results folder of the test's own."""
    monkeypatch.setenv("VIT_PLASTICITY_DATA", str(tmp_path / "data"))
    monkeypatch.setenv("VIT_PLASTICITY_RESULTS", str(tmp_path / "results"))
    monkeypatch.delenv("VIT_PLASTICITY_MODELS", raising=False)
    return tmp_path
