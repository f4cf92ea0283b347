"""One training or inference step of a factory target, shared by the probed run (`child.py`), the compile
probe and the numerics probe (its own module so that none of them imports another)."""
from __future__ import annotations


def loss_of(out):
    """A scalar to call backward on: `.loss` / `["loss"]` if the model returns one, else the sum of every
    floating output (real part of complex ones)."""
    import torch
    import torch.utils._pytree as pytree

    if isinstance(out, torch.Tensor) and out.dim() == 0 and out.is_floating_point():
        return out
    loss = getattr(out, "loss", None)
    if loss is None and isinstance(out, dict):
        loss = out.get("loss")
    if isinstance(loss, torch.Tensor):
        return loss
    total = None
    for leaf in pytree.tree_leaves(out if not hasattr(out, "to_tuple") else out.to_tuple()):
        if isinstance(leaf, torch.Tensor) and (leaf.is_floating_point() or leaf.is_complex()) and leaf.requires_grad:
            s = (leaf.real if leaf.is_complex() else leaf).sum()
            total = s if total is None else total + s
    return total


def set_mode(model, train: bool) -> None:
    """train() for a training step, eval() for a forward-only one (dropout off, batch-norm statistics frozen)."""
    fn = getattr(model, "train" if train else "eval", None)
    if callable(fn):
        fn()


def forward_backward(model, args, kwargs, train: bool):
    """One forward (and, when training, backward) pass; returns (outputs, loss)."""
    import torch

    set_mode(model, train)
    if not train:
        with torch.no_grad():
            return model(*args, **kwargs), None
    out = model(*args, **kwargs)
    loss = loss_of(out)
    if loss is not None:
        loss.backward()
    return out, loss
