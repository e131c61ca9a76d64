"""Tests for harness.vocabulary.matrix: cells, axes, presets, filters and CLI value parsing.

Coverage properties of the ci preset are recomputed here from first principles (the three
validity rules of CONTRACTS §2/§4 / the module docstring), not from the generator's helpers.
"""

from __future__ import annotations

import dataclasses
import functools

import itertools
import json
import math
import random

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from harness.vocabulary import filters, matrix, modules, recipes, shape, weights
from harness.vocabulary.matrix import AXES, AXIS_NAMES, Axis, Cell, MatrixError, select

#: this module tests the generator: its selections are made here (conftest.py)
pytestmark = pytest.mark.usefixtures("selections_made_here")

DEFAULTS = {a.name: a.values for a in AXES}
#: weights that rely on main_grad: every distributed weight (CONTRACTS §2), i.e. all but plain
NEEDS_DDP = {w for w in weights.NAMES if w != "plain"}
#: modules that are a group of one GEMM (num_gemms is always 1)
SINGLE = {"linear", "layernorm_linear", "rmsnorm_linear"}
#: TE's grouped-tensor paths: bf16 / fp16 only
TENSOR = {"grouped_linear_tensor", "ops_grouped_linear_tensor"}
#: the TE class of each module value: the values of one class share one slot of the ci
#: design and take turns in it (matrix._module_slots)
CLASS = {"linear": "Linear", "grouped_linear": "GroupedLinear", "grouped_linear_tensor": "GroupedLinear",
         "ops_grouped_linear": "ops", "ops_grouped_linear_tensor": "ops",
         "layernorm_linear": "LayerNormLinear", "rmsnorm_linear": "LayerNormLinear",
         "mcore_grouped_mlp": "TEGroupedMLP", "mcore_grouped_mlp_gelu": "TEGroupedMLP"}
#: Megatron's expert layer: built by Megatron (its own weights, its DDP, no delayed wgrad, no
#: flag, no fp16), the only module with more than one layer per cell
LAYER = {"mcore_grouped_mlp", "mcore_grouped_mlp_gelu"}
#: TE's own CPU offloading: TE's GroupedLinear leaves its grouped-tensor path under it
TE_OFFLOAD = {"te_offload", "te_offload_v1"}
#: the real installers (TE's, Megatron's): light coverage in ci
INSTALLERS = {"te_offload", "te_offload_v1", "mcore_offload"}


def unflagged(cells):
    """The cells that do not pass ``is_first_microbatch``: the designs before the ``first_mb``
    axis (its cells are a design of their own, ``test_first_microbatch_cells``)."""
    return [c for c in cells if not c.first_mb]


def slot(module, domain) -> tuple:
    """The modules that may stand for ``module`` in a (b)/(c)/(h)/(v) cell of ci."""
    return tuple(m for m in domain if CLASS[m] == CLASS[module])


def valid(assign: dict) -> bool:
    """The three validity rules, written independently of the generator."""
    if assign.get("consumer") == "autograd" and assign.get("fused") is True:
        return False
    if assign.get("module") in SINGLE and assign.get("num_gemms", 1) != 1:
        return False
    if assign.get("module") in TENSOR and assign.get("dtype") == "fp32":
        return False
    if assign.get("module") in TENSOR and assign.get("recipe") in ("delayed", "nvfp4"):  # no such path in TE
        return False
    if assign.get("consumer") == "autograd" and assign.get("weight") in NEEDS_DDP:
        return False
    if assign.get("weight") in ("megatron", "megatron_fp8") and assign.get("world_size", 2) < 2:
        return False
    if assign.get("first_mb") and (CLASS.get(assign.get("module")) in ("ops", "TEGroupedMLP")
                                   or assign.get("microbatches", 2) < 2):
        return False
    if assign.get("module") == "grouped_linear_tensor" and assign.get("hooks") in TE_OFFLOAD:
        return False
    if assign.get("module") in LAYER:
        if (assign.get("weight", "plain") not in ("plain", "megatron") or assign.get("consumer", "ddp") != "ddp"
                or assign.get("delay_wgrad") or assign.get("dtype") == "fp16"):
            return False
    elif assign.get("layers", 1) != 1:
        return False
    return True


#: the axes a pair's completion is searched over (the rest take any value)
_SEARCHED = ("module", "fused", "consumer", "num_gemms", "weight", "world_size", "dtype", "hooks",
             "delay_wgrad", "layers")


def exists(domains, **fixed) -> bool:
    """Brute force by backtracking: some valid completion of ``fixed`` within ``domains``
    (linear forces num_gemms=1, a module that is not a layer layers=1). ``valid`` judges a
    partial assignment by its assigned axes alone, so a dead end is cut where it arises."""
    rest = tuple(n for n in _SEARCHED if n not in fixed)
    return _exists(tuple(sorted(fixed.items())), tuple((n, tuple(domains[n])) for n in rest))


@functools.lru_cache(maxsize=None)
def _exists(fixed: tuple, rest: tuple) -> bool:
    def extend(assign: dict, i: int) -> bool:
        if not valid(assign):
            return False
        if i == len(rest):
            return True
        name, options = rest[i]
        if name == "num_gemms" and assign.get("module") in SINGLE:
            options = (1,)
        if name == "layers" and assign.get("module") not in LAYER:
            options = (1,)
        return any(extend({**assign, name: v}, i + 1) for v in options)

    return extend(dict(fixed), 0)


def pair_possible(a, va, b, vb, domains) -> bool:
    """Brute force: some valid completion holds a=va and b=vb."""
    return exists(domains, **{a: va, b: vb})


def required_pairs(domains):
    for a, b in itertools.combinations(AXIS_NAMES, 2):
        for va in domains[a]:
            for vb in domains[b]:
                if pair_possible(a, va, b, vb, domains):
                    yield (a, va), (b, vb)


def assert_pairwise(cells, domains):
    seen = {((a, getattr(c, a)), (b, getattr(c, b)))
            for c in cells for a, b in itertools.combinations(AXIS_NAMES, 2)}
    missing = [p for p in required_pairs(domains) if p not in seen]
    assert not missing, f"{len(missing)} pairs uncovered, e.g. {missing[:3]}"


def _dtype(domain, module: str) -> str:
    """bf16 if selected, else the first selected dtype - among those the module's path has
    (the grouped-tensor paths have no fp32: their cells take the next dtype selected)."""
    ordered = (("bf16",) if "bf16" in domain else ()) + tuple(domain)
    return next((x for x in ordered if x in modules.KINDS[module].dtypes), ordered[0])


