"""Known-answer model for `neuron-migrate probe`: torch.linalg.qr, atan2, an rfft and a float64 buffer.

    neuron-migrate probe examples/probe_models/fallback_model.py:make

The tests read the line numbers of the marked lines below (`# PROBE: <tag>`), so edit freely.
"""
import torch
from torch import nn


class FallbackModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(16, 16)
        self.register_buffer("scale", torch.linspace(0.5, 1.5, 16, dtype=torch.float64))  # PROBE: buffer
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        h = self.proj(x)
        q, r = torch.linalg.qr(h.reshape(-1, 4, 4))  # PROBE: qr
        h = q.reshape(-1, 16) + r.reshape(-1, 16)
        angle = torch.atan2(h, h.flip(-1) + 2.0)  # PROBE: atan2
        spec = torch.fft.rfft(angle, dim=-1)  # PROBE: rfft
        mag = spec.abs()
        h = torch.cat([mag, angle[:, : 16 - mag.shape[-1]]], dim=-1)
        h = (h * self.scale).float()  # PROBE: float64-use
        return self.head(h)


def make():
    torch.manual_seed(0)
    return FallbackModel(), (torch.randn(8, 16),)
