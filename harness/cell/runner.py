"""One cell on one rank: build, inject, run the microbatches, check against the oracle.

The worker calls ``run_cell`` for every cell of its launch; the in-process tests call it
with world size 1. Every check traces to a sentence of docs/contracts.md (quoted in comments).

Every step is tagged with its owner (``_owned``): what the backend's code raises is a
verdict on the backend; what the harness's own set-up and checks raise is a harness bug.
"""

from __future__ import annotations

import dataclasses
import math
import re
import traceback
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Iterator

import torch

from harness.vocabulary import hook_modes, modules, recipes, shape, weights
from harness.cell import compare, faults, lowp, mlp, oracle, oracle_store, predict, quantized, rejection, te_path, twin
from harness.cell.consumer import Consumer
from harness.cell.faults import BackendFault, error_info, peer_lost
from harness.cell.attach import attach_weight
from harness.cell.gtp import GTPGroup, weight_names
from harness.cell import hooks as hook_installers
from harness.cell.hooks import forward_executions
from harness.cell.inputs import DTYPES, CellInputs, make_inputs
from harness.vocabulary.shape import Example
from harness.vocabulary.matrix import Cell
from harness.records.record import Check, RankResult
from harness.vocabulary.status import HARNESS_ERROR, PATH_NOT_TAKEN


@dataclass
class RankContext:
    """What a rank brings to every cell: identity, device and process group."""

    rank: int = 0
    world_size: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    group: Any = None
    #: the twins this rank keeps for the lane's later hooked cells (None: every twin runs)
    twins: twin.Twins | None = None


def _backend_class(backend: ModuleType, api: str) -> Any:
    """``backend.Linear`` or a nested name such as ``backend.ops.GroupedLinear``.

    Raises:
        AttributeError: the backend has no such class (a backend fault: it is called inside
            the constructor phase).
    """
    obj: Any = backend
    for part in api.split("."):
        obj = getattr(obj, part)
    return obj


def build_module(backend: ModuleType, cell: Cell, example: Example, device: torch.device) -> torch.nn.Module:
    """Construct the cell's module with only the keyword arguments CONTRACTS §1 names."""
    kind = modules.KINDS[cell.module]
    dtype = DTYPES[cell.dtype]
    e = example
    cls = _backend_class(backend, kind.api)
    if weights.KINDS[cell.weight].native:  # its weights born quantized, as Megatron's model under --fp8-param-gather
        with lowp.native_parameters(backend, cell.recipe):
            return _construct(cls, kind, cell, e, dtype, device)
    return _construct(cls, kind, cell, e, dtype, device)


def _construct(cls: Any, kind: modules.ModuleKind, cell: Cell, e: Example, dtype: torch.dtype,
               device: torch.device) -> torch.nn.Module:
    if kind.ops:
        return cls(cell.num_gemms, e.in_features, e.out_features, bias=cell.bias, device=device,
                   dtype=dtype, accumulate_into_main_grad=cell.fused,
                   delay_wgrad_compute=cell.delay_wgrad, **dict(kind.options))
    lead = (cell.num_gemms,) if kind.grouped else ()
    extra: dict[str, Any] = dict(kind.options)
    if kind.normalization is not None:
        extra.update(normalization=kind.normalization, zero_centered_gamma=kind.zero_centered_gamma)
    return cls(*lead, e.in_features, e.out_features, bias=cell.bias, params_dtype=dtype,
               device=device, fuse_wgrad_accumulation=cell.fused,
               delay_wgrad_compute=cell.delay_wgrad, **extra)


def overwrites_first(cell: Cell) -> bool:
    """The first microbatch's weight gradient replaces ``main_grad`` instead of adding to it:
    ``is_first_microbatch=True`` with fused accumulation into a plain weight (TE:
    ``accumulate = fuse_wgrad_accumulation and not is_first_microbatch``). A DistributedWeight
    is exempt - its finalize accumulates - and biases and norm parameters go through ``.grad``."""
    return cell.first_mb and cell.fused and not cell.distributed


def _bias_names(module: torch.nn.Module) -> list[str]:
    names = [n for n, _ in module.named_parameters(recurse=False) if n.startswith("bias")]
    return sorted(names, key=lambda n: int(n[4:] or 0))