def demanding(domains, **fixed) -> dict:
    """Expected values of the non-fixed axes for (b)/(c) cells, per the spec."""
    d = domains
    out = {
        "microbatches": max(d["microbatches"]),
        "num_gemms": 1 if fixed["module"] in SINGLE else max(d["num_gemms"]),
        "bias": True in d["bias"], "input_grad": True in d["input_grad"],
        "dtype": _dtype(d["dtype"], fixed["module"]),
        "consumer": "ddp" if "ddp" in d["consumer"] else "autograd",
        "delay_wgrad": False if False in d["delay_wgrad"] else True,
        "hooks": "off" if "off" in d["hooks"] else d["hooks"][0],
        "world_size": max(d["world_size"]),
        "weight": d["weight"][0],
    }
    out.update(fixed)
    return out


LIGHT = ("gtp_async", "gtp_inplace", "gtp_cached", "gtp_nan", "gtp_pad16", "gtp_nograd", "gtp_tagged")


def full_coverage_weights(domain) -> tuple:
    """The weights that get (b)/(c): all but gtp_mcore and the light variants - or, when
    only those are selected, all of them."""
    full = tuple(w for w in domain if w != "gtp_mcore" and w not in LIGHT)
    return full or tuple(domain)


def assert_b_and_c(cells, domains):
    ids = {c.id for c in cells}
    full = full_coverage_weights(domains["weight"])
    full_hooks = tuple(h for h in domains["hooks"] if h not in INSTALLERS) or tuple(domains["hooks"])
    modules_ = [m for m in domains["module"] if m not in LAYER]
    for m, h, f, w, ws in itertools.product(modules_, full_hooks,
                                            domains["fused"], full, domains["world_size"]):
        wants = [demanding(domains, module=x, hooks=h, fused=f, weight=w, world_size=ws)
                 for x in slot(m, domains["module"])]
        wants = [x for x in wants if valid(x)]
        if wants:  # some module value of the slot takes the combination
            assert any(Cell(**x).id in ids for x in wants), f"(b) missing {Cell(**wants[0]).id}"
        elif w == "megatron" and ws < 2:  # Megatron never builds a GTP group of one
            continue
        elif m in TENSOR and set(domains["dtype"]) == {"fp32"}:  # no grouped-tensor path in fp32
            continue
        elif m == "grouped_linear_tensor" and h in TE_OFFLOAD:  # TE leaves that path under its offloading
            continue
        else:  # only a fused (or main_grad-reliant) cell without a ddp consumer can be impossible
            assert "ddp" not in domains["consumer"] and (f is True or w in NEEDS_DDP)
    # (i) TE's and Megatron's installers (light): every module slot at every world size
    if full_hooks != tuple(domains["hooks"]):
        for h, m, ws in itertools.product([h for h in domains["hooks"] if h in INSTALLERS], modules_,
                                          domains["world_size"]):
            if any(exists(domains, module=x, hooks=h, world_size=ws) for x in slot(m, domains["module"])):
                assert any(c.hooks == h and c.world_size == ws and c.module in slot(m, domains["module"])
                           for c in cells), f"(i) no {h} cell for {m} at ws{ws}"
    # (l) Megatron's expert layer: every hook mode per weight it takes; a one-layer chunk of
    # several microbatches under Megatron's offloading
    for m in [m for m in domains["module"] if m in LAYER]:
        for w, h in itertools.product(domains["weight"], domains["hooks"]):
            if any(exists(domains, module=x, weight=w, hooks=h) for x in slot(m, domains["module"])):
                assert any(c.weight == w and c.hooks == h and c.module in LAYER for c in cells), f"(l) {m} {w} {h}"
        mb = max(domains["microbatches"])
        if "mcore_offload" in domains["hooks"] and 1 in domains["layers"] and exists(
                domains, module=m, hooks="mcore_offload", layers=1, microbatches=mb):
            assert any(c.module in LAYER and c.hooks == "mcore_offload" and c.layers == 1 and c.microbatches == mb
                       for c in cells), "(l) no one-layer chunk under Megatron's offloading"
    for m, dl, f, w in itertools.product(modules_, domains["delay_wgrad"],
                                         domains["fused"], full):
        wants = [demanding(domains, module=x, delay_wgrad=dl, fused=f, weight=w)
                 for x in slot(m, domains["module"])]
        wants = [x for x in wants if valid(x)]
        if wants:
            assert any(Cell(**x).id in ids for x in wants), f"(c) missing {Cell(**wants[0]).id}"
    if full == tuple(domains["weight"]):
        return
    # gtp_mcore: every hook mode per module and world size; each light variant: every module
    # at every world size (when a valid cell exists)
    for w in domains["weight"]:
        if w not in full:
            for m, ws in itertools.product(modules_, domains["world_size"]):
                here = [c for c in cells if c.weight == w and c.world_size == ws
                        and c.module in slot(m, domains["module"])]
                if any(exists(domains, module=x, weight=w, world_size=ws) for x in slot(m, domains["module"])):
                    assert here, f"no {w} cell for {m} at ws{ws}"
                    if w == "gtp_mcore":
                        takes = {h for h in domains["hooks"] if any(
                            exists(domains, module=x, weight=w, world_size=ws, hooks=h) for x in slot(m, domains["module"]))}
                        assert {c.hooks for c in here} >= takes, (w, m, ws)


# --- cells ------------------------------------------------------------------------------

@st.composite
def cells(draw):
    d = {n: draw(st.sampled_from(v)) for n, v in DEFAULTS.items()}
    d["world_size"] = draw(st.integers(1, 64))
    d["microbatches"] = draw(st.integers(1, 16))
    d["num_gemms"] = 1 if d["module"] in SINGLE else draw(st.integers(1, 16))
    if d["module"] in TENSOR and d["dtype"] == "fp32":
        d["dtype"] = "bf16"
    d["recipe"] = "none" if d["module"] in TENSOR else draw(st.sampled_from(recipes.NAMES))
    if d["recipe"] == "delayed" and d["hooks"] == "checkpoint":
        d["recipe"] = "current"
    if d["recipe"] in recipes.NO_FP16 and d["dtype"] == "fp16":
        d["dtype"] = "bf16"
    if d["consumer"] == "autograd":
        d["fused"] = False
        if d["weight"] in NEEDS_DDP:
            d["consumer"] = "ddp"
    if d["module"] == "grouped_linear_tensor" and d["hooks"] in TE_OFFLOAD:
        d["hooks"] = "mcore_offload"
    if d["module"] in LAYER:
        d.update(weight=draw(st.sampled_from(("plain", "megatron") if d["world_size"] > 1 else ("plain",))),
                 consumer="ddp", delay_wgrad=False, layers=draw(st.integers(1, 8)))
        if d["dtype"] == "fp16":
            d["dtype"] = "bf16"
    else:
        d["layers"] = 1
    d["shape"] = draw(st.sampled_from(shape.NAMES)) if recipes.KINDS[d["recipe"]].blocked else "base"
    return Cell(**d)


