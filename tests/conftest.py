"""Fixtures shared by every test: a seeded random state, a results root of the test's own, small
finetuning runs of the demo world, the demo ViT, and small notebooks."""

import os

import nbformat
import pytest
import torch

from paperlib import models, report
from paperlib.runs import Config

os.environ.setdefault("MPLBACKEND", "Agg")

SMALL = {"steps": 12, "batch_size": 16, "warmup": 2, "eval_every": 4, "lr": 0.05}
"""A finetuning run of the demo world small enough for a unit test (seconds on a CPU)."""


@pytest.fixture(autouse=True)
def _seeded():
    """Every test starts from the same global random state."""
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def results(tmp_path, monkeypatch):
    """Every test's results root (``VIT_PLASTICITY_RESULTS``): a folder of its own."""
    monkeypatch.setenv("VIT_PLASTICITY_RESULTS", str(tmp_path / "results"))
    return tmp_path / "results"


@pytest.fixture
def move_results(tmp_path, monkeypatch):
    """``move_results(name)``: the results root moves to ``<tmp_path>/<name>`` (a second root in one
    test, e.g. an uninterrupted run beside an interrupted one); returns it."""

    def move(name: str):
        monkeypatch.setenv("VIT_PLASTICITY_RESULTS", str(tmp_path / name))
        return tmp_path / name

    return move


@pytest.fixture
def small():
    """``small(**overrides)``: a ``Config`` of ``SMALL`` with the overrides."""
    return lambda **overrides: Config(**{**SMALL, **overrides})


@pytest.fixture
def tiny_vit():
    """``tiny_vit(**kwargs)``: the demo ViT's architecture with random weights (seeded by ``_seeded``),
    ``models.create_model("demo", pretrained=False, **kwargs)``: a whole ViT in milliseconds."""
    return lambda **kwargs: models.create_model("demo", pretrained=False, **kwargs)


@pytest.fixture
def tiny_model(tiny_vit):
    """``tiny_vit`` with a 3-class head."""
    return tiny_vit(num_classes=3)


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A data root (and so a models folder) and a results folder of the test's own."""
    monkeypatch.setenv("VIT_PLASTICITY_DATA", str(tmp_path / "data"))
    monkeypatch.setenv("VIT_PLASTICITY_RESULTS", str(tmp_path / "results"))
    monkeypatch.delenv("VIT_PLASTICITY_MODELS", raising=False)
    return tmp_path


@pytest.fixture
def write_notebook():
    """``write_notebook(path, *code, parameters=None, heading=None)``: a small notebook for the project's
    kernel written to ``path`` (returned): a markdown ``heading`` and a cell tagged ``parameters``, if
    given, then a code cell per source in ``code``."""

    def write(path, *code: str, parameters: str | None = None, heading: str | None = None):
        cells = [nbformat.v4.new_markdown_cell(heading)] if heading else []
        if parameters is not None:
            cells.append(nbformat.v4.new_code_cell(parameters, metadata={"tags": ["parameters"]}))
        nb = nbformat.v4.new_notebook(cells=cells + [nbformat.v4.new_code_cell(source) for source in code])
        nb.metadata["kernelspec"] = report.KERNELSPEC
        nbformat.write(nb, path)
        return path

    return write
