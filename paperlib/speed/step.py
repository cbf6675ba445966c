"""A training step, as fast as its options make it, for the protocol code to call.

The protocol asks this module for its step (``make_step``, through ``train.step.build_step``): given the
model, whose trainable parameters it has set, the run's optimizer settings and its ``StepOptions``, a ``Step``
that takes a batch and does one optimisation step (forward, backward, clipping at a global norm,
the update) and returns the loss and the gradient norm before clipping as device tensors. How it is
made fast is decided here and nowhere else: the optimizer's kernels (``make_optimizer``: PyTorch's
fused SGD and AdamW on CUDA), the precision (``autocast_for``; or bf16 compute with fp32 master
weights, ``MasterWeights``), ``torch.compile`` of the model or its blocks (``compile_model``), the
attention kernel (``step_context``), our fused ops in the model (``fuse``), and micro-batches when a
batch does not fit in GPU memory. Every choice computes the same step, to rounding. The sweep's
cost estimate (``paperlib.sweeps.plan``) and the step benchmarks (``benchmarks.step``) build their steps as
``finetune`` does, through ``train.step.build_step`` and so ``make_step``.
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass

import torch
from timm.optim import param_groups_weight_decay
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from paperlib.records.names import check_choice
from paperlib.records.step_options import OPTIMIZERS, StepOptions, compile_choice, fused_parts
from paperlib.speed.layers import fuse_bias_gelu, fuse_qkv, linear_patch_embed
from paperlib.speed.options import (
    OWN_COMPILE_MODES,
    SDPA_BACKENDS,
    resolve_fused,
)

MODEL_FUSIONS = {"gelu": fuse_bias_gelu, "qkv": fuse_qkv}
"""The model's fused ops by name (``step_options.FUSED_PARTS``)."""


def autocast_for(device: torch.device, precision: str = "fp32"):
    """A context factory for forward passes in ``precision``.

    ``precision``: one of ``step_options.PRECISIONS`` checked for ``device`` (``options.checked``), by default the
    protocol's fp32. "autocast" and "bf16" (whose bf16 copy, ``MasterWeights``, runs under it) run under bf16 autocast,
    on CUDA and on a CPU; "fp32" and "tf32" run as they are (their TF32 flags: ``tf32_flags``)."""
    if precision in ("autocast", "bf16"):
        return lambda: torch.autocast(device.type, dtype=torch.bfloat16)
    return lambda: torch.autocast(device.type, enabled=False)


@contextlib.contextmanager
def tf32_flags(precision: str):
    """PyTorch's TF32 flags as ``precision`` asks, while the context lasts.

    After it, the caller's flags again (no global flag left behind). "tf32" allows TF32 tensor cores for matrix
    products (``torch.backends.cuda.matmul.allow_tf32``) and cuDNN's convolutions
    (``torch.backends.cudnn.allow_tf32``); every other precision has PyTorch's defaults, as the authors' code
    ran: matrix products in full fp32, convolutions allowed TF32. ``Step`` holds it over a whole step (backward
    and update included: a flag is read when each kernel launches) and over evaluation."""
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    before = matmul.allow_tf32, cudnn.allow_tf32
    matmul.allow_tf32, cudnn.allow_tf32 = precision == "tf32", True
    try:
        yield
    finally:
        matmul.allow_tf32, cudnn.allow_tf32 = before


def step_context(device: torch.device, attention: str = "auto", precision: str = "fp32"):
    """A context factory for forward passes: the precision and the attention kernel.

    Both checked for ``device`` (``options.checked``). ``precision``: ``autocast_for`` and its TF32 flags
    (``tf32_flags``), by default the protocol's fp32. ``attention``: unless "auto", the one scaled-dot-product
    attention kernel allowed to run (the same function in every kernel, to rounding; their speed differs by device).
    "auto" leaves the choice to PyTorch, except in bf16 on a CPU, where it is the math kernel."""
    autocast = autocast_for(device, precision)
    if attention == "auto" and device.type == "cpu" and precision in ("autocast", "bf16"):
        # PyTorch's CPU flash attention is slow backwards in bf16 (69% of a demo ViT step); the math kernel
        # gives the step fp32's speed there (71.5 against 152.0 ms, batch 32, one thread: docs/benchmarks.md)
        attention = "math"
    backend = None if attention == "auto" else getattr(SDPBackend, SDPA_BACKENDS[attention])

    @contextlib.contextmanager
    def context():
        with tf32_flags(precision), autocast(), sdpa_kernel(backend) if backend else contextlib.nullcontext():
            yield

    return context


