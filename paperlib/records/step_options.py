"""How a training step may run: the names of its choices, as a run records them.

``StepOptions`` holds them: ``compile`` (torch.compile of the model or of each block),
``compile_mode``, ``attention`` (the scaled-dot-product attention kernel), ``precision``
(``PRECISIONS``: "fp32", the paper's and every default's; beyond it "tf32", "autocast" and "bf16")
and ``fused`` (our fused ops, ``kernels``). What each means on a device, and its checks there, are
``speed.options``' (``speed.options.checked``: every choice checked for a device and resolved, "auto" written
out, which is what ``step`` builds a step from). A run gives each of them under its
own name (``Config``'s fields, notebook 05's parameters, a sweep spec's keys); a speed preset is a name
for a set of them besides ``precision`` (``preset``: "auto", the defaults; "none", nothing fused or
compiled; or a YAML file of ``parameters/speed/``), which ``with_preset`` puts into a run's parameters,
the options given explicitly overriding the preset's. Nothing here imports torch: reading specs, presets and results
(``specs``, ``runs_table.for_spec``, ``stats``) loads none of the training stack.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

from paperlib.records import paths
from paperlib.records.cli import read_yaml
from paperlib.records.names import check_choice

ATTENTION_CHOICES = ("auto", "flash", "cudnn", "efficient", "math")
"""The attention kernels ``F.scaled_dot_product_attention`` may be asked for; "auto" leaves the choice to PyTorch
(which a device has: ``speed.options.check_attention``)."""


COMPILE_CHOICES = ("none", "model", "blocks")


def compile_choice(value: bool | str) -> str:
    """What a run's ``compile`` (``StepOptions.compile``) asks for: "none", "model" (True) or "blocks"."""
    if value is False or value is None:
        return "none"
    if value is True:
        return "model"
    if value not in COMPILE_CHOICES:
        raise ValueError(
            f"unknown compile choice {value!r}; valid choices: {', '.join(COMPILE_CHOICES)} (or True/False)"
        )
    return value


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


def check_precision_name(precision: str) -> str:
    """``precision`` if it is one of ``PRECISIONS``; otherwise a ValueError naming them.

    Whether a device has it: ``speed.options.check_precision``."""
    return check_choice(precision, PRECISIONS, "precision")


OPTIMIZERS = ("sgd", "adamw")
"""``sgd``: the paper's (appendix C.3); ``adamw``: an extension (the paper's future work names a
tailored optimisation of each module)."""


# our fused ops (``kernels``) that a step may use, by name: each takes passes over the data that
# PyTorch leaves apart and makes them one, in the model's blocks (``step.fuse``): "gelu", fc1's bias
# and GELU; "qkv", the q/k/v projection's split into heads
FUSED_PARTS = ("gelu", "qkv")
FUSED_CHOICES = ("auto", "none", "all", *FUSED_PARTS)  # and parts joined by "+", e.g. "gelu+qkv"


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


def fused_name(parts: tuple[str, ...]) -> str:
    """``FUSED_PARTS`` written one way: "none", or joined by "+" in their order."""
    return "+".join(parts) or "none"


@dataclass(frozen=True)
class StepOptions:
    """How a training step runs, not what it trains: a run's ``step`` (``runs.Run.step``).

    A run's parameters and record name each under its own name (``precision``, ``compile``...; ``runs.run_fields``).
    Passed whole to what builds a step (``step.make_step``, ``step.make_forward``) and to the step benchmarks
    (``benchmarks.step``); ``step_context`` takes the two that shape a forward pass (attention, precision)."""

    # torch.compile: False/"none", True/"model" (the whole model) or "blocks" (one graph shared by the blocks)
    compile: bool | str = False
    # torch.compile's mode: default, coordinate-descent, max-autotune-no-cudagraphs, ... (or OWN_COMPILE_MODES)
    compile_mode: str = "default"
    attention: str = "auto"  # scaled-dot-product attention kernel: auto, flash, cudnn, efficient or math
    # fp32 (the paper's protocol: PyTorch's defaults, matrix products without TF32), or beyond it "tf32" (TF32 matrix
    # products and convolutions; CUDA only), "autocast" (bf16 autocast) or "bf16" (bf16 compute, fp32 master
    # weights): faster on a GPU, not the paper's, so their runs get their own folders (PRECISIONS)
    precision: str = "fp32"
    # our fused kernels (Triton on CUDA; the same function): auto (gelu+qkv on CUDA, none elsewhere), none, all, or of
    # gelu (fc1's bias+GELU), qkv (the q/k/v split) one or several joined by "+" (FUSED_CHOICES, fused_parts)
    fused: str = "auto"


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
    precision = check_precision_name(parameters.get("precision", StepOptions.precision))  # the device: Config
    given = {key: value for key, value in parameters.items() if not (key in PRESET_OPTIONS and value is None)}
    return offered(preset(name), precision, name) | given
