"""Judging a record: known-defects ledgers (``ledger``, ``ledgers/*.toml``), a TE change's
review entry by entry (``review``), the one exit-code rule (``gate``) and the record builder
that judges verdicts into a record under the ledger (``assemble``). Pure functions of the
record, no torch: a verdict can be re-judged from a run folder anywhere.
"""
