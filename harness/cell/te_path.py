"""TE's own record of the execution path it chose, read off a forward's autograd node.

Why: a cell's module value names a TE execution path (``GroupedLinear``'s split-quantize or
grouped-tensor path), but TE picks the path itself, at every forward, from the device, the
cuBLASLt version, the dtype and the recipe - and falls back without a word. On a GPU no
kernel counter says which path ran; TE's autograd context does: the ``grad_fn`` of a custom
autograd Function's output *is* its ``ctx``. ``_GroupedLinear.forward`` sets
``ctx.grouped_tensor_supported`` (module/grouped_linear.py); the op-fuser's
``GroupedLinear.fuser_forward_save_ctx`` sets ``use_grouped_tensor_path`` on its
``OperationContext``, which ``_OperationFuserAutogradFunction`` keeps as
``grad_fn.basic_op_ctxs[i]`` beside ``grad_fn.basic_ops[i]`` (ops/fuser.py).

Everything here is duck-typed attribute reads: no TE import, so the same reader serves real
TE, te-cpu and a test's fake. :func:`read` also reads, at the same moment, what TE's path
predicate saw (from the module that defines the class: its ``tex.get_cublasLt_version``,
``get_device_compute_capability`` and the predicate itself), so :func:`explain` can say why TE
took the other path in TE's own terms. Runs inside a rank (the runner calls it after each
forward); imports nothing of the harness.
"""

from __future__ import annotations

import os
import sys
from dataclasses import asdict, dataclass, field
from typing import Any, Iterator

__all__ = ["Choice", "SPLIT", "GROUPED", "NAMES", "read", "pick", "explain", "cublaslt_text"]

SPLIT, GROUPED = "split_quantize", "grouped_tensor"
#: a path as a reader sees it
NAMES = {SPLIT: "split-quantize", GROUPED: "grouped-tensor"}
#: autograd nodes looked at from the output before giving up (a reshape or a hook may sit on top)
MAX_NODES = 16
#: the flags of ``_GroupedLinear``'s ctx that decide or qualify the path (module/grouped_linear.py)
_MODULE_FLAGS = ("grouped_tensor_supported", "activation_dtype", "fp8", "fp8_recipe", "cpu_offloading", "debug")
#: the same of the op-fuser's grouped linear (ops/basic/grouped_linear.py)
_OP_FLAGS = ("use_grouped_tensor_path", "with_quantized_compute")
#: TE 2.20's path predicates, by where the choice was recorded
_PREDICATES = {"module": "is_module_grouped_tensor_path_supported",
               "ops": "is_op_fuser_grouped_tensor_path_supported"}
#: the grouped GEMM's cuBLASLt minimum (13.3), and on Hopper (13.4); TE 2.20's predicates
_MIN_CUBLASLT, _MIN_CUBLASLT_HOPPER = 130300, 130400
_HALF = ("torch.bfloat16", "torch.float16")


@dataclass
class Choice:
    """The path TE recorded for one forward, and what it decided from.

    Attributes:
        path: ``SPLIT`` or ``GROUPED``: the path TE took.
        where: ``"module"`` (``GroupedLinear``) or ``"ops"`` (``ops.GroupedLinear``).
        node: the autograd node that recorded it (``_GroupedLinearBackward``, ...).
        flags: the ctx attributes read, JSON-safe (the deciding one first).
        inputs: what TE's predicate saw, read right after the forward: ``cublaslt`` (TE's
            integer, e.g. 120901), ``compute_capability`` (``[9, 0]``), ``dtype``,
            ``predicate`` and its ``answer`` (None where unreadable), module attributes
            (``use_grouped_tensor``, ``fp8_calibration``) and ``unreadable`` (why not).
        reason: why TE took ``path`` (set by the runner when it is not the cell's path).
    """

    path: str
    where: str
    node: str
    flags: dict[str, Any] = field(default_factory=dict)
    inputs: dict[str, Any] = field(default_factory=dict)
    reason: str | None = None

    def serialize(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v not in (None, {})}


def _safe(v: Any) -> Any:
    """A flag's value as JSON keeps it: bools, numbers, strings; anything else as its text."""
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (tuple, list)):
        return [_safe(x) for x in v]
    return str(v)


