"""Shared helpers of the loss tests."""

from __future__ import annotations

import torch


def grad_check(loss: torch.Tensor, leaf: torch.Tensor) -> None:
    """``loss`` is a finite scalar whose backward pass gives ``leaf`` a finite gradient."""
    assert loss.dim() == 0 and bool(torch.isfinite(loss)), float(loss)
    loss.backward()
    assert leaf.grad is not None and bool(torch.isfinite(leaf.grad).all())
