"""Fused kernels for what ``torch.compile`` leaves apart in a ViT training step.

``bias_gelu(mm, bias)`` is GELU (the exact, erf form of ``nn.GELU()``) of ``mm + bias``, where
``mm`` is the first feedforward layer's matrix product without its bias. Its backward returns the
gradient of ``mm`` *and* the bias gradient (the column sums of that gradient) from one pass over
the data. Compiled by inductor, the same two results take two passes over two (tokens x 4d)
tensors: a pointwise kernel writes the gradient for the matrix products and a separate reduction
reads the inputs again for the bias gradient (their share of a step: docs/benchmarks.md).

On CUDA the op runs two Triton kernels; elsewhere (and for float64, which the kernels, computing
in fp32, would not keep) it runs the same arithmetic in PyTorch (the reference the kernels are
tested against, and what a CPU computes). Both compute in fp32 (float64 stays float64) and return
``mm``'s dtype; the bias gradient is summed in fp32 before rounding to
the bias's dtype, as inductor's reduction does. It is a ``torch.library`` custom op with its own
autograd, so ``torch.compile`` graphs keep it whole. ``layers.fuse_bias_gelu`` puts it into a
ViT's feedforward layers.

``qkv_heads_backward(dq, dk, dv)`` is the backward of splitting the attention's q/k/v projection
into heads: it stacks the three head gradients back into the projection's (tokens x 3d) layout and,
in the same pass, sums the projection's bias gradient. Compiled by inductor these are again two
passes (a stack kernel and a reduction that reads the head gradients again). ``layers.fuse_qkv``
puts it into a ViT's attention through ``QkvHeads``, an autograd function over the projection and
its split.

The Triton kernels run on a CPU too under Triton's interpreter (``TRITON_INTERPRET=1``), which
is how the tests check them without a GPU.
"""

from __future__ import annotations

import functools
import math
from types import SimpleNamespace

import torch

SQRT_HALF = 1.0 / math.sqrt(2.0)
INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)

# The forward kernel is element-wise over the flat tensor, BLOCK elements per program. The backward
# and stack kernels walk ROWS rows per program in tiles of BLOCK_M rows x BLOCK_N columns, summing
# their column totals on the way (one fp32 partial row per ROWS rows); their loops are software
# pipelined over STAGES tiles, so the next tiles' loads are in flight while one is computed. Chosen on
# an H100 at ViT-Base/16's shapes, batch 512 (the timings: docs/benchmarks.md, fused ops).
BLOCK, BLOCK_M, BLOCK_N, ROWS, STAGES, WARPS = 2048, 32, 128, 512, 3, 4
TILES = {"ROWS": ROWS, "BLOCK_M": BLOCK_M, "BLOCK_N": BLOCK_N, "STAGES": STAGES, "num_warps": WARPS}
"""The backward and stack kernels' launch settings."""


def _on_triton(dtype: torch.dtype) -> bool:
    """Whether the Triton kernels serve ``dtype`` on CUDA: they compute in fp32, so not float64."""
    return dtype != torch.float64


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


