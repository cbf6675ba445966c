"""Finetuning one component (paper §5.2, appendix C.3, Tables 3-5): one run, readable top to bottom.

    from paperlib.finetune import Config, run
    metrics = run(Config(model="demo", dataset="digits", config="mha", lr=0.01, steps=300))

Protocol: a new classification head; trainable = the chosen component in every block + the head
+ the final LayerNorm (``components.set_trainable``); SGD with momentum 0.9 and no weight decay
(or, beyond the paper, AdamW: ``optimizer``, ``weight_decay``; and LoRA in place of the component's
weights: ``lora_rank``, ``paperlib.lora``);
linear warm-up then cosine decay to 0; gradients clipped at global norm 1 (the logged norm is the
one clipping saw); evaluation on the ``val`` split (20% of the training set, chosen by the seed)
every ``eval_every`` steps; the result is the test accuracy of the best-validation checkpoint.

Each run owns ``results/finetune/<model>/<dataset>/<config>/lr=<lr>/seed=<seed>/`` (``Config.folder``) with
``params.json``, ``history.csv``, ``metrics.json`` (written last: a run with it is finished) and,
while it runs, ``checkpoint.pt``; with ``save_weights``, ``weights.safetensors``: what the run
trained, as it was at the best-validation checkpoint, from which ``load_model`` rebuilds the
finetuned model. Started again with the same parameters, a finished run returns
its metrics and an interrupted one resumes from its last checkpoint; batches are a function of
(seed, step), so the resumed run ends where an uninterrupted one would. A non-finite loss stops the
run and is recorded as ``diverged``. bf16 autocast on CUDA (fp32 weights), fp32 on CPU; or, with
``precision="bf16"``, forward and backward in bf16 with fp32 master weights (``MasterWeights``). With
``micro_batch=0``, a batch that does not fit in GPU memory is split into micro-batches (gradient
accumulation, the same update) and the step retried.

Speed (the GPU time is what users pay): one step is ``training_step`` (the function the benchmark
times), the SGD update is one fused kernel on CUDA, losses and gradient norms stay on the device
and are read back every ``READ_BACK`` steps and at evaluations (not once per step, which would
stall the GPU), and ``compile`` runs the model (or each of its blocks) through ``torch.compile``.
``attention`` picks the attention kernel where PyTorch's own choice is not the fastest.
``compile_mode="coordinate-descent"`` adds inductor's tuning of its own kernels' launch settings.
``fused`` swaps in our fused ops (``kernels``: one pass where PyTorch makes several; the same function):
"gelu" and "qkv" in the model, "update" in the optimizer (``FusedSGD``); its default, "auto", uses
the model's on CUDA (Triton kernels) and none on a CPU. ``graph=True`` replays
each step from a CUDA graph (``GraphedStep``; not yet measured on a GPU, so off by default).
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import sys
import time
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

import pandas as pd
import torch
from torch import nn

from . import components, data, kernels, lora, models, paths
from .loader import CACHE_SIZE, DeviceLoader, cache_side, decode_workers, uint8_images

READ_BACK = 50  # steps between reads of losses and gradient norms from the device (and divergence checks)


@dataclass(frozen=True)
class Config:
    """One finetuning run. Defaults: the demo world, minutes on a CPU."""

    model: str = "demo"  # short name or timm ViT name
    dataset: str = "digits"  # downstream dataset (see data.dataset_names())
    config: str = "mha"  # mha, fc1, fc2, ln2, ln1, full or linear
    lr: float = 0.01  # peak learning rate
    seed: int = 0  # head initialisation, validation split, batch order, augmentation
    steps: int = 300  # optimisation steps
    batch_size: int = 64  # images per step (the paper: 512)
    micro_batch: int = 0  # images per forward pass (gradient accumulation); 0 = the whole batch, halved while the GPU runs out of memory
    warmup: int = 30  # linear warm-up steps
    eval_every: int = 50  # evaluate on val every this many steps (and at the end)
    device: str = "cpu"
    image_size: int = 0  # 0 = the model's resolution
    normalize: str = "imagenet"  # imagenet (the paper: ImageNet's mean and std) or model (the mean and std the model was pretrained with; models.normalization)
    data_root: str = ""  # "" = $VIT_PLASTICITY_DATA or data/
    momentum: float = 0.9
    clip: float = 1.0  # global gradient-norm clipping
    optimizer: str = "sgd"  # sgd (the paper: momentum, no weight decay) or adamw (beyond the paper: AdamW, betas 0.9/0.999)
    weight_decay: float = 0.0  # AdamW's decoupled weight decay, on weight matrices only (not biases, norms, position embedding, class token)
    compile: bool | str = False  # torch.compile: False/"none", True/"model" (the whole model) or "blocks" (one graph shared by the blocks)
    compile_mode: str = "default"  # torch.compile's mode: default, coordinate-descent, max-autotune-no-cudagraphs, ...
    attention: str = "auto"  # scaled-dot-product attention kernel: auto, flash, cudnn, efficient or math
    precision: str = "autocast"  # "autocast" (the protocol: bf16 autocast on CUDA, fp32 on CPU) or "bf16" (bf16 compute, fp32 master weights)
    fused: str = "auto"  # our fused kernels (Triton on CUDA; the same function): auto (gelu+qkv on CUDA, none elsewhere), none, all, or of gelu (fc1's bias+GELU), qkv (the q/k/v split), update (clipping and SGD in one pass) one or several joined by "+"
    graph: bool = False  # replay each training step from a CUDA graph (CUDA only; GraphedStep): the same step without the time between its kernels
    lora_rank: int = 0  # 0: the component's own weights train (the paper); r > 0: a rank-r LoRA update beside each of its weight matrices trains instead (``lora``; mha, fc1, fc2 or full)
    lora_alpha: float = 0.0  # LoRA's alpha (updates scaled by alpha / rank); 0 = the rank (a scale of 1; stored as the rank)
    lora_dropout: float = 0.0  # dropout on the LoRA updates' input
    tag: str = ""  # a name for runs whose parameters outside the folder name (steps, batch size, warm-up, momentum, clip...) differ from another's: its own folder (seed=<s>+<tag>) and results column, so an ablation keeps every run
    save_weights: bool = False  # keep the best checkpoint's trainable parameters in the run folder (weights.safetensors; load_model rebuilds the finetuned model); not part of what a run is

    def __post_init__(self):
        if isinstance(self.tag, (int, float)) and not isinstance(self.tag, bool):  # a sweep spec's `tag: [2000]`
            object.__setattr__(self, "tag", f"{self.tag:g}")
        # LoRA's alpha written one way: 0 means the rank, so lora_alpha=0 and lora_alpha=rank are one
        # run (one folder, one record, one row of the results tables)
        if self.lora_alpha == 0 and isinstance(self.lora_rank, int) and not isinstance(self.lora_rank, bool) and self.lora_rank > 0:
            object.__setattr__(self, "lora_alpha", float(self.lora_rank))

    def validate(self) -> "Config":
        """Fail before any work, with the valid choices."""
        components.check_config(self.config)
        data.check_dataset(self.dataset)
        models.resolve_name(self.model)
        if not (isinstance(self.lr, (int, float)) and math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"lr must be a positive number, got {self.lr!r}")
        for name in ("steps", "batch_size", "eval_every"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)!r}")
        if not 0 <= self.warmup < self.steps:
            raise ValueError(f"warmup must be in 0..steps-1 ({self.steps - 1}), got {self.warmup!r}")
        if self.micro_batch and self.batch_size % self.micro_batch:
            raise ValueError(f"micro_batch ({self.micro_batch}) must divide batch_size ({self.batch_size})")
        check_optimizer(self.optimizer, self.weight_decay)
        lora.check(self.config, self.lora_rank, self.lora_alpha, self.lora_dropout)
        models.normalization(self.model, self.normalize)  # a model without recorded statistics fails here, before any work
        if not isinstance(self.tag, str) or (self.tag and not paths.CUSTOM_NAME.fullmatch(self.tag)):
            raise ValueError(f"tag must be '' or one folder name of letters, digits, '_', '.' or '-' (e.g. 'steps2000'), got {self.tag!r}")
        if not isinstance(self.save_weights, bool):
            raise ValueError(f"save_weights must be True or False, got {self.save_weights!r}")
        options = self.step_options().checked(self.device)
        if self.optimizer != "sgd":  # what only SGD has
            if fuses_update(options.fused, torch.device(self.device)):
                raise ValueError(f"fused={self.fused!r} includes the fused SGD update, which {self.optimizer} does not have: "
                                 "leave 'update' out (e.g. fused='gelu+qkv' or 'auto')")
            if self.graph:
                raise ValueError(f"graph=True replays SGD's update; with optimizer={self.optimizer!r} use graph=False")
            if self.momentum != Config.momentum:
                raise ValueError(f"momentum is SGD's; {self.optimizer} has its own (betas 0.9, 0.999): leave momentum at {Config.momentum}")
        return self

    def step_options(self) -> StepOptions:
        """How this run's steps run (``StepOptions``: compilation, attention kernel, precision, fused ops)."""
        return StepOptions(**{name: getattr(self, name) for name in STEP_OPTIONS})

    def folder(self) -> Path:
        """``results/finetune/<model>/<dataset>/<config>/lr=<lr>/seed=<seed>``, with ``-<precision>``
        unless the precision is the protocol's, ``-<optimizer>[-wd<weight decay>]`` unless the
        optimizer is, ``-lora-r<rank>[-a<alpha>][-d<dropout>]`` for LoRA, ``-norm-model`` for
        the model's own normalisation, and ``+<tag>`` last (``+``, which no tag has, so that no tag
        can spell another suffix): a bf16, AdamW, LoRA, ``normalize="model"``
        or tagged run never replaces one of the paper's. Other parameters (steps, batch size,
        warm-up, momentum, clip...) are not in the name: a run that changes them replaces the
        run in its folder unless it has a tag of its own."""
        run = f"seed={self.seed}" + ("" if self.precision == "autocast" else f"-{self.precision}")
        if self.optimizer != "sgd":  # another optimizer, another folder: the paper's runs are kept
            run += f"-{self.optimizer}" + (f"-wd{self.weight_decay:g}" if self.weight_decay else "")
        if self.lora_rank:
            run += f"-lora-r{self.lora_rank}" + (f"-a{self.lora_alpha:g}" if self.lora_alpha != self.lora_rank else "")
            run += f"-d{self.lora_dropout:g}" if self.lora_dropout else ""
        run += "" if self.normalize == "imagenet" else f"-norm-{self.normalize}"
        run += f"+{self.tag}" if self.tag else ""
        return paths.results_dir() / "finetune" / self.model / self.dataset / self.config / f"lr={self.lr:g}" / run


