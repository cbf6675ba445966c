"""Speed: how a finetuning step is made fast on this machine, the same step to rounding (beyond the paper).

A layer the protocol calls and never the reverse (the layers contract, ``docs/architecture.md``).

- ``devices``  the devices a run may name, and those this machine has
- ``threads``  CPU threads of processes of ours that share a machine
- ``options``  what a run's step options mean on a device, and their checks there
- ``kernels``  our fused ops (Triton on CUDA, their PyTorch reference elsewhere)
- ``layers``   timm's layers rewritten for speed (patch embedding as a matrix product, fused ops)
- ``step``     ``step.make_step``: the run's optimizer and ``Step``, what the protocol calls once per batch
- ``clock``    the device and the clock a step is timed with (``plan``, the benchmarks)

The benchmarks that print their figures live outside the package, in ``benchmarks/`` (``python -m benchmarks``).
"""
