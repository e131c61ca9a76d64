"""Selecting cells from command-line options: shared by the CLI commands and the external
launcher mode (which runs under a user's own torchrun, without the CLI)."""

from __future__ import annotations

import argparse
from typing import Any, Callable, Iterable

from harness.vocabulary import hook_modes, matrix, modules, recipes, weights
from harness.vocabulary import shard
from harness.vocabulary.errors import UsageError


#: the preset a selection starts from when ``--preset`` is not given
DEFAULT_PRESET = "ci"


def add_selection(parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    """``--preset``, one option per axis, ``--filter``, ``--cells``, ``--shard``: each with the
    default None, so ``given`` can tell what the command line set. Returns the group, where a
    command adds its own selection options."""
    g = parser.add_argument_group("selection")
    g.add_argument("--preset", help=f"cell preset: {', '.join(matrix.PRESETS)} (default: {DEFAULT_PRESET})")
    for opt, axis in matrix.AXIS_OPTIONS.items():
        g.add_argument(opt, dest=f"axis_{axis}", metavar="V[,V...]",
                       help=f"restrict axis {axis} to these values: {matrix.values_help(axis)}")
    g.add_argument("--filter", dest="filter_expr", metavar="EXPR", help='boolean expression over axes, e.g. '
                   '\'module == "linear" and world_size >= 2\'')
    g.add_argument("--cells", metavar="ID|TEXT[,...]",
                   help="only these cells of the selection: a whole cell id selects that cell, any "
                        "other text the cells whose id contains it (as pytest -k); the same as "
                        "--filter 'id == \"ID\" or \"TEXT\" in id'")
    g.add_argument("--sample", metavar="N[@SEED]",
                   help="only a deterministic sample of N cells of the selection (seed 0 unless @SEED): the "
                        "same cells on every machine; --resume and merge reproduce it from the run record")
    g.add_argument("--shard", metavar="K/N", help="only shard K of N: a deterministic, cost-balanced "
                   "part of the selection (join the N run folders with `merge`)")
    return g


def given(args: argparse.Namespace) -> list[str]:
    """The selection options the command line set (``--preset smoke``, ``--dtypes bf16``, ...),
    as their option strings: a resumed run takes its recorded selection, and says no to these."""
    named = {"preset": "--preset", "filter_expr": "--filter", "cells": "--cells", "shard": "--shard", "sample": "--sample",
             **{f"axis_{axis}": opt for opt, axis in matrix.AXIS_OPTIONS.items()}}
    return [opt for dest, opt in named.items() if getattr(args, dest, None) is not None]


def overrides(args: argparse.Namespace) -> dict[str, tuple]:
    """The axis values the command line sets (``--modules linear,grouped_linear`` ...)."""
    return overrides_from(lambda axis: getattr(args, f"axis_{axis}", None))


def overrides_from(option: Callable[[str], str | None]) -> dict[str, tuple]:
    """The axis values set, read per axis name by ``option`` (the CLI's namespace, pytest's
    options): one parser for both."""
    out = {}
    for axis in matrix.AXIS_NAMES:
        text = option(axis)
        if text is not None:
            out[axis] = matrix.parse_values(axis, text)
    return out


def with_cells(filter_expr: str | None, cells: str | None) -> str | None:
    """``--filter`` and ``--cells`` as one filter (what the run record stores, so ``--resume``
    and ``merge`` see the same selection)."""
    if not cells:
        return filter_expr
    terms = []
    for item in (t.strip() for t in cells.split(",")):
        if not item:
            raise UsageError(f"--cells {cells!r} has an empty item")
        try:
            matrix.Cell.from_id(item)
            terms.append(f"id == {item!r}")
        except matrix.MatrixError:
            terms.append(f"{item!r} in id")
    ids = " or ".join(terms)
    return f"({filter_expr}) and ({ids})" if filter_expr else ids


def select(args: argparse.Namespace) -> tuple[list[matrix.Cell], dict[str, Any]]:
    """The selected cells and the selection as the run record stores it.

    Raises:
        UsageError: the selection is empty, or needs a weight whose package is not installed.
        MatrixError: an unknown preset, axis value or a malformed filter.
    """
    ov = overrides(args)
    part = shard.Shard.parse(args.shard) if getattr(args, "shard", None) else None
    preset = args.preset or DEFAULT_PRESET
    args.filter_expr = with_cells(args.filter_expr, getattr(args, "cells", None))
    sel = {"preset": preset, "overrides": {k: list(v) for k, v in ov.items()}, "filter": args.filter_expr}
    if getattr(args, "sample", None):
        count, seed = matrix.parse_sample(args.sample)
        sel["sample"] = {"count": count, "seed": seed}
    cells = recorded(sel)
    if not cells:
        raise UsageError(f"the selection is empty: {matrix.why_empty(preset, ov, args.filter_expr)}")
    why = weights.unavailable({c.weight for c in cells})
    if why is not None:
        raise UsageError(why)
    return apply_shard(cells, sel, part)


def recorded(sel: dict[str, Any]) -> list[matrix.Cell]:
    """The cells of a selection as a run record stores it (preset, overrides, filter, the
    optional ``sample``, and what the backend could not run, ``left_out``), before any shard:
    what ``--resume`` and ``merge`` expand again."""
    cells = matrix.select(sel.get("preset", "ci"), {k: tuple(v) for k, v in sel.get("overrides", {}).items()},
                          sel.get("filter"))
    if sel.get("sample"):
        cells = matrix.sample(cells, sel["sample"]["count"], sel["sample"].get("seed", 0))
    missing = set((sel.get("left_out") or {}).get("requires", ()))
    return [c for c in cells if not requires(c) & missing] if missing else cells


#: what a cell may need beyond the harness, and how a user gets it
REQUIREMENTS: dict[str, tuple[str, str]] = {
    "te": ("TransformerEngine's own code as the backend",
           "--backend te-cpu after `python -m harness install te` (or TE on a GPU)"),
    "megatron": ("Megatron-Core 0.19.2", "`python -m harness install megatron`"),
}


def requires(cell: matrix.Cell) -> frozenset[str]:
    """What ``cell`` needs of its run (``REQUIREMENTS``), read off its axis values: an installer
    that is TE's or Megatron's own code (``hook_modes.HookMode``), Megatron's expert layer
    (``modules.ModuleKind.layer``: built by Megatron from TE's modules), Megatron's weight."""
    out = set()
    hook = hook_modes.KINDS[cell.hooks]
    if hook.needs_te:
        out.add("te")
    if hook.needs_megatron:
        out.add("megatron")
    if modules.KINDS[cell.module].layer:
        out |= {"te", "megatron"}
    if weights.KINDS[cell.weight].implementer == "megatron":
        out.add("megatron")
    return frozenset(out)


def missing(apis: Iterable[str] | None) -> set[str]:
    """What a run lacks of ``REQUIREMENTS``, given its backend's APIs (``BackendInfo.apis``;
    None: not known, nothing assumed missing): a backend that is not TE (it has no
    ``get_cpu_offload_context``: TE's and Megatron's installers and Megatron's expert layer run
    TE's own code), Megatron-Core not installed here."""
    out = set()
    if apis is not None and hook_modes.OFFLOAD_API not in apis:
        out.add("te")
    if weights.megatron_missing() is not None:
        out.add("megatron")
    return out


def _causes(cell: matrix.Cell, missing: set[str]) -> list[tuple[str, str]]:
    """The axis values of ``cell`` that need something ``missing``: ``(axis, value)``."""
    out = []
    hook = hook_modes.KINDS[cell.hooks]
    if (hook.needs_te and "te" in missing) or (hook.needs_megatron and "megatron" in missing):
        out.append(("hooks", cell.hooks))
    if modules.KINDS[cell.module].layer and missing & {"te", "megatron"}:
        out.append(("module", cell.module))
    if weights.KINDS[cell.weight].implementer == "megatron" and "megatron" in missing:
        out.append(("weight", cell.weight))
    return out


def leave_out(cells: list[matrix.Cell], sel: dict[str, Any], missing: set[str]) -> tuple[list[matrix.Cell], dict[str, Any]]:
    """The cells this run can run, when it lacks what ``missing`` names (``REQUIREMENTS``):
    a cell that needs it is left out of the run - never run, never counted as passed - and
    ``sel`` records which requirements were absent and how many cells of the selection that
    left out (its ``left_out``: ``recorded`` expands the same cells again, ``--resume`` and
    ``merge`` too). A value the user named (``--hooks te_offload`` with a backend that is not TE)
    is refused instead: asked for and unrunnable is bad input.

    Raises:
        UsageError: the user named a value this run cannot run, or nothing is left to run.
    """
    named = {axis: set(values) for axis, values in (sel.get("overrides") or {}).items()}
    out = [c for c in cells if not requires(c) & missing]
    if len(out) == len(cells):
        return cells, sel
    dropped = [c for c in cells if requires(c) & missing]
    causes = dict.fromkeys(cause for c in dropped for cause in _causes(c, missing))
    needs = [r for r in REQUIREMENTS if r in missing and any(r in requires(c) for c in dropped)]
    asked = [f"{axis} {value}" for axis, value in causes if value in named.get(axis, ())]
    if asked or not out:
        what = ", ".join(asked or [f"{axis} {value}" for axis, value in causes])
        raise UsageError(f"{what} need{'s' if len(asked or causes) == 1 else ''} "
                         + " and ".join(f"{REQUIREMENTS[r][0]}: {REQUIREMENTS[r][1]}" for r in needs))
    whole = recorded({**sel, "left_out": None}) if sel.get("shard") else cells
    left = [c for c in whole if requires(c) & set(needs)]
    sel = {**sel, "left_out": {"requires": needs, "cells": len(left),
                               "values": [f"{axis} {value}" for axis, value in causes]}}
    if sel.get("shard"):
        kept = [c for c in whole if not requires(c) & set(needs)]
        sel.update(cells_total=len(kept), cells_digest=matrix.ids_digest(kept))
    return out, sel


def left_out_line(sel: dict[str, Any]) -> str | None:
    """One line saying what a run left out and how to run it (None: nothing left out)."""
    left = sel.get("left_out")
    if not left:
        return None
    needs = " and ".join(f"{REQUIREMENTS[r][0]} ({REQUIREMENTS[r][1]})" for r in left["requires"] if r in REQUIREMENTS)
    return (f"left out {left['cells']} cell(s) of the selection, never run nor counted ({', '.join(left['values'])}): "
            f"they need {needs}")


def apply_shard(cells: list[matrix.Cell], sel: dict[str, Any],
                part: shard.Shard | None) -> tuple[list[matrix.Cell], dict[str, Any]]:
    """The shard's cells, and ``sel`` saying which shard of which selection (its size and the
    digest of its ids: ``merge`` refuses shards of different selections)."""
    if part is None:
        return cells, sel
    mine = shard.select(cells, part)
    if not mine:
        raise UsageError(f"shard {part} of {len(cells)} cell(s) is empty: choose fewer shards")
    return mine, {**sel, "shard": part.serialize(), "cells_total": len(cells),
                  "cells_digest": matrix.ids_digest(cells)}


def check_shardable(cells: list[matrix.Cell], out_features: int) -> None:
    """Every distributed cell's world size can shard ``out_features`` rows with its weight's
    padding (a weight that pads to 16·N may leave a rank with only padding: that is legal).

    Raises:
        UsageError: some world size would leave a rank with only padding rows where the
            weight does not allow it.
    """
    for weight, ws, recipe in sorted({(c.weight, c.world_size, c.recipe) for c in cells if c.distributed}):
        try:
            weights.shard_rows(out_features, ws, weights.pad_multiple(weight, recipe))
        except ValueError as exc:
            raise UsageError(f"weight {weight}: {exc}; choose smaller world sizes") from exc


def check_recipes(cells: list[matrix.Cell]) -> None:
    """Every cell's recipe is one the oracle models on its module (``recipes.MODELLED``): a
    cell it could not judge is refused before any launch, not run and called a harness error.

    Raises:
        UsageError: naming the recipe/module pairs not modelled yet.
    """
    missing = recipes.unmodelled((c.recipe, c.module) for c in cells)
    if missing:
        by_modules: dict[tuple[str, ...], list[str]] = {}
        for r, m in recipes.MODELLED.items():
            if r != "none":
                by_modules.setdefault(tuple(m), []).append(r)
        modelled = "; ".join(f"{', '.join(rs)} on {', '.join(m)}" for m, rs in by_modules.items())
        raise UsageError(f"the oracle does not model {', '.join(missing)} yet (it models {modelled}): "
                         f"select other --recipes or --modules")