def _call(module: torch.nn.Module, cell: Cell, splits: list[int], backend: ModuleType,
          device: torch.device, mb: int = 0):
    """Microbatch ``mb``'s module call: with the cell's split sizes, and ``is_first_microbatch``
    (True for the first, False after) when the cell passes it (``first_mb``)."""
    flag = {"is_first_microbatch": mb == 0} if cell.first_mb else {}
    convention = modules.KINDS[cell.module].splits
    if convention == "none":
        return lambda x: module(x, **flag)
    if convention == "list":
        return lambda x: module(x, splits, **flag)
    sizes = torch.tensor(splits, dtype=torch.int64)
    if convention == "device":
        # in device memory, as a caller of the grouped-tensor path passes them (TE insists);
        # a CPU backend that stands in for a device marks them resident (te-cpu)
        mark = getattr(backend, "device_tensor", None)
        sizes = mark(sizes) if callable(mark) else sizes.to(device)
    return lambda x: module(x, sizes, **flag)


def fitted(example: Example, cell: Cell) -> Example:
    """``example`` as the cell runs it (``harness.vocabulary.shape.fitted``: the module's out_features,
    the recipe's alignment, the block-spanning shape)."""
    return shape.fitted(example, cell.module, cell.bias, cell.recipe, cell.num_gemms, cell.shape)


@dataclass
class _Step:
    outputs: list[torch.Tensor] = field(default_factory=list)
    dgrads: list[torch.Tensor | None] = field(default_factory=list)
    #: most forward-gathered weights alive between a forward and its backward
    live_gathers: int = 0
    #: TE's recorded path choice of each forward (``harness.cell.te_path``; None: none recorded)
    choices: list[te_path.Choice | None] = field(default_factory=list)
    #: what the step's saved-tensor hooks packed (``harness.cell.hooks.Packs``)
    packs: hook_installers.Packs = field(default_factory=hook_installers.Packs)
    #: forwards that ran to their end (a hook check needs one: before it nothing had to be saved)
    forwards: int = 0


def _load_full(module: torch.nn.Module, inputs: CellInputs) -> None:
    with torch.no_grad():
        for name, w in zip(weight_names(module), inputs.weights):
            getattr(module, name).copy_(w)
        for name, b in zip(_bias_names(module), inputs.biases):
            getattr(module, name).copy_(b)
        if inputs.norm is not None:
            for name, t in zip(modules.NORM_PARAMS, inputs.norm.params):
                getattr(module, name).copy_(t)


@contextmanager
def _owned(owner: str, phase: str, cell: Cell) -> Iterator[None]:
    """Tag what runs inside with its owner.

    ``backend``: the backend's constructor, hook registration, forward, backward and
    ``backward_dw`` (and whatever they call back into); an exception is a ``BackendFault``.
    ``harness``: inputs, the oracle, GTP injection, the consumer, the checks; an exception is
    a ``compare.HarnessBug`` (status ``harness_error``, exit 3), never a backend verdict.
    Either way a collective that a peer broke is flagged as such (``faults.peer_lost``), and
    the phase is posted on the rank's board (``faults.PhaseBoard``) while it runs: a rank that
    hangs in it is judged by whose phase it hung in.
    """
    board = faults.BOARD
    before = board.post(owner, phase) if board is not None else None
    try:
        yield
    except (BackendFault, compare.HarnessBug):
        raise
    except Exception as exc:
        if owner == "backend":
            raise BackendFault(phase, exc) from exc
        raise compare.HarnessBug(f"the harness failed in its {phase} phase of {cell.id}: "
                                 f"{type(exc).__name__}: {exc}") from exc
    finally:
        if board is not None and before is not None:
            board.post(*before)


def run_cell(backend: ModuleType, cell: Cell, ctx: RankContext, example: Example | None = None) -> RankResult:
    """Run ``cell`` on this rank and return its checks.

    Never raises for a backend fault (a result with status ``error``, or the judged expected
    error); a failure of the harness's own phases returns status ``harness_error`` with the
    traceback, so it is never mistaken for a verdict on the backend.
    """
    example = fitted(example or Example(), cell)
    evidence = getattr(backend, "path_evidence", None)
    if callable(evidence):
        backend.reset_path_evidence()
    lowp.present(backend, cell.recipe)  # before use_path: its grouped-GEMM threshold follows the device
    use_path = getattr(backend, "use_path", None)
    if callable(use_path):
        use_path(modules.KINDS[cell.module].path)  # held for the whole cell, twin included
    # what a backend holds only while its own cells run (a self-test mutant's planted fault,
    # harness.backends.te_cpu.mutants), twin included
    scope = getattr(backend, "cell_scope", None)
    with scope() if callable(scope) else nullcontext():
        return _run_scoped(backend, cell, ctx, example, evidence)


