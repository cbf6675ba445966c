import hashlib
import json
import re
import shutil

import pytest
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


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_pretraining_is_deterministic_and_replaces_other_weights_only_when_asked(tmp_path, capsys):
    out, card = tmp_path / "demo.safetensors", tmp_path / "demo.json"
    tiny = ["pretrain", "--epochs", "1", "--out", str(out)]
    # other weights there (the committed ones, as another CPU's would be): one line with both, nothing written
    shutil.copy(paths.DEMO_WEIGHTS, out)
    committed = out.read_bytes()
    with pytest.raises(SystemExit) as stopped:
        demo.main(tiny)
    lines = capsys.readouterr().err.strip().splitlines()
    assert stopped.value.code == 2 and len(lines) == 1, lines
    there = json.loads(paths.DEMO_CARD.read_text())["test_accuracy"]
    line = re.fullmatch(
        r"error: these weights differ from (.+): sha256 (\w{64}), test accuracy ([\d.]+) here; "
        r"sha256 (\w{64}), test accuracy ([\d.]+) there; pass --overwrite to replace them",
        lines[0],
    )
    assert line and line[1] == str(out) and line[4] == sha256(committed) and line[5] == f"{there:.4f}", lines[0]
    made, accuracy = line[2], line[3]
    assert made != sha256(committed)
    assert out.read_bytes() == committed and not card.exists()
    demo.main([*tiny, "--overwrite"])  # asked: replaced, with its card
    assert capsys.readouterr().out.splitlines()[-1] == f"wrote {out} (sha256 {made})"
    test = get_dataset("digits_source", "test")
    assert sha256(out.read_bytes()) == made
    assert accuracy == f"{demo.accuracy(models.create_model('demo', weights=out), test):.4f}"
    written = card.read_text()
    demo.main(tiny)  # the same weights again (deterministic here): nothing written, not even the card's new time
    assert capsys.readouterr().out.splitlines()[-1] == f"the same weights as {out} (sha256 {made}): left as they are"
    assert sha256(out.read_bytes()) == made and card.read_text() == written
    assert json.loads(written)["recipe"]["epochs"] == 1 and f"{json.loads(written)['test_accuracy']:.4f}" == accuracy
    assert not list(tmp_path.glob(".*.tmp")), "temporary files left behind"


def test_shift_batch_moves_pixels_within_range():
    images = torch.zeros(16, 3, 8, 8, dtype=torch.uint8)
    images[:, :, 4, 4] = 255
    shifted = demo.shift_batch(images, 2, torch.Generator().manual_seed(0))
    rows, cols = (shifted[:, 0] == 255).nonzero()[:, 1:].T
    assert shifted.shape == images.shape
    assert rows.min() >= 2 and rows.max() <= 6 and cols.min() >= 2 and cols.max() <= 6
    assert len(set(zip(rows.tolist(), cols.tolist()))) > 1
