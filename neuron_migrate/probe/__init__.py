"""`neuron-migrate probe`: execute the user's model under an aten-op recorder (in a child process) and
classify every op against the TorchNeuron compat table. See README.md in this folder.

Importing this package does not import torch.
"""
