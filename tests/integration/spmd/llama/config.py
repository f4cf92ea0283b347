"""The decoder's size and the training settings of the tensor-parallel SPMD program."""
WIDTH, HEADS, VOCAB, LAYERS = 64, 4, 128, 2
BATCH, SEQ, STEPS = 4, 16, 6
LR = 1e-2
SEED = 1
