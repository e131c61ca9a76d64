import pytest

pytest_plugins = [
    "harness.plugin",
    "fixtures.process_group",
    "fixtures.hook_modes",
]


def pytest_configure(config: pytest.Config) -> None:
    """Under ``-n``, every test of a module goes to one xdist worker (``--dist loadscope``)
    unless ``--dist`` is given: most modules judge a few sweeps made by a module fixture,
    and xdist's default spreads a module's tests over the workers, each running those
    sweeps again."""
    explicit = any(a == "--dist" or a.startswith("--dist=") for a in config.invocation_params.args)
    if getattr(config.option, "dist", "no") == "load" and not explicit:
        config.option.dist = "loadscope"
