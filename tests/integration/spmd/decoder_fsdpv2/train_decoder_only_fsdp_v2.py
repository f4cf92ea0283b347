"""FSDPv2 training of the decoder-only model, in the style of pytorch/xla's examples/fsdp/train_decoder_only_fsdp_v2.py:
one process drives every device; the mesh has an 'fsdp' axis; each DecoderLayer is wrapped by FSDPv2 through the
auto-wrap policy, then the model; the global batch (batch_size * num_devices) is sharded along 'fsdp' by the device
loader's input_sharding."""
import argparse
import functools

import numpy as np
import torch
import torch_xla.distributed.parallel_loader as pl
import torch_xla.distributed.spmd as xs
from torch_xla import runtime as xr
from torch_xla.distributed.fsdp.wrap import transformer_auto_wrap_policy
from torch_xla.experimental.spmd_fully_sharded_data_parallel import SpmdFullyShardedDataParallel as FSDPv2

import decoder_only_model
from train_decoder_only_base import TrainDecoderOnlyBase


class TrainDecoderOnlyFSDPv2(TrainDecoderOnlyBase):

    def __init__(self, batch_size):
        super().__init__(batch_size)
        # Define the mesh following common SPMD practice
        num_devices = xr.global_runtime_device_count()
        mesh_shape = (num_devices, 1)
        device_ids = np.array(range(num_devices))
        # The mesh must have an axis named 'fsdp', which the weights and activations are sharded on.
        self.mesh = xs.Mesh(device_ids, mesh_shape, ("fsdp", "model"))
        xs.set_global_mesh(self.mesh)

        # Shard the input (data parallel): one process handles every device, so the batch scales with them.
        self.batch_size *= num_devices
        train_loader = self.make_loader(self.batch_size)
        self.train_device_loader = pl.MpDeviceLoader(
            train_loader,
            self.device,
            # Shard the input's batch dimension along the `fsdp` axis, no sharding along other dimensions
            input_sharding=xs.ShardingSpec(self.mesh, ("fsdp", None)))

        # Apply FSDP sharding on each DecoderLayer layer.
        auto_wrap_policy = functools.partial(
            transformer_auto_wrap_policy,
            transformer_layer_cls={
                decoder_only_model.DecoderLayer
            },
        )
        # FSDPv2 will use the global mesh set above
        self.model = FSDPv2(
            self.model, auto_wrap_policy=auto_wrap_policy)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch_size", type=int, default=2, help="per device")
    args = parser.parse_args()
    # Enable the SPMD
    xr.use_spmd()
    base = TrainDecoderOnlyFSDPv2(args.batch_size)
    base.start_training()
