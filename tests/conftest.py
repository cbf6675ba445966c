"""Fixtures shared by every test: a seeded random state, a results root of the test's own, small
finetuning runs of the demo world, the demo ViT, and small notebooks; and the helpers several test files
share (``from conftest import ...``): a run interrupted and resumed, metrics without their timings, what a
plasticity result written by hand found."""

import os

# Under pytest-xdist (``make test`` runs ``pytest -n``) several workers share the cores: each computes
# with its share of them (at least one thread), and so do the processes it starts (notebook kernels,
# command lines), which inherit OMP_NUM_THREADS. One count for a worker and its subprocesses keeps the
# tests that compare a run in this process with one in a subprocess exact (the thread count changes a
# run's last digits on a CPU, paperlib.speed.threads). Set before torch is imported; a value set by the user
# stands. Without xdist nothing changes: PyTorch's own choice, as the recorded demo results used.
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    _cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, _cores // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))))

import nbformat  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from paperlib.records.runs import run_fields
from paperlib.reports import execute  # noqa: E402
from paperlib.train import finetune
from paperlib.train.config import Config
from paperlib.vit import models

if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))  # in case torch was imported before this file

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
def figures(tmp_path, monkeypatch):
    """The test's own figures folder (``VIT_PLASTICITY_REPORTS``), so that the saved names can be read; every figure
    is closed after the test."""
    import matplotlib.pyplot as plt

    monkeypatch.setenv("VIT_PLASTICITY_REPORTS", str(tmp_path / "reports"))
    yield tmp_path / "reports" / "figures"
    plt.close("all")


@pytest.fixture
def small():
    """``small(**overrides)``: a ``Config`` of ``SMALL`` with the overrides, given as a run's parameters
    (``method="lora", lora_rank=2``: ``runs.run_fields``)."""
    return lambda **overrides: Config(**run_fields({**SMALL, **overrides}))


@pytest.fixture
def tiny_data(tmp_path):
    """A data root holding CIFAR-10 of 60 training and 20 test images in its official format (``write_cifar``).

    A run on it (``dataset="cifar10", data_root=...``) evaluates 12 validation and 20 test images, where a demo set
    has 144 and 179: for a test of how a run trains whose cost is its evaluations (bf16, emulated on AVX2 alone)."""
    from paperlib.data import fixtures

    fixtures.write_cifar(tmp_path / "data", "cifar10", n_train=60, n_test=20)
    return str(tmp_path / "data")


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
        nb.metadata["kernelspec"] = execute.KERNELSPEC
        nbformat.write(nb, path)
        return path

    return write


def interrupted(config: Config, step: int, monkeypatch) -> None:
    """Run ``config`` until it stops with a simulated interruption when it asks for training batch ``step``."""
    from paperlib.data import loader

    original = loader.DeviceLoader.batch

    def crash(self, index):
        if index == step and self.augment:
            raise KeyboardInterrupt("simulated interruption")
        return original(self, index)

    with monkeypatch.context() as patch:
        patch.setattr(loader.DeviceLoader, "batch", crash)
        with pytest.raises(KeyboardInterrupt):
            finetune.run(config)


def resumed(config: Config, monkeypatch) -> dict:
    """``finetune.run(config)`` of a run interrupted after a checkpoint, checked to resume from it (its
    first training batch is not the first): a checkpoint that failed to load would start it again."""
    from paperlib.data import loader

    asked, original = [], loader.DeviceLoader.batch

    def spy(self, index):
        if self.augment:
            asked.append(index)
        return original(self, index)

    with monkeypatch.context() as patch:
        patch.setattr(loader.DeviceLoader, "batch", spy)
        metrics = finetune.run(config)
    assert asked and asked[0] > 0, "the run started again from the beginning instead of resuming"
    return metrics


def recorded_difference(config: Config) -> list[str] | None:
    """How the run recorded in ``config``'s folder differs from ``config`` (``runs.differing``); None where none is."""
    from paperlib.records import runs

    params = runs.read_params(config.folder())
    return None if params is None else runs.differing(params, runs.run_record(config))


def same_metrics(metrics: dict) -> dict:
    """Metrics without the timings, which differ between runs, and the checksums of the files kept (``files``)."""
    return {k: v for k, v in metrics.items() if k not in ("wall_seconds", "images_per_second", "files")}


def found(table, **facts) -> dict:
    """What measuring ``table`` found, as a record holds it (``measurements.FOUND``): for results written by hand."""
    pairs = int(table["pair"].nunique())
    counts = {"n_pairs": pairs, "distinct_reference": pairs, "distinct_target": pairs, "identical_pairs_excluded": 0}
    return counts | {"token_rms": 1.0} | facts
