"""Logging helpers in the style of pytorch/examples' tensor_parallelism/log_utils.py, with its GPU-count check."""
import logging

import torch

logging.basicConfig(format="%(asctime)s %(message)s", level=logging.INFO)


def get_logger():
    return logging.getLogger(__name__)


def rank_log(rank, logger, msg):
    """Log on global rank 0 only."""
    if rank == 0:
        logger.info(f" {msg}")


def verify_min_gpu_count(min_gpus: int = 2) -> bool:
    """Whether there are at least `min_gpus` GPUs to run the distributed example on."""
    has_cuda = torch.cuda.is_available()
    gpu_count = torch.cuda.device_count()
    return has_cuda and gpu_count >= min_gpus