@given(cells())
def test_id_roundtrip_and_serialize(cell):
    assert Cell.from_id(cell.id) == cell
    data = json.loads(json.dumps(cell.serialize()))
    assert Cell.from_dict(data) == cell
    assert isinstance(data["fused"], bool) and list(data) == list(AXIS_NAMES)
    assert 0 <= cell.seed < 2**63 and cell.seed == Cell.from_id(cell.id).seed


def test_id_format_and_seed_are_stable():
    c = Cell("grouped_linear", "distributed", "offload", True, "bf16", 4, "ddp", 2, 4,
             True, False, False)
    assert c.id == ("grouped_linear-distributed-hooks_offload-fused-bf16-ws4-ddp-mb2-g4-"
                    "bias-noigrad-nodelay")
    # pinned: a change here reshuffles every cell's data across runs and machines
    import hashlib
    data = "grouped_linear-*-hooks_*-fused-bf16-ws4-ddp-mb2-g4-bias-noigrad-nodelay"
    assert c.seed == int(hashlib.sha256(data.encode()).hexdigest()[:16], 16) >> 1
    # the weight kind and the hook mode draw no other numbers; every other axis does
    same = [dataclasses.replace(c, weight=w, hooks=h) for w in ("plain", "megatron") for h in ("off", "checkpoint")]
    assert {x.seed for x in same} == {c.seed}
    other = [dataclasses.replace(c, fused=False), dataclasses.replace(c, world_size=2),
             dataclasses.replace(c, microbatches=1), dataclasses.replace(c, bias=False)]
    assert len({c.seed, *(x.seed for x in other)}) == 1 + len(other)


@pytest.mark.parametrize("bad", [
    "linear", "linear-distributed-hooks_off-fused-bf16-ws2-ddp-mb2-g1-bias-igrad",
    "linear-distributed-hook=off-fused-bf16-ws2-ddp-mb2-g1-bias-igrad-nodelay",
    "linear-distributed-hooks_off-yes-bf16-ws2-ddp-mb2-g1-bias-igrad-nodelay",
    "linear-distributed-hooks_off-fused-bf16-wsX-ddp-mb2-g1-bias-igrad-nodelay",
    "linear-distributed-hooks_off-fused-bf16-ws02-ddp-mb2-g1-bias-igrad-nodelay",
    "linear-distributed-hooks_off-fused-fp64-ws2-ddp-mb2-g1-bias-igrad-nodelay",
    "linear-distributed-hooks_off-fused-bf16-ws0-ddp-mb2-g1-bias-igrad-nodelay",
    "linear-distributed-hooks_off-fused-bf16-ws2-ddp-mb2-g4-bias-igrad-nodelay",
    "linear-distributed-hooks_off-fused-bf16-ws2-autograd-mb2-g1-bias-igrad-nodelay",
])
def test_from_id_rejects_malformed(bad):
    with pytest.raises(MatrixError, match="Malformed cell id") as e:
        Cell.from_id(bad)
    assert "\n" not in str(e.value)


def test_constraints_on_construction():
    base = dict(module="grouped_linear", weight="plain", hooks="off", fused=False,
                dtype="fp32", world_size=1, consumer="autograd", microbatches=1,
                num_gemms=4, bias=True, input_grad=True, delay_wgrad=False)
    Cell(**base)
    with pytest.raises(MatrixError, match="consumer='autograd' requires fused=False"):
        Cell(**{**base, "fused": True})
    with pytest.raises(MatrixError, match="not grouped .* requires num_gemms=1"):
        Cell(**{**base, "module": "linear"})
    for w in sorted(NEEDS_DDP):
        with pytest.raises(MatrixError, match="always has a main_grad .* requires consumer='ddp'"):
            Cell(**{**base, "weight": w})
        Cell(**{**base, "weight": w, "consumer": "ddp", "world_size": 2,
                 "recipe": "mxfp8" if weights.KINDS[w].native else "none"})
    with pytest.raises(MatrixError, match="weight='megatron', 'megatron_fp8' and 'gtp_mcore_fp8' require world_size >= 2"):
        Cell(**{**base, "weight": "megatron", "consumer": "ddp"})
    native = {**base, "weight": "megatron_fp8", "consumer": "ddp", "world_size": 2}
    rule = ("weight='megatron_fp8' .* requires a recipe in delayed, current, mxfp8 and 'gtp_mcore_fp8' one in "
            "delayed, current, mxfp8, blockwise")
    with pytest.raises(MatrixError, match=rule):
        Cell(**native)
    with pytest.raises(MatrixError, match=rule):
        Cell(**{**native, "recipe": "blockwise"})
    with pytest.raises(MatrixError, match=rule):
        Cell(**{**native, "weight": "gtp_mcore_fp8", "recipe": "nvfp4", "dtype": "bf16"})
    Cell(**{**native, "weight": "gtp_mcore_fp8", "recipe": "blockwise"})
    Cell(**{**native, "recipe": "mxfp8"})
    Cell(**{**native, "recipe": "delayed"})
    with pytest.raises(MatrixError, match=r"Unknown value 'fp64' for axis dtype \(choose from"):
        Cell(**{**base, "dtype": "fp64"})
    with pytest.raises(MatrixError, match="world_size must be an int >= 1, got world_size=0"):
        Cell(**{**base, "world_size": 0})
    with pytest.raises(MatrixError, match="fused must be a bool"):
        Cell(**{**base, "fused": "off"})
    with pytest.raises(MatrixError, match="missing=\\['bias'\\]"):
        Cell.from_dict({k: v for k, v in base.items() if k != "bias"})


def test_expect_error_exactly_for_delay_and_distributed():
    full = select("full", {"weight": list(weights.NAMES)})
    for c in full:
        assert (c.expect == "error") == (c.delay_wgrad and c.weight != "plain"), c.id
        assert c.distributed == (c.weight != "plain")
    assert any(c.expect == "error" for c in full) and any(c.expect == "pass" for c in full)


# --- axes -------------------------------------------------------------------------------

def test_axis_is_immutable_composable_and_validated():
    a = Axis("dtype", ("fp32", "bf16"))
    b = a.filter(lambda v: v != "fp32")
    assert b.values == ("bf16",) and a.values == ("fp32", "bf16")
    assert repr(b) == "Axis('dtype', ('fp32', 'bf16')).filter(<lambda>)"
    u = b | Axis("dtype", ("fp16", "bf16"))
    assert u.values == ("bf16", "fp16") and "|" in repr(u)
    assert a.restrict(["bf16"]).values == ("bf16",)
    assert u == Axis("dtype", ("bf16", "fp16"))  # repr history is not part of equality
    with pytest.raises(Exception):
        a.values = ("fp16",)
    with pytest.raises(MatrixError, match="Cannot restrict axis dtype to 'fp16'"):
        a.restrict(["fp16"])
    with pytest.raises(MatrixError, match="Cannot union axis dtype with axis hooks"):
        a | Axis("hooks", ("off",))
    with pytest.raises(MatrixError, match="no values"):
        a.filter(lambda v: False)
    with pytest.raises(MatrixError, match="Unknown axis 'dtypes'"):
        Axis("dtypes", ("bf16",))


