"""Exit codes, mapped in one place (the CLI, the CI gate and the docs use these)."""

OK = 0            #: every cell met its expectation
MISMATCH = 1      #: some cell failed, errored or timed out (or a diff found new failures)
BAD_INPUT = 2     #: the request was invalid; nothing was launched
HARNESS_BUG = 3   #: the harness itself failed
INTERRUPTED = 130 #: Ctrl-C / CI cancel; what was written stays valid and says "incomplete"


class UsageError(ValueError):
    """Bad input detected by a command (exit 2)."""
