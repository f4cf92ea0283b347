"""`neuron-migrate verify`: run the original torch_xla program (on XLA's CPU backend, in its own torch 2.9 +
torch-xla 2.9 environment) and the migrated program (natively, torch on CPU or the emulated `neuron` device)
step by step with the same seeds and the same random numbers, and compare losses, gradients and parameters.

Layer: above rewrite and probe (it rewrites a copy and uses the emulated device), below report. Importing this
package, or any module of it but `compare`, does not import torch.
"""
