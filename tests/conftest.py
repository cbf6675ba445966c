import os

import pytest
import torch

os.environ.setdefault("MPLBACKEND", "Agg")


@pytest.fixture(autouse=True)
def _seeded():
    """Every test starts from the same global random state."""
    torch.manual_seed(0)
