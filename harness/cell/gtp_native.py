"""The harness GTP weight over native quantized shards (weight ``gtp_mcore_fp8``).

Megatron-Core's native-FP8 GTP path (weight ``megatron_fp8``) builds each rank's weight
shard as a TE quantized tensor (TE's ``quantized_model_init``: the shard quantized on its
own) and hands it to TE's gather, which all-gathers the quantized data and scales instead of
a high-precision shard - but for a 2D-block (``blockwise``) weight, which TE 2.20.2 gathers
in high precision and quantizes whole (``_start_all_gather_fp8_blockwise``). This
module is the harness's own implementer of that path, so the path can be judged - and its
defects told apart from Megatron's - without Megatron installed, as ``gtp_mcore`` is for
the high-precision weight.

What it shares with Megatron's class, because TE reads it:

- the shard *is* a TE quantized tensor: its class is a subclass of the shard's own TE class
  (``GTPNative_Float8Tensor``, ...) carrying the harness weight's protocol methods, so TE
  treats it as a quantized parameter and never quantizes it again;
- each gather goes through TE's ``gather_along_first_dim`` with a copy of the shard's
  quantizer set for the direction (row-wise data forward, column-wise backward): the copy,
  never the parameter's own quantizer, whose usages TE's optimizer path relies on;
- padding rows are stripped from the gathered quantized tensor (data and scales).

Where it differs, as a correct implementer may: padding is stripped for per-tensor FP8 and
block-scaled shards too (Megatron asserts MXFP8 or NVFP4, ledger entry
``megatron-native-fp8-padding-unsupported``), a block-scaled shard is whole 128-row tiles
(``weights.STANDIN_BLOCK_PAD``; Megatron does not build one), the stripped tensor keeps the weight's own
dtype (Megatron's names bf16, which TE refuses for an fp32 weight), and a group gathers its
members one collective each. Gradients are high precision and take the harness weight's
path (:class:`harness.cell.gtp.GTPGroup`): pre-scale, reduce-scatter, ``main_grad``.
``cases/test_megatron_native_differential.py`` proves the gathers, the wgrads and
``main_grad`` bitwise equal to Megatron's class where both run.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from harness.vocabulary.weights import STANDIN_BLOCK_PAD, Behaviour, shard_rows
from harness.cell.gtp import GTPGroup, GTPWeight, attach_like_megatron, sharding

__all__ = ["NativeGroup", "inject_native", "native_shard", "quantized"]

#: GTPWeight members a native subclass does not take: construction hooks (a shard is
#: reclassed, never constructed), class machinery, and every name its TE class already has
_SKIP = frozenset({"__new__", "__init__", "__dict__", "__weakref__", "__module__", "__doc__",
                   "__qualname__", "__slots__", "__torch_function__"})
_SUBCLASSES: dict[type, type] = {}
#: MXFP8's scale block along the rows, and the tiles TE pads its scale-inverses to; the
#: block-scaled recipe's block (TE's ``Float8BlockQuantizer.block_len``, a weight's tiles
#: 128 x 128), which is the stand-in's alignment of a block-scaled shard
_MX_BLOCK, _ROW_TILE, _COL_TILE, _BLOCK = 32, 128, 4, STANDIN_BLOCK_PAD


def quantized(tensor: Any) -> bool:
    """``tensor`` holds TE's quantized data (a quantized tensor or its bare storage)."""
    from transformer_engine.pytorch.quantized_tensor import QuantizedTensor, QuantizedTensorStorage

    return isinstance(tensor, (QuantizedTensor, QuantizedTensorStorage))


def native_shard(weight: torch.Tensor, shard: torch.Tensor) -> torch.nn.Parameter:
    """``shard`` (high precision) quantized as TE's ``quantized_model_init`` quantizes a
    parameter it builds (``TransformerEngineBaseModule.reset_parameters``: the weight's
    quantizer, row-wise and column-wise usage, ``internal=False``), as a parameter carrying
    ``weight``'s attributes - as though TE had built the module shard-sized, which is how
    a native GTP model is built.

    Raises:
        ValueError: ``weight`` was not built under ``quantized_model_init``.
    """
    quantizer = getattr(weight, "_quantizer", None)
    if quantizer is None:
        raise ValueError(f"{type(weight).__name__} is no native quantized weight (build the module "
                         f"under quantized_model_init)")
    quantizer.set_usage(rowwise=True, columnwise=True)  # the module's own quantizer, as TE's init uses it
    quantizer.internal = False
    with torch.no_grad():
        param = torch.nn.Parameter(quantizer(shard.to(weight.dtype)), requires_grad=weight.requires_grad)
    for name, value in vars(weight).items():  # TE's tensor-parallel attributes and the like
        if not name.startswith("_") and not hasattr(param, name):
            setattr(param, name, value)
    return param


