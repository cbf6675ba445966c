"""How a finetuning step is made fast: beyond the paper, the same step to rounding.

- ``options``  the choices (compilation, attention kernel, precision, fused ops, CUDA graph),
               checked once and resolved for a device (``StepOptions``), and named presets
- ``step``     ``Step``: what the protocol (``finetune``) calls once per batch, and the machinery
               behind it (``compile_model``, ``MasterWeights``, ``FusedSGD``, ``GraphedStep``)
- ``layers``   timm's layers rewritten for speed (patch embedding as a matrix product, fused ops)
- ``kernels``  our fused ops (Triton on CUDA, their PyTorch reference elsewhere)
- ``bench``    benchmarks that print their figures: ``python -m paperlib.speed.bench``
"""

from .options import STEP_OPTIONS, StepOptions, preset
from .step import Step, sgd

__all__ = ["STEP_OPTIONS", "Step", "StepOptions", "preset", "sgd"]
