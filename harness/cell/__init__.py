"""What runs inside a rank: one cell on one rank, and everything it is judged with.

The worker (``harness.rank.worker``) calls ``runner.run_cell`` for each cell of its lanes. The
runner builds the module, attaches the GTP weight (``gtp``, ``attach``, Megatron-Core's own
through ``megatron_gtp``), runs the step under the cell's saved-tensor hook mode (``hooks``)
with the consumer that owns the gradient of record (``consumer``), and judges every rank's
tensors against the float64 oracle (``oracle``, ``compare``; a known defect's prediction,
``predict``), the hooked cell against its twin (``twin``), a must-raise cell's exception
(``rejection``) and the path TE took (``te_path``). Only the worker, ``harness.rank.external`` and
the rank-side backends (``harness.backends.reference``, ``harness.backends.te_cpu.backend``) import this package; the
parent never does (``pyproject.toml``'s import contracts).
"""
