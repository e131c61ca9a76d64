pytest_plugins = ["harness.plugin"]