def _nodes(out: Any) -> Iterator[Any]:
    """The autograd nodes from ``out.grad_fn`` down, breadth first, at most ``MAX_NODES``."""
    first = getattr(out, "grad_fn", None)
    queue, seen = ([first] if first is not None else []), 0
    while queue and seen < MAX_NODES:
        node = queue.pop(0)
        seen += 1
        yield node
        for nxt in getattr(node, "next_functions", ()) or ():
            if nxt and nxt[0] is not None:
                queue.append(nxt[0])


def _recorded(node: Any) -> tuple[str, Any, Any, dict[str, Any], Any] | None:
    """``(where, path flag, op, flags, dtype)`` when ``node`` holds TE's record of a path choice
    (``dtype``: the one TE handed its predicate, as an object)."""
    flag = getattr(node, "grouped_tensor_supported", None)
    if isinstance(flag, bool):
        flags = {k: _safe(getattr(node, k)) for k in _MODULE_FLAGS if hasattr(node, k)}
        return "module", flag, None, flags, getattr(node, "activation_dtype", None)
    ops, ctxs = getattr(node, "basic_ops", None), getattr(node, "basic_op_ctxs", None)
    for op, ctx in zip(ops or (), ctxs or ()):
        flag = getattr(ctx, "use_grouped_tensor_path", None)
        if isinstance(flag, bool):
            flags = {"op": type(op).__name__, **{k: _safe(getattr(ctx, k)) for k in _OP_FLAGS if hasattr(ctx, k)}}
            # the fuser hands its predicate the weight's dtype (autocast aside)
            weight = getattr(op, "weight0", None)
            weight = getattr(op, "weight", None) if weight is None else weight
            return "ops", flag, op, flags, getattr(weight, "dtype", None)
    return None


def read(out: Any, module: Any = None) -> Choice | None:
    """TE's recorded path choice for the forward that produced ``out`` (None: nothing recorded,
    e.g. a module with one path, or a backend that is not TE). ``module``: the module that ran
    (its class's defining module holds TE's predicate and what it reads)."""
    for node in _nodes(out):
        found = _recorded(node)
        if found is None:
            continue
        where, grouped, op, flags, dtype = found
        owner = op if op is not None else module
        return Choice(GROUPED if grouped else SPLIT, where, type(node).__name__, flags,
                      _inputs(where, owner, flags, dtype))
    return None


def _inputs(where: str, owner: Any, flags: dict[str, Any], dtype: Any) -> dict[str, Any]:
    """What TE's predicate reads, from the module that defines ``owner``'s class, now; a value
    that cannot be read is left out and ``unreadable`` says why (never raises: a reader that
    broke a cell would be a harness fault)."""
    out: dict[str, Any] = {"predicate": _PREDICATES[where], "dtype": _safe(dtype)}
    for attr in ("use_grouped_tensor", "fp8_calibration"):
        if isinstance(getattr(owner, attr, None), bool):
            out[attr] = getattr(owner, attr)
    home = sys.modules.get(type(owner).__module__) if owner is not None else None
    if home is None:
        out["unreadable"] = "the module that defines the class is not loaded"
        return out
    problems = []
    try:
        out["cublaslt"] = int(home.tex.get_cublasLt_version())
    except Exception as exc:  # noqa: BLE001 - any failure only means "not readable"
        problems.append(f"cuBLASLt version: {type(exc).__name__}: {exc}")
    try:
        out["compute_capability"] = [int(x) for x in home.get_device_compute_capability()]
    except Exception as exc:  # noqa: BLE001
        problems.append(f"compute capability: {type(exc).__name__}: {exc}")
    predicate = getattr(home, out["predicate"], None)
    # the recipe TE handed it: None without FP8; with FP8 the ctx keeps only its text, so
    # the predicate is not asked again (its answer would be for another recipe)
    if callable(predicate) and not (flags.get("fp8") or flags.get("with_quantized_compute")):
        try:
            out["answer"] = bool(predicate(None, dtype))
        except Exception as exc:  # noqa: BLE001
            problems.append(f"{out['predicate']}: {type(exc).__name__}: {exc}")
    if problems:
        out["unreadable"] = "; ".join(problems)
    return out


def pick(choices: list[Choice | None], wanted: str) -> Choice | None:
    """The choice a cell is judged by: the first forward that took another path than
    ``wanted``, else the first recorded one."""
    seen = [c for c in choices if c is not None]
    return next((c for c in seen if wanted and c.path != wanted), seen[0] if seen else None)


