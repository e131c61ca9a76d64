"""The vocabulary every world shares: pure data and rules, no torch, no process.

What a cell is and how cells are chosen (``matrix``, ``filters``, ``selection``, ``shard``,
``cost``), what each axis's values mean (``modules``, ``weights``, ``hook_modes``,
``recipes``, ``shape``), the launch protocol between the parent and torchrun's processes
(``plan``), what a backend is before anyone imports it (``backend_specs``), the status table
(``status``), the tolerance table (``tolerance``), the self-test's planted faults
(``fault_classes``, ``perturbation``) and known defects' models (``defects``), and every
torch-free error with its exit code (``errors``). The parent reads these without paying
torch's import; a rank reads the same definitions, so both sides agree by construction.
"""
