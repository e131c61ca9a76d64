"""Megatron-Core's expert layer as a cell: ``TEGroupedMLP`` built, sharded and run by Megatron.

Module values ``mcore_grouped_mlp`` (SwiGLU) and ``mcore_grouped_mlp_gelu``
(``harness.vocabulary.modules``). A cell is a model chunk of ``layers`` MoE layers, each
Megatron-Core 0.19.2's ``TEGroupedMLP`` with ``num_gemms`` experts (two TE ``GroupedLinear``:
fc1 and fc2, the activation times the routing probabilities between them), built as Megatron
builds it (``TESpecProvider().grouped_mlp_modules``, a ``TransformerConfig``, the process
groups passed explicitly): with weight ``megatron`` its constructor pre-shards each layer's
experts over the cell's ranks and attaches GTP (``attach_gtp_to_presharded_module``); with
``plain`` it builds them whole. Then Megatron's training set-up names and chains them
(``classify_gtp_remat_chains``).

The step is two iterations of ``microbatches`` each: per microbatch each layer's output feeds
the next; backward from the cell's output gradient; after each iteration the harness's DDP
stand-in (``_LayerDDP``) averages the replicated parameters' gradients, the checks read every
``main_grad``, and the optimizer's part writes the next iteration's weights into the
parameters in place (as Megatron's distributed optimizer does) before ``main_grad`` is reset
(its ``zero_grad_buffer``; here to a seeded non-zero start, so that an overwrite shows).
The weights the layer initialised are overwritten with the cell's seeded ones before the
first step, so the float64 oracle (``harness.cell.mlp_oracle``) knows them.

Judged: every output, input gradient and routing-probability gradient of every iteration and
microbatch, every ``main_grad`` after each iteration (padding rows untouched), the DDP flags,
the GTP protocol's call counts per expert group, and - hooked - the hooks-off twin, bit for
bit (``harness.cell.twin``).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Callable

import torch
import torch.distributed as dist

from harness.cell import compare, hooks, megatron_gtp, te_path, twin
from harness.cell.faults import BackendFault, error_info, peer_lost
from harness.cell.inputs import draw_splits, main_grad_start
from harness.cell.mlp_oracle import LayerInputs, LayerOracle, make_inputs
from harness.cell.oracle import record_of
from harness.records.record import Check, RankResult
from harness.vocabulary import modules, weights
from harness.vocabulary.hook_modes import forward_executions
from harness.vocabulary.matrix import Cell
from harness.vocabulary.shape import Example
from harness.vocabulary.tolerance import UNIT_ROUNDOFF, gemm_dtype

__all__ = ["run_layer_cell"]

#: what Megatron's offloading offloads of the layer under ``mcore_offload``
OFFLOAD_MODULES = ["expert_fc1", "moe_act"]
#: the names Megatron's GTP chain classifier keys a model's expert layers on
LAYER_NAME = "decoder.layers.{}.mlp.experts"


class _Experts(torch.nn.Module):
    def __init__(self, experts: torch.nn.Module) -> None:
        super().__init__()
        self.experts = experts


class _Layer(torch.nn.Module):
    def __init__(self, experts: torch.nn.Module) -> None:
        super().__init__()
        self.mlp = _Experts(experts)


class _Decoder(torch.nn.Module):
    def __init__(self, layers: list[torch.nn.Module]) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(layers)


class Chunk(torch.nn.Module):
    """A model chunk as Megatron names one: ``decoder.layers.<i>.mlp.experts``."""

    def __init__(self, layers: list[torch.nn.Module]) -> None:
        super().__init__()
        self.decoder = _Decoder([_Layer(m) for m in layers])

    @property
    def mlps(self) -> list[torch.nn.Module]:
        return [layer.mlp.experts for layer in self.decoder.layers]


_SINGLE: dict[int, Any] = {}


def _single() -> Any:
    """This rank's process group of one (Megatron's tensor, pipeline, context and expert
    parallel groups of a cell: all of size one); created by this rank alone, once."""
    rank = dist.get_rank()
    if rank not in _SINGLE:
        _SINGLE[rank] = dist.new_group([rank], backend="gloo", use_local_synchronization=True)
    return _SINGLE[rank]


#: Megatron's modules the expert layer is built from: its spec provider, process-group
#: collection and config (torchrun's agent imports them for its ranks once,
#: ``harness.rank.worker.preload``)
MEGATRON_IMPORTS: tuple[str, ...] = ("megatron.core.extensions.transformer_engine_spec_provider",
                                     "megatron.core.process_groups_config",
                                     "megatron.core.transformer.transformer_config")


def _megatron() -> tuple[Any, Any, Any, Any]:
    """Megatron's spec provider, process-group collection, config and GTP module (the rank
    loaded TE first: the backend is TE)."""
    gtp = megatron_gtp.load()
    spec, groups, config = (importlib.import_module(name) for name in MEGATRON_IMPORTS)
    return spec.TESpecProvider, groups.ProcessGroupCollection, config.TransformerConfig, gtp


def build(cell: Cell, example: Example, group: Any) -> Chunk:
    """The cell's chunk, as Megatron builds it (the weights are Megatron's initialisation)."""
    kind = modules.KINDS[cell.module]
    spec, collection, config_cls, gtp = _megatron()
    megatron_gtp.reset_state()
    world = group if group is not None else dist.group.WORLD
    me = _single()
    sharded = weights.KINDS[cell.weight].implementer == "megatron"
    pgs = collection(tp=me, pp=me, cp=me, ep=me, expt_tp=me, tp_ep=me, expt_dp=me, gtp_remat=me,
                     expt_gtp_remat=world if sharded else me, dp=world, dp_cp=world)
    swiglu = kind.activation == "swiglu"
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[cell.dtype]
    config = config_cls(
        num_layers=cell.layers, hidden_size=example.in_features, num_attention_heads=1,
        num_moe_experts=cell.num_gemms, moe_ffn_hidden_size=example.out_features, moe_grouped_gemm=True,
        add_bias_linear=cell.bias, gated_linear_unit=swiglu,
        activation_func=torch.nn.functional.silu if swiglu else torch.nn.functional.gelu,
        bf16=cell.dtype == "bf16", fp16=cell.dtype == "fp16", params_dtype=dtype,
        gradient_accumulation_fusion=cell.fused, use_cpu_initialization=True, bias_activation_fusion=False,
        expert_tensor_parallel_size=1,
        expert_tensor_parallel_num_weight_shards=dist.get_world_size(world) if sharded else 1,
        fine_grained_activation_offloading=cell.hooks == "mcore_offload",
        offload_modules=OFFLOAD_MODULES if cell.hooks == "mcore_offload" else [],
    )
    make = spec().grouped_mlp_modules(True)
    layers = [make(cell.num_gemms, config, pg_collection=pgs, name=LAYER_NAME.format(i)) for i in range(cell.layers)]
    chunk = Chunk(layers)
    gtp.classify_gtp_remat_chains(chunk)  # what Megatron's training set-up does after building
    return chunk


def _weights_of(chunk: Chunk) -> list[tuple[str, str, int, int, torch.nn.Parameter]]:
    """``(name, fc, layer, expert, parameter)`` of every expert weight and bias."""
    out = []
    for layer, mlp in enumerate(chunk.mlps):
        for fc in ("linear_fc1", "linear_fc2"):
            lin = getattr(mlp, fc)
            for e in range(lin.num_gemms):
                for kind in ("weight", "bias"):
                    p = getattr(lin, f"{kind}{e}", None)
                    if isinstance(p, torch.nn.Parameter):
                        out.append((f"{LAYER_NAME.format(layer)}.{fc}.{kind}{e}", fc, layer, e, p))
    return out


def _value(inputs: LayerInputs, it: int, name: str, fc: str, layer: int, e: int) -> torch.Tensor:
    full = {"linear_fc1": (inputs.w1, inputs.b1), "linear_fc2": (inputs.w2, inputs.b2)}[fc]
    return full[0 if ".weight" in name else 1][it][layer][e]


def _is_sharded(p: torch.Tensor) -> bool:
    return bool(getattr(p, "is_gtp_weight_remat", False))


def _rows(p: torch.Tensor, group: Any) -> tuple[int, int, int]:
    """``(padded rows, first row, rows)`` of this rank's shard of a GTP parameter."""
    world = dist.get_world_size(group)
    rank = dist.get_rank(group)
    n = p.shape[0]
    return n * world, rank * n, n


