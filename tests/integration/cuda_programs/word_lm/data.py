import torch


class Corpus(object):
    """A synthetic corpus: a fixed cycle of 20 words with noise (the real one reads wikitext-2 from disk)."""

    def __init__(self, n=6000, seed=0):
        g = torch.Generator().manual_seed(seed)
        base = torch.arange(n) % 20
        noise = torch.randint(0, 20, (n,), generator=g)
        keep = torch.rand(n, generator=g) < 0.9
        self.train = torch.where(keep, base, noise)
        self.valid = (torch.arange(n // 5) + 3) % 20
        self.ntokens = 20
