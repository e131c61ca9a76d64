"""The figures README.md and docs/ quote from a sweep (``<!--fig:sweep:RUN:WHAT-->``,
``fixtures/figures.py``'s ``RUNS``) agree with that sweep, judged on the run the suite already
makes of it - no sweep runs twice for the docs' sake. A drifted figure is named by file and
line; ``python -m fixtures.figures --write --run te-cpu-ci=RUN_DIR`` rewrites it.

The te-cpu ``ci`` sweep is ``fixtures/te_runs.py``'s, shared with the ledger's tests (it needs
``python -m harness install te``, which the README's test command runs)."""

from __future__ import annotations

from fixtures import figures
from fixtures.te_runs import SWEEPS, te_runs  # noqa: F401 (a fixture)
from harness.records import recordfile


def test_te_cpu_ci_figures_agree_with_the_sweep(te_runs):
    assert figures.RUNS["te-cpu-ci"] == ["--backend", "te-cpu", *SWEEPS["ci"]]  # what te_runs["ci"] runs
    run, _, _ = te_runs["ci"]
    stale = figures.check_run("te-cpu-ci", recordfile.read(run))
    assert not stale, "\n".join(stale)
