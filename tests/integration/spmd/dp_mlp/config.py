"""Training settings of the data-parallel SPMD program (one place, as the launcher and the script both read them)."""
GLOBAL_BATCH = 8  # the batch the whole mesh trains on per step (sharded over the "data" axis)
STEPS = 6
LR = 0.05
SEED = 1
