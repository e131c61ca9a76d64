"""Path evidence: a cell records which path TE ran - TE's own record of its choice on the
autograd node (``harness.cell.te_path``, every backend that is TE) and the kernels it called
(te-cpu). A cell never passes on another path than its label names: where TE itself chose the
other path the cell is ``path_not_taken`` with TE's reason; where the evidence contradicts
itself or the label, a harness error (a grouped-tensor cell that silently took the
split-quantize path would otherwise pass hollow)."""

from __future__ import annotations

import types

import pytest

import harness.backends.reference as reference
from harness.records import fold
from harness.vocabulary import modules
from harness.cell import te_path
from harness.commands import repro_cmd as repro
from harness.vocabulary.matrix import Cell
from harness.cell.runner import RankContext, run_cell
from harness.vocabulary.status import HARNESS_ERROR, PATH_NOT_TAKEN

GROUPED = "grouped_linear-plain-hooks_off-unfused-bf16-ws1-ddp-mb1-g4-bias-igrad-nodelay"


def _reporting(calls: dict[str, int]) -> types.ModuleType:
    """The reference backend, claiming it called the extension functions ``calls``."""
    backend = types.ModuleType("reporting")
    for name in ("Linear", "GroupedLinear", "LayerNormLinear", "ops"):
        setattr(backend, name, getattr(reference, name))
    resets = []
    backend.reset_path_evidence = lambda: resets.append(1)
    backend.path_evidence = lambda: dict(calls)
    backend.resets = resets
    return backend


def test_the_labelled_path_passes_and_is_recorded():
    backend = _reporting({"te_general_grouped_gemm": 3})
    result = run_cell(backend, Cell.from_id(GROUPED), RankContext())
    assert result.status == "pass" and result.path == {"te_general_grouped_gemm": 3}
    assert backend.resets == [1]
    assert result.serialize()["path"] == {"te_general_grouped_gemm": 3}


def test_another_path_is_a_harness_error_naming_both():
    for calls in ({"generic_gemm": 3}, {"te_general_grouped_gemm": 3, "generic_gemm": 1}, {}):
        result = run_cell(_reporting(calls), Cell.from_id(GROUPED), RankContext())
        assert result.status == HARNESS_ERROR, calls
        assert result.error["type"] == "PathMismatch" and "grouped_linear" in result.error["message"]


def test_a_backend_without_evidence_records_none():
    result = run_cell(reference, Cell.from_id(GROUPED), RankContext())
    assert result.status == "pass" and result.path is None and "path" not in result.serialize()


def test_every_module_kind_names_its_evidence():
    for kind in modules.KINDS.values():
        assert kind.evidence, kind.name
        assert kind.path_mismatch({f: 1 for f in kind.evidence}) is None
        assert kind.path_mismatch({}) is not None
        for foreign in kind.excludes:
            assert "another path" in kind.path_mismatch({**{f: 1 for f in kind.evidence}, foreign: 1})


def test_under_a_recipe_the_grouped_tensor_path_must_run_its_own_quantizer():
    """A grouped-tensor cell under a recipe proves its path by its quantizer too: TE's
    ``group_quantize`` ran, the split-quantize path's ``split_quantize`` did not; a cell without a
    recipe is judged by its GEMMs alone."""
    for name in ("grouped_linear_tensor", "ops_grouped_linear_tensor"):
        kind = modules.KINDS[name]
        gemms = {f: 1 for f in kind.evidence}
        assert kind.path_mismatch(gemms) is None
        assert "group_quantize" in kind.path_mismatch(gemms, quantized=True)
        assert kind.path_mismatch({**gemms, "group_quantize": 1}, quantized=True) is None
        assert "another path" in kind.path_mismatch({**gemms, "group_quantize": 1, "split_quantize": 2}, quantized=True)


# --------------------------------------------------------------------------- TE's recorded choice

TENSOR = "grouped_linear_tensor-plain-hooks_off-unfused-bf16-ws1-ddp-mb1-g4-bias-igrad-nodelay"
SPLIT_KERNELS = {"te_general_grouped_gemm": 3}
GROUPED_KERNELS = {"te_general_grouped_gemm_for_discrete_in": 2, "te_general_grouped_gemm_for_discrete_out": 1}
UNAVAILABLE = ("TE chose the split-quantize path: cuBLASLt 12.9.1 < 13.3 required for the grouped GEMM (TE's "
               "is_module_grouped_tensor_path_supported saw torch.bfloat16, sm_90, cuBLASLt 12.9.1: False)")


class _Node:
    """A fake autograd node: attributes as TE's ctx sets them, and ``next_functions``."""

    def __init__(self, below: tuple = (), **attrs: object) -> None:
        self.next_functions = tuple((n, 0) for n in below)
        self.__dict__.update(attrs)


