"""Dispatcher messages about tensor kinds a dense-only device does not have, translated into one line."""
from __future__ import annotations

from neuron_migrate.probe.messages import device_cannot, translate

# the head of what torch 2.13 prints (the rest lists every dispatch key: about 5 kB)
SPARSE = ("Could not run 'aten::_sparse_coo_tensor_with_dims_and_tensors' with arguments from the 'Sparseneuron' "
          "backend. This could be because the operator doesn't exist for this backend, or was omitted during the "
          "selective/custom build process (if using custom build). If you are a Facebook employee using PyTorch on "
          "mobile, please visit https://fburl.com/ptmfixes for possible resolutions. "
          "'aten::_sparse_coo_tensor_with_dims_and_tensors' is only available for these backends: [Meta, SparseCPU, "
          "SparseMeta, BackendSelect, Python, ...].\n\nMeta: registered at ...")
NESTED = "Could not run 'aten::to_padded_tensor' with arguments from the 'NestedTensorneuron' backend. This could be"
CSR = "Could not run 'aten::mm' with arguments from the 'SparseCsrPrivateUse1' backend. This could be"


def test_sparse_and_nested_dispatcher_messages_become_one_line():
    line = translate(SPARSE)
    assert line == ("torch.sparse: unsupported on TorchNeuron: aten::_sparse_coo_tensor_with_dims_and_tensors has no "
                    "kernel for sparse tensors on the device (dispatch key Sparseneuron)")
    assert "\n" not in line and "Facebook" not in line
    assert device_cannot(NESTED) == ("aten::to_padded_tensor", "torch.nested", "NestedTensorneuron")
    assert device_cannot(CSR) == ("aten::mm", "torch.sparse", "SparseCsrPrivateUse1")
    assert device_cannot("only strided (dense) tensors exist on the device, got layout Sparse")[1] == "torch.sparse"


def test_other_errors_are_left_alone():
    # a CPU backend lacking a kernel is not a device limitation; nor is an ordinary error
    assert translate("Could not run 'aten::eq.Tensor' with arguments from the 'SparseCPU' backend. This") is None
    assert translate("Could not run 'aten::foo' with arguments from the 'neuron' backend.") is None
    assert translate("Expected all tensors to be on the same device, but found at least two devices") is None
    assert translate("shape '[2, 3]' is invalid for input of size 7") is None