def set_trainable(model: nn.Module, config: str, lora_rank: int = 0) -> nn.Module:
    """Freeze all but what a run of ``config`` trains: the component (``components.set_trainable``)
    or, with ``lora_rank``, the LoRA updates that the model carries beside it (``lora.set_trainable``)."""
    return (lora.set_trainable if lora_rank else components.set_trainable)(model, config)


def lr_factor(step: int, warmup: int, steps: int) -> float:
    """Learning-rate multiplier at ``step`` (0-based): linear warm-up, then cosine decay to 0."""
    if step < warmup:
        return (step + 1) / warmup
    return 0.5 * (1.0 + math.cos(math.pi * (step - warmup) / max(steps - warmup, 1)))


def autocast_for(device: torch.device, cache: bool = True):
    """The protocol's precision: a context factory, bf16 autocast on CUDA (fp32 master weights), fp32
    elsewhere. ``cache=False`` turns off autocast's cache of cast weights, as PyTorch asks of
    autocast inside a CUDA graph capture (``GraphedStep``)."""
    if device.type == "cuda":
        return lambda: torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=cache)
    return lambda: torch.autocast(device.type, enabled=False)


# the attention kernels ``F.scaled_dot_product_attention`` may choose from; "auto" leaves the choice to PyTorch
ATTENTION_CHOICES = {"auto": None, "flash": "FLASH_ATTENTION", "cudnn": "CUDNN_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "math": "MATH"}
CPU_ATTENTION = ("auto", "flash", "math")  # the kernels PyTorch has on a CPU


def check_attention(attention: str, device: torch.device) -> str:
    """``attention`` if it names a kernel this device has; otherwise a ValueError with the valid choices."""
    valid = tuple(ATTENTION_CHOICES) if device.type == "cuda" else CPU_ATTENTION
    if attention not in valid:
        raise ValueError(f"unknown attention kernel {attention!r} for a {device.type} device; valid choices: {', '.join(valid)}")
    return attention


def step_context(device: torch.device, attention: str = "auto", graph: bool = False):
    """A context factory for forward passes: the protocol's precision (``autocast_for``; its cache
    off for steps replayed from a CUDA ``graph``) and, unless ``attention`` is "auto", the one
    scaled-dot-product attention kernel allowed to run (the same function in every kernel, to
    rounding; their speed differs by device)."""
    autocast = autocast_for(device, cache=not graph)
    if check_attention(attention, device) == "auto":
        return autocast
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = getattr(SDPBackend, ATTENTION_CHOICES[attention])

    @contextlib.contextmanager
    def context():
        with autocast(), sdpa_kernel(backend):
            yield

    return context


COMPILE_CHOICES = ("none", "model", "blocks")


def compile_choice(value: bool | str) -> str:
    """What ``Config.compile`` asks for: "none", "model" (True) or "blocks"."""
    if value is False or value is None:
        return "none"
    if value is True:
        return "model"
    if value not in COMPILE_CHOICES:
        raise ValueError(f"unknown compile choice {value!r}; valid choices: {', '.join(COMPILE_CHOICES)} (or True/False)")
    return value


# modes of our own: torch.compile's default mode with these inductor options
OWN_COMPILE_MODES = {
    # inductor tunes the launch settings (block sizes, warps) of each kernel it generates, by timing
    # them: the fused LayerNorm, GELU and residual kernels that bound a bf16 ViT step. ViT-Base/16,
    # blocks compiled, H100: about a minute more compilation, 1-2% more images/s (docs/benchmarks.md)
    "coordinate-descent": {"coordinate_descent_tuning": True},
    # programmatic dependent launch (Hopper and later): each of inductor's kernels may start while the
    # one before it finishes, waiting for its data only where it reads it; for the time between
    # kernels. Not yet measured here (docs/benchmarks.md); on older GPUs inductor leaves it out
    "pdl": {"triton.enable_pdl": True},
    "coordinate-descent-pdl": {"coordinate_descent_tuning": True, "triton.enable_pdl": True},
}


def _inductor_knows(options: dict) -> bool:
    """Whether this PyTorch's inductor has every one of these options (older ones lack some)."""
    try:
        known = torch._inductor.config.get_config_copy()
    except AttributeError:
        return True
    return all(name in known for name in options)


def compile_modes() -> tuple[str, ...]:
    """The modes ``compile_model`` accepts: this PyTorch's ``torch.compile`` modes and those of
    ``OWN_COMPILE_MODES`` whose options its inductor has."""
    try:
        modes = tuple(torch._inductor.list_mode_options())
    except AttributeError:  # a PyTorch without the listing: the modes of torch 2.x
        modes = ("default", "reduce-overhead", "max-autotune-no-cudagraphs", "max-autotune")
    return modes + tuple(mode for mode, options in OWN_COMPILE_MODES.items() if _inductor_knows(options))


def check_compile_mode(mode: str) -> str:
    if mode not in compile_modes():
        raise ValueError(f"unknown torch.compile mode {mode!r}; valid modes: {', '.join(compile_modes())}")
    return mode


PRECISIONS = ("autocast", "bf16")


def _graphs_of_its_own(mode: str) -> bool:
    """Whether ``torch.compile``'s ``mode`` records CUDA graphs itself (reduce-overhead, max-autotune)."""
    if mode == "default" or mode in OWN_COMPILE_MODES:
        return False
    try:
        return bool(torch._inductor.list_mode_options(mode).get("triton.cudagraphs"))
    except (AttributeError, RuntimeError):  # a PyTorch without the listing: the modes of torch 2.x that do
        return mode in ("reduce-overhead", "max-autotune")


def check_precision(precision: str) -> str:
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; valid choices: {', '.join(PRECISIONS)}")
    return precision


# our fused ops (``kernels``) that a step may use, by name: each takes passes over the data that
# PyTorch leaves apart and makes them one (docs/benchmarks.md). The model's are put in by these
# functions; "update" is the optimizer's (``FusedSGD``).
MODEL_FUSIONS = {"gelu": models.fuse_bias_gelu, "qkv": models.fuse_qkv}
FUSED_PARTS = (*MODEL_FUSIONS, "update")
FUSED_CHOICES = ("auto", "none", "all", *FUSED_PARTS)  # and parts joined by "+", e.g. "gelu+qkv"
# what "auto" means on CUDA: the ops measured faster there (docs/benchmarks.md); "update" is not yet measured on a GPU
AUTO_FUSED_CUDA = ("gelu", "qkv")


def fused_parts(fused: str) -> tuple[str, ...]:
    """The ``FUSED_PARTS`` that a ``fused`` choice other than "auto" names ("none": none, "all": all,
    else its "+"-joined parts), in ``FUSED_PARTS``' order; a ValueError naming the valid choices otherwise."""
    if fused == "none":
        return ()
    if fused == "all":
        return FUSED_PARTS
    parts = fused.split("+") if isinstance(fused, str) else [fused]
    if not parts or any(part not in FUSED_PARTS for part in parts) or len(set(parts)) != len(parts):
        raise ValueError(f"unknown fused choice {fused!r}; valid choices: {', '.join(FUSED_CHOICES)}, "
                         f"or several of {', '.join(FUSED_PARTS)} joined by '+' (e.g. 'gelu+qkv')")
    return tuple(part for part in FUSED_PARTS if part in parts)


def _fused_name(parts: tuple[str, ...]) -> str:
    return "none" if not parts else "all" if set(parts) == set(FUSED_PARTS) else "+".join(parts)


def check_fused(fused: str, device: torch.device | None = None) -> str:
    """``fused`` if it is a valid choice (``FUSED_CHOICES``, or parts joined by "+") that can run on
    ``device`` (on CUDA the ops are Triton kernels); otherwise a ValueError that says why. "auto"
    always can: it is ``resolve_fused``."""
    if fused == "auto":
        return fused
    if fused_parts(fused) and device is not None and torch.device(device).type == "cuda" and not kernels.triton_available():
        raise ValueError(f"fused={fused!r} runs Triton kernels on CUDA, and Triton is not installed; "
                         "install it (pip install triton) or use fused='none' (or 'auto')")
    return fused


def check_graph(graph: bool, device: torch.device | None = None) -> bool:
    """``graph`` if it is a bool, and False or on a CUDA device (graphs are CUDA's); otherwise a
    ValueError that says what is valid."""
    if not isinstance(graph, bool):
        raise ValueError(f"graph must be True or False, got {graph!r}")
    if graph and device is not None and torch.device(device).type != "cuda":
        raise ValueError(f"graph=True replays steps from a CUDA graph and needs a CUDA device, not {torch.device(device).type!r}; "
                         "use graph=False there")
    return graph


def resolve_fused(fused: str, device: torch.device) -> str:
    """What ``fused`` means on ``device``, written one way ("none", "all", or parts joined by "+" in
    ``FUSED_PARTS``' order): "auto" is ``AUTO_FUSED_CUDA`` on CUDA when Triton is there (measured
    faster on an H100: docs/benchmarks.md) and "none" elsewhere (on a CPU the ops run their PyTorch
    reference, which inductor's own code beats)."""
    if check_fused(fused, device) != "auto":
        return _fused_name(fused_parts(fused))
    cuda = torch.device(device).type == "cuda" and kernels.triton_available()
    return _fused_name(AUTO_FUSED_CUDA if cuda else ())


def fuses_update(fused: str, device: torch.device) -> bool:
    """Whether ``fused`` on ``device`` includes the fused SGD update ("update": ``FusedSGD``)."""
    return "update" in fused_parts(resolve_fused(fused, device))


def fuse(model: nn.Module, fused: str = "all") -> nn.Module:
    """``model`` with the model's fused ops of ``fused`` in its blocks, in place: "gelu", fc1's bias
    and GELU as ``kernels.bias_gelu`` (``models.fuse_bias_gelu``); "qkv", the q/k/v projection and
    its split into heads as ``kernels.QkvHeads`` (``models.fuse_qkv``); "all" (or "gelu+qkv"),
    both; "auto", what ``resolve_fused`` gives for the model's device ("update" is the optimizer's,
    nothing here). The same parameters and function (to rounding); not undone by a later call."""
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    for part in fused_parts(resolve_fused(fused, device)):
        if part in MODEL_FUSIONS:
            MODEL_FUSIONS[part](model)
    return model


@dataclass(frozen=True)
class StepOptions:
    """How a training step runs, not what it trains: ``Config``'s fields of the same names, passed
    whole from ``train`` and the benchmarks to ``make_forward``, ``step_context`` and ``make_step``."""

    compile: bool | str = False  # False/"none", True/"model" or "blocks" (compile_model)
    compile_mode: str = "default"  # torch.compile's mode, or one of OWN_COMPILE_MODES
    attention: str = "auto"  # scaled-dot-product attention kernel (ATTENTION_CHOICES)
    precision: str = "autocast"  # PRECISIONS
    fused: str = "auto"  # FUSED_CHOICES, or parts joined by "+" (fused_parts)
    graph: bool = False  # replay steps from a CUDA graph (make_step, GraphedStep)

    def checked(self, device: torch.device) -> "StepOptions":
        """These options with every choice checked for ``device`` before any work (a ValueError
        that names the valid choices otherwise), ``compile`` as its choice ("none", "model" or
        "blocks") and ``fused`` as what it means there (``resolve_fused``)."""
        device = torch.device(device)
        check_compile_mode(self.compile_mode)
        check_attention(self.attention, device)
        check_precision(self.precision)
        check_graph(self.graph, device)
        if self.graph and compile_choice(self.compile) != "none" and _graphs_of_its_own(self.compile_mode):
            raise ValueError(f"compile_mode={self.compile_mode!r} records CUDA graphs of its own, which cannot be recorded "
                             "inside graph=True's; use graph=True with a mode without them (default, coordinate-descent, "
                             "max-autotune-no-cudagraphs) or graph=False")
        return replace(self, compile=compile_choice(self.compile), fused=resolve_fused(self.fused, device))


STEP_OPTIONS = tuple(field.name for field in fields(StepOptions))


class MasterWeights:
    """``precision="bf16"``: forward and backward through a bf16 copy of ``model``; the optimizer
    updates ``model`` itself, whose fp32 parameters are the master weights.

    Mixed precision as in Apex's O2 level or FSDP's ``param_dtype``: after each backward the copy's
    bf16 gradients go to the master parameters as fp32 (``to_master``), clipping and the update run
    in fp32 there, and the updated weights go back to the copy (``from_master``), so small updates
    are not lost to bf16 rounding. Unlike autocast, which keeps the residual stream, LayerNorm
    outputs and their gradients in fp32, activations stay bf16 between blocks, which cuts the
    memory traffic of the element-wise kernels that bound a compiled ViT step on a GPU (ViT-Base/16
    on an H100: 39.0% FLOP utilisation against 37.8%, docs/benchmarks.md). It is not the paper's
    protocol (``"autocast"``, the default); its rounding differs.

    Call the instance on images (fp32 images are cast); ``compile`` compiles the copy
    (``compile_model``); ``module`` is the copy, for ``train()``/``eval()``.
    """

    def __init__(self, model: nn.Module, dtype: torch.dtype = torch.bfloat16):
        self.dtype = dtype
        self.module = copy.deepcopy(model).to(dtype)
        self.forward = self.module
        copies = dict(self.module.named_parameters())
        trainable = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
        self.masters = [p for _, p in trainable]
        self.copies = [copies[name] for name, _ in trainable]
        self._grads = None  # the masters' fp32 gradients, made by the first to_master (FusedSGD needs none) and kept

    def compile(self, how: bool | str = "model", mode: str = "default", fused: str = "auto") -> "MasterWeights":
        self.forward = compile_model(self.module, how, mode, fused)
        return self

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        return self.forward(images.to(self.dtype))

    def zero_grad(self) -> None:
        self.module.zero_grad(set_to_none=True)

    def to_master(self) -> None:
        """The copy's gradients, as fp32, become the master parameters' gradients (one multi-tensor
        copy into buffers kept across steps, rather than a kernel and an allocation per parameter)."""
        if self._grads is None:
            self._grads = [torch.empty_like(p) for p in self.masters]
        given = [(master, buffer, copied.grad) for master, buffer, copied in zip(self.masters, self._grads, self.copies)
                 if copied.grad is not None]
        if given:
            torch._foreach_copy_([buffer for _, buffer, _ in given], [grad for _, _, grad in given])
        for master, buffer, _ in given:
            master.grad = buffer

    @torch.no_grad()
    def from_master(self) -> None:
        """The master weights, rounded to bf16, into the copy (after each update, and after loading weights)."""
        if self.copies:
            torch._foreach_copy_(self.copies, [master.detach() for master in self.masters])


def make_forward(model: nn.Module, options: StepOptions = StepOptions()):
    """What a training step calls: ``model`` through ``compile_model`` (``options``' compile, mode
    and fused ops), or with ``precision="bf16"`` its bf16 copy, compiled likewise (``MasterWeights``)."""
    if check_precision(options.precision) == "bf16":
        return MasterWeights(model).compile(options.compile, options.compile_mode, options.fused)
    return compile_model(model, options.compile, options.compile_mode, options.fused)


class FusedSGD(torch.optim.SGD):
    """SGD with momentum and no weight decay whose ``step`` clips and updates each parameter in
    one pass (``kernels.sgd_update``); ``fused="update"``.

    ``torch.optim.SGD``'s parameter groups, learning rates, state (``momentum_buffer``) and
    checkpoints, so either optimizer resumes the other's run; the same arithmetic to fp32 rounding.
    Unfused, a step with ``MasterWeights`` is five passes over the parameters: the bf16 gradients
    copied to fp32, their norm, clipping's product, the SGD update, the masters copied back to bf16.
    Here the norm is taken from the bf16 gradients themselves (in fp32: the same value) and one
    kernel per parameter does the rest, writing the bf16 copy as it goes. Learning rates may be
    floats or 0-d fp32 device tensors (``GraphedStep``'s); nothing waits for the device.
    """

    def __init__(self, params, lr: float, momentum: float):
        super().__init__(params, lr=lr, momentum=momentum, weight_decay=0.0)

    @torch.no_grad()
    def step(self, closure=None, *, clip: float = math.inf, master: "MasterWeights | None" = None) -> torch.Tensor:
        """Clip the gradients at global norm ``clip`` and update, as ``clip_grad_norm_`` then
        ``torch.optim.SGD.step()`` would; returns the norm before clipping (a device tensor). With
        ``master``, the gradients are its bf16 copy's, and the updated masters go to that copy."""
        if closure is not None:
            raise ValueError("FusedSGD.step takes no closure: run forward and backward first")
        copies = dict(zip(map(id, master.masters), master.copies)) if master is not None else {}
        work = []  # (group, parameter, gradient, copy)
        for group in self.param_groups:
            for p in group["params"]:
                copy_ = copies.get(id(p))
                grad = copy_.grad if copy_ is not None else p.grad
                if grad is not None:
                    work.append((group, p, grad, copy_))
        if not work:
            return torch.zeros((), device=self.param_groups[0]["params"][0].device)
        device = work[0][1].device
        norms = torch._foreach_norm([grad for _, _, grad, _ in work], 2, dtype=torch.float32)
        total = torch.linalg.vector_norm(torch.stack(norms))
        scale = torch.clamp(clip / (total + 1e-6), max=1.0)  # clip_grad_norm_'s factor
        lrs = {}
        for group, p, grad, copy_ in work:
            if id(group) not in lrs:
                lr = group["lr"]
                lrs[id(group)] = lr if isinstance(lr, torch.Tensor) else torch.full((), lr, dtype=torch.float32, device=device)
            state = self.state[p]
            first = state.get("momentum_buffer") is None
            if first:
                state["momentum_buffer"] = torch.empty_like(p, memory_format=torch.contiguous_format)
            kernels.sgd_update(grad.contiguous(), p, state["momentum_buffer"], lrs[id(group)], scale, group["momentum"], first, copy_)
        return total


OPTIMIZERS = ("sgd", "adamw")
"""``sgd``: the paper's (appendix C.3); ``adamw``: an extension (the paper's future work names a
tailored optimisation of each module)."""


def check_optimizer(optimizer: str, weight_decay: float = 0.0) -> str:
    """``optimizer`` if valid with ``weight_decay``; otherwise a ValueError with the valid choices."""
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {optimizer!r}; valid optimizers: {', '.join(OPTIMIZERS)}")
    if not (isinstance(weight_decay, (int, float)) and math.isfinite(weight_decay) and weight_decay >= 0):
        raise ValueError(f"weight_decay must be a non-negative number, got {weight_decay!r}")
    if optimizer == "sgd" and weight_decay:
        raise ValueError("the paper's SGD has no weight decay: weight_decay is for optimizer='adamw'")
    return optimizer


def decay_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """The trainable parameters of ``model`` in two AdamW groups, by timm's rule
    (``timm.optim.param_groups_weight_decay``): weight matrices decay; biases, norms (1-d) and the
    model's ``no_weight_decay()`` (a ViT's position embedding and class token) do not."""
    from timm.optim import param_groups_weight_decay

    skip = model.no_weight_decay() if hasattr(model, "no_weight_decay") else ()
    return [group for group in param_groups_weight_decay(model, weight_decay, no_weight_decay_list=skip) if group["params"]]


def make_optimizer(parameters, lr: float, momentum: float, device: torch.device, fused_update: bool = False,
                   optimizer: str = "sgd", weight_decay: float = 0.0) -> torch.optim.Optimizer:
    """SGD with momentum and no weight decay (appendix C.3): one fused update kernel on CUDA
    (``torch.optim.SGD(fused=True)``); with ``fused_update``, ``FusedSGD`` (clipping, the update
    and master copies in one pass). ``optimizer="adamw"``: ``torch.optim.AdamW`` (fused on CUDA)
    with ``weight_decay``; ``parameters`` may then be ``decay_groups``."""
    if check_optimizer(optimizer, weight_decay) == "adamw":
        return torch.optim.AdamW(parameters, lr=lr, weight_decay=weight_decay, fused=device.type == "cuda")
    if fused_update:
        return FusedSGD(parameters, lr=lr, momentum=momentum)
    return torch.optim.SGD(parameters, lr=lr, momentum=momentum, weight_decay=0.0, fused=device.type == "cuda")


def compile_model(model: nn.Module, how: bool | str = "model", mode: str = "default", fused: str = "auto"):
    """The model's forward through ``torch.compile``, from an empty compilation cache; returns the
    callable to train with.

    ``how``: "model" compiles the whole forward (returns the compiled twin); "blocks" compiles each
    transformer block in place (``nn.Module.compile``): the blocks share their code, so one graph
    (two when the first block's input needs no gradient) serves them all and compilation does not
    grow with depth (regional compilation); "none" returns the model as it is. ``mode``:
    ``torch.compile``'s mode ("default" leaves it out) or one of ``OWN_COMPILE_MODES``.

    Dynamo may reuse a graph compiled for the same ``forward`` code when only the parameters'
    ``requires_grad`` differ (pytorch/pytorch#139476; seen on an H100 with torch 2.11: ``linear``
    compiled after ``full`` ran full finetuning's whole backward). Reused the other way round, a
    graph compiled for a frozen model would give the blocks no gradients at all. Each run (or
    benchmarked configuration) therefore compiles afresh, and blocks compiled by an earlier call
    are returned to eager first.

    On CUDA the patch embedding's convolution is first replaced by the same function as one matrix
    product (``models.linear_patch_embed``; same parameters, faster there), compiled or not. With
    ``fused`` other than "none" (by default "auto": on CUDA only), the blocks get our fused ops
    (``fuse``; same parameters, the same function to rounding). Neither change is undone by a later call.
    """
    how = compile_choice(how)
    check_compile_mode(mode)
    options = {} if mode == "default" else {"options": dict(OWN_COMPILE_MODES[mode])} if mode in OWN_COMPILE_MODES else {"mode": mode}
    for module in model.modules():  # undo an earlier in-place ("blocks") compilation
        if getattr(module, "_compiled_call_impl", None) is not None:
            module._compiled_call_impl = None
    if any(p.is_cuda for p in model.parameters()):
        models.linear_patch_embed(model)
    fuse(model, fused)
    if how == "none":
        return model
    torch.compiler.reset()
    if how == "model":
        return torch.compile(model, **options)
    blocks = getattr(model, "blocks", None)
    if not isinstance(blocks, (nn.Sequential, nn.ModuleList)):  # VisionTransformer's Sequential, Eva's ModuleList
        raise ValueError(f"compile='blocks' needs a ViT with a `blocks` sequence; {type(model).__name__} has none (use 'model')")
    for block in blocks:
        block.compile(**options)
    return model


def training_step(forward, trainable: list[torch.Tensor], optimizer, images, labels, micro: int, clip: float, context):
    """One optimisation step: forward and backward (in chunks of ``micro`` images, gradients
    accumulated), clipping at global norm ``clip``, SGD update.

    Returns (loss, gradient norm before clipping) as device tensors, without waiting for the
    device: the caller decides when to read them back. ``forward`` is the model, its compiled twin,
    or ``MasterWeights`` (bf16 compute; ``trainable`` are then its fp32 masters); ``context`` makes
    the context of its forward passes (``step_context``: precision, attention kernel).
    """
    master = forward if isinstance(forward, MasterWeights) else None
    zero_grads(forward, optimizer)
    total = torch.zeros((), device=images.device)
    for first in range(0, len(images), micro):
        with context():
            logits = forward(images[first : first + micro])
        loss = nn.functional.cross_entropy(logits.float(), labels[first : first + micro]) * (len(logits) / len(images))
        loss.backward()
        total += loss.detach()
    return total, clip_and_update(optimizer, trainable, clip, master)


def zero_grads(forward, optimizer) -> None:
    """The gradients of a step gone (set to None): the optimizer's parameters' and, with
    ``MasterWeights``, its bf16 copy's."""
    optimizer.zero_grad(set_to_none=True)
    if isinstance(forward, MasterWeights):
        forward.zero_grad()


def clip_and_update(optimizer, trainable: list[torch.Tensor], clip: float, master: MasterWeights | None = None) -> torch.Tensor:
    """After a backward: clip the gradients at global norm ``clip`` and update; returns the norm
    before clipping (a device tensor). With ``master``, the copy's gradients go to the fp32 masters
    (``trainable``) and the updated masters back to the copy; ``FusedSGD`` does all of it in one
    pass per parameter."""
    if isinstance(optimizer, FusedSGD):
        return optimizer.step(clip=clip, master=master)
    if master is not None:
        master.to_master()
    norm = torch.nn.utils.clip_grad_norm_(trainable, clip)
    optimizer.step()
    if master is not None:
        master.from_master()
    return norm


GRAPH_WARMUP = 3  # steps a GraphedStep runs as usual before its capture: every kernel is compiled and loaded by then


class GraphedStep:
    """``training_step`` replayed from a CUDA graph: call it on (images, labels) as
    ``training_step`` is called, once per step; it returns the same (loss, gradient norm).

    A compiled ViT-Base/16 step launches hundreds of kernels, and the GPU idles between them for
    the time each launch takes (about 5 of 137 ms per step on an H100, docs/benchmarks.md). A
    graph launches the whole step (forward, backward, clipping, the update and, with
    ``MasterWeights``, both copies) at once. The first ``warmup`` calls are ordinary steps, on a
    side stream as PyTorch asks (compilation, cuBLAS and kernel loading happen there); the next
    call records the step into a graph, with its inputs, outputs, gradients and activations in
    memory the graph keeps, and every call replays it: the images and labels are copied into the
    recorded inputs and the learning rates, which a schedule changes between steps, into device
    tensors the recorded update reads. The (loss, norm) returned are copies, so they stay valid
    after the next replay. Same batch shape every call; nothing in the step may wait for the host
    (``training_step`` does not).
    """

    def __init__(self, forward, trainable: list[torch.Tensor], optimizer, micro: int, clip: float, context, warmup: int = GRAPH_WARMUP):
        if not trainable:
            raise ValueError("a graphed step needs trainable parameters")
        if warmup < 2:  # the capture must not record a first step (the momentum's initialisation) or compile kernels
            raise ValueError(f"a graphed step needs at least 2 ordinary steps before its capture, got warmup={warmup}")
        self.forward, self.trainable, self.optimizer = forward, trainable, optimizer
        self.micro, self.clip, self.context, self.warmup = micro, clip, context, warmup
        self.device = trainable[0].device
        self.calls = 0  # ordinary steps run so far
        self._lrs = [torch.zeros((), dtype=torch.float32, device=self.device) for _ in optimizer.param_groups]  # fused SGD reads fp32
        self._stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self._replay = self._inputs = self._outputs = None

    def _step(self, images: torch.Tensor, labels: torch.Tensor):
        """``training_step``, with the optimizer reading its learning rates from ``_lrs`` (its groups'
        Python numbers, which the schedule and the checkpoints own, are put back after)."""
        groups = self.optimizer.param_groups
        kept = [group["lr"] for group in groups]
        for group, lr in zip(groups, self._lrs):
            group["lr"] = lr
        try:
            return training_step(self.forward, self.trainable, self.optimizer, images, labels, self.micro, self.clip, self.context)
        finally:
            for group, lr in zip(groups, kept):
                group["lr"] = lr

    def _on_side_stream(self, run):
        if self._stream is None:
            return run()
        current = torch.cuda.current_stream(self.device)
        self._stream.wait_stream(current)
        try:
            with torch.cuda.stream(self._stream):
                return run()
        finally:  # also when the step fails (out of memory): later work waits for what it started
            current.wait_stream(self._stream)

    def _capture(self, run):
        """Record ``run`` (not run now) into a CUDA graph; returns (the graph's replay, ``run``'s outputs)."""
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=self._stream):
            outputs = run()
        return graph.replay, outputs

    def __call__(self, images: torch.Tensor, labels: torch.Tensor):
        for group, lr in zip(self.optimizer.param_groups, self._lrs):
            lr.fill_(group["lr"])
        if self._replay is None and self.calls < self.warmup:
            self.calls += 1
            return self._on_side_stream(lambda: self._step(images, labels))
        if self._replay is None:
            self._inputs = (images.clone(), labels.clone())
            zero_grads(self.forward, self.optimizer)  # the ordinary steps' gradients go before the graph takes its memory
            try:
                self._replay, self._outputs = self._capture(lambda: self._step(*self._inputs))
            except torch.cuda.OutOfMemoryError:
                raise  # train() retries it with micro-batches
            except RuntimeError as error:  # an op that cannot be recorded: say which option to drop
                if "out of memory" in str(error).lower():  # the allocator's error may come through the capture as a plain one
                    raise torch.cuda.OutOfMemoryError(str(error)) from error
                raise RuntimeError(f"recording the training step into a CUDA graph failed ({error}); an op in the step "
                                   "cannot be recorded: run with graph=False, or try another attention kernel "
                                   "(attention='flash') or fused='none' to find which") from error
        else:
            if images.shape != self._inputs[0].shape or labels.shape != self._inputs[1].shape:
                raise ValueError(f"a graphed step replays one batch shape, {tuple(self._inputs[0].shape)}; got {tuple(images.shape)}")
            self._inputs[0].copy_(images)
            self._inputs[1].copy_(labels)
        self._replay()
        return tuple(output.clone() for output in self._outputs)


