"""A small Llama-like decoder (embedding, attention with q/k/v/o projections, MLP with gate/up/down, RMSNorm, LM
head), plain torch.nn: the SPMD training script shards its weights by annotation."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from config import HEADS, LAYERS, VOCAB, WIDTH


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


class DecoderLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn_norm = RMSNorm(WIDTH)
        self.q_proj = nn.Linear(WIDTH, WIDTH, bias=False)
        self.k_proj = nn.Linear(WIDTH, WIDTH, bias=False)
        self.v_proj = nn.Linear(WIDTH, WIDTH, bias=False)
        self.o_proj = nn.Linear(WIDTH, WIDTH, bias=False)
        self.mlp_norm = RMSNorm(WIDTH)
        self.gate_proj = nn.Linear(WIDTH, 2 * WIDTH, bias=False)
        self.up_proj = nn.Linear(WIDTH, 2 * WIDTH, bias=False)
        self.down_proj = nn.Linear(2 * WIDTH, WIDTH, bias=False)

    def forward(self, x):
        b, t, _ = x.shape
        h = self.attn_norm(x)
        q, k, v = (p(h).view(b, t, HEADS, -1).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, WIDTH)
        x = x + self.o_proj(a)
        h = self.mlp_norm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class LlamaLike(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = nn.Embedding(VOCAB, WIDTH)
        self.layers = nn.ModuleList(DecoderLayer() for _ in range(LAYERS))
        self.norm = RMSNorm(WIDTH)
        self.lm_head = nn.Linear(WIDTH, VOCAB, bias=False)

    def forward(self, tokens):
        x = self.embed_tokens(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm(x))