class _Out:
    def __init__(self, node: object) -> None:
        self.grad_fn = node


def _choosing(calls: dict[str, int] | None) -> types.ModuleType:
    """``fixtures.path_choice`` (TE's choice recorded as on a machine without the grouped GEMM),
    reporting the kernels ``calls`` (None: no kernel evidence, as real TE on a GPU)."""
    import fixtures.path_choice as chooser

    backend = types.ModuleType("choosing")
    for name in ("Linear", "GroupedLinear", "LayerNormLinear", "ops"):
        setattr(backend, name, getattr(chooser, name))
    if calls is not None:
        backend.reset_path_evidence = lambda: None
        backend.path_evidence = lambda: dict(calls)
    return backend


def test_the_reader_finds_the_module_ctx_below_a_view():
    ctx = _Node(grouped_tensor_supported=False, activation_dtype="torch.bfloat16", fp8=False, debug=False)
    choice = te_path.read(_Out(_Node(below=(_Node(below=(ctx,)),))))  # two reshapes on top
    assert choice is not None and choice.path == te_path.SPLIT and choice.where == "module"
    assert choice.node == "_Node" and choice.flags["grouped_tensor_supported"] is False
    assert choice.inputs["predicate"] == "is_module_grouped_tensor_path_supported"
    assert "unreadable" in choice.inputs  # no class, no module to read TE's inputs from


def test_the_reader_finds_the_op_fusers_basic_op_ctx():
    class GroupedLinear:  # the op, as the fuser keeps it beside its OperationContext
        pass

    node = _Node(basic_ops=[object(), GroupedLinear()],
                 basic_op_ctxs=[_Node(), _Node(use_grouped_tensor_path=True, with_quantized_compute=False)])
    choice = te_path.read(_Out(node))
    assert choice.path == te_path.GROUPED and choice.where == "ops"
    assert choice.flags == {"op": "GroupedLinear", "use_grouped_tensor_path": True, "with_quantized_compute": False}
    assert choice.inputs["predicate"] == "is_op_fuser_grouped_tensor_path_supported"


def test_nothing_recorded_is_none():
    assert te_path.read(_Out(None)) is None and te_path.read(object()) is None
    assert te_path.read(_Out(_Node(grouped_tensor_supported="yes"))) is None  # not TE's bool
    deep = _Node()
    for _ in range(te_path.MAX_NODES):
        deep = _Node(below=(deep,))
    deep.grouped_tensor_supported = None
    assert te_path.read(_Out(deep)) is None


@pytest.mark.parametrize("inputs, flags, why", [
    ({"dtype": "torch.bfloat16", "compute_capability": [9, 0], "cublaslt": 120901, "answer": False}, {},
     "cuBLASLt 12.9.1 < 13.3 required for the grouped GEMM"),
    ({"dtype": "torch.bfloat16", "compute_capability": [9, 0], "cublaslt": 130300, "answer": False}, {},
     "cuBLASLt 13.3.0 < 13.4 required for the grouped GEMM on Hopper"),
    ({"dtype": "torch.bfloat16", "compute_capability": [8, 0], "cublaslt": 130400, "answer": False}, {},
     "compute capability 8.0 (sm_80): the grouped GEMM needs 9.0 to 11.0"),
    ({"dtype": "torch.float32", "compute_capability": [10, 0], "cublaslt": 130400, "answer": False}, {},
     "dtype torch.float32: the grouped GEMM takes bf16 or fp16 only"),
    ({"dtype": "torch.bfloat16", "use_grouped_tensor": False, "cublaslt": 130400}, {},
     "the module was built with use_grouped_tensor=False"),
    ({"dtype": "torch.bfloat16", "cublaslt": 130400, "answer": True}, {"cpu_offloading": True},
     "CPU offloading is on"),
    ({"dtype": "torch.bfloat16", "compute_capability": [9, 0], "cublaslt": 130400, "answer": True}, {},
     "no input the harness reads explains it"),
])
def test_the_reason_is_tes_decision_input(inputs, flags, why):
    choice = te_path.Choice(te_path.SPLIT, "module", "_GroupedLinearBackward", flags,
                            {"predicate": "is_module_grouped_tensor_path_supported", **inputs})
    text = te_path.explain(choice, te_path.GROUPED)
    assert text.startswith(f"TE chose the split-quantize path: {why} (TE's is_module_grouped_tensor_path_supported saw ")