def make_step(forward, trainable: list[torch.Tensor], optimizer, micro: int, clip: float, context, graph: bool = False):
    """One training step as a function of (images, labels) -> (loss, gradient norm): ``training_step``
    with these arguments, or with ``graph`` the same replayed from a CUDA graph (``GraphedStep``)."""
    if check_graph(graph):
        return GraphedStep(forward, trainable, optimizer, micro, clip, context)
    return lambda images, labels: training_step(forward, trainable, optimizer, images, labels, micro, clip, context)


def warmup_steps(options: StepOptions) -> int:
    """Steps before a step of ``options`` runs at its speed: compilation takes the first few
    (block 0 and the rest, forward and backward), a graph its ``GRAPH_WARMUP`` and the capture."""
    steps = 1 if compile_choice(options.compile) == "none" else 3
    return max(steps, GRAPH_WARMUP + 1) if options.graph else steps


@torch.no_grad()
def evaluate(model: nn.Module, loader: DeviceLoader, context, forward=None) -> tuple[float, float]:
    """(mean cross-entropy, accuracy) over a whole split; one read-back from the device at the end.
    ``model`` is the module that runs (``MasterWeights.module`` with bf16 precision), ``forward``
    what calls it (compiled, or ``MasterWeights``)."""
    model.eval()
    forward = model if forward is None else forward
    totals = torch.zeros(2, dtype=torch.float64, device=loader.device)  # summed loss, correct predictions
    for images, labels in loader:
        with context():
            logits = forward(images)
        loss = nn.functional.cross_entropy(logits.float(), labels, reduction="sum")
        totals += torch.stack([loss.double(), (logits.argmax(dim=1) == labels).sum().double()])
    loss, correct = totals.tolist()
    count = len(loader.images)
    return loss / count, correct / count


