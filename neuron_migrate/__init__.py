"""neuron-migrate: move PyTorch/XLA and CUDA code to TorchNeuron (the native `neuron` device)."""

__version__ = "0.1.0"
