"""neuron-migrate: move PyTorch/XLA and CUDA code to TorchNeuron (the native `neuron` device)."""


def _version() -> str:
    # the version lives in one place, pyproject.toml; releases are tagged v<version> (README: pre-commit)
    try:
        from importlib.metadata import PackageNotFoundError, version

        return version("neuron-migrate")
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "0+unknown"


__version__ = _version()