def load(chunk: Chunk, inputs: LayerInputs, it: int, group: Any) -> None:
    """Iteration ``it``'s weights written into the parameters in place (a GTP shard: its rows of
    the full weight; padding rows stay as Megatron made them), as an optimizer writes them. A
    parameter that is neither the layer's logical shape nor a GTP shard of it is left as Megatron
    built it: Megatron-Core 0.19.2's expert GTP builds the experts' biases shard-sized and never
    gathers them (a defect of its own, ``megatron-expert-gtp-bias-not-gathered`` in the ledger),
    which the step then shows."""
    with torch.no_grad():
        for name, fc, layer, e, p in _weights_of(chunk):
            full = _value(inputs, it, name, fc, layer, e)
            if _is_sharded(p):
                _, row0, n = _rows(p, group)
                part = full[row0:row0 + n]
                p.data[:part.shape[0]].copy_(part)
            elif p.shape == full.shape:
                p.data.copy_(full)


class _LayerDDP:
    """Megatron's DDP for the chunk, as it treats expert parameters: a ``main_grad`` (fp32, the
    shard's shape) per parameter with ``grad_added_to_main_grad``; for a GTP parameter the hook
    Megatron's GTP calls after its finalize (``register_grad_accum_hook``), for the others one
    after autograd accumulates; the hook adds ``.grad`` to ``main_grad`` unless the backend
    already did, and clears it. After each iteration the replicated (non-GTP) parameters'
    increments are averaged over the ranks (the GTP ones were reduce-scattered as a mean)."""

    def __init__(self, chunk: Chunk, seed: int, rank: int, group: Any) -> None:
        self.params = {name: p for name, *_, p in _weights_of(chunk)}
        self.seed, self.rank, self.group = seed, rank, group
        #: iteration -> parameter -> its ``main_grad`` at the iteration's start
        self.starts: list[dict[str, torch.Tensor]] = []
        self.kept: dict[str, tuple[torch.Tensor, int]] = {}
        self._handles: list[Any] = []
        for name, p in self.params.items():
            p.main_grad = torch.zeros(p.shape, dtype=torch.float32, device=p.device)
            p.grad_added_to_main_grad = False
            self.kept[name] = (p.main_grad, p.main_grad.data_ptr())
            hook = self._hook(p)
            if _is_sharded(p) and hasattr(p, "register_grad_accum_hook"):
                p.register_grad_accum_hook(None, hook)
            else:
                self._handles.append(p.register_post_accumulate_grad_hook(lambda q, h=hook: h()))

    @staticmethod
    def _hook(p: torch.Tensor) -> Callable[..., None]:
        def hook(*_: Any) -> None:
            if p.grad is not None and not p.grad_added_to_main_grad:
                p.main_grad.add_(p.grad.data)
            p.grad = None
        return hook

    def start_iteration(self, it: int) -> None:
        """``zero_grad_buffer``: every ``main_grad`` to a seeded start, in place; the flags off."""
        self.starts.append({})
        for name, p in self.params.items():
            start = main_grad_start(tuple(p.shape), self.seed, f"{name}@{it}",
                                    self.rank if _is_sharded(p) else None)
            self.starts[it][name] = start
            p.main_grad.copy_(start)
            p.grad_added_to_main_grad = False

    def finish_iteration(self) -> None:
        replicated = [(n, p) for n, p in self.params.items() if not _is_sharded(p)]
        world = dist.get_world_size(self.group)
        if not replicated or world == 1:
            return
        start = self.starts[-1]
        flat = torch.cat([(p.main_grad - start[n]).reshape(-1) for n, p in replicated])
        dist.all_reduce(flat, group=self.group)
        for (n, p), part in zip(replicated, flat.split([p.numel() for _, p in replicated])):
            p.main_grad.copy_(start[n] + part.view_as(p.main_grad) / world)

    def main_grad_kept(self, name: str) -> bool:
        kept, ptr = self.kept[name]
        now = getattr(self.params[name], "main_grad", None)
        return now is kept and now.data_ptr() == ptr

    def close(self) -> None:
        for h in self._handles:
            h.remove()