def smaller_micro_batch(batch_size: int, micro: int) -> int:
    """The largest divisor of ``batch_size`` at most half of ``micro``: the next try after running out of memory."""
    if micro <= 1:
        raise ValueError("a micro-batch of one image cannot be split further")
    return max(d for d in range(1, micro // 2 + 1) if batch_size % d == 0)


def _read_back(pending: list, rows: list) -> bool:
    """Move the pending (row, loss, norm) steps into ``rows`` with their values; True if one diverged.

    Rows after the first non-finite loss are dropped: the run stops at that step.
    """
    if not pending:
        return False
    values = torch.stack([torch.stack([loss.double(), norm.double()]) for _, loss, norm in pending]).tolist()
    pending_rows = [row for row, _, _ in pending]
    pending.clear()
    for row, (loss, norm) in zip(pending_rows, values):
        rows.append({**row, "train_loss": loss, "grad_norm": norm})
        if not math.isfinite(loss):
            return True
    return False


def _trainable_state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in components.trainable_parameters(model)}


def _write_json(path: Path, payload: dict) -> None:
    paths.atomic_write_text(path, json.dumps(payload, indent=2, default=str) + "\n")


def run(config: Config, progress: bool = False) -> dict:
    """Finetune, evaluate and record one run; returns its metrics (see module docstring).

    A run already finished with the same parameters is not repeated: its metrics are returned
    (trained again only if ``save_weights`` asks for weights it did not keep).
    """
    config.validate()
    folder = config.folder()
    if (folder / "metrics.json").is_file() and same_params(json.loads((folder / "params.json").read_text()), config):
        metrics = json.loads((folder / "metrics.json").read_text())
        if not config.save_weights or (folder / WEIGHTS).is_file() or metrics.get("best_step") is None:  # diverged before any checkpoint: nothing to keep
            return metrics
        (folder / "metrics.json").unlink()  # trained again for its weights: partial until that training ends
    return train(config, progress)[1]


def load_model(config: Config, merge: bool = True) -> nn.Module:
    """The model a finished run with ``save_weights=True`` finetuned, at its best-validation
    checkpoint, in eval mode: the pretrained model with the run's new head, and the parameters the
    run trained (component, head, final norm; or its LoRA updates) as it kept them. A LoRA run's
    updates are merged into a plain timm ViT (``lora.merge``) unless ``merge=False``. Its
    ``pretrained_cfg`` records the normalisation the run used. Save it as your own model with
    ``models.save_model(model, "custom/<name>")``."""
    from safetensors.torch import load_file

    config.validate()
    folder = config.folder()
    weights = folder / WEIGHTS
    if not (folder / "metrics.json").is_file() or not weights.is_file():
        raise FileNotFoundError(f"no finetuned weights in {paths.display(folder)}: run it with save_weights=True "
                                "(Config(save_weights=True), -p save_weights True, --save-weights true)")
    differ = differing(json.loads((folder / "params.json").read_text()), run_record(config), OUTPUT_ONLY + HOW_IT_RAN)
    if differ:
        raise ValueError(f"the run in {paths.display(folder)} differs from this configuration in {', '.join(differ)} "
                         "(fingerprints: a custom model or dataset changed since): run this configuration to finetune it")
    metrics = json.loads((folder / "metrics.json").read_text())
    model = models.create_model(config.model, num_classes=metrics["num_classes"])
    if config.lora_rank:
        lora.add_lora(model, config.config, config.lora_rank, config.lora_alpha, config.lora_dropout)
    state = load_file(str(weights))
    unexpected = sorted(set(state) - {name for name, _ in model.named_parameters()})
    if unexpected:
        raise ValueError(f"{paths.display(weights)} holds parameters this model does not have: {', '.join(unexpected[:5])}")
    model.load_state_dict(state, strict=False)
    if config.lora_rank and merge:
        model = lora.merge(model)
    if metrics.get("mean") is not None:  # the statistics it was finetuned with, which save_model then records
        model.pretrained_cfg = {**model.pretrained_cfg, "mean": tuple(metrics["mean"]), "std": tuple(metrics["std"])}
    return model.eval()


def input_fingerprints(config: Config) -> dict:
    """What a custom dataset and model hold now (``data.content_fingerprint``,
    ``models.content_fingerprint``), for the run's record; empty for the built-in ones."""
    found = {"dataset": data.content_fingerprint(config.dataset, config.data_root or None),
             "model": models.content_fingerprint(config.model)}
    return {key: value for key, value in found.items() if value}


def run_record(config: Config) -> dict:
    """What ``params.json`` (and a checkpoint) record of a run: its parameters and, for custom
    datasets and models, their fingerprints."""
    fingerprints = input_fingerprints(config)
    return asdict(config) | ({"fingerprints": fingerprints} if fingerprints else {})


OUTPUT_ONLY = ("save_weights",)
"""``Config`` fields that say what a run keeps, not what it computes: runs that differ only in them
are the same run."""

HOW_IT_RAN = ("device", "data_root", "micro_batch", "compile", "compile_mode", "attention", "fused", "graph")
"""``Config`` fields that say how a run ran, not what it trains: ``load_model`` rebuilds a run's
model whatever they were (a run on a GPU, compiled, loads on a CPU)."""

WEIGHTS = "weights.safetensors"
"""The file in a run's folder that ``save_weights`` keeps: its trainable parameters at the best checkpoint."""


def same_params(saved: dict, config: Config, record: dict | None = None) -> bool:
    """Whether parameters recorded by a run (``params.json``, a checkpoint) are ``config``'s, on
    the same custom data and model as now (``record``: ``run_record(config)``, if already made:
    it reads every file's status). A key the record lacks (written before ``Config`` had that
    field, or no fingerprints) counts as the field's default (none); ``OUTPUT_ONLY`` fields do not count."""
    return not differing(saved, run_record(config) if record is None else record, OUTPUT_ONLY)


def differing(saved: dict, record: dict, ignore: tuple[str, ...] = ()) -> list[str]:
    """The keys whose values differ between two run records (``params.json``, ``run_record``),
    a key one lacks counting as the field's default (none for fingerprints); ``ignore``d keys aside."""
    defaults = {field.name: field.default for field in fields(Config)} | {"fingerprints": {}}
    saved, record = {**defaults, **saved}, {**defaults, **record}
    return sorted(key for key in saved.keys() | record.keys() if key not in ignore and saved.get(key) != record.get(key))


@contextlib.contextmanager
def _deterministic(enabled: bool):
    """PyTorch's deterministic algorithms while a run trains; the caller's setting restored after."""
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(enabled)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(previous)


def train(config: Config, progress: bool = False) -> tuple[nn.Module, dict]:
    """Train (or resume) a run and record it; returns the model at its best-validation checkpoint and the metrics.
    A LoRA run's model carries its LoRA layers; ``lora.merge`` folds them into a plain timm ViT.

    Deterministic on a CPU (same seed, same numbers); on CUDA, as the caller set PyTorch (its
    deterministic mode there also needs ``CUBLAS_WORKSPACE_CONFIG``).
    """
    config.validate()
    cpu = torch.device(config.device).type != "cuda"
    with _deterministic(cpu or torch.are_deterministic_algorithms_enabled()):
        return _train(config, progress)


def _train(config: Config, progress: bool) -> tuple[nn.Module, dict]:
    folder = config.folder()
    params = run_record(config)
    recorded = folder / "params.json"

    device = torch.device(config.device)
    cuda = device.type == "cuda"
    context = step_context(device, config.attention, config.graph)
    torch.manual_seed(config.seed)

    root = config.data_root or None
    decoders = decode_workers()  # file datasets are decoded once, in parallel, then cached under the data root
    size = config.image_size or models.architecture(config.model).patch_embed.img_size[0]
    side = cache_side(size)  # a model above 224 gets a larger cache, so its crops are not upsampled from 256
    splits = {s: uint8_images(data.get_dataset(config.dataset, s, root=root, seed=config.seed), cache_size=side, workers=decoders) for s in ("train", "val", "test")}
    mean_std = models.normalization(config.model, config.normalize)
    num_classes = len(splits["test"].classes)
    torch.manual_seed(config.seed)  # again: decoding a file dataset the first time draws from the generator
    model = models.create_model(config.model, num_classes=num_classes).to(device)
    if config.lora_rank:  # after the head, so a LoRA run's head starts as the component-wise run's; before the fused ops
        lora.add_lora(model, config.config, config.lora_rank, config.lora_alpha, config.lora_dropout)
    if recorded.is_file() and not same_params(json.loads(recorded.read_text()), config, params):
        # the folder held a run of other parameters (steps, batch size, warm-up... are not in its
        # name): its record goes, so that it is never read back as this run's; only now that this
        # run's data and model have loaded, so that a run that cannot start loses nothing
        for stale in ("metrics.json", "history.csv", "checkpoint.pt", WEIGHTS):
            (folder / stale).unlink(missing_ok=True)
    _write_json(recorded, params)
    set_trainable(model, config.config, config.lora_rank)
    trainable = [p for _, p in components.trainable_parameters(model)]
    options = config.step_options().checked(device)
    forward = make_forward(model, options)
    master = forward if isinstance(forward, MasterWeights) else None
    network = master.module if master else model  # the module that runs
    train = DeviceLoader(splits["train"], config.batch_size, augment=True, image_size=size, device=device, seed=config.seed, images_on="auto", mean_std=mean_std)
    val = DeviceLoader(splits["val"], 256, augment=False, image_size=size, device=device, images_on="auto", mean_std=mean_std)
    test = DeviceLoader(splits["test"], 256, augment=False, image_size=size, device=device, images_on="auto", mean_std=mean_std)
    groups = decay_groups(model, config.weight_decay) if config.optimizer == "adamw" else trainable
    optimizer = make_optimizer(groups, config.lr, config.momentum, device, fuses_update(options.fused, device), config.optimizer, config.weight_decay)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, config.warmup, config.steps))

    start_step, rows, best = 0, [], {"val_accuracy": -1.0, "step": None, "state": None}
    checkpoint = folder / "checkpoint.pt"
    if checkpoint.is_file():
        saved = torch.load(checkpoint, map_location=device, weights_only=False)
        if same_params(saved["params"], config, params) and saved.get("cache_side", CACHE_SIZE if size <= 224 else None) == side:
            # on the images it started on; a checkpoint from before the record: CACHE_SIZE up to 224 px, and above, not known (it starts again)
            model.load_state_dict(saved["model"], strict=False)
            optimizer.load_state_dict(saved["optimizer"])
            schedule.load_state_dict(saved["schedule"])
            start_step, rows, best = saved["step"], saved["history"], saved["best"]
            if "rng" in saved:  # what draws from torch's generators during training (LoRA's dropout) goes on where it stopped
                torch.set_rng_state(saved["rng"]["cpu"])
                if cuda and saved["rng"].get("cuda") is not None:
                    torch.cuda.set_rng_state(saved["rng"]["cuda"], device)
            if master:
                master.from_master()

    micro = config.micro_batch or config.batch_size
    one_step = make_step(forward, trainable, optimizer, micro, config.clip, context, config.graph)
    status, start, seen = "finished", time.perf_counter(), 0
    pending = []  # steps whose loss and gradient norm are still on the device
    for step in range(start_step, config.steps):
        network.train()
        images, labels = train.batch(step)
        lr = optimizer.param_groups[0]["lr"]
        loss = None
        while loss is None:
            try:
                loss, norm = one_step(images, labels)
            except torch.cuda.OutOfMemoryError:
                if config.micro_batch or micro == 1:  # a micro-batch the user chose is kept: say so
                    raise
                micro = smaller_micro_batch(config.batch_size, micro)
                one_step = make_step(forward, trainable, optimizer, micro, config.clip, context, config.graph)
            if loss is None:  # out of the except block, the failed attempt's tensors are freed
                torch.cuda.empty_cache()
                if progress:
                    print(f"step {step + 1}: out of GPU memory, now {config.batch_size // micro} micro-batches of {micro}", flush=True)
        schedule.step()
        seen += len(images)
        pending.append(({"step": step + 1, "lr": lr}, loss, norm))
        evaluation = (step + 1) % config.eval_every == 0 or step + 1 == config.steps
        if (evaluation or (step + 1) % READ_BACK == 0) and _read_back(pending, rows):
            status = "diverged"
            break
        if evaluation:
            row = rows[-1]
            row["val_loss"], row["val_accuracy"] = evaluate(network, val, context, forward)
            current = _trainable_state(model)
            if row["val_accuracy"] > best["val_accuracy"]:
                best = {"val_accuracy": row["val_accuracy"], "step": step + 1, "state": current}
            rng = {"cpu": torch.get_rng_state(), "cuda": torch.cuda.get_rng_state(device) if cuda else None}
            state = {"params": params, "step": step + 1, "history": rows, "best": best, "rng": rng, "cache_side": side,
                     "model": current, "optimizer": optimizer.state_dict(), "schedule": schedule.state_dict()}
            paths.atomic_write(checkpoint, lambda tmp: torch.save(state, tmp))
            if progress:
                print(f"step {step + 1:6d}  loss {row['train_loss']:.4f}  val accuracy {row['val_accuracy']:.4f}", flush=True)
    wall = time.perf_counter() - start

    test_loss = test_accuracy = float("nan")
    if best["state"] is not None:
        model.load_state_dict(best["state"], strict=False)
        if master:
            master.from_master()
        test_loss, test_accuracy = evaluate(network, test, context, forward)
    table = pd.DataFrame(rows, columns=["step", "lr", "train_loss", "grad_norm", "val_loss", "val_accuracy"])
    paths.atomic_write(folder / "history.csv", lambda tmp: table.to_csv(tmp, index=False))
    kept = config.save_weights and best["state"] is not None
    if kept:
        from safetensors.torch import save_file

        tensors = {name: tensor.detach().to("cpu").contiguous() for name, tensor in best["state"].items()}
        paths.atomic_write(folder / WEIGHTS, lambda tmp: save_file(tensors, tmp, metadata={"step": str(best["step"])}))
    else:  # weights of an earlier training of this run would not be this training's
        (folder / WEIGHTS).unlink(missing_ok=True)
    metrics = {
        "status": status,
        "best_val_accuracy": best["val_accuracy"] if best["step"] is not None else float("nan"),
        "best_step": best["step"],
        "test_accuracy": test_accuracy,
        "test_loss": test_loss,
        "trainable_parameters": sum(p.numel() for p in trainable),
        "micro_batch": micro,
        "num_classes": num_classes,
        "wall_seconds": round(wall, 2),
        "images_per_second": round(seen / wall, 1) if wall > 0 else None,
        "device": torch.cuda.get_device_name(device) if cuda else "cpu",
        "precision": config.precision,
        "optimizer": config.optimizer,
        "lora_rank": config.lora_rank,
        "normalize": config.normalize,
        "cache_side": side,
        "weights": WEIGHTS if kept else None,
        "mean": list(mean_std[0]),
        "std": list(mean_std[1]),
        "torch": torch.__version__,
    }
    _write_json(folder / "metrics.json", metrics)
    checkpoint.unlink(missing_ok=True)
    return model, metrics