def fuse(model: nn.Module, fused: str = "all") -> nn.Module:
    """``model`` with the fused ops of ``fused`` in its blocks, in place.

    The ops: "gelu", fc1's bias and GELU as ``kernels.bias_gelu`` (``layers.fuse_bias_gelu``);
    "qkv", the q/k/v projection and its split into heads as ``kernels.QkvHeads``
    (``layers.fuse_qkv``); "all" (or "gelu+qkv"), both; "auto", what ``resolve_fused`` gives for the
    model's device. The same parameters and function (to rounding); not undone by a later call."""
    return _fuse(model, fused_parts(resolve_fused(fused, _device_of(model))))


def _device_of(model: nn.Module) -> torch.device:
    return next((p.device for p in model.parameters()), torch.device("cpu"))


def _fuse(model: nn.Module, parts: tuple[str, ...]) -> nn.Module:
    for part in parts:
        MODEL_FUSIONS[part](model)
    return model


class MasterWeights:
    """``precision="bf16"``: forward and backward through a bf16 copy of ``model``.

    The optimizer updates ``model`` itself, whose fp32 parameters are the master weights.

    Mixed precision as in Apex's O2 level or FSDP's ``param_dtype``: after each backward the copy's
    bf16 gradients go to the master parameters as fp32 (``to_master``), clipping and the update run
    in fp32 there, and the updated weights go back to the copy (``from_master``), so small updates
    are not lost to bf16 rounding. Unlike autocast, which keeps the residual stream, LayerNorm
    outputs and their gradients in fp32, activations stay bf16 between blocks, which cuts the
    memory traffic of the element-wise kernels that bound a compiled ViT step on a GPU (figures:
    docs/benchmarks.md). It is not the paper's
    protocol (fp32, the default); its rounding differs.

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
        self._grads = None  # the masters' fp32 gradients, made by the first to_master and kept

    def compile(self, how: str = "model", mode: str = "default", fused: str = "none") -> "MasterWeights":
        self.forward = compile_model(self.module, how, mode, fused)
        return self

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        return self.forward(images.to(self.dtype))

    def zero_grad(self) -> None:
        self.module.zero_grad(set_to_none=True)

    def to_master(self) -> None:
        """The copy's gradients, as fp32, become the master parameters' gradients.

        One multi-tensor copy into buffers kept across steps, rather than a kernel and an allocation per parameter."""
        if self._grads is None:
            self._grads = [torch.empty_like(p) for p in self.masters]
        given = [
            (master, buffer, copied.grad)
            for master, buffer, copied in zip(self.masters, self._grads, self.copies)
            if copied.grad is not None
        ]
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
    """What a training step calls: ``model`` compiled as ``options`` ask, or its bf16 copy.

    Compiled by ``compile_model`` (``options``' compile, mode and fused ops); with ``precision="bf16"``, the bf16
    copy (``MasterWeights``), compiled likewise."""
    if options.precision == "bf16":
        return MasterWeights(model).compile(options.compile, options.compile_mode, options.fused)
    return compile_model(model, options.compile, options.compile_mode, options.fused)


def compile_model(model: nn.Module, how: str = "model", mode: str = "default", fused: str = "none"):
    """The model's forward through ``torch.compile``, from an empty compilation cache.

    Returns the callable to train with. ``how``, ``mode`` and ``fused`` are a step's options checked for the model's
    device (``options.checked``: ``fused`` resolved there, "auto" written out).

    ``how``: "model" compiles the whole forward (returns the compiled twin); "blocks" compiles each
    transformer block in place (``nn.Module.compile``): the blocks share their code, so one graph
    (two when the first block's input needs no gradient) serves them all and compilation does not
    grow with depth (regional compilation); "none" returns the model as it is. ``mode``:
    ``torch.compile``'s mode ("default" leaves it out) or one of ``OWN_COMPILE_MODES``.

    Dynamo may reuse a graph compiled for the same ``forward`` code when only the parameters'
    ``requires_grad`` differ (pytorch/pytorch#139476; seen with torch 2.11: ``linear``
    compiled after ``full`` ran full finetuning's whole backward). Reused the other way round, a
    graph compiled for a frozen model would give the blocks no gradients at all. Each run (or
    benchmarked component) therefore compiles afresh, and blocks compiled by an earlier call
    are returned to eager first.

    On CUDA the patch embedding's convolution is first replaced by the same function as one matrix
    product (``layers.linear_patch_embed``; same parameters, faster there), compiled or not. With
    ``fused`` other than "none", the blocks get our fused ops (``fuse``; same parameters, the same function to
    rounding). Neither change is undone by a later call.
    """
    device = _device_of(model)
    options = (
        {}
        if mode == "default"
        else {"options": dict(OWN_COMPILE_MODES[mode])}
        if mode in OWN_COMPILE_MODES
        else {"mode": mode}
    )
    for module in model.modules():  # undo an earlier in-place ("blocks") compilation
        if getattr(module, "_compiled_call_impl", None) is not None:
            module._compiled_call_impl = None
    if device.type == "cuda":
        linear_patch_embed(model)
    _fuse(model, fused_parts(fused))
    if how == "none":
        return model
    torch.compiler.reset()
    if how == "model":
        return torch.compile(model, **options)
    blocks = getattr(model, "blocks", None)
    if not isinstance(blocks, (nn.Sequential, nn.ModuleList)):  # VisionTransformer's Sequential, Eva's ModuleList
        raise ValueError(
            f"compile='blocks' needs a ViT with a `blocks` sequence; {type(model).__name__} has none (use 'model')"
        )
    for block in blocks:
        block.compile(**options)
    return model


def clip_and_update(
    optimizer, trainable: list[torch.Tensor], clip: float, master: MasterWeights | None = None
) -> torch.Tensor:
    """After a backward: clip the gradients at global norm ``clip`` and update.

    Returns the norm before clipping (a device tensor). With ``master``, the copy's gradients go to the fp32
    masters (``trainable``) and the updated masters back to the copy."""
    if master is not None:
        master.to_master()
    norm = torch.nn.utils.clip_grad_norm_(trainable, clip)
    optimizer.step()
    if master is not None:
        master.from_master()
    return norm


def warmup_steps(options: StepOptions) -> int:
    """Steps before a step of ``options`` runs at its speed.

    Compilation takes the first few (block 0 and the rest, forward and backward)."""
    return 1 if compile_choice(options.compile) == "none" else 3


def smaller_micro_batch(batch_size: int, micro: int) -> int:
    """The largest divisor of ``batch_size`` at most half of ``micro``: the next try after running out of memory."""
    if micro <= 1:
        raise ValueError("a micro-batch of one image cannot be split further")
    return max(d for d in range(1, micro // 2 + 1) if batch_size % d == 0)


def decay_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """The trainable parameters of ``model`` in two AdamW groups, by timm's rule.

    timm's rule is ``timm.optim.param_groups_weight_decay``: weight matrices decay; biases, norms
    (1-d) and the model's ``no_weight_decay()`` (a ViT's position embedding and class token) do
    not."""
    skip = model.no_weight_decay() if hasattr(model, "no_weight_decay") else ()
    groups = param_groups_weight_decay(model, weight_decay, no_weight_decay_list=skip)
    return [group for group in groups if group["params"]]


@dataclass(frozen=True)
class OptimizerSettings:
    """A run's optimizer, as ``make_optimizer`` builds it.

    ``optimizer`` "sgd" (SGD with ``momentum`` and no weight decay, the paper's) or "adamw" (AdamW with
    ``weight_decay`` on weight matrices only), at learning rate ``lr`` (the peak of the schedule). A bad
    ``optimizer`` is a ValueError when it is made."""

    optimizer: str
    lr: float
    momentum: float
    weight_decay: float = 0.0

    def __post_init__(self):
        check_choice(self.optimizer, OPTIMIZERS, "optimizer", "optimizers")


def make_optimizer(model: nn.Module, settings: OptimizerSettings) -> torch.optim.Optimizer:
    """The optimizer of ``model``'s trainable parameters, as ``settings`` say.

    On CUDA it runs PyTorch's fused kernel (one update kernel for all parameters). "sgd", SGD with
    ``momentum`` and no weight decay (the paper's, appendix C.3); "adamw", AdamW with
    ``weight_decay`` on weight matrices only (``decay_groups``)."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    cuda = bool(trainable) and trainable[0].device.type == "cuda"
    if settings.optimizer == "adamw":
        groups = decay_groups(model, settings.weight_decay)
        return torch.optim.AdamW(groups, lr=settings.lr, weight_decay=settings.weight_decay, fused=cuda)
    return torch.optim.SGD(trainable, lr=settings.lr, momentum=settings.momentum, weight_decay=0.0, fused=cuda)


class Step:
    """One optimisation step of a run as fast as its ``options`` make it.

    ``options`` are checked (``options.checked``). ``step(images, labels)`` -> (loss, gradient norm before
    clipping), device tensors.

    ``trainable`` are ``model``'s parameters with ``requires_grad``, those clipping sees and ``optimizer`` updates
    (with bf16 precision, the fp32 masters of ``MasterWeights``); ``forward`` is what
    runs the model (compiled, or ``MasterWeights``), ``network`` the module that runs
    (``train()``/``eval()``), ``context`` the context of its forward passes (precision, attention
    kernel), for evaluation too. With ``micro_batch`` 0, a batch that does not fit in GPU memory is
    split into micro-batches (gradient accumulation: the same update) and the step retried (here, in
    ``__call__``); ``micro`` is the micro-batch in use. Call ``loaded()`` after loading weights into
    the model (bf16 precision: they go to the copy that runs). Made by ``make_step``.
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer,
        options: StepOptions,
        batch_size: int,
        clip: float,
        micro_batch: int = 0,
        progress: bool = False,
    ):
        self.trainable = [p for p in model.parameters() if p.requires_grad]
        device = self.trainable[0].device if self.trainable else next(model.parameters()).device
        self.forward = make_forward(model, options)
        self.master = self.forward if isinstance(self.forward, MasterWeights) else None
        self.network = self.master.module if self.master else model
        self.context = step_context(device, options.attention, options.precision)
        self.optimizer, self.options, self.clip = optimizer, options, clip
        self.batch_size, self.fixed, self.progress = batch_size, bool(micro_batch), progress
        self.micro = micro_batch or batch_size

    def __call__(self, images: torch.Tensor, labels: torch.Tensor):
        while True:
            try:
                with tf32_flags(self.options.precision):  # backward and update too, not only the forward
                    return self.once(images, labels)
            except torch.cuda.OutOfMemoryError:
                if self.fixed or self.micro == 1:  # a micro-batch the user chose is kept: say so
                    raise
                self.micro = smaller_micro_batch(self.batch_size, self.micro)
            # out of the except block, the failed attempt's tensors are freed
            torch.cuda.empty_cache()
            if self.progress:
                print(
                    f"out of GPU memory, now {self.batch_size // self.micro} micro-batches of {self.micro}", flush=True
                )

    def once(self, images: torch.Tensor, labels: torch.Tensor):
        """One optimisation step at micro-batch ``micro``: forward and backward, clipping, the optimizer's update.

        The forward and backward passes run in chunks of ``micro`` images, gradients accumulated. Returns (loss,
        gradient norm before clipping) as device tensors, without waiting for the device: the caller decides when
        to read them back."""
        self.optimizer.zero_grad(set_to_none=True)
        if self.master is not None:
            self.master.zero_grad()
        total = torch.zeros((), device=images.device)
        for first in range(0, len(images), self.micro):
            with self.context():
                logits = self.forward(images[first : first + self.micro])
            chunk = labels[first : first + self.micro]
            loss = nn.functional.cross_entropy(logits.float(), chunk) * (len(logits) / len(images))
            loss.backward()
            total += loss.detach()
        return total, clip_and_update(self.optimizer, self.trainable, self.clip, self.master)

    def loaded(self) -> None:
        """Weights loaded into the model reach what runs (``MasterWeights``' bf16 copy)."""
        if self.master:
            self.master.from_master()


def make_step(
    model: nn.Module,
    options: StepOptions,
    *,
    optimizer: OptimizerSettings,
    batch_size: int,
    clip: float,
    micro_batch: int = 0,
    progress: bool = False,
) -> Step:
    """The step of a run that trains ``model``'s trainable parameters.

    Those are the parameters with ``requires_grad``, as the caller set them (the protocol decides what trains). The
    step has its optimizer (``make_optimizer`` of the ``OptimizerSettings`` ``optimizer``: "sgd" or "adamw", ``lr``,
    ``momentum``, ``weight_decay``) and is a ``Step`` of ``options`` (checked: ``options.checked``) at
    ``batch_size``, clipping at global norm ``clip``, ``micro_batch`` (0: the whole batch, split while the GPU runs
    out of memory). ``Step.optimizer`` is the optimizer, for the schedule and the checkpoints. What ``finetune``
    trains with, and what the step benchmarks time."""
    return Step(model, make_optimizer(model, optimizer), options, batch_size, clip, micro_batch, progress)