def _run_scoped(backend: ModuleType, cell: Cell, ctx: RankContext, example: Example, evidence: Any) -> RankResult:
    try:
        if cell.hooks == "off" or cell.expect == "error":
            keep = ctx.twins is not None and cell.hooks == "off" and cell.expect != "error"
            kept = twin.Kept() if keep else None
            result = _run_cell(backend, cell, ctx, example, kept=kept)
            if keep:  # the hooked cells after it take it as their twin
                ctx.twins.put(twin.Twins.key(backend, cell.id, example), result, kept)
        else:
            kept = twin.Kept()
            result = _run_cell(backend, cell, ctx, example, kept=kept)
            # Decided on this rank alone, never with a collective: a rank that raised does no
            # more collectives on the cell's group (its peers are then stuck mid-step anyway,
            # and the launcher attributes the hang to it); ranks that ran to the end all do.
            # The twin's kernels are not the cell's path evidence: under TE's offloading a
            # grouped cell and its hooks-off twin may run different paths.
            if result.status in ("pass", "fail"):
                with getattr(backend, "harness_reads", nullcontext)():
                    _add_twin_checks(backend, cell, ctx, example, result, kept)
    except compare.HarnessBug as bug:
        return RankResult(ctx.rank, HARNESS_ERROR, [], error_info(bug), by_peer=peer_lost(bug))
    _judge_path(cell, result, dict(evidence()) if callable(evidence) else None)
    result.recipe = lowp.describe(backend, cell.recipe)
    return result


def _judge_path(cell: Cell, result: RankResult, called: dict[str, int] | None) -> None:
    """Judge the path the cell ran, from TE's own record of its choice (``result.choice``,
    every backend that is TE) and the kernels it called (``called``, te-cpu only).

    TE recorded another path than the cell names: ``path_not_taken`` with TE's reason,
    whatever the step did after (it tested that other path) - unless the kernels contradict
    TE's record, a harness error. Otherwise the kernels of a step that ran to the end must
    prove the named path, or it is a harness error (the cell would pass or fail hollow)."""
    result.path = called
    kind = modules.KINDS[cell.module]
    choice = te_path.Choice(**result.choice) if result.choice else None
    ran = result.status in ("pass", "fail") and result.error is None  # a raise stops anywhere
    if choice is not None and kind.path and choice.path != kind.path:
        taken = modules.on_path(kind, choice.path)
        clash = (taken.path_mismatch(called, cell.recipe != "none") if taken is not None and called is not None
                 and ran else None)
        if clash is not None:
            _path_mismatch(result, f"{clash}; yet TE's {choice.node} records the "
                                   f"{te_path.NAMES[choice.path]} path")
            return
        choice.reason = te_path.explain(choice, kind.path)
        result.choice, result.status = choice.serialize(), PATH_NOT_TAKEN
        return
    mismatch = kind.path_mismatch(called, cell.recipe != "none") if called is not None and ran else None
    if mismatch is not None:
        recorded = f"; TE's {choice.node} records the {te_path.NAMES[choice.path]} path" if choice else ""
        _path_mismatch(result, mismatch + recorded)


def _path_mismatch(result: RankResult, why: str) -> None:
    """The evidence contradicts itself or the cell's label: a harness error (exit 3)."""
    result.status = HARNESS_ERROR
    result.error = {"type": "PathMismatch", "message": why, "traceback": why, "phase": "path evidence"}


def _add_twin_checks(backend: ModuleType, cell: Cell, ctx: RankContext, example: Example,
                     result: RankResult, kept: twin.Kept) -> None:
    """Run the hooks-off twin on the same inputs and start values - or take the one this rank
    keeps (``twin.Twins``) - and judge bitwise (``harness.cell.twin``)."""
    twin_cell = dataclasses.replace(cell, hooks="off")
    key = twin.Twins.key(backend, twin_cell.id, example)
    found = ctx.twins.get(key) if ctx.twins is not None else None
    if found is not None:
        twin_result, twin_kept = found
    else:
        twin_kept = twin.Kept()
        twin_result = _run_cell(backend, twin_cell, ctx, example, seed=cell.seed, kept=twin_kept, judge=False)
        if ctx.twins is not None:
            ctx.twins.put(key, twin_result, twin_kept)
    if twin_result.status != "pass" and twin_result.status != "fail":
        # the backend raised in its twin: the cell's error, as if the hooked run had raised
        # (so the worker treats it as any backend error: the rank's peers may be mid-collective)
        err = dict(twin_result.error or {})
        err["phase"] = f"hooks-off twin: {err.get('phase', '?')}"
        result.status, result.error, result.by_peer = twin_result.status, err, twin_result.by_peer
        result.comparisons.extend(twin_result.comparisons)
        return
    with _owned("harness", "twin checks", cell):
        result.comparisons.extend(twin.checks(cell.hooks, kept, twin_kept))
    result.status = "pass" if all(c.ok for c in result.comparisons) else "fail"


