"""Ship the top-level rules/ and compat_table/ data inside the wheel as neuron_migrate._data.*.

The repo keeps rule and table data at the top level (easy to review); an installed copy (for example the
one pre-commit builds) finds them as package data instead.
"""
from setuptools import find_packages, setup

DATA_PACKAGES = {
    "neuron_migrate._data.rules": "rules",
    "neuron_migrate._data.compat_table": "compat_table",
}

setup(
    packages=find_packages(include=["neuron_migrate", "neuron_migrate.*"]) + list(DATA_PACKAGES),
    package_dir=DATA_PACKAGES,
    package_data={**{name: ["*.yaml", "*.yml", "*.md", "*.json"] for name in DATA_PACKAGES},
                  # the emulated neuron device's C++ source, compiled on first use
                  "neuron_migrate.probe.emulator": ["*.cpp"]},
    include_package_data=False,
)
