"""The parent process: from a command's options to a judged record.

``preflight`` checks what can be checked before anything starts (the backend described by
``probe`` in a subprocess, never imported here), ``sweep`` runs a selection to a record
(resumable), ``merge`` joins shards, ``selftest`` and ``sensitivity`` plant faults and measure
what the checks catch. Launches go through ``harness.launcher``. Nothing here imports torch,
a backend or the rank world (``harness.rank``, ``harness.cell``, ``harness.backends``).
"""
