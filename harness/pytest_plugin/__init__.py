"""The pytest plugin (``plugin``, registered by the ``pytest11`` entry point ``dw_harness``)
and its batches (``batches``: each world size's cells in one launch, shared by xdist workers
through a file lock). Loading the plugin imports no torch and no backend.
"""
