"""Exit codes, mapped in one place (the CLI, the CI gate and the docs use these)."""

OK = 0            #: every cell met its expectation
MISMATCH = 1      #: some cell failed, errored or timed out (or a diff found new failures)
BAD_INPUT = 2     #: the request was invalid; nothing was launched
HARNESS_BUG = 3   #: the harness itself failed
INTERRUPTED = 130 #: Ctrl-C / CI cancel; what was written stays valid and says "incomplete"


class UsageError(ValueError):
    """Bad input detected by a command (exit 2)."""


#: what each command's exit codes mean, for its ``--help`` (docs/cli.md has the same table)
COMMAND_EXITS: dict[str, str] = {
    "sweep": "0 every cell met its expectation (pass, expected error met, known defect); 1 a cell "
             "missed it, a ledger entry is stale, or (--fixes) a required entry is not fixed; "
             "2 bad input, nothing launched (an empty selection included; pytest says 5 there); "
             "3 the harness itself failed; 130 interrupted (continue with sweep --resume RUN_DIR)",
    "merge": "as sweep, over the joined shards; 2 also when a shard is missing or the folders are "
             "not shards of one sweep",
    "repro": "0 the cell met its expectation; 1 it did not; 2 bad input; 3 the harness failed; 130 interrupted",
    "selftest": "0 every mutant killed by evidence of its fault, no false alarm; 1 otherwise; 2 bad "
                "input; 3 the harness failed on a clean cell; 130 interrupted",
    "diff": "0 the new run is no worse; 1 a cell newly misses its expectation, the new run is incomplete, "
            "or coverage was lost (a cell newly skipped or missing); 2 a record cannot be read",
    "report": "0 rendered; (--margins) 1 a worst error/bound ratio is above 1; 2 the record cannot be read",
    "list": "0 listed; 2 bad input (an unknown preset, axis value or filter)",
    "ledger": "0 done (check: the ledger is valid); 2 a malformed ledger, an unknown entry or an unreadable record",
    "install": "0 every component ready; 1 (--check) a component is missing; 2 a component could not be "
               "installed (the line says what it needs)",
    "patch-te": "0 every hunk applied; 1 some did not (named, .rej files left); 2 bad input, nothing written",
}