# --- presets ----------------------------------------------------------------------------

def test_full_by_whole_ids_is_the_product_filtered():
    """``--cells`` with whole ids (a repro) builds those cells from ``full`` instead of its whole
    product: the same cells, in the same order, as filtering the product - ids outside the
    domains, malformed and non-canonical ones selecting nothing, an ``and`` with another filter."""
    ov = {"weight": ("distributed", "plain", "megatron"), "world_size": (1, 4, 8), "dtype": ("bf16",)}
    everything = select("full", ov)
    rng = random.Random(7)
    picked = rng.sample([c.id for c in everything], 300)
    outside = [c.id for c in rng.sample(select("full", {**ov, "dtype": ("fp32",)}), 20)]
    ids = picked + outside + ["linear-nonsense", picked[0].upper()]
    assert any(modules.KINDS[Cell.from_id(i).module].layer for i in picked)  # layers forced where not a layer
    expr = " or ".join(f"id == {i!r}" for i in ids)
    assert filters.exact_ids(expr) == frozenset(ids)
    want = [c for c in everything if c.id in set(ids)]
    assert len(want) == len(picked) and select("full", ov, expr) == want
    both = f"world_size >= 4 and id in {tuple(ids)!r}"
    assert filters.exact_ids(both) == frozenset(ids)
    assert select("full", ov, both) == [c for c in want if c.world_size >= 4]
    assert filters.exact_ids(f"id == {ids[0]!r} or world_size == 8") is None
    assert filters.exact_ids(f"{ids[0]!r} in id") is None


def test_full_size_is_product_minus_invalid():
    """``full`` is the whole valid product; its weight domain defaults to the kind weight,
    plain and the two strictest implementers (the single-behaviour variants are opt-in)."""
    everything = select("full")
    assert len(everything) == len({c.id for c in everything})
    full = unflagged(everything)
    # the flagged cells: every unflagged cell that can take the flag (two microbatches, a module
    # whose forward takes it), once more with it
    flagged = [c for c in everything if c.first_mb]
    takes = [c for c in full if c.microbatches == 2 and CLASS[c.module] not in ("ops", "TEGroupedMLP")]
    assert {dataclasses.replace(c, first_mb=False) for c in flagged} == set(takes)
    assert len(flagged) == len(takes) == 164376 and len(everything) == 505104 + 164376
    assert {c.weight for c in full} == {"distributed", "plain", "gtp_mcore", "gtp_nograd"}
    # linear cells exist only with num_gemms=1, which is in the default domain
    domains = {**DEFAULTS, "weight": ("distributed", "plain", "gtp_mcore", "gtp_nograd")}
    expected = sum(valid(dict(zip(AXIS_NAMES, combo)))
                   for combo in itertools.product(*domains.values()))
    none = [c for c in full if c.recipe == "none"]
    assert len(none) == expected == 102912
    assert all(valid(c.serialize()) for c in full)
    assert len(unflagged(select("full", {"weight": ["distributed", "plain"], "recipe": ["none"]}))) == 59904
    # and every judged recipe on the modules it is judged on: each a copy of those modules'
    # cells, delayed without hooks=checkpoint (one hook mode of eight not built)
    lowp = [c for c in full if c.recipe != "none"]
    judged = {"linear", "grouped_linear", "ops_grouped_linear", "layernorm_linear", "rmsnorm_linear"}
    assert {(c.recipe, c.module) for c in lowp} == {(r, m) for r in recipes.JUDGED if r != "none"
                                                    for m in recipes.MODELLED[r]} == {
        (r, m) for r in ("current", "delayed", "mxfp8", "blockwise", "nvfp4") for m in judged} | {
        (r, m) for r in ("current", "mxfp8", "blockwise") for m in TENSOR}
    for module in sorted(TENSOR):  # the grouped-tensor paths: TE takes them under three recipes
        twins = sum(c.module == module for c in none)
        for r in ("current", "mxfp8", "blockwise"):
            assert sum(c.recipe == r and c.module == module for c in lowp) == twins, (r, module)
    for module, count in (("linear", 10368), ("grouped_linear", 20736), ("ops_grouped_linear", 20736),
                          ("layernorm_linear", 10368), ("rmsnorm_linear", 10368)):
        twins = sum(c.module == module for c in none)
        for r in ("current", "mxfp8", "blockwise"):
            assert sum(c.recipe == r and c.module == module for c in lowp) == twins == count, (r, module)
        assert sum(c.recipe == "delayed" and c.module == module for c in lowp) == twins * 7 // 8, module
        # nvfp4: no fp16 cell (TE's FP4 GEMM refuses an fp16 output), a third of the dtypes
        assert sum(c.recipe == "nvfp4" and c.module == module for c in lowp) == twins * 2 // 3, module
    assert not any(c.recipe == "nvfp4" and c.dtype == "fp16" for c in full)
    assert len(full) == 102912 + 3 * 72576 + 63504 + 48384 + 3 * (10368 + 13824) == 505104
    # the oracle judges every pair the matrix can generate; the guard still names any other
    assert recipes.unmodelled((c.recipe, c.module) for c in full) == []
    assert recipes.unmodelled([("mxfp8", "mcore_grouped_mlp")]) == ["mxfp8/mcore_grouped_mlp"]



def test_ci_default_coverage_and_size():
    ci = [c for c in unflagged(select("ci")) if c.recipe == "none"]  # (how fast: benchmarks/bench_timings.py)
    # 437 cells before TE's and Megatron's installers and Megatron's expert layer joined: each
    # installer adds about a cell per module slot and world size, the layer a few dozen
    assert 437 < len(ci) <= 600
    assert len({c.id for c in ci}) == len(ci)
    assert {c.weight for c in ci} == set(weights.DEFAULT_NAMES)
    assert "megatron" not in weights.DEFAULT_NAMES
    assert_pairwise(ci, DEFAULTS)
    assert_b_and_c(ci, DEFAULTS)
    # impossible pairs really are absent
    assert not any(c.consumer == "autograd" and c.fused for c in ci)
    assert {c.num_gemms for c in ci if c.module in SINGLE} == {1}


def test_ci_is_deterministic_and_ordered():
    a, b = select("ci"), select("ci")
    assert a == b and matrix.ids_digest(a) == matrix.ids_digest(b)
    assert [c.world_size for c in a] == sorted(c.world_size for c in a)
    groups = matrix.plan(a)
    assert list(groups) == [1, 2, 4]
    assert [c for g in groups.values() for c in g] == a


