"""A small learnable classification set (token ids; the label is whether the first token is large)."""
import torch


class TokenSet(torch.utils.data.Dataset):
    def __init__(self, n=64, length=12, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randint(5, 60, (n, length), generator=g)
        self.y = (self.x[:, 0] > 30).long()

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"input_ids": self.x[i], "labels": self.y[i]}
