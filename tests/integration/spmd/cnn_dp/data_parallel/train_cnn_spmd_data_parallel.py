"""Data-parallel SPMD training of the small CNN, in the layout of pytorch/xla's
examples/data_parallel/train_resnet_spmd_data_parallel.py: the base class (train_cnn_base.py in the parent folder,
found through sys.path) builds the model and its optimizer; this subclass shards the input's batch dimension over
a ('data',) mesh of every device, one process driving them all on the global batch."""
import sys
import os
import time
example_folder = os.path.dirname(os.path.dirname(os.path.abspath(sys.argv[0])))
sys.path.append(example_folder)
from train_cnn_base import TrainCNNBase, fake_batch

import numpy as np

import torch
import torch_xla.distributed.xla_multiprocessing as xmp
import torch_xla.core.xla_model as xm
import torch_xla.distributed.spmd as xs
import torch_xla.distributed.parallel_loader as pl
import torch_xla.utils.utils as xu
from torch_xla import runtime as xr

# Enable the SPMD
xr.use_spmd()


class TrainCNNXLASpmdDDP(TrainCNNBase):

  def __init__(self):
    super().__init__()
    # Shard along batch dimension only
    num_devices = xr.global_runtime_device_count()
    device_ids = np.arange(num_devices)
    mesh_shape = (num_devices,)
    mesh = xs.Mesh(device_ids, mesh_shape, ('data',))
    # scale the batch size with num_devices since there will be only one
    # process that handles all runtime devices.
    self.batch_size *= num_devices

    train_loader = xu.SampleGenerator(
        data=fake_batch(self.batch_size, self.img_dim),
        sample_count=self.train_dataset_len // self.batch_size)
    self.train_device_loader = pl.MpDeviceLoader(
        train_loader,
        self.device,
        # Shard the input's batch dimension along the `data` axis, no sharding along other dimensions
        input_sharding=xs.ShardingSpec(mesh, ('data', None, None, None)))


if __name__ == '__main__':
  spmd_ddp = TrainCNNXLASpmdDDP()

  start_time = time.time()
  spmd_ddp.start_training()
  end_time = time.time()
  print(f"Finished training in {end_time - start_time:.3f}s")