def test_the_op_fuser_choosing_the_grouped_path_is_explained_too():
    choice = te_path.Choice(te_path.GROUPED, "ops", "_OperationFuserAutogradFunctionBackward", {},
                            {"predicate": "is_op_fuser_grouped_tensor_path_supported", "dtype": "torch.bfloat16",
                             "compute_capability": [9, 0], "cublaslt": 130400, "answer": True})
    assert te_path.explain(choice, te_path.SPLIT) == (
        "TE chose the grouped-tensor path: the op fuser takes the grouped-tensor path wherever its predicate holds "
        "(it has no switch) (TE's is_op_fuser_grouped_tensor_path_supported saw torch.bfloat16, sm_90, "
        "cuBLASLt 13.4.0: True)")


@pytest.mark.parametrize("calls", [SPLIT_KERNELS, None], ids=["kernels", "ctx-flags-alone"])
def test_te_choosing_another_path_is_path_not_taken_with_tes_reason(calls):
    result = run_cell(_choosing(calls), Cell.from_id(TENSOR), RankContext())
    assert result.status == PATH_NOT_TAKEN and result.error is None
    assert result.choice["reason"] == UNAVAILABLE and result.choice["node"] == "GroupGemmBackward"
    assert result.choice["inputs"]["cublaslt"] == 120901 and result.choice["inputs"]["answer"] is False
    assert result.path == calls
    merged = fold.merge(Cell.from_id(TENSOR), [result], 0.1, "fixtures/path_choice.py")
    assert merged.status == PATH_NOT_TAKEN and merged.first_failure == f"[rank 0] {UNAVAILABLE}"
    assert merged  # it does not fail the gate
    shown = repro.detail(merged)  # what `repro` prints for the cell
    assert "    path: TE took the split_quantize path (GroupGemmBackward: grouped_tensor_supported=False" in shown
    assert f"          {UNAVAILABLE}" in shown
    assert ("    kernels: te_general_grouped_gemm x3" in shown) == (calls is not None)


def test_the_named_path_recorded_by_te_passes(monkeypatch):
    monkeypatch.setenv("DW_FAKE_CUBLASLT", "130400")  # the grouped GEMM is there: TE records the grouped path
    result = run_cell(_choosing(GROUPED_KERNELS), Cell.from_id(TENSOR), RankContext())
    assert result.status == "pass" and result.choice["path"] == te_path.GROUPED and "reason" not in result.choice


def test_kernels_that_contradict_tes_record_are_a_harness_error(monkeypatch):
    # TE records the split path, yet the grouped GEMM ran (or nothing): the evidence disagrees
    for calls in (GROUPED_KERNELS, {}):
        result = run_cell(_choosing(calls), Cell.from_id(TENSOR), RankContext())
        assert result.status == HARNESS_ERROR and result.error["type"] == "PathMismatch", calls
        assert "yet TE's GroupGemmBackward records the split-quantize path" in result.error["message"]
    # TE records the grouped path (the cell's), yet the split-quantize GEMM ran
    monkeypatch.setenv("DW_FAKE_CUBLASLT", "130400")
    result = run_cell(_choosing(SPLIT_KERNELS), Cell.from_id(TENSOR), RankContext())
    assert result.status == HARNESS_ERROR
    assert "TE's GroupGemmBackward records the grouped-tensor path" in result.error["message"]


def test_a_step_that_raised_on_the_other_path_is_still_path_not_taken():
    """TE 2.20's split fallback raises in ``backward_dw`` with delayed bias gradients: the
    forward recorded the split path, so the error is about that path, not the named one."""
    import fixtures.path_choice as chooser

    class FallbackRaises(chooser.GroupedLinear):
        def backward_dw(self) -> None:
            raise RuntimeError("GroupedLinear(use_grouped_tensor=True) fell back to the split-quantize path, which "
                               "produced per-expert bias gradients during delayed wgrad.")

    FallbackRaises.__module__ = chooser.__name__  # where TE's predicate and its inputs live
    backend = _choosing(None)
    backend.GroupedLinear = FallbackRaises
    cell = Cell.from_id("grouped_linear_tensor-plain-hooks_off-unfused-bf16-ws1-ddp-mb1-g4-bias-igrad-delay")
    result = run_cell(backend, cell, RankContext())
    assert result.status == PATH_NOT_TAKEN and result.choice["reason"] == UNAVAILABLE
    assert result.error["type"] == "RuntimeError"  # what the other path did is kept
    # a backend that raises before its forward recorded no choice: the cell is judged as ever
    cell = Cell.from_id("grouped_linear_tensor-distributed-hooks_off-fused-bf16-ws1-ddp-mb1-g4-bias-igrad-delay")
    result = run_cell(_choosing(None), cell, RankContext())
    assert result.status == "xfail" and result.choice is None


def test_the_split_path_cell_agrees_with_tes_record():
    result = run_cell(_choosing(SPLIT_KERNELS), Cell.from_id(GROUPED), RankContext())
    assert result.status == "pass" and result.choice["path"] == te_path.SPLIT
