"""OrdinalCLIP references (Li et al., "OrdinalCLIP: Learning Rank Prompts for Language-Guided Ordinal Regression", NeurIPS 2022).

* :func:`ordinal_clip_loss_reference` -- the seed's loss (``runner.compute_kl_loss``):
  ``ce_w * CE(logits, y) + kl_w * mean over present ranks r of KL(q_r || p_r)``, with
  ``q_r = softmax_i(s * [y_i == r])`` over the batch and ``p_r = softmax_i(logits_ir)``
  (the column of rank r), plus its analytic gradient; loops over plain floats;
* :func:`interpolation_weights_formula` -- the rank interpolation weights of issue 6 with
  plain Python floats: base ranks at ``b (R - 1) / (B - 1)`` (one base rank: the middle),
  weights ``1 - d / (R - 1)`` (linear), ``1 / (d + 1e-5)`` (inv_prop) or ``exp(-d^2)``
  (normal), normalised over the base ranks;
* :func:`seed_interpolation` -- the seed's ``create_interpolation_weights`` in torch, in the
  CLIP dtype (float32), where ``normal`` underflows to ``0 / 0`` for ranks far from every
  base rank.
"""

from __future__ import annotations

import math

import numpy as np
import torch

__all__ = ["ordinal_clip_loss_reference", "interpolation_weights_formula", "seed_interpolation"]


def ordinal_clip_loss_reference(
    logits: np.ndarray, labels: np.ndarray, ce_w: float = 1.0, kl_w: float = 1.0, s: float = 10.0
) -> tuple[float, float, float, np.ndarray]:
    """``(total, CE, KL, d total / d logits)`` of the CE + KL loss, one sample and one rank at a time."""
    N, R = logits.shape
    ce, g_ce = 0.0, np.zeros_like(logits)
    for i in range(N):
        m = logits[i].max()
        lse = m + math.log(sum(math.exp(v - m) for v in logits[i]))
        ce += -(logits[i, labels[i]] - lse) / N
        for r in range(R):
            g_ce[i, r] = (math.exp(logits[i, r] - lse) - (labels[i] == r)) / N
    present = [r for r in range(R) if (labels == r).any()]
    kl, g_kl = 0.0, np.zeros_like(logits)
    for r in present:
        e = [math.exp(s * (labels[i] == r)) for i in range(N)]
        q = [v / sum(e) for v in e]
        col = logits[:, r]
        m = col.max()
        lse = m + math.log(sum(math.exp(v - m) for v in col))
        logp = [col[i] - lse for i in range(N)]
        kl += sum(q[i] * (math.log(q[i]) - logp[i]) for i in range(N)) / len(present)
        for i in range(N):
            g_kl[i, r] = (math.exp(logp[i]) - q[i]) / len(present)
    return ce_w * ce + kl_w * kl, ce, kl, ce_w * g_ce + kl_w * g_kl


def interpolation_weights_formula(R: int, B: int, kind: str) -> np.ndarray:
    """Issue 6 / reference formula written out with plain Python floats: [R, B] weights."""
    pos = [(R - 1) / 2.0] if B == 1 else [b * (R - 1) / (B - 1) for b in range(B)]
    out = np.zeros((R, B))
    for r in range(R):
        row = []
        for b in range(B):
            d = abs(r - pos[b])
            if kind == "linear":
                row.append(1.0 - d / (R - 1))
            elif kind == "inv_prop":
                row.append(1.0 / (d + 1e-5))
            else:
                row.append(math.exp(-d * d))
        s = sum(row)
        out[r] = [v / s for v in row]
    return out


def seed_interpolation(R: int, B: int, kind: str, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Our re-implementation of the seed's ``create_interpolation_weights`` (in the CLIP dtype)."""
    rank = torch.arange(R, dtype=dtype)[:, None].expand(R, B)
    # one base rank: the middle of three
    pos = torch.linspace(0, R - 1, 3, dtype=dtype)[1:2] if B == 1 else torch.linspace(0, R - 1, B, dtype=dtype)
    d = (rank - pos[None]).abs()
    if kind == "linear":
        w = 1.0 - d / (R - 1)
    elif kind == "inv_prop":
        w = 1.0 / (d + 1e-5)
    else:
        w = torch.exp(-d * d)
    return w / w.sum(dim=-1, keepdim=True)