@dataclass
class _Observed:
    """One iteration's tensors of one rank."""

    outputs: list[torch.Tensor] = field(default_factory=list)
    dgrads: list[torch.Tensor | None] = field(default_factory=list)
    dprobs: list[list[torch.Tensor | None]] = field(default_factory=list)
    main_grads: dict[str, torch.Tensor] = field(default_factory=dict)
    flags: dict[str, bool] = field(default_factory=dict)
    kept: dict[str, bool] = field(default_factory=dict)
    #: per GTP group (``<layer>.<fc>``): protocol call kind -> calls per member
    calls: dict[str, dict[str, list[int]]] = field(default_factory=dict)


def _groups(chunk: Chunk, group: Any) -> dict[str, megatron_gtp.MegatronGroup]:
    """Megatron's GTP expert groups of the chunk, each observed (its protocol calls logged)."""
    out = {}
    for layer, mlp in enumerate(chunk.mlps):
        for fc in ("linear_fc1", "linear_fc2"):
            lin = getattr(mlp, fc)
            members = [getattr(lin, f"weight{e}") for e in range(lin.num_gemms)]
            if members and _is_sharded(members[0]):
                padded, _, n = _rows(members[0], group)
                out[f"layers.{layer}.{fc}"] = megatron_gtp.MegatronGroup(members, padded, n)
    return out


