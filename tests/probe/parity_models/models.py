"""Small models whose parity answer is known, for `probe --compare/--emulate-precision` tests.

Each culprit line carries a `# CULPRIT` marker, so tests find the line without hard-coding numbers.
"""
import torch
from torch import nn


class Energy(nn.Module):
    """float64 physics-style code: a large offset added and removed again (cancels exactly in float64 only)."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8).double()
        self.head = nn.Linear(8, 1).double()

    def forward(self, x):
        h = self.proj(x)
        shifted = h + 1.0e8
        delta = shifted - 1.0e8  # CULPRIT float64
        return self.head(delta * 10.0)


def energy():
    torch.manual_seed(0)
    return Energy(), torch.randn(16, 8, dtype=torch.float64)


class HashEmbed(nn.Module):
    """Hashed-id embedding: int64 index arithmetic that exceeds the int32 range."""

    def __init__(self, buckets=97):
        super().__init__()
        self.buckets = buckets
        self.emb = nn.Embedding(buckets, 16)
        self.out = nn.Linear(16, 4)

    def forward(self, ids):
        mixed = ids * 2654435761  # CULPRIT int64
        bucket = torch.remainder(mixed, self.buckets)
        return self.out(self.emb(bucket))


def hash_embed():
    torch.manual_seed(0)
    return HashEmbed(), torch.randint(1, 50_000, (32,), dtype=torch.int64)


class OnePassNorm(nn.Module):
    """RMS/LayerNorm-style reduction with the one-pass variance E[h^2] - E[h]^2."""

    def __init__(self, d):
        super().__init__()
        self.eps = 1e-5

    def forward(self, h):
        mean = h.mean(-1, keepdim=True)
        var = (h * h).mean(-1, keepdim=True) - mean * mean  # CULPRIT bf16
        return (h - mean) * torch.rsqrt(var.clamp_min(0.0) + self.eps)


class Block(nn.Module):
    def __init__(self, d=64):
        super().__init__()
        self.up = nn.Linear(d, d)
        self.norm = OnePassNorm(d)
        self.down = nn.Linear(d, 8)

    def forward(self, x):
        return self.down(self.norm(self.up(x)))


def block():
    torch.manual_seed(0)
    m = Block()
    with torch.no_grad():
        m.up.bias.fill_(30.0)  # large activations with a small spread: what the one-pass variance cannot take
        m.up.weight.mul_(4.0)
    return m, torch.randn(16, 64)


class Clean(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 4))

    def forward(self, x):
        return self.net(x)


def clean():
    torch.manual_seed(0)
    return Clean(), torch.randn(8, 16)


class CleanMigrated(nn.Module):
    """`Clean` as a careless migration left it: the same weights, but Tanh where GELU was."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.LayerNorm(32), nn.Linear(32, 4))

    def forward(self, x):
        return self.net(x)


def clean_migrated():
    torch.manual_seed(0)
    return CleanMigrated(), torch.randn(8, 16)
