"""The planted faults of docs/fault-classes.md die in-process, for the right reason; the reference lives.

Every mutant of ``harness.backends.reference.mutants`` runs the world-size-1 cells of the ``ci``
preset in this process. A mutant that can show at ws=1 must be *killed* (some cell's status
is neither pass nor xfail) and at least one killing check must be evidence of its own fault
(``Mutant.evidence``), not a side effect. The clean reference must pass every one of the
same cells (no false alarms).

The cells are those ``ci`` places at ws=1 plus the ``ci`` design computed for a one-process
world (``world_size`` domain ``(1,)``). The second set is needed because ``ci`` puts its
delayed-wgrad cells with a plain weight at the largest world size only (plus one unfused
ws=2 cell), so ``dw-fused-hook-skipped`` has no killing cell among the ws=1 cells of ``ci``.

``full-shape-dummy`` and ``unfused-finalize-dropped`` change nothing at ws=1 where a shard is
the whole weight; under Megatron's alignment (``gtp_pad16``, ``gtp_mcore``: rows padded to
16·N) a ws=1 shard is padded and they die there too. A test below proves they die at ws=1
exactly in the padded cells, and ``test_selftest_multirank`` proves they die at world size 2
under torchrun.
"""

from __future__ import annotations

import types

import pytest

from harness.vocabulary import matrix, modules, recipes, selection, weights
from harness.backends.reference import _core, _modules, mutants, ops
from harness.backends.reference import Linear as RefLinear
from harness.cell.runner import RankContext, run_cell
from harness.vocabulary.shape import Example, fitted

GOOD = ("pass", "xfail")


def _cells() -> list[matrix.Cell]:
    """The world-size-1 cells of ``ci`` the reference can run (those needing TE's or Megatron's
    code are left out, as a sweep on the reference leaves them out)."""
    ci_ws1 = [c for c in matrix.select("ci") if c.world_size == 1]
    single = matrix.select("ci", overrides={"world_size": (1,)})
    return [c for c in dict.fromkeys(ci_ws1 + single) if not selection.requires(c)]


CELLS = _cells()


def _run(backend, cells):
    return {c: run_cell(backend, c, RankContext()) for c in cells}


def test_reference_passes_every_in_process_cell():
    import harness.backends.reference as reference

    bad = {c.id: [(k.name, k.message) for k in r.comparisons if not k.ok][:3]
           for c, r in _run(reference, CELLS).items() if r.status not in GOOD}
    assert not bad, f"the clean reference fails {len(bad)} cells: {bad}"


@pytest.mark.parametrize("name", [n for n, m in mutants.MUTANTS.items() if m.min_world_size == 1])
def test_mutant_killed_about_its_fault(name):
    m = mutants.MUTANTS[name]
    # Cells of modules the mutant leaves alone run the reference's own classes (checked
    # below), so only the others can die; the first kill with evidence settles it.
    killed = []
    for cell in (c for c in CELLS if m.applies(c.module, c.recipe, c.first_mb)):
        result = run_cell(m.backend, cell, RankContext())
        if result.status in GOOD:
            continue
        if mutants.evidence_found(m, result.comparisons):
            return
        killed.append((cell, result))
    assert killed, f"{name} survived all {len(CELLS)} in-process cells"
    pytest.fail(f"{name} was killed, but by no check about its fault ({m.evidence}): "
                + "; ".join(f"{c.id}: {[k.name for k in r.comparisons if not k.ok]}"
                            for c, r in killed[:3]))


def test_shape_faults_die_at_ws1_exactly_where_the_shard_is_padded():
    """The faults that hand autograd a full-shape gradient die at ws=1 exactly in the cells
    whose weight pads its rows (a ws=1 shard is then not the whole weight) - and, for the local wgrad
    handed to autograd, where finalize is asynchronous (nothing has marked the weight yet, so
    the DDP hook adds it to main_grad) - and survive the others."""
    for name in ("full-shape-dummy", "unfused-finalize-dropped"):
        m = mutants.MUTANTS[name]
        results = _run(m.backend, [c for c in CELLS if m.applies(c.module, c.recipe, c.first_mb)])
        died = {c.id for c, r in results.items() if r.status not in GOOD}
        kinds = {c.id: weights.KINDS[c.weight] for c in results}

        def padded(c: matrix.Cell) -> bool:
            """The ws=1 shard holds padding rows (under a recipe every feature count is a
            multiple of 16 already: Megatron's alignment pads nothing there)."""
            rows = fitted(Example(), c.module, c.bias, c.recipe, c.num_gemms).out_features
            return weights.shard_rows(rows, 1, kinds[c.id].pad_multiple)[0] != rows

        if name == "full-shape-dummy":
            want = {c.id for c in results if c.fused and c.expect == "pass"
                    and c.distributed and padded(c)}
        else:
            want = {c.id for c in results if not c.fused and c.expect == "pass" and c.distributed
                    and (padded(c) or kinds[c.id].chained)}
        assert died == want and died, (name, sorted(died ^ want)[:4])


