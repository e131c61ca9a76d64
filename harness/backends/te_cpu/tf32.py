"""Backend ``te-cpu-tf32``: ``te-cpu`` with fp32 GEMMs emulating TF32, as TE runs them on CUDA.

TE's fp32 GEMMs use ``CUBLAS_COMPUTE_32F_FAST_TF32`` (``common/gemm/cublaslt_gemm.cu``):
operands keep 10 mantissa bits. This backend rounds fp32 operands to TF32 before the fp32
product (``harness.backends.te_cpu.gemm``), declares ``FP32_GEMM = "tf32"``, and the harness then
judges fp32 cells with TF32's unit roundoff 2^-11 (CONTRACTS §5). The GEMM precision is a
process-wide setting of the CPU layer, so ``te-cpu`` and ``te-cpu-tf32`` cannot share a
process: importing this after ``harness.backends.te_cpu.backend`` was imported with IEEE fp32 is an error.
"""

from __future__ import annotations

import os
import sys

if "harness.backends.te_cpu.backend" in sys.modules and sys.modules["harness.backends.te_cpu.backend"].FP32_GEMM != "tf32":
    raise ImportError("te-cpu (IEEE fp32 GEMMs) is already loaded in this process; "
                      "te-cpu-tf32 needs a process of its own")
os.environ["DW_TE_CPU_FP32"] = "tf32"

from harness.backends.te_cpu.backend import FP32_GEMM, GroupedLinear, Linear, describe, get_cpu_offload_context, ops  # noqa: E402

__all__ = ["Linear", "GroupedLinear", "ops", "FP32_GEMM", "describe", "get_cpu_offload_context"]
