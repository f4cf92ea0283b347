"""A small Llama-like decoder-only model (embedding, attention with q/k/v/o projections, MLP with gate/up/down,
RMSNorm, LM head), in the style of pytorch/xla's examples/decoder_only_model.py: DecoderLayer is the class the
FSDPv2 auto-wrap policy names."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class DecoderOnlyConfig:
    def __init__(self, hidden_size=64, num_attention_heads=4, num_hidden_layers=2, intermediate_size=128, vocab_size=128):
        self.hidden_size = hidden_size
        self.num_attention_heads = num_attention_heads
        self.num_hidden_layers = num_hidden_layers
        self.intermediate_size = intermediate_size
        self.vocab_size = vocab_size


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


class DecoderLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        width, self.heads = config.hidden_size, config.num_attention_heads
        self.input_layernorm = RMSNorm(width)
        self.q_proj = nn.Linear(width, width, bias=False)
        self.k_proj = nn.Linear(width, width, bias=False)
        self.v_proj = nn.Linear(width, width, bias=False)
        self.o_proj = nn.Linear(width, width, bias=False)
        self.post_attention_layernorm = RMSNorm(width)
        self.gate_proj = nn.Linear(width, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(width, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, width, bias=False)

    def forward(self, x):
        b, t, width = x.shape
        h = self.input_layernorm(x)
        q, k, v = (p(h).view(b, t, self.heads, -1).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, width)
        x = x + self.o_proj(a)
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class DecoderOnlyModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size)
        self.output = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    def forward(self, input_ids):
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(x)
        return self.output(self.norm(x))