def test_ci_world_size_override_adds_ws8():
    domains = {**DEFAULTS, "world_size": (1, 2, 4, 8)}
    ci = [c for c in unflagged(select("ci", {"world_size": [1, 2, 4, 8]})) if c.recipe == "none"]
    assert any(c.world_size == 8 for c in ci) and 437 < len(ci) <= 760
    assert_pairwise(ci, domains)
    assert_b_and_c(ci, domains)
    # (c) uses the largest world size
    assert all(c.world_size == 8 for c in ci if c.delay_wgrad and c.hooks == "off"
               and c.microbatches == 2 and c.dtype == "bf16" and c.bias and c.input_grad
               and c.consumer == "ddp" and c.num_gemms == (1 if c.module in SINGLE else 4)
               and c.world_size >= 4)


def small_domain(name, values):
    if name in ("world_size", "microbatches", "num_gemms"):
        return st.lists(st.integers(1, 6), min_size=1, max_size=3, unique=True)
    return st.lists(st.sampled_from(values), min_size=1, max_size=len(values), unique=True)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(st.fixed_dictionaries({}, optional={n: small_domain(n, v) for n, v in DEFAULTS.items()}))
def test_ci_coverage_under_random_overrides(overrides):
    domains = {**DEFAULTS, **{k: tuple(v) for k, v in overrides.items()}}
    everything = unflagged(select("ci", overrides))
    if "recipe" not in overrides:  # the judged recipes join, each on its modules
        assert_recipe_pairs(everything, domains)
    ci = [c for c in everything if c.recipe == "none"]
    if not ci:  # only when no valid cell exists at all (brute force)
        assert not exists({**domains, "recipe": ("none",)})
        return
    for c in ci:
        for n in AXIS_NAMES:
            v = getattr(c, n)
            assert v in domains[n] or (n == "num_gemms" and c.module in SINGLE and v == 1) or (
                n == "layers" and c.module not in LAYER and v == 1)
    assert_pairwise(ci, domains)
    assert_b_and_c(ci, domains)
    # (determinism: test_ci_is_deterministic_and_ordered; a second select here doubled the test)


def assert_recipe_pairs(cells, domains):
    """Each judged recipe's cells cover every pair of values of its domain: the modules it is
    judged on, every hook mode but ``checkpoint`` under ``delayed`` (not built), every dtype but
    fp16 under ``nvfp4`` (not in TE)."""
    for r in recipes.JUDGED[1:]:
        mods = tuple(m for m in domains["module"] if m in recipes.MODELLED[r])
        mine = [c for c in cells if c.recipe == r]
        assert {c.module for c in mine} <= set(mods)
        d = {**domains, "recipe": (r,), "module": mods,
             "hooks": tuple(h for h in domains["hooks"] if not (r == "delayed" and h == "checkpoint")),
             "dtype": tuple(x for x in domains["dtype"] if not (r in recipes.NO_FP16 and x == "fp16"))}
        if not mods or not d["hooks"] or not d["dtype"] or not mine:
            assert not mine or mods
            continue
        assert_pairwise(mine, d)
    assert {c.recipe for c in cells} <= set(recipes.JUDGED)


def test_full_under_overrides_adds_linear_num_gemms_1():
    full = select("full", {"num_gemms": [4], "consumer": ["ddp"], "world_size": [2]})
    lin = [c for c in full if c.module in SINGLE]
    assert lin and {c.num_gemms for c in lin} == {1}
    assert {c.num_gemms for c in full if c.module not in SINGLE} == {4}


def test_smoke():
    smoke = select("smoke")
    assert len(smoke) == 2 * len(DEFAULTS["module"])
    assert {c.module for c in smoke} == set(DEFAULTS["module"])
    assert {c.hooks for c in smoke} == {"identity", "off"}
    # Megatron's expert layer builds its own weights: plain (it takes no harness weight)
    assert all(c.world_size == 2 and c.fused and c.weight == ("plain" if c.module in LAYER else "distributed")
               and c.expect == "pass" for c in smoke)
    assert {c.world_size for c in select("smoke", {"world_size": [1]})} == {1}


def test_unknown_preset_and_axis():
    with pytest.raises(MatrixError, match=r"Unknown preset 'nightly' \(presets: ci, full, smoke, seed\)"):
        select("nightly")
    with pytest.raises(MatrixError, match=r"Unknown axis 'dtypes' \(axes: module, weight"):
        select("ci", {"dtypes": ["bf16"]})
    with pytest.raises(MatrixError, match="world_size must be an int >= 1, got world_size=0"):
        select("ci", {"world_size": [0, 2]})
    with pytest.raises(MatrixError, match="Unknown value 'fp64'"):
        select("ci", {"dtype": ["fp64"]})


# --- filters ----------------------------------------------------------------------------

@pytest.mark.parametrize("expr,check", [
    ('module == "linear" and world_size >= 2',
     lambda c: c.module == "linear" and c.world_size >= 2),
    ('hooks in ("offload", "checkpoint") and not fused',
     lambda c: c.hooks in ("offload", "checkpoint") and not c.fused),
    ("fused or delay_wgrad", lambda c: c.fused or c.delay_wgrad),
    ("1 < world_size <= 4 and dtype != 'fp32'",
     lambda c: 1 < c.world_size <= 4 and c.dtype != "fp32"),
    ("hooks not in ['off'] and num_gemms == 4", lambda c: c.hooks != "off" and c.num_gemms == 4),
])
def test_filter_matches_python_semantics(expr, check):
    ci = select("ci")
    got = select("ci", filter_expr=expr)
    assert got == [c for c in ci if check(c)] and got


@pytest.mark.parametrize("expr,msg", [
    ("module ==", "Malformed filter 'module ==': invalid syntax"),
    ("modul == 'linear'", "Unknown name 'modul' in filter (axes: module, weight"),
    ("__import__('os')", "Unsupported syntax Call"),
    ("module.upper() == 'X'", "Unsupported syntax"),
    ("world_size + 1 > 2", "Unsupported syntax BinOp"),
    ("module == 'linaer'", "Unknown value 'linaer' for axis module"),
    ("fused == 'on'", "fused must be a bool"),
    ("hooks in ('offload', 'ofload')", "Unknown value 'ofload' for axis hooks"),
    ("hooks in (module,)", "only constants"),
    ("[x for x in ()]", "Unsupported syntax"),
])
def test_filter_rejects(expr, msg):
    with pytest.raises(MatrixError) as e:
        select("ci", filter_expr=expr)
    assert msg in str(e.value) and "\n" not in str(e.value)


def test_filter_type_error_is_matrix_error():
    with pytest.raises(MatrixError, match="Cannot evaluate filter"):
        select("ci", filter_expr="module < 3")


# --- CLI helpers ------------------------------------------------------------------------

def test_parse_values():
    assert matrix.parse_values("fused", "on, OFF") == (True, False)
    assert matrix.parse_values("bias", "true,0,1") == (True, False)
    assert matrix.parse_values("world_size", "1,2,4,8") == (1, 2, 4, 8)
    assert matrix.parse_values("dtype", "bf16") == ("bf16",)
    assert set(matrix.AXIS_OPTIONS.values()) == set(AXIS_NAMES)
    assert matrix.AXIS_OPTIONS["--world-sizes"] == "world_size"


