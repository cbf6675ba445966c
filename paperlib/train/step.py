"""What a run trains with.

Its network (``network``), adapted to what it trains (``adapt``), and its step (``build_step``).

    from paperlib.train.config import Config
    from paperlib.train.step import build_step, network
    config = Config(component="mha", lr=0.03)
    model = network(config, num_classes=5)
    step = build_step(config, model)   # model: adapted in place
    loss, norm = step(images, labels)

One builder for every place that trains or times a run's step: ``finetune`` trains with it, the sweep's
cost estimate times it (``sweeps.plan.time_step``) and so do the step benchmarks (``benchmarks.step``), so
that the step a run trains is the step that was timed: the same trainable parameters (the component, its
LoRA updates or its equal-capacity subset, the head and the final norm: ``adapt``), the same optimizer
and the same step options (``speed.step.make_step``).
"""

from __future__ import annotations

from torch import nn

from paperlib.speed.step import OptimizerSettings, Step, make_step
from paperlib.train.config import Config
from paperlib.train.paper_step import PaperStep, is_paper_step
from paperlib.vit import methods, models


def network(config: Config, num_classes: int, pretrained: bool = True) -> nn.Module:
    """The run's model with a new head of ``num_classes``.

    Pretrained (``pretrained=False``: random weights, what a step is timed on).

    At ``config.image_size`` if set (timm resamples the position embedding: DINOv2 at 224, not 518), else at its own."""
    size = {"img_size": config.image_size} if config.image_size else {}
    return models.create_model(config.model, pretrained=pretrained, num_classes=num_classes, **size)


def adapt(model: nn.Module, config: Config) -> nn.Module:
    """``model`` as a run of ``config`` trains it, in place, by the run's method (``vit.methods.adapt``)."""
    return methods.adapt(model, config.method, config.component)


def build_step(config: Config, model: nn.Module, progress: bool = False) -> Step | PaperStep:
    """The step a run of ``config`` trains ``model`` with; ``model`` is adapted to the run first, in place (``adapt``).

    ``model``: the run's network (pretrained or random, with its head, on the run's device), not yet adapted. A run
    that asks for nothing beyond the paper (``paper_step.is_paper_step``) takes the paper's step as the authors' loop
    does it (``PaperStep``); any other, ``speed.step.make_step``'s, the same step made fast. Either trains the
    parameters ``adapt`` left trainable with the run's optimizer (``Config.optimizer``, ``lr``, ``momentum``,
    ``weight_decay``; ``Step.optimizer``, for the schedule and the checkpoints), its step options
    (``Config.checked_options``: compilation, attention kernel, precision, fused ops), at its ``batch_size``,
    clipping at its ``clip``, in its ``micro_batch`` (0: the whole batch, split while the GPU runs out of memory;
    ``progress``: say so)."""
    adapt(model, config)
    if is_paper_step(config.optimizer, config.checked_options, config.micro_batch):
        return PaperStep(model, config.lr, config.momentum, config.clip, config.batch_size)
    return make_step(
        model,
        config.checked_options,
        optimizer=OptimizerSettings(config.optimizer, config.lr, config.momentum, config.weight_decay),
        batch_size=config.batch_size,
        clip=config.clip,
        micro_batch=config.micro_batch,
        progress=progress,
    )