def _run_cell(backend: ModuleType, cell: Cell, ctx: RankContext, example: Example,
              seed: int | None = None, kept: twin.Kept | None = None, judge: bool = True) -> RankResult:
    """One step of ``cell``; ``seed`` (default the cell's) draws the inputs and start values,
    ``kept`` receives the step's tensors and call counts for a twin, ``judge=False`` skips
    the oracle (a twin is judged only against its hooked cell). The result carries the path
    TE recorded (``choice``), however the step ended."""
    step = _Step()
    result = _run_cell_step(backend, cell, ctx, example, step, seed, kept, judge)
    choice = te_path.pick(step.choices, modules.KINDS[cell.module].path)
    result.choice = choice.serialize() if choice is not None else None
    if hook_modes.KINDS[cell.hooks].hooked:
        result.hooks = step.packs.serialize(cell.hooks)
        # judged once a forward ran to its end: a step that raised before has saved nothing yet
        if result.status in ("pass", "fail") and judge and step.forwards:
            result.comparisons.append(hooks_installed(cell.hooks, step.packs))
            result.status = "pass" if all(c.ok for c in result.comparisons) else "fail"
    return result


def hooks_installed(mode: str, packs: hook_installers.Packs) -> Check:
    """A hooked cell's hooks packed something: a mode whose installer installed nothing, or
    whose hooks were never called, would pass as if hooked and prove nothing about hooks."""
    ok = packs.packs > 0
    return Check("hook_packs", "count", ok, expected="> 0", actual=packs.packs,
                 message=None if ok else f"hook_packs: the {mode} hooks packed no saved tensor in the whole "
                                         f"step ({hook_modes.KINDS[mode].installer}'s installer installed none, "
                                         f"or none was called): the cell ran unhooked")


def _run_cell_step(backend: ModuleType, cell: Cell, ctx: RankContext, example: Example, step: _Step,
                   seed: int | None, kept: twin.Kept | None, judge: bool) -> RankResult:
    seed = cell.seed if seed is None else seed
    kind = modules.KINDS[cell.module]
    if kind.layer:  # Megatron's expert layer: Megatron builds it, a step is iterations of a chunk
        return mlp.run_layer_cell(backend, cell, ctx.rank, ctx.world_size, ctx.group, example, seed,
                                  lambda owner, phase: _owned(owner, phase, cell), step, kept, judge,
                                  getattr(backend, "FP32_GEMM", "ieee"))
    with _owned("harness", "inputs", cell):
        inputs = make_inputs(seed, example, cell.dtype, ctx.world_size, cell.microbatches,
                             cell.num_gemms, cell.bias, kind.normalization, kind.zero_centered_gamma,
                             unit=shape.group_unit(cell.recipe, cell.shape, cell.module),
                             profile=shape.KINDS[cell.shape].profile)
    gtp: GTPGroup | None = None
    consumer: Consumer | None = None
    try:
        with _owned("backend", "constructor", cell):
            module = build_module(backend, cell, example, ctx.device)
        with _owned("harness", "set-up", cell):
            _load_full(module, inputs)
            gtp = attach_weight(module, cell.weight, ctx.group, cell.recipe, inputs.weights)
            sharded = set(weight_names(module)) if gtp else set()
            replaced = set(weight_names(module)) if overwrites_first(cell) else set()
            consumer = Consumer(cell.consumer, module, sharded, seed, ctx.rank, ctx.world_size, ctx.group,
                                replaced)
        with _owned("backend", "register_wgrad_accumulation_and_reduce_hooks", cell):
            consumer.register_hooks()
        _run_step(module, cell, inputs, ctx, step, consumer, gtp, backend)
        with _owned("harness", "consumer", cell):
            consumer.finish_step()
    except BackendFault as fault:  # the backend's failure is a result, not a harness crash
        lost = peer_lost(fault.exc)  # a collective broke under it: a peer's failure, not a rejection
        if cell.expect == "error" and not lost:
            with _owned("harness", "checks", cell):
                return _judge_expected_error(cell, fault.exc, consumer, gtp, ctx.rank, backend)
        exc = fault.exc
        return RankResult(ctx.rank, "error", [Check("exception", "exception", False,
                                                    message=f"{type(exc).__name__}: {exc}"),
                                              *_autograd_shape_checks(exc)],
                          {**error_info(exc), "phase": fault.phase}, by_peer=lost)
    finally:
        if consumer is not None:
            consumer.close()
    if cell.expect == "error":
        return RankResult(ctx.rank, "fail", [Check(
            "expected_exception", "exception", False,
            message="delay_wgrad_compute=True with a DistributedWeight must raise before any "
                    "collective (CONTRACTS §2), but the step ran")])
    fp32_gemm = getattr(backend, "FP32_GEMM", "ieee")  # TF32 GEMMs: a coarser fp32 u (§5)
    with _owned("harness", "checks", cell):
        if kept is not None:
            _keep(kept, step, consumer, gtp)
        # a twin is judged only against its hooked cell (harness.cell.twin), not the oracle
        checks = _checks(cell, inputs, ctx, module, consumer, gtp, step, fp32_gemm) if judge else []
    return RankResult(ctx.rank, "pass" if all(c.ok for c in checks) else "fail", checks)


