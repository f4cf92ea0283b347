"""An ImageNet-style trainer: argparse backend, entry and worker functions, DDP under torchrun."""
import argparse
import os

import torch
import torch.backends.cudnn as cudnn
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from models import TinyResNet
from utils import AverageMeter, accuracy, synthetic_images

parser = argparse.ArgumentParser(description="PyTorch ImageNet-style Training")
parser.add_argument("--epochs", default=4, type=int)
parser.add_argument("-b", "--batch-size", default=32, type=int)
parser.add_argument("--lr", default=0.05, type=float)
parser.add_argument("--dist-url", default="env://", type=str, help="url used to set up distributed training")
parser.add_argument("--dist-backend", default="nccl", type=str, help="distributed backend")
parser.add_argument("--seed", default=0, type=int)


def main():
    args = parser.parse_args()
    if torch.cuda.is_available():
        print("GPU:", torch.cuda.get_device_name(0))
        print("CUDA", torch.version.cuda, "cuDNN", torch.backends.cudnn.version())
    args.world_size = int(os.environ.get("WORLD_SIZE", 1))
    args.distributed = args.world_size > 1 or "RANK" in os.environ
    ngpus_per_node = torch.cuda.device_count()
    print(f"{ngpus_per_node} devices per node")
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    main_worker(local_rank, args)


def main_worker(local_rank, args):
    if args.distributed:
        if args.dist_backend == "nccl":
            assert dist.is_nccl_available(), "NCCL is not available"
        dist.init_process_group(backend=args.dist_backend, init_method=args.dist_url)
        rank = dist.get_rank()
    else:
        rank = 0

    if torch.cuda.is_available():
        device = torch.device(f"cuda:{local_rank}")
        torch.cuda.set_device(device)
    elif torch.backends.mps.is_available():
        device = torch.device("mps")
    else:
        device = torch.device("cpu")
    cudnn.benchmark = True

    torch.manual_seed(args.seed)
    model = TinyResNet().to(device)
    if args.distributed:
        model = DistributedDataParallel(model, device_ids=[local_rank] if device.type == "cuda" else None)
    criterion = nn.CrossEntropyLoss().to(device)
    optimizer = torch.optim.SGD(model.parameters(), args.lr, momentum=0.9)

    dataset = synthetic_images(512, seed=1)
    sampler = DistributedSampler(dataset, seed=args.seed) if args.distributed else None
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=sampler is None, sampler=sampler,
                        pin_memory=args.dist_backend == "nccl")

    step = 0
    for epoch in range(args.epochs):
        if sampler is not None:
            sampler.set_epoch(epoch)
        losses = AverageMeter("Loss")
        for images, target in loader:
            images = images.to(device, non_blocking=True)
            target = target.to(device, non_blocking=True)
            output = model(images)
            loss = criterion(output, target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.update(loss.item(), images.size(0))
            step += 1
        print(f"rank {rank} epoch {epoch} loss {losses.avg:.4f} acc {accuracy(output, target):.1f}")

    checksum = sum(float(p.detach().sum().item()) for p in model.parameters())
    world = dist.get_world_size() if args.distributed else 1
    print(f"rank {rank} world {world} device {device.type} steps {step} checksum {checksum:.6f}")
    if args.distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
