"""What a run's step options mean on a device, and their checks there.

A run records its step options by name (``records.step_options``: ``StepOptions``, torch-free); which of them a
device has, and what "auto" means on it, is decided here (``checked``), before any work, and ``step`` builds the
step from what ``checked`` gives back.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from paperlib.records.step_options import (
    PRECISIONS,
    StepOptions,
    check_precision_name,
    compile_choice,
    fused_name,
    fused_parts,
)

SDPA_BACKENDS = {
    "flash": "FLASH_ATTENTION",
    "cudnn": "CUDNN_ATTENTION",
    "efficient": "EFFICIENT_ATTENTION",
    "math": "MATH",
}
"""The ``torch.nn.attention.SDPBackend`` each attention kernel but "auto" names (``step.step_context``)."""
CPU_ATTENTION = ("auto", "flash", "math")  # the kernels PyTorch has on a CPU


def check_attention(attention: str, device: torch.device) -> str:
    """``attention`` if it names a kernel this device has; otherwise a ValueError with the valid choices."""
    device = torch.device(device)
    valid = ("auto", *SDPA_BACKENDS) if device.type == "cuda" else CPU_ATTENTION
    if attention not in valid:
        raise ValueError(
            f"unknown attention kernel {attention!r} for a {device.type} device; valid choices: {', '.join(valid)}"
        )
    return attention


def triton_available() -> bool:
    """Whether Triton can be imported (PyTorch's CUDA builds for Linux bring it)."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


# modes of our own: torch.compile's default mode with these inductor options
OWN_COMPILE_MODES = {
    # inductor tunes the launch settings (block sizes, warps) of each kernel it generates, by timing
    # them: the fused LayerNorm, GELU and residual kernels that bound a bf16 ViT step; longer
    # compilation for a few % more images/s (docs/benchmarks.md)
    "coordinate-descent": {"coordinate_descent_tuning": True},
}


def compile_modes() -> tuple[str, ...]:
    """The modes ``compile_model`` accepts: this PyTorch's ``torch.compile`` modes and ``OWN_COMPILE_MODES``."""
    try:
        modes = tuple(torch._inductor.list_mode_options())
    except AttributeError:  # a PyTorch without the listing: the modes of torch 2.x
        modes = ("default", "reduce-overhead", "max-autotune-no-cudagraphs", "max-autotune")
    return modes + tuple(OWN_COMPILE_MODES)


def check_compile_mode(mode: str) -> str:
    """``mode`` if it is a ``torch.compile`` mode, else a ValueError naming the valid ones."""
    if mode not in compile_modes():
        raise ValueError(f"unknown torch.compile mode {mode!r}; valid modes: {', '.join(compile_modes())}")
    return mode


def native_bf16() -> bool:
    """Whether this CPU multiplies bf16 matrices in hardware.

    In hardware means x86's AVX-512 BF16 or AMX, which ``torch.backends.cpu.get_cpu_capability()`` does not
    tell from AVX-512. Where it does not (AVX2 alone, or a CPU other than x86), PyTorch's bf16 matrix
    products are emulated, and a demo finetuning run in "autocast" or "bf16" is slower than in fp32."""
    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


CUDA_ONLY_PRECISIONS = ("tf32",)


def check_precision(precision: str, device: torch.device) -> str:
    """``precision`` if it is one of ``PRECISIONS`` that ``device`` has; otherwise a ValueError naming those."""
    check_precision_name(precision)
    kind = torch.device(device).type
    if precision in CUDA_ONLY_PRECISIONS and kind != "cuda":
        valid = [p for p in PRECISIONS if p not in CUDA_ONLY_PRECISIONS]
        raise ValueError(
            f"precision {precision!r} runs matrix products on TF32 tensor cores, which only CUDA devices have, "
            f"not {kind!r}; valid precisions on {kind}: {', '.join(valid)}"
        )
    return precision


# what "auto" means on CUDA: the ops measured faster there (docs/benchmarks.md)
AUTO_FUSED_CUDA = ("gelu", "qkv")


def resolve_fused(fused: str, device: torch.device) -> str:
    """What ``fused`` means on ``device``, written one way.

    That way is "none", or its parts joined by "+" in ``FUSED_PARTS``' order ("all" is "gelu+qkv"). "auto" is
    ``AUTO_FUSED_CUDA`` on CUDA when Triton is there (measured faster on a GPU: docs/benchmarks.md) and "none"
    elsewhere (on a CPU the ops run their PyTorch reference, which inductor's own code beats). Any other choice names
    parts (``fused_parts``), which on CUDA are Triton kernels: a ValueError says why when Triton is not installed."""
    cuda = torch.device(device).type == "cuda"
    if fused == "auto":
        return fused_name(AUTO_FUSED_CUDA if cuda and triton_available() else ())
    parts = fused_parts(fused)
    if parts and cuda and not triton_available():
        raise ValueError(
            f"fused={fused!r} runs Triton kernels on CUDA, and Triton is not installed; "
            "install it (pip install triton) or use fused='none' (or 'auto')"
        )
    return fused_name(parts)


def checked(options: StepOptions, device: torch.device) -> StepOptions:
    """``options`` with every choice checked for ``device`` before any work.

    A bad choice is a ValueError that names the valid choices. ``compile`` is returned as its choice ("none",
    "model" or "blocks") and ``fused`` as what it means there (``resolve_fused``)."""
    device = torch.device(device)
    check_compile_mode(options.compile_mode)
    check_attention(options.attention, device)
    check_precision(options.precision, device)
    return replace(options, compile=compile_choice(options.compile), fused=resolve_fused(options.fused, device))
