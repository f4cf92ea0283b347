"""Run settings: defaults here, overridden from the command line."""
import argparse
from dataclasses import dataclass, fields


@dataclass
class TrainConfig:
    device: str = "auto"  # "auto", "cuda", "cuda:1", "mps", "cpu"
    dist_backend: str = "nccl"
    precision: str = "bf16"  # "bf16", "fp16" or "fp32"
    steps: int = 24
    batch_size: int = 32
    lr: float = 0.05
    seed: int = 0
    log_every: int = 4

    @classmethod
    def from_args(cls, argv=None):
        parser = argparse.ArgumentParser()
        for f in fields(cls):
            parser.add_argument(f"--{f.name.replace('_', '-')}", type=type(f.default), default=f.default)
        return cls(**vars(parser.parse_args(argv)))