@pytest.mark.parametrize("axis,text,msg", [
    ("fused", "yes", "fused takes on/off, true/false or 1/0, got fused='yes'"),
    ("world_size", "1,two", "world_size must be an int >= 1, got world_size='two'"),
    ("world_size", "0", "world_size must be an int >= 1, got world_size=0"),
    ("dtype", "bf16,fp64", "Unknown value 'fp64' for axis dtype"),
    ("dtype", "bf16,", "Empty value in dtype='bf16,'"),
    ("dtypes", "bf16", "Unknown axis 'dtypes'"),
])
def test_parse_values_errors(axis, text, msg):
    with pytest.raises(MatrixError) as e:
        matrix.parse_values(axis, text)
    assert msg in str(e.value) and "\n" not in str(e.value)


def test_describe_and_digest():
    ci = select("ci")
    text = matrix.describe(ci)
    lines = text.splitlines()
    errors = sum(c.delay_wgrad and c.distributed for c in ci)
    assert lines[0] == f"{len(ci)} cells ({errors} expected to raise)" and errors > 0
    assert len(lines) == 1 + len(AXIS_NAMES)
    ws_line = next(line for line in lines if line.strip().startswith("world_size:"))
    n1 = sum(c.world_size == 1 for c in ci)
    assert f"1={n1}," in ws_line
    assert matrix.ids_digest(ci) != matrix.ids_digest(ci[::-1])
    assert len(matrix.ids_digest([])) == 64
    assert math.isclose(sum(int(p.split("=")[1]) for p in lines[1].split(": ")[1].split(", ")),
                        len(ci))


@pytest.mark.parametrize("chosen", [("megatron",), ("megatron", "distributed", "plain"),
                                    ("gtp_mcore", "gtp_nan"), ("megatron", "gtp_async")])
def test_ci_with_chosen_weights(chosen):
    """``--weights`` with Megatron's class or only variants: every pair and the (b)/(c)
    blocks are covered (variants alone get full coverage), never a megatron cell at ws1."""
    domains = {**DEFAULTS, "weight": chosen}
    ci = select("ci", {"weight": list(chosen)})
    assert {c.weight for c in ci} == set(chosen)
    assert not any(c.weight == "megatron" and c.world_size == 1 for c in ci)
    assert all(valid(c.serialize()) for c in ci)
    assert_pairwise(ci, domains)
    assert_b_and_c(ci, domains)


def test_megatron_ci_size():
    """``sweep --preset ci --weights megatron``: ws 2 and 4 only, hooks x fused x module each, plus the
    hooked no-input-gradient and delayed-wgrad interactions (n) and (d)."""
    ci = unflagged(select("ci", {"weight": ["megatron"]}))
    assert {c.world_size for c in ci} == {2, 4}
    # under the recipes: the judged modules, the grouped-tensor paths among them (three recipes)
    assert 60 <= sum(c.recipe == "none" for c in ci) <= 180 and sum(c.recipe != "none" for c in ci) <= 300


def test_seed_preset_is_the_production_combination():
    """``--preset seed``: Megatron's expert layer (TEGroupedMLP) x Megatron's weight x bf16 x 4
    experts x fused wgrad x two layers and two microbatches under Megatron's own offloading, plus a
    hooks-off control, at every world size Megatron allows; restricting an axis away from the
    seed's value keeps the user's values."""
    seed = select("seed")
    assert {(c.hooks, c.world_size) for c in seed} == {("mcore_offload", 2), ("off", 2), ("mcore_offload", 4), ("off", 4)}
    for c in seed:
        assert (c.module, c.weight, c.fused, c.dtype, c.consumer, c.delay_wgrad) == (
            "mcore_grouped_mlp", "megatron", True, "bf16", "ddp", False)
        assert c.num_gemms == 4 and c.microbatches == 2 and c.layers == 2 and not c.bias
    mcore = select("seed", {"weight": ["gtp_mcore"], "dtype": ["fp32"]})
    assert {c.weight for c in mcore} == {"gtp_mcore"} and {c.dtype for c in mcore} == {"fp32"}
    assert {c.world_size for c in mcore} == {1, 2, 4}
    # the layer takes no harness weight: its experts' own class stands in, one layer
    assert {(c.module, c.layers) for c in mcore} == {("grouped_linear", 1)}


# --- the recipe axis ----------------------------------------------------------------------

#: select("ci")'s cells without a recipe (pinned when TE's and Megatron's installers and
#: Megatron's expert layer joined; 437 cells before): the recipe axis must not move one of them
CI_BEFORE_RECIPES = (539, "8ef6ceb99245fb9ba5e21070b14960a74cbffa52f8c997e6d768c1835efbbe68")


def test_presets_keep_their_cells_and_add_the_judged_recipes():
    """``ci`` and ``full`` add the recipes the oracle judges, on the modules it judges them on;
    their cells without a recipe are those before the axis; smoke and seed stay without."""
    ci = unflagged(select("ci"))
    none = [c for c in ci if c.recipe == "none"]
    assert (len(none), matrix.ids_digest(none)) == CI_BEFORE_RECIPES
    only_none = unflagged(select("ci", {"recipe": ["none"]}))
    assert (len(only_none), matrix.ids_digest(only_none)) == CI_BEFORE_RECIPES
    assert recipes.JUDGED == ("none", "delayed", "current", "mxfp8", "blockwise", "nvfp4")
    # full's recipes on linear, judged under every recipe (which recipe full holds on each
    # module: test_full_size_is_product_minus_invalid, over the whole of full)
    assert {c.recipe for c in ci} == set(recipes.JUDGED) == {c.recipe for c in select("full", {"module": ["linear"]})}
    assert {c.module for c in ci if c.recipe != "none"} == {"linear", "grouped_linear", "ops_grouped_linear",
                                                          "layernorm_linear", "rmsnorm_linear"} | TENSOR
    assert {c.module for c in ci if c.recipe in ("mxfp8", "blockwise", "current")} == {
        "linear", "grouped_linear", "ops_grouped_linear", "layernorm_linear", "rmsnorm_linear"} | TENSOR
    assert not {c.module for c in ci if c.recipe in ("delayed", "nvfp4")} & TENSOR  # no such path in TE
    for preset in ("smoke", "seed"):
        assert {c.recipe for c in select(preset)} == {"none"}, preset


