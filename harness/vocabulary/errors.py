"""Exit codes and the errors that map to them, in one place (torch-free: every world imports it).

A command's outcome is one of the exit codes below. Every exception the parent, the records'
readers and the launch protocol raise for bad input or a failed launch is defined here, with
the exit code a command maps it to; the rank's own faults (whose fault a failure inside a
cell is: the backend's or the harness's) are ``harness.cell.faults``.

| exception | raised for | exit |
|---|---|---|
| ``UsageError`` | bad input a command detects | 2 |
| ``MatrixError`` | an unknown axis, value, preset, id or filter | 2 |
| ``FilterError`` | a malformed ``--filter`` (``MatrixError`` carries it to the CLI) | 2 |
| ``BackendError`` | a backend that cannot be used (spec, import, missing names) | 2 |
| ``LedgerError`` | a malformed or unreadable ledger | 2 |
| ``ReviewError`` | a review that cannot be made (``--fixes`` naming no entry) | 2 |
| ``TreeError`` | a folder that is not a TE source tree | 2 |
| ``InstallError`` | an optional component that could not be installed | 2 |
| ``LoopbackError`` | a launch that cannot be confined to loopback (the agent) | 2 |
| ``NoEvidence`` | an upstream report with no failing cell to show | 2 |
| ``LaunchFailure`` | a launch that failed before any verdict (the harness's) | 3 |
| ``NoVerdict`` | a pytest item whose cell never got a verdict | 3 |
"""

from __future__ import annotations

from typing import Any


OK = 0            #: every cell met its expectation
MISMATCH = 1      #: some cell failed, errored or timed out (or a diff found new failures)
BAD_INPUT = 2     #: the request was invalid; nothing was launched
HARNESS_BUG = 3   #: the harness itself failed
INTERRUPTED = 130 #: Ctrl-C / CI cancel; what was written stays valid and says "incomplete"


class UsageError(ValueError):
    """Bad input detected by a command (exit 2)."""


class MatrixError(ValueError):
    """Bad input to the matrix: an unknown axis, value, preset, id or filter."""


class FilterError(ValueError):
    """A filter that is malformed, uses syntax outside the subset, or names what is not an axis."""


class BackendError(ValueError):
    """The backend cannot be used (bad spec, import failure, missing names)."""


class LedgerError(ValueError):
    """A ledger file that cannot be used: unreadable, malformed, or an entry that is wrong."""


class ReviewError(ValueError):
    """``--fixes`` names something the ledger does not have."""


class TreeError(ValueError):
    """The folder is not a usable TE tree (one line, says what was expected)."""


class InstallError(RuntimeError):
    """A component could not be installed; the message is one line for the user."""


class LaunchFailure(RuntimeError):
    """Launches that ended before any cell started, twice in a row: nothing can run.

    Not a verdict on any cell (none ran); the run ends with exit 3 and this message, which
    names the first failing rank's error.
    """

    def __init__(self, message: str, launches: list[Any]) -> None:
        """``launches``: the ``harness.records.record.LaunchRecord`` of each failed launch."""
        super().__init__(message)
        self.launches = launches


class NoVerdict(RuntimeError):
    """A cell's batch finished without a verdict for it (its launches could not start)."""


class LoopbackError(RuntimeError):
    """The launch cannot be confined to loopback; nothing was started."""


class NoEvidence(ValueError):
    """The run holds no cell in which the entry reproduces."""


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
    "ledger": "0 done (check: the ledger is valid); 2 a malformed or empty ledger, an unknown entry or an "
              "unreadable record",
    "install": "0 every component ready; 1 (--check) a component is missing; 2 a component could not be "
               "installed (the line says what it needs)",
    "patch-te": "0 every hunk applied; 1 some did not (named, .rej files left); 2 bad input, nothing written",
}