def run_layer_cell(backend: ModuleType, cell: Cell, rank: int, world: int, group: Any, example: Example,
                   seed: int, owned: Callable[[str, str], Any], step: Any, kept: twin.Kept | None,
                   judge: bool, fp32_gemm: str) -> RankResult:
    """One step of a layer cell on this rank (``harness.cell.runner`` calls it as it calls its
    own step for a module; ``owned(owner, phase)`` tags what runs inside with its owner)."""
    kind = modules.KINDS[cell.module]
    with owned("harness", "inputs"):
        inputs = make_inputs(seed, example.in_features, example.out_features, example.rows, cell.dtype,
                             kind.activation, cell.num_gemms, cell.layers, kind.iterations, world,
                             cell.microbatches, cell.bias, _splits)
    ddp: _LayerDDP | None = None
    observed: list[_Observed] = []
    try:
        with owned("backend", "constructor"):
            chunk = build(cell, example, group)
        with owned("harness", "set-up"):
            load(chunk, inputs, 0, group)
            ddp = _LayerDDP(chunk, seed, rank, group)
            gtps = _groups(chunk, group)
        with owned("backend", "hooks"):
            installed = hooks.installer(cell.hooks, backend, layers=cell.layers, params=list(chunk.parameters()),
                                        megatron_inside=True)
        try:
            with step.packs.observing():
                for it in range(kind.iterations):
                    observed.append(_iteration(backend, cell, chunk, inputs, it, rank, group, owned, step, ddp,
                                               gtps, installed))
        finally:
            with owned("backend", "hooks"):
                installed.close()
    except BackendFault as fault:
        exc = fault.exc
        return RankResult(rank, "error", [Check("exception", "exception", False, message=f"{type(exc).__name__}: {exc}")],
                          {**error_info(exc), "phase": fault.phase}, by_peer=peer_lost(exc))
    finally:
        if ddp is not None:
            ddp.close()
    with owned("harness", "checks"):
        if kept is not None:
            _keep(kept, observed)
        checks = _checks(cell, inputs, rank, world, observed, ddp, gtps, fp32_gemm) if judge else []
        if judge and gtps:  # §2: gathered weights are transient; none may outlive the forward that made them
            checks.append(compare.compare_value("forward_gathers_alive_at_backward", "count", step.live_gathers, 0))
    return RankResult(rank, "pass" if all(c.ok for c in checks) else "fail", checks)


def _splits(rows: int, groups: int, seed: int, rank: int, key: tuple[int, int, int]) -> list[int]:
    """Tokens per expert (rank 0's first microbatch of the first iteration's first layer leaves
    an expert empty, as ``draw_splits`` does for a module's first microbatch)."""
    return draw_splits(rows, groups, seed, rank, 0 if key == (0, 0, 0) else key)


