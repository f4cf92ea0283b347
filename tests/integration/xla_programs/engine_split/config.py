# The run's settings, as a dataclass module of their own (the entry script reads them, the engine never does).
from dataclasses import dataclass


@dataclass
class Config:
    lr: float = 0.2
    batch_size: int = 16
    epochs: int = 2
    samples: int = 128
