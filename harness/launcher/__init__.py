"""The launcher: what the parent process does to run cells under torchrun.

It packs a selection's cells onto sub-groups of ranks (``packing``, by the cost model of
``cost``; ``shard`` cuts a selection the same way), writes each launch's plan (``plan``),
starts torchrun with its rendezvous on loopback (``loopback``; the first launch's agent is the
backend probe's warm process, ``warm``), follows the ranks' reports and the result stream, and
says why a launch ended (``forensics``); ``batches`` is the same for the pytest plugin. It
imports nothing of ``harness.cell``: what runs inside a rank is the worker's business.
"""