def test_catalog_matches_bugs_md():
    """docs/fault-classes.md's ten classes in order, then the four only a Megatron-like implementer exposes,
    then the one only an exact check catches, four subtle numeric faults, the four of
    GroupedLinear's grouped-tensor path and LayerNormLinear's normalization, the five of
    the FP8 path (cells under a recipe only), the one of MXFP8, the one of NVFP4, the two of the
    blocks (cells whose operands span several blocks only) and the two of
    ``is_first_microbatch`` (flagged cells only)."""
    assert list(mutants.MUTANTS) == [
        "hooks-strip-subclass", "wgrad-compute-dtype", "shared-grad-buffer", "full-shape-dummy",
        "unfused-finalize-dropped", "ops-double-add", "dgrad-forward-copy",
        "per-member-materialize", "dw-fused-hook-skipped", "delay-with-dw-accepted",
        "wgrads-reused-after-finalize", "main-grad-read-after-finalize", "materialized-copy-kept",
        "requires-grad-from-copies", "main-grad-rebound", "wgrad-rounded-through-bf16",
        "main-grad-accumulated-in-bf16", "dgrad-with-bf16-weight", "tf32-declared-ieee",
        "grouped-tensor-path-no-dw", "norm-dgamma-dropped", "norm-dbeta-on-gamma",
        "norm-zero-centered-ignored-in-backward", "fp8-per-shard-amax", "fp8-stale-weight-workspace",
        "fp8-e4m3-gradient", "fp8-dgrad-weight-unquantized", "fp8-dgrad-weight-requantized",
        "mxfp8-scale-rounded-down", "nvfp4-shard-tensor-scale", "block-amax-from-neighbour",
        "block-tile-boundary-off-by-one", "first-microbatch-ignored",
        "first-microbatch-overwrites-distributed",
    ]
    for m in mutants.MUTANTS.values():
        assert m.description and "\n" not in m.description
        assert m.evidence and all(e.split(":", 1)[0] in ("check", "text") for e in m.evidence)
        assert set(m.modules) <= set(modules.NAMES)
        assert m.recipes is None or (m.name.startswith(("fp8-", "mxfp8-", "nvfp4-", "block-"))
                                     and set(m.recipes) <= set(recipes.QUANTIZED))
        assert m.first_mb == m.name.startswith("first-microbatch-")
        for attr in ("Linear", "GroupedLinear", "LayerNormLinear"):
            assert isinstance(getattr(m.backend, attr), type)
        assert isinstance(m.backend.ops.GroupedLinear, type)


def _classes(backend) -> dict[str, type]:
    """Each module value's class in ``backend`` (values of one TE class share it)."""
    by_api = {"Linear": backend.Linear, "GroupedLinear": backend.GroupedLinear,
              "ops.GroupedLinear": backend.ops.GroupedLinear, "LayerNormLinear": backend.LayerNormLinear}
    return {name: by_api[kind.api] for name, kind in modules.KINDS.items()}


def test_untouched_modules_are_the_reference_classes():
    import harness.backends.reference as reference

    ref = _classes(reference)
    for m in mutants.MUTANTS.values():
        got = _classes(m.backend)
        for module, cls in got.items():
            # one class serves every module value of its TE class: it deviates when any does
            api = modules.KINDS[module].api
            deviates = any(modules.KINDS[x].api == api for x in m.modules)
            if deviates:
                assert cls is not ref[module] and issubclass(cls, ref[module]), (m.name, module)
                assert type(cls._impl) is not type(ref[module]._impl), (m.name, module)
            else:
                assert cls is ref[module], (m.name, module)


def test_reference_carries_no_mutant_code():
    assert type(RefLinear._impl) is _core.ReferenceImpl
    assert type(ops.GroupedLinear._impl) is ops.OpsImpl


def test_get_and_loader():
    from harness.vocabulary.backend_specs import BackendError
    from harness.rank.loading import load_backend

    assert mutants.get("shared-grad-buffer") is mutants.MUTANTS["shared-grad-buffer"].backend
    assert load_backend("harness.backends.reference.mutants:ops-double-add") is mutants.get("ops-double-add")
    assert getattr(mutants, "dgrad-forward-copy") is mutants.get("dgrad-forward-copy")
    assert isinstance(mutants.get("per-member-materialize"), types.ModuleType)
    with pytest.raises(ValueError, match="hooks-strip-subclass.*delay-with-dw-accepted"):
        mutants.get("no-such-mutant")
    with pytest.raises(BackendError, match="no-such-mutant"):
        load_backend("harness.backends.reference.mutants:no-such-mutant")
    with pytest.raises(AttributeError):
        getattr(mutants, "no-such-mutant")


