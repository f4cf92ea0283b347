"""neuron-migrate: move PyTorch/XLA and CUDA code to TorchNeuron (the native `neuron` device)."""


def _version() -> str:
    # the version lives in one place, pyproject.toml; releases are tagged v<version> (README: pre-commit)
    import os

    # a regular install keeps its metadata folder beside the package: its name has the version, and reading it
    # costs a directory listing, not importlib.metadata's import (most of `neuron-migrate --version`)
    site = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        for name in os.listdir(site):
            if name.startswith("neuron_migrate-") and name.endswith(".dist-info"):
                return name[len("neuron_migrate-"):-len(".dist-info")]
    except OSError:
        pass
    try:
        from importlib.metadata import PackageNotFoundError, version

        return version("neuron-migrate")
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "0+unknown"


def __getattr__(name: str):
    # lazy: importlib.metadata costs start-up time on every run, and most runs never print the version
    if name == "__version__":
        value = _version()
        globals()["__version__"] = value
        return value
    raise AttributeError(f"module 'neuron_migrate' has no attribute {name!r}")
