"""How a finetuning step is made fast: beyond the paper, the same step to rounding.

A layer the protocol calls and never the reverse: nothing here imports ``finetune``, ``runs`` or
``sweep`` (``tests/test_layout.py`` checks it). Each module below imports only those above it.

- ``kernels``  our fused ops (Triton on CUDA, their PyTorch reference elsewhere)
- ``layers``   timm's layers rewritten for speed (patch embedding as a matrix product, fused ops)
- ``options``  the choices (compilation, attention kernel, precision, fused ops), checked once and
               resolved for a device (``StepOptions``), and named presets
- ``step``     ``step.make_step``: the run's optimizer and ``Step``, what the protocol (``finetune``)
               calls once per batch, and the machinery behind it (``compile_model``, ``MasterWeights``)
- ``clock``    the device and the clock a step is timed with (``plan``, the benchmarks)

The benchmarks that print their figures live outside the package, in ``benchmarks/``
(``python -m benchmarks``); nothing here imports them.
"""

from .options import STEP_OPTIONS, StepOptions, preset

__all__ = ["STEP_OPTIONS", "StepOptions", "preset"]