def bias_gelu_reference(mm: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """GELU(mm + bias) in PyTorch, computed in fp32 (or float64), returned in ``mm``'s dtype."""
    x = mm.to(_compute_dtype(mm.dtype)) + bias.to(_compute_dtype(mm.dtype))
    return (0.5 * x * (1.0 + torch.erf(x * SQRT_HALF))).to(mm.dtype)


def bias_gelu_backward_reference(
    grad: torch.Tensor, mm: torch.Tensor, bias: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(gradient of ``mm``, gradient of ``bias``) of ``bias_gelu`` given the output's ``grad``."""
    dtype = _compute_dtype(mm.dtype)
    x = mm.to(dtype) + bias.to(dtype)
    derivative = 0.5 * (1.0 + torch.erf(x * SQRT_HALF)) + x * torch.exp(-0.5 * x * x) * INV_SQRT_2PI
    grad_mm = grad.to(dtype) * derivative
    return grad_mm.to(mm.dtype), grad_mm.reshape(-1, mm.shape[-1]).sum(0).to(bias.dtype)


@functools.cache
def _triton_kernels():
    """The Triton kernels, compiled on first use; ``SQRT_HALF`` and ``INV_SQRT_2PI`` written out (no globals)."""
    import triton
    import triton.language as tl

    @triton.jit
    def forward_kernel(mm_ptr, bias_ptr, out_ptr, total, N, BLOCK: tl.constexpr):
        offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < total
        bias = tl.load(bias_ptr + offsets % N, mask=mask, other=0.0).to(tl.float32)
        x = tl.load(mm_ptr + offsets, mask=mask, other=0.0).to(tl.float32) + bias
        y = 0.5 * x * (1.0 + tl.math.erf(x * 0.7071067811865476))
        tl.store(out_ptr + offsets, y.to(out_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def backward_kernel(  # noqa: PLR0913 -- its parameters are the Triton kernel's launch contract
        grad_ptr,
        mm_ptr,
        bias_ptr,
        grad_mm_ptr,
        partial_ptr,
        M,
        N,
        ROWS: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        STAGES: tl.constexpr,
    ):
        cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        bias = tl.load(bias_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)
        total = tl.zeros([BLOCK_N], dtype=tl.float32)
        for start in tl.range(0, ROWS, BLOCK_M, num_stages=STAGES):
            rows = tl.program_id(0) * ROWS + start + tl.arange(0, BLOCK_M)
            mask = (rows[:, None] < M) & (cols[None, :] < N)
            offsets = rows[:, None].to(tl.int64) * N + cols[None, :]
            x = tl.load(mm_ptr + offsets, mask=mask, other=0.0).to(tl.float32) + bias[None, :]
            g = tl.load(grad_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
            derivative = (
                0.5 * (1.0 + tl.math.erf(x * 0.7071067811865476)) + x * tl.exp(-0.5 * x * x) * 0.3989422804014327
            )
            d = tl.where(mask, g * derivative, 0.0)
            tl.store(grad_mm_ptr + offsets, d.to(grad_mm_ptr.dtype.element_ty), mask=mask)
            total += tl.sum(d, axis=0)
        tl.store(partial_ptr + tl.program_id(0).to(tl.int64) * N + cols, total, mask=cols < N)

    @triton.jit
    def stack_kernel(  # noqa: PLR0913 -- its parameters are the Triton kernel's launch contract
        head_ptr,
        out_ptr,
        partial_ptr,
        M,
        N,
        H,
        D,
        C,
        column,
        s_b,
        s_h,
        s_n,
        s_d,
        ROWS: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        STAGES: tl.constexpr,
    ):
        # head gradient [B, H, N, D] (any strides) -> out[:, column:column + C] of a (B*N, 3C) matrix,
        # with its column totals per ROWS rows
        cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        col_offsets = (cols // D).to(tl.int64) * s_h + (cols % D).to(tl.int64) * s_d
        total = tl.zeros([BLOCK_N], dtype=tl.float32)
        for start in tl.range(0, ROWS, BLOCK_M, num_stages=STAGES):
            rows = tl.program_id(0) * ROWS + start + tl.arange(0, BLOCK_M)
            mask = (rows[:, None] < M) & (cols[None, :] < C)
            row_offsets = (rows // N).to(tl.int64) * s_b + (rows % N).to(tl.int64) * s_n
            g = tl.load(head_ptr + row_offsets[:, None] + col_offsets[None, :], mask=mask, other=0.0)
            tl.store(out_ptr + rows[:, None].to(tl.int64) * (3 * C) + column + cols[None, :], g, mask=mask)
            total += tl.sum(g.to(tl.float32), axis=0)
        tl.store(partial_ptr + tl.program_id(0).to(tl.int64) * (3 * C) + column + cols, total, mask=cols < C)

    return SimpleNamespace(triton=triton, forward=forward_kernel, backward=backward_kernel, stack=stack_kernel)


def _matrix(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(-1, t.shape[-1])


def bias_gelu_triton(mm: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """``bias_gelu`` by the Triton forward kernel (contiguous output of ``mm``'s shape and dtype)."""
    ops = _triton_kernels()
    matrix = _matrix(mm)
    out = torch.empty(mm.shape, dtype=mm.dtype, device=mm.device)
    cols = matrix.shape[1]
    if matrix.numel():
        ops.forward[(ops.triton.cdiv(matrix.numel(), BLOCK),)](
            matrix, bias.contiguous(), out, matrix.numel(), cols, BLOCK=BLOCK, num_warps=WARPS
        )
    return out


def bias_gelu_backward_triton(
    grad: torch.Tensor, mm: torch.Tensor, bias: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``bias_gelu``'s backward by the Triton backward kernel.

    One pass writes the gradient of ``mm`` and an fp32 partial column sum per ``ROWS`` rows; the partials
    are then summed (in a fixed order: the result does not depend on scheduling)."""
    ops = _triton_kernels()
    matrix, grad_matrix = _matrix(mm), _matrix(grad)
    rows, cols = matrix.shape
    grad_mm = torch.empty(mm.shape, dtype=mm.dtype, device=mm.device)
    partial = torch.empty((ops.triton.cdiv(rows, ROWS), cols), dtype=torch.float32, device=mm.device)
    if matrix.numel():
        grid = (ops.triton.cdiv(rows, ROWS), ops.triton.cdiv(cols, BLOCK_N))
        ops.backward[grid](grad_matrix, matrix, bias.contiguous(), grad_mm, partial, rows, cols, **TILES)
    return grad_mm, partial.sum(0).to(bias.dtype)


def _check(mm: torch.Tensor, bias: torch.Tensor) -> None:
    if bias.dim() != 1 or mm.dim() < 1 or bias.shape[0] != mm.shape[-1]:
        raise ValueError(
            f"bias_gelu needs a bias of the last dimension's size; got {tuple(mm.shape)} and bias {tuple(bias.shape)}"
        )


def _bias_gelu_pytorch(mm: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """The op without Triton: on a CPU, and for float64 on CUDA."""
    _check(mm, bias)
    return bias_gelu_reference(mm, bias).contiguous()


@torch.library.custom_op("paperlib::bias_gelu", mutates_args=())
def bias_gelu(mm: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """GELU(mm + bias) (exact, erf form); its backward gives the bias gradient from the same pass."""
    return _bias_gelu_pytorch(mm, bias)


@bias_gelu.register_kernel("cuda")
def _bias_gelu_cuda(mm: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    if not _on_triton(mm.dtype):
        return _bias_gelu_pytorch(mm, bias)
    _check(mm, bias)
    return bias_gelu_triton(mm, bias)


@bias_gelu.register_fake
def _bias_gelu_fake(mm: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return torch.empty(mm.shape, dtype=mm.dtype, device=mm.device)


def _bias_gelu_backward_pytorch(
    grad: torch.Tensor, mm: torch.Tensor, bias: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The op without Triton: on a CPU, and for float64 on CUDA."""
    grad_mm, grad_bias = bias_gelu_backward_reference(grad, mm, bias)
    return grad_mm.contiguous(), grad_bias


@torch.library.custom_op("paperlib::bias_gelu_backward", mutates_args=())
def bias_gelu_backward(grad: torch.Tensor, mm: torch.Tensor, bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(gradient of ``mm``, gradient of ``bias``) of ``bias_gelu``."""
    return _bias_gelu_backward_pytorch(grad, mm, bias)


@bias_gelu_backward.register_kernel("cuda")
def _bias_gelu_backward_cuda(
    grad: torch.Tensor, mm: torch.Tensor, bias: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    if not _on_triton(mm.dtype):
        return _bias_gelu_backward_pytorch(grad, mm, bias)
    return bias_gelu_backward_triton(grad, mm, bias)


@bias_gelu_backward.register_fake
def _bias_gelu_backward_fake(
    grad: torch.Tensor, mm: torch.Tensor, bias: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty(mm.shape, dtype=mm.dtype, device=mm.device), torch.empty(
        bias.shape, dtype=bias.dtype, device=bias.device
    )


def _setup_context(ctx, inputs, output) -> None:
    mm, bias = inputs
    ctx.save_for_backward(mm, bias)


def _backward(ctx, grad: torch.Tensor):
    mm, bias = ctx.saved_tensors
    grad_mm, grad_bias = bias_gelu_backward(grad, mm, bias)
    need_mm, need_bias = ctx.needs_input_grad
    return (grad_mm if need_mm else None), (grad_bias if need_bias else None)


bias_gelu.register_autograd(_backward, setup_context=_setup_context)


def qkv_heads_backward_reference(
    dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The head gradients (each [B, H, N, D]) stacked into the projection's [B, N, 3 H D] layout, and the bias gradient.

    The bias gradient is the stack's column sums in fp32 (or float64)."""
    batch, heads, tokens, dim = dq.shape
    stacked = torch.stack([dq, dk, dv]).permute(1, 3, 0, 2, 4).reshape(batch, tokens, 3 * heads * dim)
    return stacked, stacked.reshape(-1, stacked.shape[-1]).to(_compute_dtype(dq.dtype)).sum(0)


def qkv_heads_backward_triton(
    dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``qkv_heads_backward`` by the Triton stack kernel, once per head gradient (any strides).

    One pass writes the stacked gradient and fp32 partial column sums per ``ROWS`` rows."""
    ops = _triton_kernels()
    batch, heads, tokens, dim = dq.shape
    width = heads * dim
    rows = batch * tokens
    out = torch.empty((batch, tokens, 3 * width), dtype=dq.dtype, device=dq.device)
    partial = torch.empty((ops.triton.cdiv(rows, ROWS), 3 * width), dtype=torch.float32, device=dq.device)
    if out.numel():
        grid = (ops.triton.cdiv(rows, ROWS), ops.triton.cdiv(width, BLOCK_N))
        for which, head in enumerate((dq, dk, dv)):
            ops.stack[grid](head, out, partial, rows, tokens, heads, dim, width, which * width, *head.stride(), **TILES)
    return out, partial.sum(0)


def _check_heads(dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor) -> None:
    if dq.dim() != 4 or dq.shape != dk.shape or dq.shape != dv.shape or not dq.dtype == dk.dtype == dv.dtype:
        raise ValueError(
            f"qkv_heads_backward needs three [B, H, N, D] gradients of one shape and dtype; got "
            f"{[(tuple(t.shape), t.dtype) for t in (dq, dk, dv)]}"
        )


def _qkv_heads_backward_pytorch(
    dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The op without Triton: on a CPU, and for float64 on CUDA."""
    _check_heads(dq, dk, dv)
    stacked, sums = qkv_heads_backward_reference(dq, dk, dv)
    return stacked.contiguous(), sums  # sums in _compute_dtype: fp32, or float64 for float64


@torch.library.custom_op("paperlib::qkv_heads_backward", mutates_args=())
def qkv_heads_backward(dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(the [B, N, 3 H D] gradient of the q/k/v projection, its fp32 column sums) from the head gradients."""
    return _qkv_heads_backward_pytorch(dq, dk, dv)


@qkv_heads_backward.register_kernel("cuda")
def _qkv_heads_backward_cuda(dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if not _on_triton(dq.dtype):
        return _qkv_heads_backward_pytorch(dq, dk, dv)
    _check_heads(dq, dk, dv)
    return qkv_heads_backward_triton(dq, dk, dv)


@qkv_heads_backward.register_fake
def _qkv_heads_backward_fake(dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    batch, heads, tokens, dim = dq.shape
    return (
        torch.empty((batch, tokens, 3 * heads * dim), dtype=dq.dtype, device=dq.device),
        torch.empty((3 * heads * dim,), dtype=_compute_dtype(dq.dtype), device=dq.device),
    )


class QkvHeads(torch.autograd.Function):
    """q, k, v heads of the attention's projection, split as timm's ``Attention`` splits it.

    The heads are [B, H, N, D] views (no copy) of the projection ``linear(x, weight, bias)``. The
    backward stacks the head gradients and sums the bias gradient in one pass (``qkv_heads_backward``),
    then runs the two matrix products.

    Under autocast the projection runs in the autocast dtype, as ``nn.Linear`` would; gradients are
    returned in the inputs' dtypes.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, heads: int):
        device = x.device.type
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype
        xc, wc = x.to(dtype), weight.to(dtype)
        with torch.autocast(device, enabled=False):
            qkv = torch.nn.functional.linear(xc, wc, bias.to(dtype))
        batch, tokens, _ = x.shape
        q, k, v = qkv.view(batch, tokens, 3, heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
        ctx.save_for_backward(xc, wc)
        ctx.dtypes = (x.dtype, weight.dtype, bias.dtype)
        return q, k, v

    @staticmethod
    def backward(ctx, dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor):
        xc, wc = ctx.saved_tensors
        x_dtype, weight_dtype, bias_dtype = ctx.dtypes
        stacked, sums = qkv_heads_backward(dq.to(wc.dtype), dk.to(wc.dtype), dv.to(wc.dtype))
        matrix = stacked.view(-1, stacked.shape[-1])
        need_x, need_weight, need_bias = ctx.needs_input_grad[:3]
        dx = (matrix @ wc).view(xc.shape).to(x_dtype) if need_x else None
        dweight = (matrix.t() @ xc.reshape(-1, xc.shape[-1])).to(weight_dtype) if need_weight else None
        dbias = sums.to(bias_dtype) if need_bias else None
        return dx, dweight, dbias, None