def test_ci_recipe_cells_are_all_pairs_on_the_judged_modules():
    """Each judged recipe's ci cells: every pair of values (module x hooks, hooks x weight,
    weight x world size, ...) on the judged modules, each distributed weight of full coverage
    hooks-off with an input gradient per module (the hook-free form of the recipe's weight
    handling), and a plain delayed-wgrad cell with a bias per module; about a third of ci."""
    ci = unflagged(select("ci"))
    assert_recipe_pairs(ci, DEFAULTS)
    lowp = [c for c in ci if c.recipe != "none"]
    assert 60 <= len(lowp) <= 560
    for r in ("current", "delayed", "mxfp8", "blockwise", "nvfp4"):
        for m in recipes.MODELLED[r]:
            assert any(c.recipe == r and c.module == m and c.weight == "distributed" and c.hooks == "off"
                       and c.input_grad and not c.delay_wgrad for c in lowp), (r, m)
            assert any(c.recipe == r and c.module == m and c.weight == "plain" and c.hooks == "off"
                       and c.delay_wgrad and c.bias for c in lowp), (r, m)


def test_recipe_in_the_id_only_when_quantized_and_old_records_load():
    base = Cell("linear", "distributed", "off", True, "bf16", 2, "ddp", 2, 1, True, True, False)
    assert base.recipe == "none" and not base.id.endswith("-rnone")
    q = Cell(**{**base.serialize(), "recipe": "current"})
    assert q.id == base.id + "-rcurrent" and q.seed != base.seed
    assert Cell.from_id(q.id) == q and Cell.from_dict(json.loads(json.dumps(q.serialize()))) == q
    old = {k: v for k, v in base.serialize().items() if k != "recipe"}  # a record before the axis
    assert Cell.from_dict(old) == base
    with pytest.raises(MatrixError, match="Malformed cell id"):
        Cell.from_id(base.id + "-xcurrent")
    with pytest.raises(MatrixError, match="Unknown value 'fp4' for axis recipe"):
        Cell.from_id(base.id + "-rfp4")
    assert Cell.from_id(base.id + "-rnvfp4").recipe == "nvfp4"
    with pytest.raises(MatrixError, match="recipe nvfp4 with dtype='fp16' does not exist in TE"):
        Cell(**{**base.serialize(), "dtype": "fp16", "recipe": "nvfp4"})
    for m in sorted(TENSOR):
        for r in ("delayed", "nvfp4"):  # TE takes no grouped-tensor path under them
            with pytest.raises(MatrixError, match="on a grouped-tensor path .* does not exist in TE"):
                Cell(**{**base.serialize(), "module": m, "num_gemms": 4, "recipe": r})
        for r in ("current", "mxfp8", "blockwise"):
            assert Cell(**{**base.serialize(), "module": m, "num_gemms": 4, "recipe": r}).recipe == r
    with pytest.raises(MatrixError, match="hooks='checkpoint' with recipe='delayed' is not built"):
        Cell(**{**base.serialize(), "hooks": "checkpoint", "recipe": "delayed"})
    Cell(**{**base.serialize(), "hooks": "checkpoint", "recipe": "current"})


def test_ci_under_one_recipe_is_its_covering_design():
    cells = unflagged(select("ci", {"recipe": ["current"]}))
    assert {c.recipe for c in cells} == {"current"} and {c.module for c in cells} >= TENSOR
    domains = {**DEFAULTS, "recipe": ("current",), "module": tuple(m for m in DEFAULTS["module"] if m not in LAYER)}
    assert_pairwise(cells, domains)
    both = select("ci", {"recipe": ["none", "current"]})
    assert {c for c in unflagged(select("ci")) if c.recipe == "none"} <= set(both)
    assert {c.recipe for c in both} == {"none", "current"}


# --- the first_mb axis (is_first_microbatch) ------------------------------------------------


def test_first_microbatch_cells():
    """``ci`` adds one all-pairs design of the cells that pass ``is_first_microbatch``
    (``first_mb``): every other axis's values meet under the flag, on the modules whose forward
    takes it, with two microbatches, under every recipe the oracle judges; each distributed
    weight of full coverage meets each module hooks-off with fused accumulation, and a plain
    weight each module fused into main_grad. The cells without the flag
    keep their ids; the flag is named in the id only when passed; smoke and seed pass none."""
    ci = select("ci")
    flagged = [c for c in ci if c.first_mb]
    assert 30 <= len(flagged) <= 120 and len(unflagged(ci)) == 1030
    assert {c.microbatches for c in flagged} == {2} and not any(CLASS[c.module] in ("ops", "TEGroupedMLP") for c in flagged)
    assert {c.recipe for c in flagged} == {"none", "delayed", "current", "mxfp8", "blockwise", "nvfp4"}
    mods = tuple(m for m in DEFAULTS["module"] if CLASS[m] not in ("ops", "TEGroupedMLP"))
    domains = {**DEFAULTS, "first_mb": (True,), "module": mods, "microbatches": (2,),
               "recipe": ("none", "current", "mxfp8", "blockwise")}
    for (a, b) in itertools.combinations(AXIS_NAMES, 2):
        if "recipe" in (a, b) and {"module", "dtype"} & {a, b}:
            continue  # a recipe meets only the modules that take one (the grouped-tensor paths take none)
        for va in domains[a]:
            for vb in domains[b]:
                if any(getattr(c, a) == va and getattr(c, b) == vb for c in flagged):
                    continue
                assert not matrix._feasible({a: va, b: vb}, domains), (a, va, b, vb)
    for m in mods:
        assert any(c.module == m and c.weight == "distributed" and c.hooks == "off" and c.fused for c in flagged), m
    for c in flagged:
        assert c.id.endswith("-fmb") and Cell.from_id(c.id) == c
        assert Cell.from_dict(json.loads(json.dumps(c.serialize()))) == c
    old = {k: v for k, v in flagged[0].serialize().items() if k != "first_mb"}  # a record before the axis
    assert Cell.from_dict(old) == dataclasses.replace(flagged[0], first_mb=False)
    for preset in ("smoke", "seed"):
        assert not any(c.first_mb for c in select(preset)), preset
    base = dict(module="linear", weight="plain", hooks="off", fused=True, dtype="bf16", world_size=1,
                consumer="ddp", microbatches=2, num_gemms=1, bias=True, input_grad=True, delay_wgrad=False)
    with pytest.raises(MatrixError, match="requires microbatches >= 2"):
        Cell(**{**base, "microbatches": 1, "first_mb": True})
    with pytest.raises(MatrixError, match="ops.GroupedLinear's .* do not"):
        Cell(**{**base, "module": "ops_grouped_linear", "first_mb": True})
    assert Cell(**{**base, "recipe": "delayed", "first_mb": True}).first_mb  # the cached weight is modelled
    assert any(c.recipe == "delayed" for c in flagged)
    for m in mods:  # where TE's first microbatch overwrites main_grad
        assert any(c.module == m and c.weight == "plain" and c.fused and c.consumer == "ddp" for c in flagged), m



# --- the enumeration and the feasibility search against brute force ------------------------


