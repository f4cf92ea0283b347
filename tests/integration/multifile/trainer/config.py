"""Training configuration shared by the base trainer and the data-parallel script."""
from dataclasses import dataclass


@dataclass
class Config:
    features: int = 16
    classes: int = 4
    samples: int = 512
    batch_size: int = 16
    epochs: int = 3
    lr: float = 0.05
    seed: int = 1
