"""The torch_xla 2.5+ style: torch_xla.device(), torch_xla.sync(), torch_xla.step(), autocast on 'xla'."""
import torch
import torch_xla
from torch import nn
from torch.utils.data import DataLoader

from common import MLP, make_dataset


def main():
    torch_xla.manual_seed(0)
    device = torch_xla.device()
    model = MLP().to(device)
    loader = DataLoader(make_dataset(), batch_size=32, shuffle=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    loss_fn = nn.CrossEntropyLoss()
    losses = []
    for epoch in range(3):
        for data, target in loader:
            with torch_xla.step():
                data, target = data.to("xla"), target.to("xla")
                optimizer.zero_grad()
                with torch.autocast("xla", dtype=torch.bfloat16):
                    logits = model(data)
                loss = loss_fn(logits.float(), target)
                loss.backward()
                optimizer.step()
            losses.append(loss.detach())
        torch_xla.sync()
    if losses[0].device.type == "xla":
        print("trained on the XLA device")
    print(f"INITIAL_LOSS {torch.stack(losses[:5]).mean().item():.4f}")
    print(f"FINAL_LOSS {torch.stack(losses[-5:]).mean().item():.4f}")


if __name__ == "__main__":
    main()
