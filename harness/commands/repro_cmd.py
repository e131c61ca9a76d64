"""``repro CELL_ID``: run one cell under torchrun and print every check of every rank."""

from __future__ import annotations

import argparse

from harness.vocabulary import errors as exitcodes, matrix, selection
from harness.orchestration import preflight
from harness.judging import ledger as ledgers
from harness.commands import _options
from harness.vocabulary.shape import Example
from harness.launcher.launch import LaunchOptions, launch_cells
from harness.records.record import CellResult
from harness.judging.gate import statuses_exit_code
from harness.vocabulary.status import label
from harness.records.stream import ResultStream


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("repro", help="run one cell with full detail")
    p.add_argument("cell_id", metavar="CELL_ID", help="a cell id as printed by list/sweep")
    p.add_argument_group("selection").add_argument(
        "--example", metavar="KEY=VALUE[,...]",
        help="shape example as printed in a repro line, e.g. in_features=8,out_features=5,rows=3,salt=0")
    _options.add_backend(p)
    _options.add_run_control(p, prefix="repro")
    p.set_defaults(func=run)


def parse_example(text: str | None) -> dict | None:
    if not text:
        return None
    known = tuple(Example.__dataclass_fields__)
    try:
        pairs = dict(kv.split("=", 1) for kv in text.split(","))
    except ValueError as exc:
        raise exitcodes.UsageError(f"malformed --example {text!r}: expected KEY=VALUE[,KEY=VALUE...]") from exc
    unknown = sorted(set(pairs) - set(known))
    if unknown:
        raise exitcodes.UsageError(f"unknown key(s) {', '.join(map(repr, unknown))} in --example {text!r} "
                                   f"(known: {', '.join(known)})")
    try:
        return Example.from_dict(pairs).serialize()
    except (ValueError, TypeError) as exc:
        raise exitcodes.UsageError(f"malformed --example {text!r}: {exc}") from exc


def detail(res: CellResult) -> str:
    """Every check of every rank; a rank's error once (its exception check is that error), and
    each distinct traceback once, naming the ranks that raised it."""
    lines = [f"{res.id}: {label(res.status)} (expect {res.expect}, {res.duration_s:.3f}s)"]
    tracebacks: dict[str, list[int]] = {}
    for r in res.ranks:
        lines.append(f"  [rank {r.rank}] {label(r.status)}")
        for c in r.comparisons:
            if r.error and c.kind == "exception" and not c.ok and c.name == "exception":
                continue  # the rank's error, printed below
            mark = "ok  " if c.ok else "FAIL"
            if c.kind == "tensor":
                info = (f"max_abs={c.max_abs:.3g} max_rel={c.max_rel:.3g} ratio={c.ratio:.3g}"
                        if c.max_abs is not None else "")
            elif c.expected is None and c.actual is None:
                info = ""
            else:
                info = f"expected={c.expected!r} actual={c.actual!r}"
            lines.append(f"    {mark} {c.name:40} {info}".rstrip())
            if not c.ok and c.message:
                lines.extend("         " + m for m in c.message.splitlines())
        if r.choice:  # TE's own record of the path it took (harness.cell.te_path)
            flags = ", ".join(f"{k}={v!r}" for k, v in (r.choice.get("flags") or {}).items())
            lines.append(f"    path: TE took the {r.choice['path']} path ({r.choice.get('node')}: {flags})")
            if r.choice.get("reason"):
                lines.append(f"          {r.choice['reason']}")
        if r.path is not None:
            lines.append("    kernels: " + (", ".join(f"{k} x{n}" for k, n in sorted(r.path.items())) or "none"))
        if r.recipe:  # what TE was shown (harness.cell.lowp.describe)
            lines.append(f"    recipe: {r.recipe['recipe']} (TE's {r.recipe['te_class']}"
                         + (f", device {r.recipe['device']})" if r.recipe.get("device") else ")"))
        if r.hooks:  # what the installer's hooks saw (harness.cell.hooks.Packs)
            lines.append(f"    hooks: {r.hooks['mode']} by {r.hooks['installer']}'s installer, {r.hooks['packs']} packs, "
                         f"{r.hooks['weight_packs']} on a DistributedWeight")
        if r.error:
            lines.append(f"    raised {r.error['type']}: {r.error['message']}")
            tb = (r.error.get("traceback") or "").rstrip()
            if tb:
                tracebacks.setdefault(tb, []).append(r.rank)
    for tb, ranks in tracebacks.items():
        lines.append(f"traceback (rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}):")
        lines.extend("  " + t for t in tb.splitlines())
    lines.append(f"repro: {res.repro}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    cell = matrix.Cell.from_id(args.cell_id)
    example = parse_example(args.example)
    selection.check_recipes([cell])
    info, args.device = preflight.check_run(args.backend, args.device, [cell.world_size], [cell.module],
                                            keep_warm=True, selected_recipes=[cell.recipe],
                                            selected_weights=[cell.weight])
    ledger = _options.ledger_for(args.ledger, info)
    selection.check_shardable([cell], (example or Example().serialize())["out_features"])
    run_dir = _options.run_dir(args, prefix="repro").resolve()
    opts = LaunchOptions(backend=args.backend, run_dir=run_dir, cell_timeout=args.cell_timeout,
                         device=args.device, example=example)
    launch_cells(cell.world_size, [cell], opts)
    res = ResultStream(run_dir).latest(args.backend)[cell.id]
    res = ledgers.judge(res, ledger.entries if ledger else ())[0]
    print(detail(res))
    if res.known:
        refs = {e.id: e for e in ledger.entries}
        print("known defect: " + "; ".join(f"{i} ({refs[i].upstream}): {refs[i].title}" for i in res.known))
    print(f"rank logs: {run_dir / 'logs'}")
    return statuses_exit_code([res.status])