def test_evidence_found_reads_checks_and_dicts():
    m = mutants.MUTANTS["per-member-materialize"]
    checks = [{"name": "followers.materialize_forward_calls", "ok": False, "message": "expected 0, got 3"},
              {"name": "followers.finalize_calls", "ok": True},
              {"name": "mb0.output", "ok": False, "message": "not close"}]
    assert mutants.evidence_found(m, checks) == ["followers.materialize_forward_calls: expected 0, got 3"]
    m = mutants.MUTANTS["hooks-strip-subclass"]
    checks = [{"name": "exception", "ok": False,
               "message": "AssertionError: weight was removed while fuse_wgrad_accumulation=True"}]
    assert len(mutants.evidence_found(m, checks)) == 1


def test_a_generic_torch_error_is_evidence_only_beside_a_check_about_the_fault():
    """"shapes cannot be multiplied" is what any shape bug raises: alone it kills nothing;
    beside the fault's own check (here the backward-materialize count) it is kept."""
    m = mutants.MUTANTS["hooks-strip-subclass"]
    shape_error = {"name": "exception", "ok": False,
                   "message": "RuntimeError: mat1 and mat2 shapes cannot be multiplied (4x24 and 12x30)"}
    assert mutants.evidence_found(m, [shape_error]) == []
    count = {"name": "leader.materialize_backward_calls", "ok": False, "message": "expected 2, got 0"}
    assert len(mutants.evidence_found(m, [shape_error, count])) == 2


def test_full_shape_dummy_is_killed_by_the_autograd_shape_check():
    """The fused dummy of the full shape: autograd's validation raises, and the runner turns
    its message into the named check ``autograd_grad_shape`` (got vs the shard's shape)."""
    m = mutants.MUTANTS["full-shape-dummy"]
    cell = matrix.Cell.from_id("linear-gtp_pad16-hooks_off-fused-bf16-ws1-ddp-mb1-g1-bias-igrad-nodelay")
    result = run_cell(m.backend, cell, RankContext())
    shape = [c for c in result.comparisons if c.name == "autograd_grad_shape"]
    assert result.status == "error" and len(shape) == 1 and not shape[0].ok
    assert shape[0].actual != shape[0].expected and shape[0].expected[0] % 16 == 0
    found = mutants.evidence_found(m, result.comparisons)
    assert found and found[0].startswith("autograd_grad_shape:")


def test_fp8_scales_are_checked_exactly_after_the_step():
    """Delayed scaling: the scales the module keeps after the step are the recipe's update of
    the whole weight's and every rank's amaxes. A backward that quantizes the re-gathered
    (backward, x4) copy with the layer's quantizer records that copy's amax, which the second
    microbatch's update takes: the check fails there, and passes on the reference."""
    cell = matrix.Cell.from_id("linear-gtp_tagged-hooks_off-fused-bf16-ws1-ddp-mb2-g1-bias-igrad-nodelay-rdelayed")
    import harness.backends.reference as reference

    def scales(backend):
        return next(c for c in run_cell(backend, cell, RankContext()).comparisons if c.name == "fp8_scales")

    clean = scales(reference)
    assert clean.ok and set(clean.actual) == {"input", "weight", "grad_output"}
    bad = scales(mutants.MUTANTS["fp8-dgrad-weight-requantized"].backend)
    assert not bad.ok and bad.actual["weight"] != bad.expected["weight"], bad.message
    assert bad.actual["input"] == bad.expected["input"]


@pytest.mark.parametrize("name", ["block-amax-from-neighbour", "block-tile-boundary-off-by-one"])
def test_block_faults_die_only_where_operands_span_blocks(name):
    """The faults of block indexing and tile boundaries change nothing in an operand of one
    block: under FP8 block scaling they survive every base-shape cell the reference runs hooks
    off (one 1x128 block per row, one 128x128 tile: ci's shapes before the ``shape`` axis), and
    die by evidence in every block-spanning cell (``shape`` ``blocks``: two blocks and a ragged
    third along every blocked dimension, inputs with a block magnitude profile)."""
    m = mutants.MUTANTS[name]
    mine = [c for c in CELLS if c.recipe == "blockwise" and m.applies(c.module, c.recipe, c.first_mb)]
    spanning = [c for c in mine if c.shape == "blocks"]
    base = [c for c in mine if c.shape == "base" and c.hooks == "off"]
    assert spanning and base
    survived = [c.id for c in spanning
                if not mutants.evidence_found(m, run_cell(m.backend, c, RankContext()).comparisons)]
    assert not survived, f"{name} survived block-spanning cells: {survived}"
    killed = [c.id for c in base if run_cell(m.backend, c, RankContext()).status not in GOOD]
    assert not killed, f"{name} killed base-shape cells (one block each): {killed}"
