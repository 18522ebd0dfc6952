"""A loop reimplementation of the official CLOC loss algorithm (for benchmarks only).

Reference: ``dpitawela/CLOC`` ``loss.py`` (``OrdinalContrastiveLoss_mm``), the code
released with Pitawela, Carneiro, Chen, "CLOC: Contrastive Learning for Ordinal
Classification with Multi-Margin N-pair Loss", CVPR 2025 (arXiv:2504.17813).

This module re-expresses the *same algorithm* in our own code so that the
benchmark times what users of the official loss pay:

* the cosine-similarity matrix through ``F.cosine_similarity`` on broadcast
  ``[N, 1, D]`` x ``[1, N, D]`` inputs (an ``[N, N, D]`` intermediate);
* positives/negatives encoded as ``+inf`` / ``-inf`` entries of two copies of it;
* the margins in float64 (the reference keeps its raw margins in float64, so the
  hinge terms are float64 although the similarities are float32);
* a Python loop over the ``N`` positive *columns*, each building an ``[N, N]``
  hinge matrix (``O(N^3)`` work in total) whose rows are averaged over the
  negatives, the per-column results grown with ``torch.cat`` as the reference does;
* the final per-anchor average over the (positive, negative) pair counts, then the
  mean over anchors -- which divides by ``|N_i|`` twice (see
  :mod:`cloc_lightning.losses.cloc`).

It is *not* used by the tests as a correctness oracle (they carry their own
independent loop); the benchmark checks that ours equals it on its inputs.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

__all__ = ["cloc_reference_loss"]


def cloc_reference_loss(prediction: torch.Tensor, target: torch.Tensor, raw_distances: torch.Tensor) -> torch.Tensor:
    """CLOC loss computed with the official algorithm's loops.

    Args:
        prediction: [N, D] float32 logits/features.
        target: [N] integer labels in ``[0, C)``.
        raw_distances: [C - 1] raw (pre-softplus) adjacent margins, float64 as in the
            reference (for the single-margin variant pass the raw value repeated).

    Returns:
        Scalar float64 loss, differentiable wrt ``prediction`` and ``raw_distances``.
    """
    n = prediction.shape[0]
    device = prediction.device
    sim = F.cosine_similarity(prediction.unsqueeze(0), prediction.unsqueeze(1), dim=2)  # [N, N]

    same = target.unsqueeze(0) == target.unsqueeze(1)
    negatives = ~same
    positives = same & ~torch.eye(n, dtype=torch.bool, device=device)
    pos_sim = sim.masked_fill(~positives, math.inf)
    neg_sim = sim.masked_fill(~negatives, -math.inf)

    adjacent = F.softplus(raw_distances)
    positions = torch.cumsum(torch.cat([torch.zeros(1, dtype=adjacent.dtype, device=device), adjacent]), dim=0)
    class_dist = (positions.unsqueeze(0) - positions.unsqueeze(1)).abs()
    labels = target.unsqueeze(0).expand(n, n)
    margins = class_dist[labels, labels.t()].masked_fill(~negatives, 0.0)

    per_column = torch.empty(0, n, dtype=torch.float64, device=device)
    column_counts = torch.empty(0, n, dtype=torch.float64, device=device)
    for j in range(n):  # one positive column at a time, as the reference
        hinge = neg_sim + margins - pos_sim[:, j : j + 1]  # [anchor, negative]
        valid = torch.isfinite(hinge)
        count = valid.sum(dim=1)
        row = (F.relu(hinge) * valid).sum(dim=1) / count.clamp(min=1)
        per_column = torch.cat((per_column, row.reshape(1, -1)), dim=0)
        column_counts = torch.cat((column_counts, count.reshape(1, -1).to(torch.float64)), dim=0)

    per_anchor = (per_column * column_counts.bool()).sum(dim=0) / column_counts.sum(dim=0).clamp(min=1)
    return per_anchor.mean()
