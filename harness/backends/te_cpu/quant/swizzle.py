"""The block-scale layout TE's GEMM expects ("GEMM-swizzled" scales) and back.

cuBLASLt reads MXFP8 and NVFP4 block scales in 128x4 tiles: the scale matrix (one row per
data row, one column per K block), padded to a multiple of 128 rows and 4 columns, is cut into
128x4 tiles stored tile after tile (row-major over tiles); inside a tile, the scale of row
``r`` and column ``c`` sits at ``(r % 32) * 16 + (r // 32) * 4 + c``. TE's reference
(``custom_recipes/reference_nvfp4.py`` ``_recover_swizzled_scales``) undoes it as a reshape
to ``[rows/128, cols/4, 32, 4, 4]`` and a permutation; ``common/swizzle/swizzle.cu`` and
``gemm_swizzled_scale_idx`` write it. A column-wise scale matrix (one row per K block, one
column per data column) is swizzled as its transpose: the GEMM reads the column-wise data as
the transposed operand.
"""

from __future__ import annotations

import torch

TILE_ROWS, TILE_COLS = 128, 4


def swizzle(scales: torch.Tensor) -> torch.Tensor:
    """A row-scale matrix ``[R, C]`` (R a multiple of 128, C of 4) in swizzled order, same shape."""
    r, c = scales.shape
    if r % TILE_ROWS or c % TILE_COLS:
        raise ValueError(f"swizzled scales need [128k, 4j] matrices, got {list(scales.shape)}")
    t = scales.reshape(r // TILE_ROWS, 4, 32, c // TILE_COLS, 4).permute(0, 3, 2, 1, 4)
    return t.contiguous().reshape(r, c)


def unswizzle(scales: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`swizzle` (the buffer's shape ``[R, C]`` is the padded matrix's)."""
    r, c = scales.shape
    t = scales.reshape(r // TILE_ROWS, c // TILE_COLS, 32, 4, 4).permute(0, 3, 2, 1, 4)
    return t.contiguous().reshape(r, c)


def swizzle_columnwise(scales: torch.Tensor) -> torch.Tensor:
    """A column-scale matrix ``[C, R]`` swizzled as its transpose, kept in a ``[C, R]`` buffer."""
    return swizzle(scales.t().contiguous()).reshape(scales.shape)


def unswizzle_columnwise(scales: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`swizzle_columnwise`."""
    c, r = scales.shape
    return unswizzle(scales.reshape(r, c)).t().contiguous()
