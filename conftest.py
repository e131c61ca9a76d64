pytest_plugins = [
    "harness.plugin",
    "fixtures.process_group",
    "fixtures.hook_modes",
]
