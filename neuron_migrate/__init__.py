"""neuron-migrate: move PyTorch/XLA and CUDA code to TorchNeuron (the native `neuron` device)."""


def _version() -> str:
    # the version lives in one place, pyproject.toml; releases are tagged v<version> (README: pre-commit)
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
