"""The ``hooks`` axis: the saved-tensor hook installer a cell's forward runs under (pure data,
no torch; ``harness.cell.hooks`` installs each).

Every mode but ``off`` makes autograd hand backward a plain tensor in place of a saved
DistributedWeight - the condition under which TE's pre-fix backward lost the distributed path.
Four modes are the harness's or torch's own (``identity``, ``offload``: the harness's imitation
of fine-grained offloading, ``save_on_cpu``, ``checkpoint``). Three are the installers TE and
Megatron users train with, run as their code runs them:

- ``te_offload``: TE's CPU offloading, ``transformer_engine.pytorch.get_cpu_offload_context``
  (its default implementation), one offloaded layer per module (a chunk of ``L`` layers:
  ``L`` of ``L + 1``, the last an identity, as TE's own single-layer test does);
- ``te_offload_v1``: the same installer's v1 code path, which a user selects with
  ``NVTE_CPU_OFFLOAD_V1=1`` (TE reads it once at import into ``cpu_offload.NVTE_CPU_OFFLOAD_V1``;
  the cell sets that constant for its step and restores it);
- ``mcore_offload``: Megatron-Core's fine-grained activation offloading
  (``PipelineOffloadManager``), driven as ``GPTModel`` and the schedules drive it:
  ``init_chunk_handler`` per microbatch, the offload groups around what a layer offloads,
  ``reset()`` after every iteration on every rank.

What an installer needs of the rank, and where it cannot run, is said here once; the
preflight refuses (or leaves out) a cell whose installer the backend lacks.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["HookMode", "KINDS", "NAMES", "INSTALLERS", "OFFLOAD_API", "forward_executions"]

#: what a backend exposes when TE's own CPU offloading can run around its modules: TE's
#: ``get_cpu_offload_context`` (``transformer_engine.pytorch`` exports it; te-cpu too)
OFFLOAD_API = "get_cpu_offload_context"


@dataclass(frozen=True)
class HookMode:
    """One value of the ``hooks`` axis.

    Attributes:
        name: the axis value (the cell id names it: ``hooks_<name>``).
        summary: one line for ``list`` and the docs.
        installer: whose code installs the hooks: ``"none"`` (hooks off), ``"harness"``,
            ``"torch"``, ``"te"`` (TE's ``cpu_offload``) or ``"megatron"`` (Megatron-Core's
            fine-grained offloading).
        forward_executions: how many times the module's forward runs per microbatch under
            it (``checkpoint`` recomputes it in backward).
        coverage: how thoroughly ``ci`` covers it: ``"full"`` (every module x fused x
            distributed weight x world size) or ``"light"`` (every module at every world size,
            then all pairs): the real installers install the same saved-tensor hooks every
            mode does, and their own code (TE's offload branches, Megatron's bookkeeping) does
            not change with the weight.
        leaves_grouped_tensor_path: TE's ``GroupedLinear`` leaves its grouped-tensor path while
            this mode is on (TE 2.20: ``grouped_linear.py`` consults the path only when
            ``is_cpu_offload_enabled()`` is False): such a cell would never run the path its
            module value names, so the matrix does not generate it.
        recomputes_forward: the forward runs again in backward with the state the step has
            since changed (``checkpoint`` under delayed scaling: not built).
        spans_world: the installer's own code runs collectives over every rank of the job
            (Megatron's manager gathers a summary table over ``torch.distributed``'s default
            group after its warm-up iteration, ``post_warmup_callback``): such a cell runs in a
            launch whose every rank is its own (``harness.vocabulary.packing``).
    """

    name: str
    summary: str
    installer: str
    forward_executions: int = 1
    coverage: str = "full"
    leaves_grouped_tensor_path: bool = False
    recomputes_forward: bool = False
    spans_world: bool = False

    @property
    def hooked(self) -> bool:
        """Whether any saved-tensor hook runs (every mode but ``off``)."""
        return self.installer != "none"

    @property
    def needs_te(self) -> bool:
        """The installer is TransformerEngine's own code: the backend must be TE (it exposes
        ``OFFLOAD_API``); Megatron's manager imports TE's ``cpu_offload`` too."""
        return self.installer in ("te", "megatron")

    @property
    def needs_megatron(self) -> bool:
        """The installer is Megatron-Core's (``python -m harness install megatron``)."""
        return self.installer == "megatron"


_ALL = (
    HookMode("off", "no hook: the saved tensors are the tensors", "none"),
    HookMode("identity", "torch's saved_tensors_hooks with identity pack/unpack", "torch"),
    HookMode("offload", "the harness's imitation of fine-grained offloading: activations copied off "
             "and back, parameters passed through", "harness"),
    HookMode("save_on_cpu", "torch's save_on_cpu", "torch"),
    HookMode("checkpoint", "torch's non-reentrant checkpoint: the forward recomputed in backward", "torch",
             forward_executions=2, recomputes_forward=True),
    HookMode("te_offload", "TE's CPU offloading (get_cpu_offload_context, default implementation)", "te",
             coverage="light", leaves_grouped_tensor_path=True),
    HookMode("te_offload_v1", "TE's CPU offloading, v1 code path (NVTE_CPU_OFFLOAD_V1=1)", "te",
             coverage="light", leaves_grouped_tensor_path=True),
    HookMode("mcore_offload", "Megatron-Core's fine-grained activation offloading (PipelineOffloadManager), "
             "driven as GPTModel and the schedules drive it", "megatron", coverage="light", spans_world=True),
)
KINDS: dict[str, HookMode] = {k.name: k for k in _ALL}
NAMES: tuple[str, ...] = tuple(KINDS)
#: the modes whose installer is TE's or Megatron's own code
INSTALLERS: tuple[str, ...] = tuple(n for n, k in KINDS.items() if k.installer in ("te", "megatron"))


def forward_executions(mode: str) -> int:
    """How many times the module's forward runs per microbatch under ``mode``."""
    return KINDS[mode].forward_executions