_INVALID_GRADIENT = re.compile(r"Function (\w+) returned an invalid gradient at index (\d+) - got "
                               r"\[([\d, ]*)\] but expected shape compatible with \[([\d, ]*)\]")


def _autograd_shape_checks(exc: BaseException) -> list[Check]:
    """§2 "autograd receives a gradient of the parameter's (the shard's) shape", as seen by
    the only observer that can: autograd's own validation of a backward's results, which
    raises before any hook runs. Its message names the function, the input and both shapes."""
    m = _INVALID_GRADIENT.search(str(exc))
    if m is None:
        return []
    fn, index, got, expected = m.groups()
    shape = lambda text: [int(v) for v in text.split(",") if v.strip()]  # noqa: E731
    return [Check("autograd_grad_shape", "shape", False, expected=shape(expected), actual=shape(got),
                  message=f"autograd_grad_shape: {fn} returned a gradient of shape {shape(got)} for its "
                          f"input {index}, whose shape is {shape(expected)}")]


def _keep(kept: twin.Kept, step: _Step, consumer: Consumer, gtp: GTPGroup | None) -> None:
    kept.outputs = list(step.outputs)
    kept.dgrads = list(step.dgrads)
    attr = "main_grad" if consumer.mode == "ddp" else "grad"
    kept.records = {f"{n}.{attr}": None if (r := consumer.record(n)) is None else r.detach().clone()
                    for n in consumer.params}
    if gtp is not None:
        kept.calls = {kind: [gtp.log.count(kind, i) for i in range(len(gtp.members))]
                      for kind in ("materialize_forward", "materialize_backward", "finalize", "grad_buffer")}


def _run_step(module: torch.nn.Module, cell: Cell, inputs: CellInputs, ctx: RankContext,
              step: _Step, consumer: Consumer, gtp: GTPGroup | None = None,
              backend: ModuleType | None = None) -> None:
    dev = ctx.device
    with _owned("backend", "forward", cell):
        under_recipe = lowp.under_recipe(backend, cell.recipe, ctx.group)
    kind = modules.KINDS[cell.module]
    role = "grouped" if kind.grouped else "normalized" if kind.normalization else "linear"
    # the installer's own set-up is its code's (TE's, Megatron's): a failure there is the backend's
    with _owned("backend", "hooks", cell):
        installed = hook_installers.installer(cell.hooks, backend, params=list(module.parameters()), group=role)
    try:
        with step.packs.observing():
            _run_microbatches(module, cell, inputs, ctx, step, consumer, gtp, backend, under_recipe, installed)
        with _owned("backend", "hooks", cell):
            installed.end_iteration()
    finally:
        with _owned("backend", "hooks", cell):
            installed.close()


def _run_microbatches(module: torch.nn.Module, cell: Cell, inputs: CellInputs, ctx: RankContext,
                      step: _Step, consumer: Consumer, gtp: GTPGroup | None, backend: ModuleType | None,
                      under_recipe: Any, installed: hook_installers.Installer) -> None:
    dev = ctx.device
    for mb in range(cell.microbatches):
        with _owned("harness", "inputs", cell):
            x = inputs.x[ctx.rank][mb].to(dev, copy=True).requires_grad_(cell.input_grad)
            dy = inputs.dy[ctx.rank][mb].to(dev)
            consumer.phase = "forward"
        with _owned("backend", "forward", cell):
            call = under_recipe(_call(module, cell, inputs.splits[ctx.rank][mb], backend, dev, mb))
            installed.microbatch()
            out = installed.end_forward(installed.layer(call, x))
            step.forwards += 1
        with _owned("harness", "path evidence", cell), getattr(backend, "harness_reads", nullcontext)():
            step.choices.append(te_path.read(out, module))  # TE's own record of the path it chose
        with _owned("harness", "consumer", cell):
            if gtp is not None:
                step.live_gathers = max(step.live_gathers, gtp.live_forward_gathers(step.live_gathers))
            consumer.before_backward()
        with _owned("backend", "backward", cell):
            out.backward(dy)
        if cell.delay_wgrad:
            # Megatron calls backward_dw() after each microbatch's backward (§4).
            with _owned("harness", "consumer", cell):
                consumer.before_backward_dw(observable=x.shape[0] > 0)
            with _owned("backend", "backward_dw", cell):
                module.backward_dw()
        step.outputs.append(out.detach())
        step.dgrads.append(x.grad if cell.input_grad else None)


