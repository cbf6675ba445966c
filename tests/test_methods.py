"""How a run trains its component as a value: the registry of methods (``records.methods``), their trainers
(``vit.methods``), and a new method added in one class here, run end to end at demo scale."""

import pytest
import torch
from torch import nn

from paperlib.records import methods, storage
from paperlib.records.runs import METRICS
from paperlib.train import finetune
from paperlib.train.config import Config
from paperlib.vit import components, models
from paperlib.vit import methods as trainers


class Biases(methods.Method, trainers.Trainer):
    """A toy method: the component's biases alone train, its weight matrices stay as pretrained."""

    name = "biases"
    configurations = ("mha", "fc1", "fc2")

    def suffix(self, record: dict) -> str:
        return "biases"

    def adapt(self, model: nn.Module, record: dict) -> list[nn.Module]:
        holder = nn.Module()  # the biases as one module's parameters: set_trainable trains what it is given
        for module in components.component_modules(model, record["component"]):
            for name, parameter in module.named_parameters():
                if name.endswith("bias"):
                    holder.register_parameter(f"b{len(list(holder.parameters()))}", parameter)
        return [holder]


@pytest.fixture
def biases(monkeypatch):
    method = Biases()
    monkeypatch.setitem(methods.METHODS, method.name, method)  # what a run can name and its folder
    monkeypatch.setitem(trainers.TRAINERS, method.name, method)  # what it does to a model
    return method


def test_a_method_added_in_one_class_runs_end_to_end(biases, results):
    config = Config(component="fc1", method="biases", steps=4, warmup=1, eval_every=2)
    assert config.folder().name == "seed=0+biases"
    model, metrics = finetune.train(config)
    assert metrics["status"] == "finished" and (config.folder() / METRICS).is_file()
    before = models.create_model("demo")
    biases = sum(block.mlp.fc1.bias.numel() for block in before.blocks)
    head_and_norm = components.count_parameters(components.head_modules(before) + components.final_norm_modules(before))
    assert metrics["trainable_parameters"] == biases + head_and_norm
    for trained, pretrained in zip(model.blocks, before.blocks):
        assert torch.equal(trained.mlp.fc1.weight, pretrained.mlp.fc1.weight)  # frozen, bit for bit
        assert torch.equal(trained.attn.qkv.weight, pretrained.attn.qkv.weight)
    assert any(not torch.equal(a.mlp.fc1.bias, b.mlp.fc1.bias) for a, b in zip(model.blocks, before.blocks))
    assert storage.read_json(config.folder() / "params.json")["method"] == "biases"


def test_a_method_is_refused_where_it_cannot_train_and_by_name_where_unknown(biases):
    with pytest.raises(ValueError, match="method 'biases' trains mha, fc1, fc2, not 'ln1'"):
        Config(component="ln1", method="biases")
    with pytest.raises(ValueError, match="unknown method 'bias'; valid methods: weights, lora, subset, biases"):
        Config(method="bias")


def test_every_method_has_a_trainer_and_a_folder_of_its_own():
    assert set(trainers.TRAINERS) == set(methods.METHODS)
    runs = [Config(component="fc1", method=name, lora_rank=4 if name == "lora" else 0) for name in methods.METHODS]
    assert len({config.folder() for config in runs}) == len(methods.METHODS)
    assert runs[0].folder().name == "seed=0"  # the paper's way keeps the paper's folders
