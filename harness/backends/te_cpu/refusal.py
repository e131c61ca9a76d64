"""What te-cpu's layer says when TE asks it for something it lacks: ``MissingCpuKernel``,
naming the extension function and the TE code that called it. Its own module, below both the
extension stand-in (``extension``) and the quantization surface (``quant/``), which raise it.
"""

from __future__ import annotations

import sys

from harness.cell.faults import MissingCpuKernel
from harness.te_tree.scan import MODULE_NAME


def _te_caller() -> str:
    """The innermost TE Python function on the stack (who called the extension)."""
    frame = sys._getframe(1)
    while frame is not None:
        path = frame.f_code.co_filename.replace("\\", "/")
        if "/transformer_engine/" in path:
            rel = path[path.rindex("/transformer_engine/") + 1:]
            return f"{rel}:{frame.f_lineno} ({frame.f_code.co_name})"
        frame = frame.f_back
    return "outside TransformerEngine"


def missing(name: str, detail: str = "") -> MissingCpuKernel:
    """The error for a kernel this layer lacks: names the extension function and TE's caller."""
    extra = f" ({detail})" if detail else ""
    return MissingCpuKernel(
        f"{MODULE_NAME}.{name}{extra}: no CPU kernel in the te-cpu layer; called from "
        f"{_te_caller()}. te-cpu runs only TE's Linear / LayerNormLinear / GroupedLinear / "
        f"ops.GroupedLinear paths, non-quantized and under the recipes of harness/backends/te_cpu/quant "
        f"(harness/backends/te_cpu/extension.py)")
