"""The processes torchrun starts: the rank world's entry points.

``agent`` is torchrun itself, confined to loopback (its process forks the ranks); ``worker``
is one rank running every cell of a launch plan; ``external`` is the worker under a user's
own torchrun, whose rank 0 also writes the record; ``loading`` imports and describes a
backend (also as the parent's probe subprocess). What a cell does is ``harness.cell``; the
backends are ``harness.backends``. The parent never imports this package.
"""
