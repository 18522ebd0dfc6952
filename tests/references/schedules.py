"""Learning-rate and EMA schedules of the seed repositories, re-derived step by step.

* :func:`supcontrast_lrs` -- SupContrast's ``main_supcon.py`` (Khosla et al. 2020): the lr
  set once per epoch (epochs from 1), cosine to ``lr * rate**3`` or step decay at
  ``decay_epochs``, with a linear per-step warm-up from 0.01 over the first 10 epochs;
* :func:`scl_train_ema_coefficients` -- the ReLIC-sigmoid seed's ``train.py`` bookkeeping of
  the EMA coefficient (cosine horizon ``len(loader) * (epochs + 2) - after``, one-step lag);
* :func:`torch_epoch_lrs` -- a torch scheduler stepped once per epoch, as OrdinalCLIP's seed
  (``CosineAnnealingLR`` over the epochs, or ``MultiStepLR([60], 0.1)``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

__all__ = ["supcontrast_lrs", "scl_train_ema_coefficients", "torch_epoch_lrs"]


def supcontrast_lrs(
    lr: float, epochs: int, n_batches: int, cosine: bool, warm: bool, decay_epochs: Sequence[int] = (700, 800, 900), rate: float = 0.1
) -> list[float]:
    """The learning rate of every optimiser step of SupContrast's ``main_supcon.py`` loop."""
    warm_epochs, warmup_from = 10, 0.01
    eta_min = lr * rate**3
    warmup_to = eta_min + (lr - eta_min) * (1 + math.cos(math.pi * warm_epochs / epochs)) / 2 if cosine else lr
    out = []
    for epoch in range(1, epochs + 1):
        if cosine:
            current = eta_min + (lr - eta_min) * (1 + math.cos(math.pi * epoch / epochs)) / 2
        else:
            n = sum(1 for d in decay_epochs if epoch > d)
            current = lr * rate**n if n > 0 else lr
        for batch_id in range(n_batches):
            if warm and epoch <= warm_epochs:
                p = (batch_id + (epoch - 1) * n_batches) / (warm_epochs * n_batches)
                current_step = warmup_from + p * (warmup_to - warmup_from)
            else:
                current_step = current
            out.append(current_step)
    return out


def scl_train_ema_coefficients(n_steps: int, loader_len: int, epochs: int, beta0: float, after: int, every: int) -> dict[int, float]:
    """Simulate the seed's ``train.py`` bookkeeping: step -> coefficient used (0.0 = copy)."""
    horizon = loader_len * (epochs + 2) - after
    beta = beta0
    used: dict[int, float] = {}
    for k in range(n_steps):
        if k > after and k % every == 0:
            used[k] = beta  # the EMA uses the value computed at the previous EMA step
            beta = 1.0 - (1.0 - beta0) * (math.cos(math.pi * k / horizon) + 1.0) / 2.0
        if k <= after:
            used[k] = 0.0
    return used


def torch_epoch_lrs(scheduler: str, epochs: int) -> list[float]:
    """The seed's schedule: a torch scheduler stepped once per epoch (Lightning's default interval); factors of lr 1."""
    opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0)
    sched: torch.optim.lr_scheduler.LRScheduler
    if scheduler == "cosine":
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, float(epochs))
    else:
        sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=[60], gamma=0.1)
    out = []
    for _ in range(epochs):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out