def _judge_expected_error(cell: Cell, exc: BaseException, consumer: Consumer | None,
                          gtp: GTPGroup | None, rank: int, backend: ModuleType | None = None) -> RankResult:
    """§5: passes exactly when the backend raised the clear exception, touching nothing.

    The exception must be the backend's deliberate rejection (``rejection.judge``): a
    programming error whose text happens to name both (``NameError: name
    'check_delay_wgrad_distributed' is not defined``) is a broken check, not the contract.
    A constructor that raised leaves no consumer: nothing can have been touched."""
    text = str(exc).lower()
    checks = [compare.compare_value("exception_names_both", "exception",
                                    "delay" in text and "distributed" in text, True)]
    why_not = rejection.judge(exc, rejection.source_roots(backend))
    checks.append(Check("exception_is_a_rejection", "exception", why_not is None,
                        message=None if why_not is None else f"exception_is_a_rejection: {why_not}"))
    if gtp is not None:
        collectives = sum(gtp.log.count(k) for k in ("materialize_forward", "materialize_backward", "finalize"))
        checks.append(compare.compare_value("collectives_before_error", "count", collectives, 0))
    for name in (consumer.params if consumer is not None else {}):
        rec = consumer.record(name)
        if consumer.mode == "ddp":
            untouched = bool(torch.equal(rec.cpu(), consumer.start[name]))
        else:
            untouched = rec is None
        checks.append(compare.compare_value(f"{name}.untouched", "flag", untouched, True))
    ok = all(c.ok for c in checks)
    if not ok:
        checks[0].message = (checks[0].message or "") + f" (raised {type(exc).__name__}: {exc})"
    return RankResult(rank, "xfail" if ok else "fail", checks, None if ok else error_info(exc))


def _scales_check(actual: Any, model: quantized.DelayedScaling) -> Check:
    """``fp8_scales``: the delayed scales after the step equal the model's exactly; an input
    known only within bounds (LayerNormLinear's normalized rows) recorded an amax within
    bounds, so its scale may lie anywhere between the two ends' (no other slack)."""
    check = compare.compare_value("fp8_scales", "scale", actual, model.after)
    ends = list(zip(model.after["input"], model.after_input_bounds))
    if check.ok or not isinstance(actual, dict) or all(a == b for a, b in ends):
        return check
    others_equal = all(actual.get(k) == v for k, v in model.after.items() if k != "input")
    inputs = actual.get("input")
    within = (isinstance(inputs, list) and len(inputs) == len(ends)
              and all(min(a, b) <= v <= max(a, b) for v, (a, b) in zip(inputs, ends)))
    if others_equal and within:
        return compare.compare_value("fp8_scales", "scale", actual, actual)
    check.message = f"{check.message} (input scales may lie within {ends})"
    return check


#: this process's recent oracles and defect models (a hooked cell's are its twin's: ``oracle.Memo``)
_ORACLES = oracle.Memo()


#: the oracle's modules as this process imported them (``oracle_store.state``)
_ORACLE_STATE = oracle_store.state()


def share_oracles(store: oracle_store.Store | None) -> str | None:
    """Read and keep this process's oracles in ``store`` too (a rank: the folder
    ``DW_ORACLE_CACHE`` names, ``oracle_store.from_env``; None: memory only). The rank's
    worker asks for it once its backends are loaded, not an import of this module: a process
    that runs cells itself (a test patching the oracle) keeps its own memory only, and so does
    one whose backend changed the oracle's modules since they were imported (a planted harness
    bug) - returned as one line naming what changed (None: shared as asked)."""
    moved = oracle_store.changed(_ORACLE_STATE, oracle_store.state()) if store is not None else []
    _ORACLES.store = None if moved else store
    if moved:
        return f"oracles not shared: the backend changed {', '.join(moved[:5])}" + (" ..." if len(moved) > 5 else "")
    return None


