"""Sigmoid contrastive loss references: ReLIC-sigmoid, the seed's ``scl_loss``.

"Sigmoid Contrastive Loss for Vision" (F. Basara, https://github.com/filipbasara0/sigmoid-contrastive-loss,
``scl/scl.py`` ``scl_loss``; package ``sigmoid-contrastive-learning``): SigLIP's pairwise
loss with a confidence penalty plus ReLIC's invariance term,

``L = -1/n sum_ij (1 - sigmoid(z_ij))**gamma * log sigmoid(z_ij) + alpha * KL``,
``z_ij = l_ij * (exp(tau).clamp(0, max_tau) * <x_i, x'_j> + b)`` with ``l = 2I - 1`` on
L2-normalised rows, and ``KL = 1/n sum_i KL(T_i || P_i)``, ``P_i = softmax_j(logits_ij)``,
``T_i = softmax_j(logits_ji)``.  Penalty filtering (the seed's later ``penalty_filtering``
option, active from ``global_step > filtering_warmup_steps`` on) sums the kept pairs'
``-log sigmoid`` -- kept: ``penalty > threshold`` or a positive -- without the penalty weight.

* :func:`sigmoid_loop_reference` -- one Python step per (row, column) pair in float64 NumPy
  (nothing shared with torch's autograd);
* :func:`scl_reference` -- the formula op by op as the seed writes it (explicit labels
  ``2I - 1`` built with ``torch.eye``, ``labels * logits``, ``sigmoid``, the penalty,
  ``F.logsigmoid``, the masked sum, then ``F.kl_div(F.log_softmax(logits, 1),
  F.softmax(logits, 0).t(), reduction="batchmean")``), each a separate op that autograd
  differentiates: the tests' autograd reference for larger sizes, and the benchmark's
  stand-in for the seed (its speed and memory are representative).

Not used by the library; see :mod:`cloc_lightning.losses.sigmoid` for the real loss.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

__all__ = ["filtering_threshold", "scl_reference", "sigmoid_loop_reference"]


def filtering_threshold(global_step: int, filtering_warmup_steps: int = 5000, threshold: float = 0.05) -> float | None:
    """The seed's rule: penalty filtering with ``threshold`` once ``global_step > filtering_warmup_steps``, else off (None)."""
    return threshold if global_step > filtering_warmup_steps else None


def sigmoid_loop_reference(
    x: np.ndarray,
    xp: np.ndarray,
    tau: float,
    b: float,
    alpha: float = 0.0,
    max_tau: float = 5.0,
    gamma: float = 0.0,
    threshold: float | None = None,
) -> tuple[float, float]:
    """``(loss, KL)`` with a plain loop over pairs (``threshold``: penalty filtering active)."""
    n = x.shape[0]
    xn = [x[i] / max(math.sqrt(float(np.dot(x[i], x[i]))), 1e-12) for i in range(n)]
    xpn = [xp[i] / max(math.sqrt(float(np.dot(xp[i], xp[i]))), 1e-12) for i in range(n)]
    scale = min(max(math.exp(tau), 0.0), max_tau)
    logits = [[scale * float(np.dot(xn[i], xpn[j])) + b for j in range(n)] for i in range(n)]
    loss = 0.0
    for i in range(n):
        for j in range(n):
            z = logits[i][j] if i == j else -logits[i][j]  # label * logit
            log_sig = -np.logaddexp(0.0, -z)  # log sigmoid(z)
            penalty = (1.0 / (1.0 + math.exp(z))) ** gamma  # (1 - sigmoid(z)) ** gamma
            if threshold is None:
                loss -= penalty * log_sig
            elif i == j or penalty > threshold:  # filtering (the seed): the penalty selects, kept pairs unweighted
                loss -= log_sig
    loss /= n
    kl = 0.0
    for i in range(n):
        row = logits[i]  # P_i: softmax over j of L_ij
        col = [logits[j][i] for j in range(n)]  # T_i: softmax over j of L_ji
        lse_row = float(np.logaddexp.reduce(row))
        lse_col = float(np.logaddexp.reduce(col))
        for j in range(n):
            log_t = col[j] - lse_col
            log_p = row[j] - lse_row
            kl += math.exp(log_t) * (log_t - log_p)
    kl /= n
    return loss + alpha * kl, kl


def scl_reference(
    x: torch.Tensor,
    x_prime: torch.Tensor,
    tau: torch.Tensor,
    b: torch.Tensor,
    alpha: float = 0.0,
    max_tau: float = 5.0,
    gamma: float = 0.0,
    threshold: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(loss, invariance_loss)`` computed op by op as the seed does.

    Args:
        x: online projections [n, dim]; x_prime: target projections [n, dim].
        tau: log logit scale (0-d tensor); b: logit bias (0-d tensor).
        threshold: penalty filtering active with this threshold (see :func:`filtering_threshold`), or None.

    Returns:
        The loss (sigmoid part + ``alpha`` * KL) and the KL term.
    """
    n = x.shape[0]
    labels = 2 * torch.eye(n, device=x.device, dtype=x.dtype) - 1
    x = F.normalize(x, p=2, dim=-1)
    x_prime = F.normalize(x_prime, p=2, dim=-1)
    logits = torch.mm(x, x_prime.t()) * tau.exp().clamp(0, max_tau) + b

    signed = labels * logits
    probs = torch.sigmoid(signed)
    penalty = (1 - probs) ** gamma
    if threshold is not None:
        keep = (penalty > threshold) | (labels > 0)
        terms = F.logsigmoid(signed) * keep  # the penalty selects; kept pairs are unweighted
    else:
        terms = penalty * F.logsigmoid(signed)
    loss = -torch.sum(terms) / n

    log_p = F.log_softmax(logits, dim=1)
    target = F.softmax(logits, dim=0).t()
    invariance = F.kl_div(log_p, target, reduction="batchmean")
    return loss + alpha * invariance, invariance