def cublaslt_text(version: int) -> str:
    """TE's integer cuBLASLt version as a reader writes it: 120901 -> ``12.9.1``."""
    return f"{version // 10000}.{version // 100 % 100}.{version % 100}"


def _grouped_gemm_gaps(inputs: dict[str, Any]) -> list[str]:
    """Why TE 2.20's predicate refuses the grouped GEMM, from what it saw (empty: no gap found)."""
    gaps = []
    dtype, cc, v = inputs.get("dtype"), inputs.get("compute_capability"), inputs.get("cublaslt")
    if dtype is not None and dtype not in _HALF:
        gaps.append(f"dtype {dtype}: the grouped GEMM takes bf16 or fp16 only")
    if cc is not None and not [9, 0] <= list(cc) <= [11, 0]:
        gaps.append(f"compute capability {cc[0]}.{cc[1]} (sm_{cc[0]}{cc[1]}): the grouped GEMM needs 9.0 to 11.0")
    if v is not None and v < _MIN_CUBLASLT:
        gaps.append(f"cuBLASLt {cublaslt_text(v)} < 13.3 required for the grouped GEMM")
    elif v is not None and cc is not None and list(cc) < [10, 0] and v < _MIN_CUBLASLT_HOPPER:
        gaps.append(f"cuBLASLt {cublaslt_text(v)} < 13.4 required for the grouped GEMM on Hopper")
    return gaps


def _saw(inputs: dict[str, Any]) -> str:
    """``is_module_grouped_tensor_path_supported saw torch.bfloat16, sm_90, cuBLASLt 12.9.1: False``."""
    cc, v = inputs.get("compute_capability"), inputs.get("cublaslt")
    seen = [str(inputs.get("dtype")), f"sm_{cc[0]}{cc[1]}" if cc else None,
            f"cuBLASLt {cublaslt_text(v)}" if v is not None else None]
    answer = f": {inputs['answer']}" if "answer" in inputs else ""
    return f"TE's {inputs.get('predicate')} saw {', '.join(s for s in seen if s)}{answer}"


def explain(choice: Choice, wanted: str) -> str:
    """Why TE took ``choice.path`` where the cell names ``wanted``, in TE's own terms:
    ``TE chose the split-quantize path: cuBLASLt 12.9.1 < 13.3 required for the grouped GEMM
    (TE's is_module_grouped_tensor_path_supported saw torch.bfloat16, sm_90, cuBLASLt 12.9.1: False)``."""
    inputs, flags = choice.inputs, choice.flags
    causes: list[str] = []
    if choice.path == SPLIT:
        # GroupedLinear: use_grouped_tensor, then the run-time exclusions, then the predicate
        if inputs.get("use_grouped_tensor") is False:
            causes.append("the module was built with use_grouped_tensor=False")
        if inputs.get("fp8_calibration"):
            causes.append("FP8 calibration is on")
        if flags.get("debug"):
            causes.append("TE's debug features are on")
        if flags.get("cpu_offloading"):
            causes.append("CPU offloading is on")
        if not causes and inputs.get("answer") is not True:
            causes = _grouped_gemm_gaps(inputs)
            if flags.get("fp8") or flags.get("with_quantized_compute"):
                causes.append(f"the FP8 recipe {flags.get('fp8_recipe') or ''}".rstrip()
                              + " is not one the grouped-tensor path supports here")
    else:
        if choice.where == "ops":
            causes.append("the op fuser takes the grouped-tensor path wherever its predicate holds "
                          "(it has no switch)")
        elif inputs.get("use_grouped_tensor"):
            env = os.environ.get("NVTE_GROUPED_LINEAR_USE_FUSED_GROUPED_GEMM")
            causes.append("the module has use_grouped_tensor=True"
                          + (f" (NVTE_GROUPED_LINEAR_USE_FUSED_GROUPED_GEMM={env})" if env else ""))
    if not causes:
        causes.append("no input the harness reads explains it")
    why = "; ".join(causes)
    unreadable = f"; unreadable: {inputs['unreadable']}" if inputs.get("unreadable") else ""
    return f"TE chose the {NAMES[choice.path]} path: {why} ({_saw(inputs)}{unreadable})"
