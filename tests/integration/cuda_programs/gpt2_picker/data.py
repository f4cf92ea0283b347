"""build-nanogpt's DataLoaderLite: each rank reads its own stride of one token stream."""
import torch


class DataLoaderLite:
    def __init__(self, B, T, process_rank, num_processes, vocab_size, seed=0):
        self.B, self.T = B, T
        self.process_rank, self.num_processes = process_rank, num_processes
        g = torch.Generator().manual_seed(seed)
        # a learnable stream: each token is the previous one plus a small step
        steps = torch.randint(1, 3, (8192,), generator=g)
        self.tokens = torch.cumsum(steps, 0) % vocab_size
        self.reset()

    def reset(self):
        self.current_position = self.B * self.T * self.process_rank

    def next_batch(self):
        B, T = self.B, self.T
        buf = self.tokens[self.current_position:self.current_position + B * T + 1]
        x, y = buf[:-1].view(B, T), buf[1:].view(B, T)
        self.current_position += B * T * self.num_processes
        if self.current_position + (B * T * self.num_processes + 1) > len(self.tokens):
            self.current_position = self.B * self.T * self.process_rank
        return x, y