def _iteration(backend: ModuleType, cell: Cell, chunk: Chunk, inputs: LayerInputs, it: int, rank: int,
               group: Any, owned: Callable[[str, str], Any], step: Any, ddp: _LayerDDP,
               gtps: dict[str, megatron_gtp.MegatronGroup], installed: hooks.Installer) -> _Observed:
    seen = _Observed()
    with owned("harness", "optimizer"):
        if it > 0:
            load(chunk, inputs, it, group)
        ddp.start_iteration(it)
        before = {g: _counts(m) for g, m in gtps.items()}
    for mb in range(cell.microbatches):
        with owned("harness", "inputs"):
            x = inputs.x[it][rank][mb].clone().requires_grad_(cell.input_grad)
            probs = [p.clone().requires_grad_(True) for p in inputs.probs[it][rank][mb]]
            tpe = [torch.tensor(s, dtype=torch.int64) for s in inputs.splits[it][rank][mb]]
            dy = inputs.dy[it][rank][mb]
        with owned("backend", "forward"):
            installed.microbatch()
            h = x
            for layer, mlp in enumerate(chunk.mlps):
                h = installed.layer(lambda t, m=mlp, s=tpe[layer], p=probs[layer]: m(t, s, p)[0], h)
            out = installed.end_forward(h)
            step.forwards += 1
        with owned("harness", "path evidence"):
            step.choices.append(te_path.read(out, chunk.mlps[-1].linear_fc2))
            for g in gtps.values():
                step.live_gathers = max(step.live_gathers, g.live_forward_gathers(step.live_gathers))
        with owned("backend", "backward"):
            out.backward(dy)
        seen.outputs.append(out.detach().clone())
        seen.dgrads.append(x.grad.detach().clone() if cell.input_grad else None)
        seen.dprobs.append([None if p.grad is None else p.grad.detach().clone() for p in probs])
    with owned("backend", "hooks"):
        installed.end_iteration()
    with owned("harness", "consumer"):
        ddp.finish_iteration()
        for name, p in ddp.params.items():
            seen.main_grads[name] = p.main_grad.detach().clone()
            seen.flags[name] = bool(getattr(p, "grad_added_to_main_grad", False))
            seen.kept[name] = ddp.main_grad_kept(name)
        seen.calls = {g: _delta(_counts(m), before[g]) for g, m in gtps.items()}
    return seen


_PROTOCOL = ("materialize_forward", "materialize_backward", "finalize", "grad_buffer")


def _counts(group: megatron_gtp.MegatronGroup) -> dict[str, list[int]]:
    return {k: [group.log.count(k, i) for i in range(len(group.members))] for k in _PROTOCOL}


def _delta(now: dict[str, list[int]], before: dict[str, list[int]]) -> dict[str, list[int]]:
    return {k: [a - b for a, b in zip(now[k], before[k])] for k in now}


def _keep(kept: twin.Kept, observed: list[_Observed]) -> None:
    """The step's tensors for the twin, every iteration's in order."""
    kept.outputs = [t for seen in observed for t in seen.outputs]
    kept.dgrads = [t for seen in observed for t in seen.dgrads]
    kept.records = {}
    for it, seen in enumerate(observed):
        for name, t in seen.main_grads.items():
            kept.records[f"it{it}.{name}.main_grad"] = t
        for mb, per_layer in enumerate(seen.dprobs):
            for layer, t in enumerate(per_layer):
                kept.records[f"it{it}.mb{mb}.layer{layer}.probs.grad"] = t
    kept.calls = {f"it{it}.{g}.{k}": v for it, seen in enumerate(observed) for g, calls in seen.calls.items()
                  for k, v in calls.items()}


