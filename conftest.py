"""The repository's pytest configuration: flashprop's plugin (``flashprop/plugin.py``), unless an
installed flashprop already registered it through its ``pytest11`` entry point."""

from importlib.metadata import entry_points

pytest_plugins = [] if any(ep.name == "flashprop" for ep in entry_points(group="pytest11")) else [
    "flashprop.plugin"
]
