"""The backends this repository ships (rank world: only ranks and the probe import them).

``reference`` (the hook-safe layers in pure PyTorch, TE's public names; ``reference.prefix``
its pre-fix behaviour, ``reference.mutants`` the self-test's planted faults) and ``te_cpu``
(TE's own code on CPU: ``te_cpu.backend``, ``te_cpu.tf32``). A backend is found by its spec
(``harness.vocabulary.backend_specs``) and imported by ``harness.rank.loading``.
"""
