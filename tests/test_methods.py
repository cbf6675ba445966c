"""How a run trains its component as a value: the one registry of methods (``records.methods``), the trainers they
name (``vit.methods``), and a new method with an option of its own, added in this one module and run end to end at
demo scale."""

from dataclasses import dataclass

import pytest
import torch
from torch import nn

from paperlib.records import methods, runs, runs_table, storage
from paperlib.records.runs import METRICS, PARAMS
from paperlib.train import finetune
from paperlib.train.config import Config, config_from
from paperlib.vit import components, models
from paperlib.vit import methods as trainers


@dataclass(frozen=True)
class Biases(methods.Method):
    """A toy method: the component's biases alone train, in the last ``blocks`` blocks (0: every block)."""

    name = "biases"
    configurations = ("mha", "fc1", "fc2")
    trainer = f"{__name__}:BiasTrainer"

    blocks: int = 0  # method biases: train the biases of the last this many blocks (0: every block)

    def check(self, component: str, weight_decay: float = 0.0) -> None:
        super().check(component)
        if not isinstance(self.blocks, int) or self.blocks < 0:
            raise ValueError(f"biases_blocks must be a non-negative integer, got {self.blocks!r}")

    def suffix(self) -> str:
        return "biases" + (f"-b{self.blocks}" if self.blocks else "")


class BiasTrainer(trainers.Trainer):
    """What ``Biases`` does to a model: its chosen blocks' biases of the component, gathered in one module."""

    def adapt(self, model: nn.Module, method: Biases, component: str) -> list[nn.Module]:
        holder = nn.Module()  # set_trainable trains the modules it is given: the biases as one module's parameters
        chosen = list(components.blocks(model))[-method.blocks :] if method.blocks else components.blocks(model)
        for block in chosen:
            for name, parameter in components.block_component(block, component).named_parameters():
                if name.endswith("bias"):
                    holder.register_parameter(f"b{len(list(holder.parameters()))}", parameter)
        return [holder]


@pytest.fixture
def biases(monkeypatch):
    """``Biases`` registered for one test: the registry as it was after it."""
    monkeypatch.setattr(methods, "METHODS", dict(methods.METHODS))
    methods.register(Biases)
    return Biases


def test_a_method_with_an_option_of_its_own_added_in_one_module_runs_end_to_end(biases, results):
    # the run is asked as notebook 05 and a sweep spec ask it: by parameters, the method's option under its name
    config = config_from({"component": "fc1", "method": "biases", "biases_blocks": "1", "steps": 4, "warmup": 1})
    assert config.method == Biases(blocks=1) and config.folder().name == "seed=0+biases-b1"
    model, metrics = finetune.train(config)
    assert metrics["status"] == "finished" and (config.folder() / METRICS).is_file()
    before = models.create_model("demo")
    head_and_norm = components.count_parameters(components.head_modules(before) + components.final_norm_modules(before))
    assert metrics["trainable_parameters"] == before.blocks[-1].mlp.fc1.bias.numel() + head_and_norm
    for index, (trained, pretrained) in enumerate(zip(model.blocks, before.blocks)):
        assert torch.equal(trained.mlp.fc1.weight, pretrained.mlp.fc1.weight)  # frozen, bit for bit
        moved = not torch.equal(trained.mlp.fc1.bias, pretrained.mlp.fc1.bias)
        assert moved == (index == len(model.blocks) - 1)  # the last block's biases alone train
    params = storage.read_json(config.folder() / PARAMS)
    assert params["method"] == "biases" and params["biases_blocks"] == 1 and params["lora_rank"] == 0
    assert finetune.run(config) == metrics  # the record read back is the run asked: not trained again
    table = runs_table.load()  # what reads results reads it, its folder's name saying its option
    assert table["method"].tolist() == ["biases"] and table["folder"].str.endswith("seed=0+biases-b1").all()


def test_a_method_is_refused_where_it_cannot_train_with_bad_options_and_by_name_where_unknown(biases):
    with pytest.raises(ValueError, match="method 'biases' trains mha, fc1, fc2, not 'ln1'"):
        Config(component="ln1", method="biases")
    with pytest.raises(ValueError, match="biases_blocks must be a non-negative integer"):
        Config(component="fc1", method=Biases(blocks=-1))
    with pytest.raises(ValueError, match="biases_blocks is method biases's: set method 'biases'"):
        config_from({"component": "fc1", "biases_blocks": 2})
    with pytest.raises(ValueError, match="unknown method 'bias'; valid methods: weights, lora, subset, biases"):
        Config(method="bias")


def test_every_method_names_a_trainer_and_has_a_folder_of_its_own():
    for method in methods.METHODS.values():
        assert isinstance(trainers.trainer_of(method()), trainers.Trainer)
    made = [Config(component="fc1", method=methods.Lora(rank=4)), Config(component="fc1", method="subset")]
    made.append(Config(component="fc1"))
    assert len({config.folder() for config in made}) == len(methods.METHODS)
    assert made[-1].folder().name == "seed=0"  # the paper's way keeps the paper's folders


def test_a_record_written_before_a_method_was_added_is_the_same_run(biases, results, small):
    config = small(component="fc2", steps=2, warmup=0, eval_every=2)
    metrics = finetune.run(config)
    params = storage.read_json(config.folder() / PARAMS)
    assert params["biases_blocks"] == 0  # every registered method's options, the others' at their defaults
    older = {key: value for key, value in params.items() if key != "biases_blocks"}
    assert runs.differing(older, runs.run_record(config)) == []  # a record without it: the same run
    assert runs.finished(config) == metrics
