# train a tiny character-level GPT on the synthetic token stream
# good for debugging and playing on macbooks and such

out_dir = 'out-small'
eval_interval = 5  # keep frequent because we'll overfit
log_interval = 5

batch_size = 8
block_size = 16  # context of up to 16 previous characters
max_iters = 20
learning_rate = 3e-3  # with baby networks can afford to go a bit higher

# on macbook also add
device = 'cuda'  # run on cpu only
backend = 'nccl'
dtype = 'bfloat16'
compile = True  # do not torch compile the model
