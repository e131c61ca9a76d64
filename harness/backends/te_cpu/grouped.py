"""CPU numerics of TE's grouped-tensor path: split offsets, the cuBLASLt grouped GEMM and the
grouped bias add.

The kernels behind the te-cpu extension's ``splits_to_offsets_multi`` and
``te_general_grouped_gemm_for_{grouped_tensor,discrete_in,discrete_out}``
(:mod:`harness.backends.te_cpu.extension` adapts them to TE's binding signatures). Plain torch
functions on top of :mod:`harness.backends.te_cpu.gemm`: they import nothing from the CPU layer, so a
test may load this file by path without applying the layer to its process.

What TE 2.20's common library does on these paths, reproduced here:

- ``nvte_splits_to_offsets_multi``: one inclusive prefix sum of the split sizes, in int64,
  times each output's stride; an output "with leading zero" starts with 0 (``n + 1``
  values), otherwise it holds the ``n`` running totals. Each value is stored with a C cast
  to the output's integer dtype.
- A grouped tensor (``GroupedTensorStorage``) is one flat buffer holding ``num_tensors``
  row-major 2-D members. Member ``i`` has ``first_dims[i]`` (or the common first dim) rows
  and ``last_dims[i]`` (or the common last dim) columns and starts at ``tensor_offsets[i]``
  elements, or - without offsets - at the running sum of the earlier members' sizes
  (``TensorShapeInfo`` / ``compute_grouped_tensor_offset`` in ``cublaslt_grouped_gemm.cu``).
- ``nvte_grouped_gemm*``: per member, ``D = alpha * op(B) @ op(A) + beta * C`` with C = D,
  operands widened exactly, fp32 accumulation, one rounding to D's dtype (BF16, FP16 or
  FP32) - :func:`harness.backends.te_cpu.gemm.gemm` per group. Operands must be BF16/FP16 ("Grouped
  GEMM inputs must be FP8, BF16, or FP16"): cuBLASLt's grouped GEMM has no FP32 operands,
  which is why TE's gates send fp32 to the split-quantize path. A member with an empty
  reduction gets ``beta * C`` (zeros when ``beta == 0``). Hopper takes one alpha/beta for
  all groups, Blackwell one per group.
- ``nvte_grouped_bias_add``: a *separate* kernel after the GEMM, so the output is rounded
  twice: ``D = T(float(D) + float(bias_g))`` for the ``sum(first_dims)`` valid rows;
  ``nvte_grouped_scaled_bias_add``: ``D = T(fmaf(float(bias_g), scale_row, float(D)))``.
  The bias is one ``(1, n)`` member per group in D's dtype; ``n`` must be a multiple of the
  kernel's vector width (8 for 16-bit, 4 for fp32 outputs).

Writes go through ``.data`` under ``torch.no_grad()`` (raw device memory, as in
:mod:`harness.backends.te_cpu.gemm`).
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import torch

from harness.cell.faults import GroupedError
from harness.backends.te_cpu import gemm as _gemm

#: operand dtypes cuBLASLt's grouped GEMM takes without quantization
OPERAND_DTYPES = (torch.bfloat16, torch.float16)
#: output dtypes it writes
OUTPUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
#: dtypes the offsets kernel reads and writes
INDEX_DTYPES = (torch.int32, torch.int64)
#: ``nvte_splits_to_offsets_multi``'s bulk allocation aligns every output to 16 bytes
BULK_ALIGNMENT = 16


def _host_ints(t: torch.Tensor) -> list[int]:
    return [int(v) for v in t.reshape(-1).tolist()]


# ---- split offsets ------------------------------------------------------------------------
def splits_to_offsets(split_sizes: torch.Tensor, strides: Sequence[int], include_leading_zero: Sequence[bool],
                      dtypes: Sequence[torch.dtype], bulk_allocate: bool = False) -> list[torch.Tensor]:
    """``nvte_splits_to_offsets_multi``: per output, the running totals of ``split_sizes``
    times its stride, optionally preceded by 0, in its integer dtype.

    ``bulk_allocate``: the outputs are views into one byte buffer, each 16-byte aligned, as
    TE's ``bulk_allocate`` lays them out; else each output has its own storage.
    """
    if not (len(strides) == len(include_leading_zero) == len(dtypes)):
        raise GroupedError("strides, include_leading_zero, and dtypes must have matching lengths, but got "
                           f"{len(strides)}, {len(include_leading_zero)}, and {len(dtypes)}.")
    if split_sizes.dim() != 1 or split_sizes.numel() == 0:
        raise GroupedError(f"split_sizes must be a non-empty 1D tensor, but got shape={tuple(split_sizes.shape)}.")
    if split_sizes.dtype not in INDEX_DTYPES:
        raise GroupedError(f"split_sizes must be an int32/int64 tensor, but got dtype={split_sizes.dtype}.")
    for i, dt in enumerate(dtypes):
        if dt not in INDEX_DTYPES:
            raise GroupedError(f"Expected outputs[{i}] to be an int32/int64 tensor, but got dtype={dt}.")
    n = split_sizes.numel()
    totals = torch.cumsum(split_sizes.to(torch.int64), 0)
    lengths = [n + (1 if lead else 0) for lead in include_leading_zero]
    outputs = _allocate(lengths, dtypes, split_sizes.device, bulk_allocate)
    for out, stride, lead in zip(outputs, strides, include_leading_zero):
        values = totals * int(stride)
        if lead:
            values = torch.cat([values.new_zeros(1), values])
        out.copy_(values.to(out.dtype))  # int64 -> int32 wraps as static_cast does
    return outputs


def _allocate(lengths: Sequence[int], dtypes: Sequence[torch.dtype], device: torch.device,
              bulk: bool) -> list[torch.Tensor]:
    if not bulk:
        return [torch.empty(length, dtype=dt, device=device) for length, dt in zip(lengths, dtypes)]
    starts, end = [], 0
    for length, dt in zip(lengths, dtypes):
        end = -(-end // BULK_ALIGNMENT) * BULK_ALIGNMENT
        starts.append(end)
        end += length * dt.itemsize
    buffer = torch.empty(end, dtype=torch.uint8, device=device)
    return [buffer[s:s + length * dt.itemsize].view(dt) for s, length, dt in zip(starts, lengths, dtypes)]


# ---- grouped tensors ----------------------------------------------------------------------
class Member(NamedTuple):
    """Where one member of a grouped tensor lives in its flat buffer."""

    offset: int
    rows: int
    cols: int


def layout(num_tensors: int, logical_shape: Sequence[int], first_dims: torch.Tensor | None,
           last_dims: torch.Tensor | None, tensor_offsets: torch.Tensor | None) -> list[Member]:
    """The members of a grouped tensor from its metadata, as ``TensorShapeInfo`` reads it."""
    if num_tensors < 1:
        raise GroupedError("Grouped GEMM requires non-empty inputs.")
    if len(logical_shape) != 2:
        raise GroupedError(f"grouped tensor needs a 2D logical shape, got {tuple(logical_shape)}")
    firsts = _host_ints(first_dims) if first_dims is not None else None
    lasts = _host_ints(last_dims) if last_dims is not None else None
    # GroupedTensorStorage.get_common_first_dim / get_common_last_dim
    common_first = logical_shape[0] // num_tensors if lasts is None else logical_shape[0]
    common_last = logical_shape[1]
    offsets = _host_ints(tensor_offsets) if tensor_offsets is not None else None
    members, running = [], 0
    for i in range(num_tensors):
        rows = firsts[i] if firsts is not None else common_first
        cols = lasts[i] if lasts is not None else common_last
        start = offsets[i] if offsets is not None else running
        members.append(Member(start, rows, cols))
        running += rows * cols
    return members


def member_views(data: torch.Tensor, members: Sequence[Member]) -> list[torch.Tensor]:
    """2-D views of ``data`` (the flat buffer), one per member."""
    flat = data.reshape(-1)
    views = []
    for i, m in enumerate(members):
        if m.offset < 0 or m.offset + m.rows * m.cols > flat.numel():
            raise GroupedError(f"grouped tensor member {i} ({m.rows}x{m.cols} at element {m.offset}) "
                               f"lies outside its buffer of {flat.numel()} elements")
        views.append(flat[m.offset:m.offset + m.rows * m.cols].view(m.rows, m.cols))
    return views


# ---- grouped GEMM -------------------------------------------------------------------------
def _scalars(t: torch.Tensor, num_tensors: int, per_group: bool, name: str) -> list[float]:
    expected = num_tensors if per_group else 1
    if t.numel() != expected:
        raise GroupedError(f"Grouped GEMM: {name} must have {'num_tensors' if per_group else '1'} element(s), "
                           f"got {t.numel()}")
    if t.dtype != torch.float32:
        raise GroupedError(f"Grouped GEMM: {name} must be float32, got {t.dtype}")
    values = [float(v) for v in t.reshape(-1).tolist()]
    return values if per_group else values * num_tensors


@torch.no_grad()
def grouped_gemm(A: Sequence[torch.Tensor], transa: bool, B: Sequence[torch.Tensor], transb: bool,
                 D: Sequence[torch.Tensor], *, alpha: torch.Tensor, beta: torch.Tensor, per_group_alpha_beta: bool,
                 fp32_mode: str = "ieee") -> None:
    """``D[i] = alpha * op(B[i]) @ op(A[i]) + beta * D[i]`` for every group, in place.

    Args:
        A, B, D: the groups' 2-D operands and outputs (views into grouped buffers or discrete
            tensors; D's dtype is the output dtype).
        alpha, beta: fp32 device scalars: one for all groups, or one per group when
            ``per_group_alpha_beta`` (Blackwell).

    Raises:
        GroupedError: operand or output dtypes the grouped GEMM does not take, mismatched
            group counts, wrong alpha/beta sizes.
        harness.backends.te_cpu.gemm.GemmError: a group's shapes do not multiply.
    """
    n = len(A)
    if len(B) != n or len(D) != n:
        raise GroupedError(f"grouped GEMM needs as many B and D members as A ({n} groups), "
                           f"got {len(B)} and {len(D)}")
    for t in (*A, *B):
        if t.dtype not in OPERAND_DTYPES:
            raise GroupedError(f"Grouped GEMM inputs must be FP8, BF16, or FP16, got {t.dtype}.")
    if len({t.dtype for t in (*A, *B)}) > 1:
        raise GroupedError("Grouped GEMM: A and B must have the same dtype.")
    for t in D:
        if t.dtype not in OUTPUT_DTYPES:
            raise GroupedError(f"Grouped GEMM: D must be BF16, FP16, or FP32, got {t.dtype}.")
    alphas = _scalars(alpha, n, per_group_alpha_beta, "alpha")
    betas = _scalars(beta, n, per_group_alpha_beta, "beta")
    for a, b, d, al, be in zip(A, B, D, alphas, betas):
        _gemm.output_shape(a, transa, b, transb)  # shapes must multiply even for an empty group
        if a.numel() == 0 or b.numel() == 0:
            # an empty reduction: D = beta * C (cuBLAS reads no C when beta == 0)
            if d.numel() and be != 1.0:
                d.data.copy_((be * d.data.to(torch.float32)).to(d.dtype) if be else torch.zeros_like(d.data))
            continue
        _gemm.gemm(a, transa, b, transb, out_dtype=d.dtype, out=d, accumulate=be != 0.0, alpha=al, beta=be,
                   fp32_mode=fp32_mode)


def bias_vector_width(dtype: torch.dtype) -> int:
    """Elements per vector access of ``grouped_bias_add_kernel``: 8 for 16-bit, 4 otherwise."""
    return 8 if dtype.itemsize <= 2 else 4


@torch.no_grad()
def grouped_bias_add(D: Sequence[torch.Tensor], bias: Sequence[torch.Tensor], scale: torch.Tensor | None = None,
                     row_starts: Sequence[int] | None = None) -> None:
    """``nvte_grouped_bias_add`` (or ``nvte_grouped_scaled_bias_add`` with ``scale``), in place.

    Args:
        D: the groups' outputs (2-D, same last dim ``n``), already rounded by the GEMM.
        bias: one ``(1, n)`` member per group, in D's dtype.
        scale: fp32, one value per row of the whole grouped output (``bias_scale``).
        row_starts: each group's first row in the whole output (for ``scale``).

    Raises:
        GroupedError: what the kernel's checks reject (dtypes, bias shape, ``n`` not a
            multiple of the vector width, scale size).
    """
    api = "Grouped scaled bias add" if scale is not None else "Grouped bias add"
    if len(D) < 1:
        raise GroupedError(f"{api}: number of tensors must be at least 1")
    if len(bias) != len(D):
        raise GroupedError(f"{api}: output and bias must have the same number of tensors")
    dtype = D[0].dtype
    n = D[0].shape[-1]
    for d, b in zip(D, bias):
        if d.dtype != dtype or b.dtype != dtype:
            raise GroupedError(f"{api}: output and bias must have matching dtypes")
        if b.shape[0] != 1:
            raise GroupedError(f"{api}: bias first dim must be 1")
        if d.shape[-1] != n or b.shape[-1] != n:
            raise GroupedError(f"{api}: output and bias last dims must match")
    width = bias_vector_width(dtype)
    if n % width:
        raise GroupedError(f"{api}: requires last dim divisible by {width}")
    if scale is not None:
        total = sum(d.shape[0] for d in D)
        if scale.dtype != torch.float32 or scale.dim() != 1:
            raise GroupedError(f"{api}: scale must be a 1D float32 tensor")
        if row_starts is None or scale.numel() < total:
            raise GroupedError(f"{api}: scale size ({scale.numel()}) must cover the output rows ({total})")
    for i, (d, b) in enumerate(zip(D, bias)):
        if d.numel() == 0:
            continue
        if scale is None:
            summed = d.data.to(torch.float32) + b.to(torch.float32)
        else:
            # fmaf: the exact b * s + d rounded once to fp32 (float64 holds b * s exactly)
            s = scale[row_starts[i]:row_starts[i] + d.shape[0]].to(torch.float64)[:, None]  # type: ignore[index]
            summed = (b.to(torch.float64) * s + d.data.to(torch.float64)).to(torch.float32)
        d.data.copy_(summed.to(dtype))


def setup_workspace_size(num_tensors: int) -> int:
    """``nvte_get_grouped_gemm_setup_workspace_size``: eight 16-byte aligned pointer arrays,
    six int arrays and one float array per group, rounded up to 256 bytes."""
    pointers = -(-num_tensors * 8 // 16) * 16
    size = 8 * pointers + 6 * num_tensors * 4 + num_tensors * 4
    return -(-size // 256) * 256

