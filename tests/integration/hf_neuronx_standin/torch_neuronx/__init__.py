"""TEST STAND-IN, not TorchNeuron: an empty `torch_neuronx` package.

transformers picks the neuron device only when a `torch_neuronx` package can be found (5.24's
`is_torch_neuron_available`); the emulated device (neuron_emulated/) registers `torch.neuron` but ships no such package.
Only the Hugging Face Trainer tests put this folder on the path.
"""
