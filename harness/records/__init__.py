"""The run record and what stores, streams and folds it: pure functions of JSON, no torch.

``record`` (the one document every report reads), ``recordfile`` (how it is stored),
``stream`` (the verdicts appended as they arrive, ``cells.jsonl``), ``fold`` (a cell's result
from its ranks'), ``runinfo`` (what a run ran on), ``runfolder`` (what a finished folder
keeps), ``provenance`` (what code a record judged). A report, a merge or a re-judging under
another ledger runs anywhere from the run folder alone.
"""