def _native_class(base: type) -> type:
    """``base`` (a TE quantized tensor class) with the harness weight's protocol methods."""
    sub = _SUBCLASSES.get(base)
    if sub is None:
        taken = {name for klass in base.__mro__ for name in vars(klass)}
        ns = {k: v for k, v in vars(GTPWeight).items() if k not in _SKIP and k not in taken}
        sub = _SUBCLASSES[base] = type(f"GTPNative_{base.__name__}", (base,), ns)
    return sub


class NativeGroup(GTPGroup):
    """A :class:`GTPGroup` whose members are native quantized shards, gathered quantized."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        from harness.cell import megatron_shims

        super().__init__(*args, **kwargs)
        megatron_shims.apply()  # TE's MXFP8 gather opens a coalescing manager, which gloo lacks
        self._gather_quantizers: list[Any] = []
        for m in self.members:
            q = m._quantizer.copy()
            q.internal = False
            # MXFP8's scales gather row by row only in their compact layout; the per-tensor and
            # block formats have no GEMM-ready layout of their own (the flag changes nothing there)
            q.optimize_for_gemm = not _is_mxfp8(q)
            self._gather_quantizers.append(q)

    def materialize(self, forward: bool) -> list[Any] | Any:
        """TE's quantized all-gather of every member, the padding rows stripped; the call's
        log entry says whether TE's gather was handed quantized shards and handed out
        quantized tensors. Both ends: TE's gather quantizes a high-precision input too, and
        under ``blockwise`` dequantizes a quantized one, so its output alone cannot tell a
        native shard from a high-precision one."""
        self.join_chain(forward)
        shards = self.members  # what TE's gather is handed: the native quantized parameters
        # detached, requiring grad as the parameter does (TE reads the copies' flag for
        # whether the weights need a gradient), as Megatron hands its gathers out
        out = [self._gather(m, q, forward).detach().requires_grad_(m.requires_grad and self.behaviour.copies_require_grad)
               for m, q in zip(shards, self._gather_quantizers)]
        if self.log.calls:
            self.log.calls[-1]["quantized"] = all(quantized(t) for t in (*shards, *out))
        if forward:
            self.track_forward(out)
        return out[0] if len(out) == 1 else out

    def _gather(self, member: torch.Tensor, quantizer: Any, forward: bool) -> Any:
        from transformer_engine.pytorch.distributed import gather_along_first_dim

        quantizer.set_usage(rowwise=forward, columnwise=not forward)
        full, _ = gather_along_first_dim(member, self.group, quantizer=quantizer)
        return self._strip(full)

    def _strip(self, tensor: Any) -> Any:
        """The gathered tensor without its padding rows: the data and the scales of the
        logical rows (TE's scale layouts: MXFP8 row-wise scales one per row, padded to 128
        rows, column-wise one per 32 rows, padded to 4; per-tensor FP8 one scale, its
        transpose holding rows as columns; block-scaled: :func:`_strip_blocks`)."""
        rows = self.logical_shape[0]
        pad = self.padded_rows - rows
        if pad == 0:
            return tensor
        meta = tensor.get_metadata()
        if _is_mxfp8_tensor(tensor):
            for key in ("rowwise_data", "columnwise_data"):
                if meta.get(key) is not None:
                    meta[key] = meta[key][:rows]
            if meta.get("rowwise_scale_inv") is not None:
                meta["rowwise_scale_inv"] = meta["rowwise_scale_inv"][:_round_up(rows, _ROW_TILE)]
            if meta.get("columnwise_scale_inv") is not None:
                meta["columnwise_scale_inv"] = meta["columnwise_scale_inv"][:_round_up(rows // _MX_BLOCK, _COL_TILE)]
        elif _is_blockwise_tensor(tensor):
            _strip_blocks(meta, rows, meta["is_2D_scaled"])
        elif "data" in meta:  # per-tensor FP8: one scale; the transpose holds rows as columns
            if meta.get("data") is not None:
                meta["data"] = meta["data"][:rows]
            if meta.get("data_transpose") is not None:
                meta["data_transpose"] = meta["data_transpose"][..., :rows].contiguous()
        else:
            raise NotImplementedError(f"stripping padding from {type(tensor).__name__} is not built")
        return type(tensor)(**meta, shape=torch.Size(self.logical_shape), dtype=meta["fake_dtype"])


def _strip_blocks(meta: dict[str, Any], rows: int, two_d: bool) -> None:
    """``meta`` of a gathered block-scaled tensor (TE's ``Float8BlockQuantizer``) cut to its
    first ``rows`` rows. Only a weight's 2D blocks (128 x 128 tiles) are built: TE 2.20.2 gathers
    them in high precision and quantizes the padded whole (``distributed.py
    _start_all_gather_fp8_blockwise``: ``block_scaling_dim != 1``), so a tile that holds logical
    and padding rows took its amax over zeros and its scale is the logical rows' own. The
    layouts (``Float8BlockQuantizer.get_scale_shape``): row-wise scales one row per 128 rows;
    the column-wise data transposed, its scales one column per 128 rows, padded to 4."""
    if not two_d:
        raise NotImplementedError("stripping padding from a 1D block-scaled (1 x 128) weight is not built")
    tiles = _round_up(rows, _BLOCK) // _BLOCK
    if meta.get("rowwise_data") is not None:
        meta["rowwise_data"] = meta["rowwise_data"][:rows]
        meta["rowwise_scale_inv"] = meta["rowwise_scale_inv"][:tiles]
    if meta.get("columnwise_data") is not None:
        meta["columnwise_data"] = meta["columnwise_data"][:, :rows].contiguous()
        # the logical tiles' columns, then zeros up to the multiple of 4 TE pads to (columns no
        # GEMM reads; the gathered tensor held there the scales of tiles of padding rows)
        scales = meta["columnwise_scale_inv"]
        kept = scales.new_zeros(scales.shape[0], _round_up(tiles, _COL_TILE))
        kept[:, :tiles] = scales[:, :tiles]
        meta["columnwise_scale_inv"] = kept


def _round_up(n: int, multiple: int) -> int:
    return math.ceil(n / multiple) * multiple


def _is_mxfp8(quantizer: Any) -> bool:
    from transformer_engine.pytorch.tensor.mxfp8_tensor import MXFP8Quantizer

    return isinstance(quantizer, MXFP8Quantizer)


def _is_blockwise_tensor(tensor: Any) -> bool:
    from transformer_engine.pytorch.tensor.storage.float8_blockwise_tensor_storage import Float8BlockwiseQTensorStorage

    return isinstance(tensor, Float8BlockwiseQTensorStorage)


def _is_mxfp8_tensor(tensor: Any) -> bool:
    from transformer_engine.pytorch.tensor import MXFP8TensorStorage

    return isinstance(tensor, MXFP8TensorStorage)


def inject_native(module: torch.nn.Module, group: Any, values: list[torch.Tensor],
                  behaviour: Behaviour) -> NativeGroup:
    """Give ``module`` (built under ``quantized_model_init``) native quantized shards of
    ``values`` (the full weights in high precision): rank r's padded rows quantized on their
    own by the weight's quantizer, reclassed into the harness weight, and wired in as
    ``behaviour`` says (Megatron's attach for ``gtp_mcore_fp8``).

    Raises:
        ValueError: the module has no weights, they are not native quantized weights, or the
            world size cannot shard them.
    """
    names, group, world_size, rank = sharding(module, group)
    logical = tuple(values[0].shape)
    padded_rows, s = shard_rows(logical[0], world_size, behaviour.pad_multiple)
    replaced, members = [], []
    for name, value in zip(names, values):
        weight = getattr(module, name)
        padded = torch.nn.functional.pad(value.detach(), (0, 0, 0, padded_rows - logical[0]))
        member = native_shard(weight, padded[rank * s:(rank + 1) * s].clone())
        member.__class__ = _native_class(type(member))
        member.gtp_group, member.gtp_index, member._grad_buffer = None, 0, None
        replaced.append(weight)
        members.append(member)
    native = NativeGroup(members, logical, padded_rows, group, world_size, rank, behaviour)
    for i, (name, m) in enumerate(zip(names, members)):
        m.join(native, i)
        # the same slot of the registration order: Megatron reclasses a native shard in place
        # (only a high-precision shard is re-registered behind the other parameters)
        module._parameters[name] = m
        if behaviour.megatron_attach:
            attach_like_megatron(module, name, m, replaced[i], i, grouped=names != ["weight"], move=False)
    if behaviour.megatron_attach and names != ["weight"]:
        members[0].weight_list = members
    return native
