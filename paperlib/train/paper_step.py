"""The paper's training step (appendix C.3), as the authors' loop takes it, in one screen.

Forward, cross-entropy, backward, the gradients clipped at global norm ``clip`` (1), an SGD update with momentum
(0.9, no weight decay), in PyTorch's fp32; the schedule steps in the loop (``finetune``). A run that asks for nothing
beyond the paper takes it (``is_paper_step``); any other, ``speed.step.make_step``'s: the same step made fast, the
same to rounding (``tests/test_finetune.py``).
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from paperlib.records.step_options import StepOptions

PAPER_OPTIONS = StepOptions(compile="none", fused="none")
"""The paper's step options, checked for a device: fp32, no compilation, PyTorch's attention, no fused ops."""


def is_paper_step(optimizer: str, options: StepOptions, micro_batch: int) -> bool:
    """Whether a run of ``optimizer``, step ``options`` checked for its device and ``micro_batch`` takes the paper's."""
    return optimizer == "sgd" and options == PAPER_OPTIONS and not micro_batch


@contextlib.contextmanager
def pytorch_fp32():
    """PyTorch's default fp32 as the authors ran it (matmul in full fp32, cuDNN's TF32 on), the caller's flags after."""
    flags = torch.backends.cuda.matmul, torch.backends.cudnn
    before = [flag.allow_tf32 for flag in flags]
    flags[0].allow_tf32, flags[1].allow_tf32 = False, True
    try:
        yield
    finally:
        flags[0].allow_tf32, flags[1].allow_tf32 = before


class PaperStep:
    """``step(images, labels)`` -> (loss, norm before clipping); ``speed.step.Step``'s attributes, for the loop."""

    context = staticmethod(pytorch_fp32)  # of every forward pass, evaluations' too

    def __init__(self, model: nn.Module, lr: float, momentum: float, clip: float, batch_size: int):
        self.network = self.forward = model
        self.trainable = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.SGD(self.trainable, lr=lr, momentum=momentum, weight_decay=0.0)
        self.clip, self.micro = clip, batch_size

    def __call__(self, images: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with self.context():
            self.optimizer.zero_grad(set_to_none=True)
            loss = nn.functional.cross_entropy(self.network(images), labels)
            loss.backward()
            norm = nn.utils.clip_grad_norm_(self.trainable, self.clip)
            self.optimizer.step()
        return loss.detach(), norm

    def loaded(self) -> None:
        """Weights loaded into the model are what runs: nothing to do."""