def _checks(cell: Cell, inputs: CellInputs, ctx: RankContext, module: torch.nn.Module,
            consumer: Consumer, gtp: GTPGroup | None, step: _Step, fp32_gemm: str = "ieee") -> list[Check]:
    tags = weights.KINDS[cell.weight].tags
    # a native weight's oracle too has the whole weight's scale; a native weight is never
    # re-quantized, so every microbatch multiplies its codes, as a cached FP8 weight's
    native = weights.KINDS[cell.weight].native
    cached = cell.first_mb or native
    digest = oracle.fingerprint(inputs)
    orc = _ORACLES.compute(inputs, ctx.rank, tags, cell.recipe, cached=cached, digest=digest)
    native_rows = gtp.rows_per_rank if native and gtp is not None else None
    dtype = compare.gemm_dtype(cell.dtype, fp32_gemm)
    # a failing value check also records its ratio under each defect model (harness.vocabulary.defects)
    models = _ORACLES.get(("models", digest, ctx.rank, tuple(tags), cell.dtype, cell.recipe, cell.distributed,
                           native_rows, cached),
                          lambda: predict.Predictor(inputs, ctx.rank, tags, cell.dtype, cell.recipe, cell.distributed,
                                                    native_rows, cached, _ORACLES.store, digest))
    checks: list[Check] = []
    for mb in range(cell.microbatches):
        check = compare.compare_tensor(f"mb{mb}.output", step.outputs[mb], orc.outputs[mb], dtype)
        if not check.ok:
            check.models = models.output(mb, step.outputs[mb], dtype) or None
        checks.append(check)
        if cell.input_grad:
            check = compare.compare_tensor(f"mb{mb}.input_grad", step.dgrads[mb], orc.dgrads[mb], dtype)
            if not check.ok:
                check.models = models.input_grad(mb, step.dgrads[mb], dtype) or None
            checks.append(check)
    ddp = cell.consumer == "ddp"
    record_attr = "main_grad" if ddp else "grad"
    # Weight gradient of record: formed in main_grad's dtype when fused, or for a
    # distributed weight with a main_grad (§2); otherwise in the compute dtype.
    w_dtype = "fp32" if ddp and (cell.fused or gtp is not None) and cell.dtype != "fp32" else dtype
    for i, name in enumerate(weight_names(module)):
        shard = None
        if gtp is not None:
            s = gtp.rows_per_rank
            shard = (gtp.padded_rows, ctx.rank * s, s)
        start = consumer.base(name) if ddp else None
        ref = oracle.record_of(orc.wgrad_sums[i], start, shard)
        actual = consumer.record(name)
        check = compare.compare_tensor(f"{name}.{record_attr}", actual, ref, w_dtype)
        if not check.ok:
            check.models = models.weight(i, actual, compare.bound(ref, w_dtype), start, shard,
                                         consumer.rebound_from(name) if ddp else None) or None
        checks.append(check)
        if shard is not None and ddp:
            checks.extend(_padding_checks(name, consumer, shard, inputs.weights[i].shape[0]))
    for i, name in enumerate(_bias_names(module)):
        start = consumer.start.get(name) if ddp else None
        ref = oracle.record_of(orc.bgrad_sums[i], start, None)
        check = compare.compare_tensor(f"{name}.{record_attr}", consumer.record(name), ref, dtype)
        if not check.ok:
            check.models = models.bias(i, consumer.record(name), compare.bound(ref, dtype), start) or None
        checks.append(check)
    # the normalization's parameters are plain and replicated: judged like a bias (§1)
    for j, (name, ref) in enumerate(zip(modules.NORM_PARAMS, orc.norm_sums)):
        start = consumer.start.get(name) if ddp else None
        ref = oracle.record_of(ref, start, None)
        check = compare.compare_tensor(f"{name}.{record_attr}", consumer.record(name), ref, dtype)
        if not check.ok:
            check.models = models.norm_param(j, consumer.record(name), dtype, start) or None
        checks.append(check)
    if ddp:
        for name in consumer.params:
            # §2: "param.main_grad itself is never reassigned by the backend" - exactly
            checks.append(compare.compare_value(f"{name}.main_grad_kept", "flag", consumer.main_grad_kept(name), True))
        for name, p in consumer.params.items():
            is_weight = name.startswith("weight")
            expected = is_weight and (cell.fused or gtp is not None)
            checks.append(compare.compare_value(f"{name}.grad_added_to_main_grad", "flag",
                                                bool(getattr(p, "grad_added_to_main_grad", False)), expected))
    # Each registered hook runs exactly once per backward_dw() that computed something,
    # after the gradients are in place (§4).
    checks.append(compare.compare_value("wgrad_hook_calls", "count", consumer.wgrad_hook_calls,
                                        cell.microbatches if cell.delay_wgrad else 0))
    if cell.delay_wgrad:
        checks.extend(_delay_checks(module, consumer))
    if cell.recipe == "delayed":
        # the recipe's state after the step: each scale from the amaxes of the whole weight and
        # of every rank's input and gradient, stepped once per forward and per backward - exactly
        actual = lowp.scales_after(module)
        check = _scales_check(actual, orc.quant)
        if not check.ok:  # exactly a model's scales, or no model's
            check.models = {name: 0.0 if _scales_check(actual, view.quant).ok else math.inf
                            for name, view in models.views_of(check.name).items()} or None
        checks.append(check)
    if gtp is not None:
        checks.extend(_protocol_checks(cell, gtp))
        # §2: gathered weights are transient; none may outlive the forward that made them
        checks.append(compare.compare_value("forward_gathers_alive_at_backward", "count",
                                            step.live_gathers, 0))
    return checks


