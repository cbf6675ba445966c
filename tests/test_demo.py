import json

import torch

from paperlib.data.datasets import get_dataset
from paperlib.records import paths
from paperlib.train import demo
from paperlib.vit import models


def test_committed_demo_model_classifies_its_source_well():
    model = models.create_model("demo")
    accuracy = demo.accuracy(model, get_dataset("digits_source", "test"))
    assert accuracy >= 0.95, f"demo ViT test accuracy {accuracy:.3f}"
    card = json.loads(paths.DEMO_CARD.read_text())
    assert abs(card["test_accuracy"] - accuracy) < 1e-9, "the weights and their card disagree: re-run pretraining"


def test_pretraining_is_deterministic_and_saves_loadable_weights(tmp_path):
    recipe = demo.Recipe(epochs=1, batch_size=128)
    first, metrics = demo.pretrain(recipe, log_every=0)
    second, _ = demo.pretrain(recipe, log_every=0)
    for (name, a), b in zip(first.state_dict().items(), second.state_dict().values()):
        assert torch.equal(a, b), name
    path = tmp_path / "demo.safetensors"
    demo.save_weights(first, path, card=metrics)
    loaded = models.create_model("demo", weights=path)
    assert torch.equal(loaded.pos_embed, first.pos_embed)
    assert json.loads(path.with_suffix(".json").read_text())["test_accuracy"] == metrics["test_accuracy"]
    assert not list(tmp_path.glob(".*.tmp")), "temporary files left behind"


def test_shift_batch_moves_pixels_within_range():
    images = torch.zeros(16, 3, 8, 8, dtype=torch.uint8)
    images[:, :, 4, 4] = 255
    shifted = demo.shift_batch(images, 2, torch.Generator().manual_seed(0))
    rows, cols = (shifted[:, 0] == 255).nonzero()[:, 1:].T
    assert shifted.shape == images.shape
    assert rows.min() >= 2 and rows.max() <= 6 and cols.min() >= 2 and cols.max() <= 6
    assert len(set(zip(rows.tolist(), cols.tolist()))) > 1