def _brute(domains):
    """Every valid cell of the product of ``domains``, straight from the definition: each
    combination in ``itertools.product`` order, an ungrouped module's num_gemms 1, ``Cell``'s
    own checks deciding."""
    out = {}
    for combo in itertools.product(*(domains[n] for n in AXIS_NAMES)):
        assign = dict(zip(AXIS_NAMES, combo))
        if not modules.KINDS[assign["module"]].grouped:
            assign["num_gemms"] = 1
        if not modules.KINDS[assign["module"]].layer:
            assign["layers"] = 1
        try:
            out.setdefault(Cell(**assign))
        except MatrixError:
            pass
    return list(out)


@st.composite
def _small_domains(draw):
    """Random sub-domains small enough to enumerate, every constrained value reachable."""
    return {n: tuple(draw(st.lists(st.sampled_from(DEFAULTS[n] if n != "weight" else weights.NAMES),
                                   min_size=1, max_size=3 if n in ("module", "weight", "recipe") else 2,
                                   unique=True)))
            for n in AXIS_NAMES}


@settings(max_examples=60, deadline=None)
@given(_small_domains(), st.randoms(use_true_random=False))
def test_enumeration_and_feasibility_match_brute_force(domains, rnd):
    """The pruned enumeration behind ``full`` yields exactly the valid cells in product order,
    and ``_feasible`` (arc consistency, then a search) answers a partial assignment exactly as
    "some valid cell agrees with it" - including values no cell can take and a constrained
    axis's value outside its domain (num_gemms=1 for an ungrouped module among them; the
    callers check the unconstrained axes' values against their domains themselves)."""
    cells = _brute(domains)
    assert list(matrix._valid(domains)) == cells  # a stream of them, in product order
    constrained = {a for axes, _ in matrix._COMPONENTS for a in axes}
    for _ in range(40):
        names = rnd.sample(AXIS_NAMES, rnd.randint(1, 4))
        assign = {n: rnd.choice(DEFAULTS[n] if n != "weight" else weights.NAMES)
                  if n in constrained and rnd.random() < 0.3 else rnd.choice(domains[n]) for n in names}
        expect = any(all(getattr(c, n) == v for n, v in assign.items()) for c in cells)
        assert matrix._feasible(assign, domains) == expect, assign


# --- the shape axis (shapes that span blocks) -----------------------------------------------

def test_ci_block_cells_span_two_blocks_of_every_operand():
    """``ci``'s ``blocks`` cells: for every block recipe and every module value the oracle
    judges it on, one cell per ``BLOCK_CELLS`` template, each of whose quantized operands spans
    at least two blocks along every blocked dimension (the rule of ``shape.spans``, counted here
    again from the recipe's block lengths); every recipe has such cells (a per-tensor recipe,
    with no blocked dimension, in every cell); the base cells are those of ``--shapes base``."""
    ci = select("ci")
    blocks = [c for c in ci if c.shape == "blocks"]
    want = {(r, m, t) for r in recipes.BLOCKED for m in recipes.MODELLED[r] for t, tmpl in enumerate(matrix.BLOCK_CELLS)
            if tmpl["dtype"] in modules.KINDS[m].dtypes}  # the grouped-tensor paths have no fp32
    got = set()
    for c in blocks:
        t = next(i for i, tmpl in enumerate(matrix.BLOCK_CELLS)
                 if all((v(DEFAULTS[k]) if callable(v) else v) == getattr(c, k) for k, v in tmpl.items()))
        got.add((c.recipe, c.module, t))
        e = shape.fitted(shape.Example(), c.module, c.bias, c.recipe, c.num_gemms, c.shape)
        kind = recipes.KINDS[c.recipe]
        rows = shape.smallest_group_rows(e, c.recipe, c.num_gemms, c.shape, c.module)
        for dim in (e.in_features, e.out_features, rows):  # every blocked dimension, 1-D blocks
            assert dim >= 2 * kind.block_length and dim % kind.align == 0, (c.id, dim)
        assert not kind.weight_tile or min(e.in_features, e.out_features) >= 2 * kind.weight_tile, c.id
        assert shape.spans(c.recipe, e.in_features, e.out_features, rows), c.id
        # a ragged edge where TE pads: not a whole number of 4 blocks (scale columns) or 128 rows
        assert e.in_features % (4 * kind.block_length) and e.in_features % 128, c.id
    assert got == want and len(blocks) == len(want)
    for r in recipes.QUANTIZED:
        mine = [c for c in ci if c.recipe == r]
        spanning = [c for c in mine if shape.spans(c.recipe, *(lambda e: (e.in_features, e.out_features,
                    shape.smallest_group_rows(e, c.recipe, c.num_gemms, c.shape, c.module)))(
                        shape.fitted(shape.Example(), c.module, c.bias, c.recipe, c.num_gemms, c.shape)))]
        assert spanning, r
        assert recipes.KINDS[r].blocked or len(spanning) == len(mine), r
    base = [c for c in ci if c.shape == "base"]
    assert matrix.ids_digest(base) == matrix.ids_digest(select("ci", {"shape": ("base",)}))


def test_blocks_shape_needs_a_block_recipe_and_round_trips():
    base = dict(module="linear", weight="distributed", hooks="off", fused=True, dtype="bf16", world_size=2,
                consumer="ddp", microbatches=2, num_gemms=1, bias=True, input_grad=True, delay_wgrad=False)
    for r in ("none", "delayed", "current"):
        with pytest.raises(MatrixError, match="requires a recipe that scales blocks"):
            Cell(**base, recipe=r, shape="blocks")
    c = Cell(**base, recipe="blockwise", shape="blocks")
    assert c.id.endswith("-rblockwise-sblocks") and Cell.from_id(c.id) == c
    assert Cell.from_dict({k: v for k, v in c.serialize().items() if k != "shape"}).shape == "base"
    assert not any(c.shape == "blocks" for p in ("full", "smoke") for c in select(p, {"module": ("linear",)}))
    assert {c.shape for c in select("ci", {"shape": ("blocks",), "module": ("linear",)})} == {"blocks"}


def test_packed_cells_are_the_cells_they_hold():
    """A sweep holds its selection as ``PackedCells`` (a byte per axis value): reading it back
    gives cells equal to those stored, in order, by index, slice and iteration; bool and int
    values of one axis stay apart (``True == 1`` in a dict)."""
    cells = select("ci") + select("full", {"module": ["linear"]}, sample=(300, 7))
    packed = matrix.PackedCells(cells)
    assert len(packed) == len(cells) and list(packed) == cells
    assert packed[0] == cells[0] and packed[-1] == cells[-1] and packed[10:20] == cells[10:20]
    assert all(type(getattr(a, n)) is type(getattr(b, n)) for a, b in zip(packed, cells) for n in AXIS_NAMES)
    with pytest.raises(IndexError):
        packed[len(cells)]
    assert list(matrix.PackedCells([])) == []