def _padding_checks(name: str, consumer: Consumer, shard: tuple[int, int, int], logical_rows: int) -> list[Check]:
    """§5: "padding rows must keep their start value" - bit for bit, not within tolerance
    (nothing is ever added to them: the reduce-scatter of zero rows is exact)."""
    _, row0, nrows = shard
    first = max(logical_rows - row0, 0)     # this shard's first padding row, if any
    if first >= nrows:
        return []
    now = consumer.record(name)[first:].detach().cpu()
    start = consumer.start[name][first:]
    return [compare.compare_value(f"{name}.padding_rows_untouched", "flag", bool(torch.equal(now, start)), True)]


def _delay_checks(module: torch.nn.Module, consumer: Consumer) -> list[Check]:
    """§4: "While wgrad is delayed, weights are marked ``skip_backward_post_hook`` and the
    main backward leaves every ``main_grad`` untouched; it may hand autograd a placeholder
    weight gradient ..., which must never reach ``main_grad`` as data" (the placeholder's
    fate is judged by the gradient of record's values: the consumer's wgrad hook adds a
    ``.grad`` that ``backward_dw()`` neither overwrote nor flagged). "A bias is marked
    exactly when its gradient is delayed"; hooks fire once the gradients are in place."""
    checks = [compare.compare_value("wgrad_hooks_after_gradients", "flag",
                                    all(consumer.hook_saw_gradients), True)]
    for name, p in consumer.params.items():
        marked = bool(getattr(p, "skip_backward_post_hook", False))
        early = name in consumer.delivered_in_main_backward
        if name.startswith("weight"):
            checks.append(compare.compare_value(f"{name}.skip_backward_post_hook", "flag", marked, True))
            if consumer.mode == "ddp":
                changed = name in consumer.main_grad_changed_in_main_backward
                checks.append(compare.compare_value(f"{name}.main_grad_untouched_by_main_backward", "flag",
                                                    not changed, True))
        else:
            checks.append(compare.compare_value(f"{name}.marked_iff_delayed", "flag", marked, not early))
    return checks


def _protocol_checks(cell: Cell, gtp: GTPGroup) -> list[Check]:
    """§2: per step, on the leader only: forward-materialize once per forward execution,
    backward-materialize exactly once, finalize exactly once; ``grad_buffer`` on every
    member when fused; finalize receives ``main_grad``'s dtype whenever there is one."""
    k = cell.microbatches
    expected = {
        "materialize_forward": k * forward_executions(cell.hooks),
        "materialize_backward": k,
        "finalize": k,
    }
    checks = []
    for kind, n in expected.items():
        checks.append(compare.compare_value(f"leader.{kind}_calls", "count", gtp.log.count(kind, 0), n))
        followers = sum(gtp.log.count(kind, i) for i in range(1, len(gtp.members)))
        if len(gtp.members) > 1:
            checks.append(compare.compare_value(f"followers.{kind}_calls", "count", followers, 0))
    if cell.fused:
        for i in range(len(gtp.members)):
            checks.append(compare.compare_value(f"weight{i}.grad_buffer_calls", "count",
                                                gtp.log.count("grad_buffer", i), k))
    want = "float32" if cell.consumer == "ddp" else str(DTYPES[cell.dtype]).replace("torch.", "")
    dtypes = sorted(set(gtp.log.finalize_dtypes()))
    checks.append(compare.compare_value("finalize_dtypes", "dtype", dtypes, [want]))
    if weights.KINDS[cell.weight].native:
        # the native path, proven: every gather handed the GEMMs quantized data (a weight
        # gathered in high precision and quantized by TE has MXFP8's values too); the
        # stand-in's also says that it handed TE's gather its quantized shards (under
        # blockwise TE dequantizes them first: a high-precision shard gives the same output)
        gathers = [c for c in gtp.log.calls if c["kind"].startswith("materialize")]
        checks.append(compare.compare_value("native_gathers_quantized", "flag",
                                            bool(gathers) and all(c.get("quantized") for c in gathers), True))
    return checks
