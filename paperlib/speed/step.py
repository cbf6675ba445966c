"""A training step, as fast as its options make it, for the protocol code to call.

The protocol (``finetune``) asks this module for ``Step``: given the model, its trainable
parameters, the optimizer and the run's ``StepOptions``, a callable that takes a batch and does
one optimisation step (forward, backward, clipping at a global norm, the update) and returns the
loss and the gradient norm before clipping as device tensors. How it is made fast is decided
here and nowhere else: the precision (``autocast_for``; or bf16 compute with fp32 master weights,
``MasterWeights``), ``torch.compile`` of the model or its blocks (``compile_model``), the attention
kernel (``step_context``), our fused ops in the model (``fuse``) and in the optimizer
(``FusedSGD``), a CUDA graph replaying the whole step (``GraphedStep``), and micro-batches when a
batch does not fit in GPU memory. Every choice computes the same step, to rounding.
"""

from __future__ import annotations

import contextlib
import copy
import math

import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from .kernels import sgd_update
from .layers import fuse_bias_gelu, fuse_qkv, linear_patch_embed
from .options import (
    ATTENTION_CHOICES,
    OWN_COMPILE_MODES,
    StepOptions,
    check_attention,
    check_compile_mode,
    check_graph,
    check_precision,
    compile_choice,
    fused_parts,
    resolve_fused,
)

MODEL_FUSIONS = {"gelu": fuse_bias_gelu, "qkv": fuse_qkv}
"""The model's fused ops by name (``options.FUSED_PARTS``; "update" is the optimizer's)."""


def autocast_for(device: torch.device, cache: bool = True, precision: str = "autocast"):
    """A context factory for forward passes in ``precision`` (``options.PRECISIONS``): "autocast"
    and "bf16" (whose bf16 copy, ``MasterWeights``, runs under it) run under bf16 autocast, on CUDA
    and on a CPU; "fp32" and "tf32" run as they are (their TF32 flags: ``tf32_flags``).
    ``cache=False`` turns off autocast's cache of cast weights, as PyTorch asks of autocast inside a
    CUDA graph capture (``GraphedStep``)."""
    if check_precision(precision, device) in ("autocast", "bf16"):
        return lambda: torch.autocast(device.type, dtype=torch.bfloat16, cache_enabled=cache)
    return lambda: torch.autocast(device.type, enabled=False)


@contextlib.contextmanager
def tf32_flags(precision: str):
    """PyTorch's TF32 flags as ``precision`` asks, while the context lasts, then the caller's again
    (no global flag left behind): "tf32" allows TF32 tensor cores for matrix products
    (``torch.backends.cuda.matmul.allow_tf32``) and cuDNN's convolutions (``torch.backends.cudnn.allow_tf32``);
    every other precision has PyTorch's defaults, as the authors' code ran: matrix products in full
    fp32, convolutions allowed TF32. ``Step`` holds it over a whole step (backward and update
    included: a flag is read when each kernel launches) and over evaluation."""
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    before = matmul.allow_tf32, cudnn.allow_tf32
    matmul.allow_tf32, cudnn.allow_tf32 = precision == "tf32", True
    try:
        yield
    finally:
        matmul.allow_tf32, cudnn.allow_tf32 = before


def step_context(device: torch.device, attention: str = "auto", graph: bool = False, precision: str = "autocast"):
    """A context factory for forward passes: ``precision`` (``autocast_for``, its cache off for steps
    replayed from a CUDA ``graph``; and its TF32 flags, ``tf32_flags``) and, unless ``attention`` is
    "auto", the one scaled-dot-product attention kernel allowed to run (the same function in every
    kernel, to rounding; their speed differs by device). "auto" leaves the choice to PyTorch, except in
    bf16 on a CPU, where it is the math kernel."""
    autocast = autocast_for(device, cache=not graph, precision=precision)
    if check_attention(attention, device) == "auto" and device.type == "cpu" and precision in ("autocast", "bf16"):
        # PyTorch's CPU flash attention is slow backwards in bf16 (69% of a demo ViT step); the math kernel
        # gives the step fp32's speed there (71.5 against 152.0 ms, batch 32, one thread: docs/benchmarks.md)
        attention = "math"
    backend = None if attention == "auto" else getattr(SDPBackend, ATTENTION_CHOICES[attention])

    @contextlib.contextmanager
    def context():
        with tf32_flags(precision), autocast(), sdpa_kernel(backend) if backend else contextlib.nullcontext():
            yield

    return context


