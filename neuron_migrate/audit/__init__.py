"""`neuron-migrate audit`: report what will not run well on TorchNeuron, without running the code."""
