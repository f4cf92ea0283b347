"""Single-GPU CUDA training with bf16 autocast, checked against a float64 reference on the host.

    python train.py --steps 200            # picks CUDA when present
    python train.py --device cpu
"""
import argparse
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import devices


class MLP(nn.Module):
    def __init__(self, d_in=16, d_hidden=64):
        super().__init__()
        self.fc1 = nn.Linear(d_in, d_hidden)
        self.fc2 = nn.Linear(d_hidden, 1)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


def reference_forward(model, x):
    """float64 reference of the MLP, computed on the host to check the device result."""
    w1, b1 = model.fc1.weight.detach().cpu().double(), model.fc1.bias.detach().cpu().double()
    w2, b2 = model.fc2.weight.detach().cpu().double(), model.fc2.bias.detach().cpu().double()
    h = F.gelu(x.detach().cpu().double() @ w1.T + b1)
    return h @ w2.T + b2


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--device", default=None, choices=["cpu", "cuda"])
    args = parser.parse_args()

    if args.device is not None:
        device = torch.device(args.device)
    else:
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    torch.cuda.manual_seed_all(0)

    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 16, generator=g)
    y = torch.tanh(x @ torch.randn(16, 1, generator=g) / 4)
    sample_weights = torch.ones(256, 1, dtype=torch.float64).to(device)
    x, y = x.cuda(), y.cuda()

    model = MLP().cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    scaler = torch.cuda.amp.GradScaler()

    start = time.time()
    for step in range(1, args.steps + 1):
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            pred = model(x)
        loss = (F.mse_loss(pred.float(), y, reduction="none") * sample_weights).mean()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        if step % 20 == 0 or step == 1:
            devices.synchronize(device)
            print(f"step {step} loss {loss.item():.5f} mem {devices.memory_mib(device):.1f}MiB", flush=True)

    with torch.no_grad():
        out = model(x)
    ref = reference_forward(model, x)
    err = (out.cpu().double() - ref).abs().max().item()
    print(f"reference {ref.dtype} max error {err:.2e}", flush=True)
    assert err < 1e-4, err
    print(f"done {args.steps} steps in {time.time() - start:.1f}s on {out.device.type} weights {sample_weights.dtype}", flush=True)


if __name__ == "__main__":
    main()