def _checks(cell: Cell, inputs: LayerInputs, rank: int, world: int, observed: list[_Observed],
            ddp: _LayerDDP, gtps: dict[str, megatron_gtp.MegatronGroup], fp32_gemm: str) -> list[Check]:
    dtype = gemm_dtype(cell.dtype, fp32_gemm)
    op_u = 2 * UNIT_ROUNDOFF["tf32"] if dtype == "tf32" else 0.0
    orc = LayerOracle(inputs, cell.dtype, op_u).compute(rank, world)
    checks: list[Check] = []
    for it, seen in enumerate(observed):
        for mb in range(cell.microbatches):
            checks.append(compare.compare_tensor(f"it{it}.mb{mb}.output", seen.outputs[mb], orc.outputs[it][mb], dtype))
            if cell.input_grad:
                checks.append(compare.compare_tensor(f"it{it}.mb{mb}.input_grad", seen.dgrads[mb],
                                                     orc.dgrads[it][mb], dtype))
            for layer, got in enumerate(seen.dprobs[mb]):
                checks.append(compare.compare_tensor(f"it{it}.mb{mb}.layer{layer}.probs.grad", got,
                                                     orc.dprobs[it][mb][layer], dtype))
        for name, p in ddp.params.items():
            short = name.replace(".mlp.experts", "").replace("decoder.", "")
            is_weight = ".weight" in name
            sharded = _is_sharded(p)
            # formed in main_grad's dtype when fused or distributed (CONTRACTS §2), else the cell's
            w_dtype = "fp32" if is_weight and (cell.fused or sharded) and dtype != "fp32" else dtype
            shard = _rows(p, ddp.group) if sharded else None
            ref = record_of(orc.grads[it][short], _base(cell, it, name, p, ddp), shard)
            check = compare.compare_tensor(f"it{it}.{short}.main_grad", seen.main_grads[name], ref, w_dtype)
            checks.append(check)
            if shard is not None:
                logical = orc.grads[it][short].value.shape[0]
                _, row0, n = shard
                first = max(logical - row0, 0)
                if first < n:
                    untouched = bool(torch.equal(seen.main_grads[name][first:], ddp.starts[it][name][first:]))
                    checks.append(compare.compare_value(f"it{it}.{short}.padding_rows_untouched", "flag",
                                                        untouched, True))
            checks.append(compare.compare_value(f"it{it}.{short}.main_grad_kept", "flag", seen.kept[name], True))
            expected = is_weight and (cell.fused or sharded)
            checks.append(compare.compare_value(f"it{it}.{short}.grad_added_to_main_grad", "flag",
                                                seen.flags[name], expected))
        checks.extend(_protocol_checks(cell, it, seen))
    for g, group in gtps.items():  # §2: finalize receives main_grad's dtype (every iteration)
        checks.append(compare.compare_value(f"{g}.finalize_dtypes", "dtype", sorted(set(group.log.finalize_dtypes())),
                                            ["float32"]))
    return checks


def _base(cell: Cell, it: int, name: str, p: torch.Tensor, ddp: _LayerDDP) -> torch.Tensor:
    """What a parameter's gradient of record adds the iteration's gradients to: its start, or
    zero where TE replaced it. Megatron's TE wrappers pass ``is_first_microbatch=True`` to the
    first forward after they are built (``TEGroupedLinear.is_first_microbatch``), and TE's fused
    wgrad GEMM then overwrites ``main_grad`` (``accumulate = fuse_wgrad_accumulation and not
    is_first_microbatch``) - harmless in training, whose first ``main_grad`` is zero; a GTP
    weight is exempt (its finalize accumulates), and so is a bias (``.grad``)."""
    replaced = it == 0 and cell.fused and ".weight" in name and not _is_sharded(p)
    start = ddp.starts[it][name]
    return torch.zeros_like(start) if replaced else start


def _protocol_checks(cell: Cell, it: int, seen: _Observed) -> list[Check]:
    """§2 per expert group and iteration: on the leader, forward-materialize once per forward
    execution, backward-materialize and finalize once per microbatch; the followers never;
    ``grad_buffer`` on every member when fused."""
    k = cell.microbatches
    expected = {"materialize_forward": k * forward_executions(cell.hooks), "materialize_backward": k, "finalize": k}
    checks = []
    for g, calls in seen.calls.items():
        for kind, n in expected.items():
            checks.append(compare.compare_value(f"it{it}.{g}.leader.{kind}_calls", "count", calls[kind][0], n))
            if len(calls[kind]) > 1:
                checks.append(compare.compare_value(f"it{it}.{g}.followers.{kind}_calls", "count",
                                                    sum(calls[kind][1:]), 0))
        if cell.fused:
            for i, n in enumerate(calls["grad_buffer"]):
                checks.append(compare.compare_value(f"it{it}.{g}.weight{i}.grad_buffer_calls", "count", n, k))
    return checks
