"""dw-harness: verification of distributed-weight autograd (TE-style Linear/GroupedLinear + GTP).

The package root stays light (no torch import) so reports and the CLI's argument checks
start fast; torch-heavy pieces live in their own modules.
"""

from harness.records.record import CellResult, RunRecord, load

__all__ = ["CellResult", "RunRecord", "load"]
