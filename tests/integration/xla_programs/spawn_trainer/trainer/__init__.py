from .base import Trainer

__all__ = ["Trainer"]