def history(config: Config) -> pd.DataFrame:
    """The history table of a run."""
    return pd.read_csv(config.folder() / "history.csv")


NOTEBOOK_NAMES = {"component": "config", "compile_model": "compile"}
"""Notebook 05's parameter names that differ from ``Config``'s (its parameter files use them)."""


def main(argv: list[str] | None = None) -> int:
    """``python -m paperlib.finetune [-f parameters/finetune/<dataset>.yaml] [--component mha --lr 1e-2 ...]``:
    one run, as notebook 05 runs it, without the notebook; prints its metrics as JSON."""
    from . import cli

    defaults = {f.name: f.default for f in fields(Config)}
    values = cli.parameters(argv, defaults, NOTEBOOK_NAMES, "One finetuning run (paper §5.2); notebook 05's parameters.", "python -m paperlib.finetune", flexible=frozenset({"compile"}))
    try:
        config = Config(**values).validate()
        with contextlib.redirect_stdout(sys.stderr):  # progress on stderr: stdout is the metrics' JSON alone
            metrics = run(config, progress=True)
    except (ValueError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    cli.print_json({"folder": paths.display(config.folder()), **metrics})
    return 0


if __name__ == "__main__":  # the package's module, not this __main__ copy of it, so its classes are the ones imported elsewhere
    from paperlib.finetune import main as _main

    raise SystemExit(_main())