def fuse(model: nn.Module, fused: str = "all") -> nn.Module:
    """``model`` with the model's fused ops of ``fused`` in its blocks, in place: "gelu", fc1's bias
    and GELU as ``kernels.bias_gelu`` (``layers.fuse_bias_gelu``); "qkv", the q/k/v projection and
    its split into heads as ``kernels.QkvHeads`` (``layers.fuse_qkv``); "all" (or "gelu+qkv"),
    both; "auto", what ``resolve_fused`` gives for the model's device ("update" is the optimizer's,
    nothing here). The same parameters and function (to rounding); not undone by a later call."""
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    for part in fused_parts(resolve_fused(fused, device)):
        if part in MODEL_FUSIONS:
            MODEL_FUSIONS[part](model)
    return model


class MasterWeights:
    """``precision="bf16"``: forward and backward through a bf16 copy of ``model``; the optimizer
    updates ``model`` itself, whose fp32 parameters are the master weights.

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
    """What a training step calls: ``model`` through ``compile_model`` (``options``' compile, mode
    and fused ops), or with ``precision="bf16"`` its bf16 copy, compiled likewise (``MasterWeights``)."""
    if options.precision == "bf16":
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
                lrs[id(group)] = (
                    lr if isinstance(lr, torch.Tensor) else torch.full((), lr, dtype=torch.float32, device=device)
                )
            state = self.state[p]
            first = state.get("momentum_buffer") is None
            if first:
                state["momentum_buffer"] = torch.empty_like(p, memory_format=torch.contiguous_format)
            sgd_update(
                grad.contiguous(), p, state["momentum_buffer"], lrs[id(group)], scale, group["momentum"], first, copy_
            )
        return total


def compile_model(model: nn.Module, how: bool | str = "model", mode: str = "default", fused: str = "auto"):
    """The model's forward through ``torch.compile``, from an empty compilation cache; returns the
    callable to train with.

    ``how``: "model" compiles the whole forward (returns the compiled twin); "blocks" compiles each
    transformer block in place (``nn.Module.compile``): the blocks share their code, so one graph
    (two when the first block's input needs no gradient) serves them all and compilation does not
    grow with depth (regional compilation); "none" returns the model as it is. ``mode``:
    ``torch.compile``'s mode ("default" leaves it out) or one of ``OWN_COMPILE_MODES``.

    Dynamo may reuse a graph compiled for the same ``forward`` code when only the parameters'
    ``requires_grad`` differ (pytorch/pytorch#139476; seen with torch 2.11: ``linear``
    compiled after ``full`` ran full finetuning's whole backward). Reused the other way round, a
    graph compiled for a frozen model would give the blocks no gradients at all. Each run (or
    benchmarked configuration) therefore compiles afresh, and blocks compiled by an earlier call
    are returned to eager first.

    On CUDA the patch embedding's convolution is first replaced by the same function as one matrix
    product (``layers.linear_patch_embed``; same parameters, faster there), compiled or not. With
    ``fused`` other than "none" (by default "auto": on CUDA only), the blocks get our fused ops
    (``fuse``; same parameters, the same function to rounding). Neither change is undone by a later call.
    """
    how = compile_choice(how)
    check_compile_mode(mode)
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
    if any(p.is_cuda for p in model.parameters()):
        linear_patch_embed(model)
    fuse(model, fused)
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


def clip_and_update(
    optimizer, trainable: list[torch.Tensor], clip: float, master: MasterWeights | None = None
) -> torch.Tensor:
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
    the time each launch takes (docs/benchmarks.md has the profile). A
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

    def __init__(
        self,
        forward,
        trainable: list[torch.Tensor],
        optimizer,
        micro: int,
        clip: float,
        context,
        warmup: int = GRAPH_WARMUP,
    ):
        if not trainable:
            raise ValueError("a graphed step needs trainable parameters")
        if warmup < 2:  # the capture must not record a first step (the momentum's initialisation) or compile kernels
            raise ValueError(f"a graphed step needs at least 2 ordinary steps before its capture, got warmup={warmup}")
        self.forward, self.trainable, self.optimizer = forward, trainable, optimizer
        self.micro, self.clip, self.context, self.warmup = micro, clip, context, warmup
        self.device = trainable[0].device
        self.calls = 0  # ordinary steps run so far
        # fused SGD reads fp32
        self._lrs = [torch.zeros((), dtype=torch.float32, device=self.device) for _ in optimizer.param_groups]
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
            return training_step(
                self.forward, self.trainable, self.optimizer, images, labels, self.micro, self.clip, self.context
            )
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
            # the ordinary steps' gradients go before the graph takes its memory
            zero_grads(self.forward, self.optimizer)
            try:
                self._replay, self._outputs = self._capture(lambda: self._step(*self._inputs))
            except torch.cuda.OutOfMemoryError:
                raise  # train() retries it with micro-batches
            except RuntimeError as error:  # an op that cannot be recorded: say which option to drop
                # the allocator's error may come through the capture as a plain one
                if "out of memory" in str(error).lower():
                    raise torch.cuda.OutOfMemoryError(str(error)) from error
                raise RuntimeError(
                    f"recording the training step into a CUDA graph failed ({error}); an op in the step "
                    "cannot be recorded: run with graph=False, or try another attention kernel "
                    "(attention='flash') or fused='none' to find which"
                ) from error
        else:
            if images.shape != self._inputs[0].shape or labels.shape != self._inputs[1].shape:
                raise ValueError(
                    f"a graphed step replays one batch shape, {tuple(self._inputs[0].shape)}; got {tuple(images.shape)}"
                )
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


def smaller_micro_batch(batch_size: int, micro: int) -> int:
    """The largest divisor of ``batch_size`` at most half of ``micro``: the next try after running out of memory."""
    if micro <= 1:
        raise ValueError("a micro-batch of one image cannot be split further")
    return max(d for d in range(1, micro // 2 + 1) if batch_size % d == 0)


def sgd(
    parameters, lr: float, momentum: float, device: torch.device, fused_update: bool = False
) -> torch.optim.Optimizer:
    """SGD with momentum and no weight decay, the paper's optimizer, as fast as the options make it:
    ``FusedSGD`` with ``fused_update`` (clipping, the update and master copies in one pass), else
    ``torch.optim.SGD`` (one fused update kernel on CUDA)."""
    if fused_update:
        return FusedSGD(parameters, lr=lr, momentum=momentum)
    return torch.optim.SGD(parameters, lr=lr, momentum=momentum, weight_decay=0.0, fused=device.type == "cuda")


class Step:
    """One optimisation step of a run as fast as its ``options`` (checked: ``StepOptions.checked``)
    make it: ``step(images, labels)`` -> (loss, gradient norm before clipping), device tensors.

    ``forward`` is what runs the model (compiled, or ``MasterWeights``), ``network`` the module
    that runs (``train()``/``eval()``), ``context`` the context of its forward passes (precision,
    attention kernel), for evaluation too. With ``micro_batch`` 0, a batch that does not fit in
    GPU memory is split into micro-batches (gradient accumulation: the same update) and the step
    retried; ``micro`` is the micro-batch in use. Call ``loaded()`` after loading weights into the
    model (bf16 precision: they go to the copy that runs).
    """

    def __init__(
        self,
        model: nn.Module,
        trainable: list[torch.Tensor],
        optimizer,
        options: StepOptions,
        batch_size: int,
        clip: float,
        micro_batch: int = 0,
        progress: bool = False,
    ):
        device = trainable[0].device if trainable else next(model.parameters()).device
        self.forward = make_forward(model, options)
        self.master = self.forward if isinstance(self.forward, MasterWeights) else None
        self.network = self.master.module if self.master else model
        self.context = step_context(device, options.attention, options.graph, options.precision)
        self.trainable, self.optimizer, self.options, self.clip = trainable, optimizer, options, clip
        self.batch_size, self.fixed, self.progress = batch_size, bool(micro_batch), progress
        self.micro = micro_batch or batch_size
        self._step = self._make()

    def _make(self):
        return make_step(
            self.forward, self.trainable, self.optimizer, self.micro, self.clip, self.context, self.options.graph
        )

    def __call__(self, images: torch.Tensor, labels: torch.Tensor):
        while True:
            try:
                with tf32_flags(self.options.precision):  # backward and update too, not only the forward
                    return self._step(images, labels)
            except torch.cuda.OutOfMemoryError:
                if self.fixed or self.micro == 1:  # a micro-batch the user chose is kept: say so
                    raise
                self.micro = smaller_micro_batch(self.batch_size, self.micro)
                self._step = self._make()
            # out of the except block, the failed attempt's tensors are freed
            torch.cuda.empty_cache()
            if self.progress:
                print(
                    f"out of GPU memory, now {self.batch_size // self.micro} micro-batches of {self.micro}", flush=True
                )

    def loaded(self) -> None:
        """Weights loaded into the model reach what runs (``MasterWeights``' bf16 copy)."""
        if self.master:
            self.master.from_master()
