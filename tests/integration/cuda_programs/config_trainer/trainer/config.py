"""Configuration: a dataclass and the command line. The backend and the device are values that the trainer
(another module) passes to torch."""
import argparse
from dataclasses import dataclass


@dataclass
class TrainConfig:
    device: str = "cuda"
    backend: str = "nccl"
    lr: float = 0.05
    steps: int = 12
    batch_size: int = 16


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description="a CUDA trainer whose settings live in their own module")
    parser.add_argument("--dist-backend", default="nccl", type=str, help="distributed backend")
    parser.add_argument("--steps", default=12, type=int)
    return parser.parse_args(argv)
