"""Data-parallel training: the base trainer's model wrapped in DDP, one process per device."""
import os
import sys

sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from trainer.base import TrainBase  # noqa: E402

import torch.distributed as dist  # noqa: E402
import torch.optim as optim  # noqa: E402
import torch_xla  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402


class TrainDDP(TrainBase):
    def __init__(self):
        dist.init_process_group("xla", init_method="xla://")
        super().__init__()
        self.model = DDP(self.model, broadcast_buffers=False, gradient_as_bucket_view=True)
        self.optimizer = optim.SGD(self.model.parameters(), lr=self.cfg.lr)


def _mp_fn(index):
    TrainDDP().start_training()


if __name__ == "__main__":
    torch_xla.launch(_mp_fn)
