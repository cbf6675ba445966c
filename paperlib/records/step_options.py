"""How a training step may run: the choices, checked once, and resolved for a device.

``StepOptions`` holds them: ``compile`` (torch.compile of the model or of each block),
``compile_mode``, ``attention`` (the scaled-dot-product attention kernel), ``precision``
(``PRECISIONS``: "fp32", the paper's and every default's; beyond it "tf32", "autocast" and "bf16")
and ``fused`` (our fused ops, ``kernels``).
``StepOptions.checked(device)`` validates every choice for a device and gives them back resolved
("auto" written out), which is what ``step`` builds a step from. A run gives each of them under its
own name (``Config``'s fields, notebook 05's parameters, a sweep spec's keys); a speed preset is a name
for a set of them besides ``precision`` (``preset``: "auto", the defaults; "none", nothing fused or
compiled; or a YAML file of ``parameters/speed/``), which ``with_preset`` puts into a run's parameters,
the options given explicitly overriding the preset's. Torch is imported where a choice is checked for
a device, not here: reading specs, presets and results (``specs``, ``runs_table.for_spec``, ``stats``) loads
none of the training stack.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING

from paperlib.records import paths
from paperlib.records.cli import read_yaml

if TYPE_CHECKING:
    import torch

# the attention kernels ``F.scaled_dot_product_attention`` may choose from; "auto" leaves the choice to PyTorch
ATTENTION_CHOICES = {
    "auto": None,
    "flash": "FLASH_ATTENTION",
    "cudnn": "CUDNN_ATTENTION",
    "efficient": "EFFICIENT_ATTENTION",
    "math": "MATH",
}
CPU_ATTENTION = ("auto", "flash", "math")  # the kernels PyTorch has on a CPU


def check_attention(attention: str, device: torch.device) -> str:
    """``attention`` if it names a kernel this device has; otherwise a ValueError with the valid choices."""
    device = _device(device)
    valid = tuple(ATTENTION_CHOICES) if device.type == "cuda" else CPU_ATTENTION
    if attention not in valid:
        raise ValueError(
            f"unknown attention kernel {attention!r} for a {device.type} device; valid choices: {', '.join(valid)}"
        )
    return attention


def _device(device) -> torch.device:
    import torch

    return torch.device(device)


def triton_available() -> bool:
    """Whether Triton can be imported (PyTorch's CUDA builds for Linux bring it)."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


COMPILE_CHOICES = ("none", "model", "blocks")


def compile_choice(value: bool | str) -> str:
    """What ``Config.compile`` asks for: "none", "model" (True) or "blocks"."""
    if value is False or value is None:
        return "none"
    if value is True:
        return "model"
    if value not in COMPILE_CHOICES:
        raise ValueError(
            f"unknown compile choice {value!r}; valid choices: {', '.join(COMPILE_CHOICES)} (or True/False)"
        )
    return value


# modes of our own: torch.compile's default mode with these inductor options
OWN_COMPILE_MODES = {
    # inductor tunes the launch settings (block sizes, warps) of each kernel it generates, by timing
    # them: the fused LayerNorm, GELU and residual kernels that bound a bf16 ViT step; longer
    # compilation for a few % more images/s (docs/benchmarks.md)
    "coordinate-descent": {"coordinate_descent_tuning": True},
}


def compile_modes() -> tuple[str, ...]:
    """The modes ``compile_model`` accepts: this PyTorch's ``torch.compile`` modes and ``OWN_COMPILE_MODES``."""
    import torch

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


PRECISIONS = ("fp32", "tf32", "autocast", "bf16")
"""How a step computes; only "fp32" is the paper's protocol, the others are for speed on a GPU and get
their own run folders (``-tf32``, ``-autocast``, ``-bf16``).

- "fp32": the paper's (Table 4's text: "with a default FP32 precision"), as the authors' code ran it:
  PyTorch's defaults, i.e. on CUDA matrix products in full fp32 (``torch.backends.cuda.matmul.allow_tf32``
  off) and cuDNN convolutions allowed TF32 (``torch.backends.cudnn.allow_tf32`` on); a step sets them so
  whatever the caller's flags (``step.tf32_flags``). On CUDA the patch embedding runs as a matrix product
  (``layers.linear_patch_embed``), so it is full fp32 here where the authors' convolution could use TF32.
- "tf32" (CUDA only): fp32 weights, activations and optimizer state; matrix products and convolutions
  on TF32 tensor cores (10-bit mantissa inputs, fp32 accumulation), for the run's steps only.
- "autocast": bf16 autocast (fp32 weights and optimizer state), on CUDA and on a CPU (there a way to check the
  precision's effect at demo scale, not a speed-up; emulated, and so slow, where the CPU has no native bf16:
  ``native_bf16``).
- "bf16": bf16 compute with fp32 master weights (``step.MasterWeights``).
"""
CUDA_ONLY_PRECISIONS = ("tf32",)

OPTIMIZERS = ("sgd", "adamw")
"""``sgd``: the paper's (appendix C.3); ``adamw``: an extension (the paper's future work names a
tailored optimisation of each module)."""


def native_bf16() -> bool:
    """Whether this CPU multiplies bf16 matrices in hardware.

    In hardware means x86's AVX-512 BF16 or AMX, which ``torch.backends.cpu.get_cpu_capability()`` does not
    tell from AVX-512. Where it does not (AVX2 alone, or a CPU other than x86), PyTorch's bf16 matrix
    products are emulated, and a demo finetuning run in "autocast" or "bf16" is slower than in fp32."""
    import torch

    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


def check_precision(precision: str, device: torch.device | None = None) -> str:
    """``precision`` if it is one of ``PRECISIONS`` that ``device`` has; otherwise a one-line ValueError naming those.

    ``device`` None: a CUDA device, which has them all."""
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; valid choices: {', '.join(PRECISIONS)}")
    kind = _device(device).type if device is not None else "cuda"
    if precision in CUDA_ONLY_PRECISIONS and kind != "cuda":
        valid = [p for p in PRECISIONS if p not in CUDA_ONLY_PRECISIONS]
        raise ValueError(
            f"precision {precision!r} runs matrix products on TF32 tensor cores, which only CUDA devices have, "
            f"not {kind!r}; valid precisions on {kind}: {', '.join(valid)}"
        )
    return precision


# our fused ops (``kernels``) that a step may use, by name: each takes passes over the data that
# PyTorch leaves apart and makes them one, in the model's blocks (``step.fuse``): "gelu", fc1's bias
# and GELU; "qkv", the q/k/v projection's split into heads
FUSED_PARTS = ("gelu", "qkv")
FUSED_CHOICES = ("auto", "none", "all", *FUSED_PARTS)  # and parts joined by "+", e.g. "gelu+qkv"
# what "auto" means on CUDA: the ops measured faster there (docs/benchmarks.md)
AUTO_FUSED_CUDA = ("gelu", "qkv")


def fused_parts(fused: str) -> tuple[str, ...]:
    """The ``FUSED_PARTS`` that a ``fused`` choice other than "auto" names, in ``FUSED_PARTS``' order.

    "none": none, "all": all, else its "+"-joined parts; a ValueError naming the valid choices otherwise."""
    if fused == "none":
        return ()
    if fused == "all":
        return FUSED_PARTS
    parts = fused.split("+") if isinstance(fused, str) else [fused]
    if any(part not in FUSED_PARTS for part in parts) or len(set(parts)) != len(parts):
        raise ValueError(
            f"unknown fused choice {fused!r}; valid choices: {', '.join(FUSED_CHOICES)}, "
            f"or several of {', '.join(FUSED_PARTS)} joined by '+' (e.g. 'gelu+qkv')"
        )
    return tuple(part for part in FUSED_PARTS if part in parts)


def _fused_name(parts: tuple[str, ...]) -> str:
    return "+".join(parts) or "none"


def resolve_fused(fused: str, device: torch.device) -> str:
    """What ``fused`` means on ``device``, written one way.

    That way is "none", or its parts joined by "+" in ``FUSED_PARTS``' order ("all" is "gelu+qkv"). "auto" is
    ``AUTO_FUSED_CUDA`` on CUDA when Triton is there (measured faster on a GPU: docs/benchmarks.md) and "none"
    elsewhere (on a CPU the ops run their PyTorch reference, which inductor's own code beats). Any other choice names
    parts (``fused_parts``), which on CUDA are Triton kernels: a ValueError says why when Triton is not installed."""
    cuda = _device(device).type == "cuda"
    if fused == "auto":
        return _fused_name(AUTO_FUSED_CUDA if cuda and triton_available() else ())
    parts = fused_parts(fused)
    if parts and cuda and not triton_available():
        raise ValueError(
            f"fused={fused!r} runs Triton kernels on CUDA, and Triton is not installed; "
            "install it (pip install triton) or use fused='none' (or 'auto')"
        )
    return _fused_name(parts)


@dataclass(frozen=True)
class StepOptions:
    """How a training step runs, not what it trains.

    ``Config``'s fields of the same names (``Config.step_options``). Passed whole to what builds a step
    (``step.make_step``, ``step.make_forward``) and to the step benchmarks (``benchmarks.step``);
    ``step_context`` takes the two that shape a forward pass (attention, precision)."""

    compile: bool | str = False  # False/"none", True/"model" or "blocks" (compile_model)
    compile_mode: str = "default"  # torch.compile's mode, or one of OWN_COMPILE_MODES
    attention: str = "auto"  # scaled-dot-product attention kernel (ATTENTION_CHOICES)
    precision: str = "fp32"  # PRECISIONS
    fused: str = "auto"  # FUSED_CHOICES, or parts joined by "+" (fused_parts)

    def checked(self, device: torch.device) -> "StepOptions":
        """These options with every choice checked for ``device`` before any work.

        A bad choice is a ValueError that names the valid choices. ``compile`` is returned as its choice ("none",
        "model" or "blocks") and ``fused`` as what it means there (``resolve_fused``)."""
        device = _device(device)
        check_compile_mode(self.compile_mode)
        check_attention(self.attention, device)
        check_precision(self.precision, device)
        return replace(self, compile=compile_choice(self.compile), fused=resolve_fused(self.fused, device))


STEP_OPTIONS = tuple(field.name for field in fields(StepOptions))


PRESETS = {"auto": {}, "none": {"compile": False, "attention": "auto", "fused": "none"}}
"""Named step options: "auto", ``StepOptions``' defaults (our fused ops where they are measured
faster: on CUDA); "none", PyTorch as it is. More in ``parameters/speed/<name>.yaml``."""

PRESET_OPTIONS = tuple(name for name in STEP_OPTIONS if name != "precision")
"""The step options a preset may set: all but ``precision``, which is a run's own parameter (a preset is
measured per precision and offered in some: ``offered``)."""

PRESET_RECORD = ("measured_on", "gain")
"""What a preset file records of itself beside its step options: the machine and step it was measured on,
and ``gain``, its images/s over ``none`` per precision (``offered``)."""


def preset(name: str) -> dict:
    """The step options of a named preset or a preset file.

    The options are ``PRESET_OPTIONS``; a preset is named in ``PRESETS``, or is
    ``parameters/speed/<name>.yaml`` or a YAML file given by its path. They come with what the file
    records of itself (``PRESET_RECORD``); a ValueError naming the choices otherwise. A preset is only a
    name for a set of step options: a run gives any of them on its own (``compile: blocks``) and
    ``with_preset`` puts the two together."""
    folder = paths.PARAMETERS / "speed"
    if not isinstance(name, str):
        raise ValueError(
            f"speed must name a preset, got {name!r}: give step options as parameters of their own "
            f"({', '.join(STEP_OPTIONS)})"
        )
    if name in PRESETS:
        return dict(PRESETS[name])
    path = Path(name) if name.endswith((".yaml", ".yml")) else folder / f"{name}.yaml"
    if not path.is_file():
        files = sorted(p.stem for p in folder.glob("*.yaml"))
        raise ValueError(
            f"unknown speed preset {name!r}; valid choices: {', '.join([*PRESETS, *files])}, "
            "or a YAML file of step options"
        )
    values = read_yaml(path, "speed preset") or {}
    unknown = (
        sorted(set(values) - set(PRESET_OPTIONS) - set(PRESET_RECORD))
        if isinstance(values, dict)
        else ["(not a mapping)"]
    )
    if unknown:
        raise ValueError(
            f"{path}: unknown step option(s) {', '.join(unknown)}; a preset sets {', '.join(PRESET_OPTIONS)} "
            "(precision is a run's own parameter)"
        )
    return dict(values)


def offered(chosen: dict, precision: str, name: str) -> dict:
    """The step options of a preset for a run in ``precision``.

    ``chosen``: ``preset``'s mapping, ``name`` its name. A preset that records its gains (``gain``: images/s over
    ``none`` per precision, as measured) is offered only in a precision where it was measured faster: elsewhere it
    could only cost time (compiling a step that then runs no faster), so it is refused, with the reason and the
    precisions it is offered for."""
    options = {key: value for key, value in chosen.items() if key not in PRESET_RECORD}
    gains = chosen.get("gain")
    if gains is None:  # "auto", "none", a file without gains: no claim to check
        return options
    if gains.get(precision, 0) > 1:
        return options
    why = (
        f"measured no faster than 'none' there ({gains[precision]:.2f}x)"
        if precision in gains
        else "not measured there (python -m benchmarks presets measures it)"
    )
    faster = [f"{p} ({gain:.2f}x)" for p, gain in gains.items() if gain > 1]
    raise ValueError(
        f"speed preset {name!r} is not offered for precision {precision!r}: {why}; "
        f"it is offered for {', '.join(faster) or 'no precision'}; use speed 'auto' in {precision}"
    )


def with_preset(name: str, parameters: dict) -> dict:
    """A run's ``parameters`` with the speed preset ``name`` put in.

    A run's ``parameters`` are flat: ``precision`` and each step option under its own name, among others. The preset
    (``preset``) sets each of its step options that the run does not give (absent, or None: notebook 05's "not
    given"); one the run gives stays, whatever its value (``-p speed h100 -p compile False`` does not compile). The
    preset is refused in the run's precision if it was not measured faster there (``offered``). The one place a preset
    becomes step options: notebook 05, the finetuning command and sweep specs all come here (``runs.config_values``)."""
    precision = check_precision(parameters.get("precision", StepOptions.precision))  # its name; the device: Config
    given = {key: value for key, value in parameters.items() if not (key in PRESET_OPTIONS and value is None)}
    return offered(preset(name), precision, name) | given
