"""Run settings of the CNN examples (the per-device batch comes from the environment, so that 1 and 2 devices can
train on the same global batch)."""
import os

BATCH_SIZE = int(os.environ.get("BATCH_SIZE", "4"))  # per device
IMG_DIM = 16
NUM_STEPS = 6
LR = 0.05
SEED = 1
