"""CLOC loss references (Pitawela, Carneiro, Chen, CVPR 2025, arXiv:2504.17813).

* :func:`cloc_loop_reference` -- issue 3's formula as a plain triple loop in float64
  (anchor i, positive j, negative k), differentiated by autograd;
* :func:`cloc_dense_reference` -- the same formula with the (j, k) pairs of one anchor as
  a small dense matrix (a loop over anchors), for mid-size batches;
* :func:`cloc_reference_loss` -- the official code's algorithm re-expressed, for the benchmark.

The formula: ``mean_i [ sum_{j in P_i} sum_{k in N_i} relu(s_ik - s_ij + |pos_yi - pos_yk|) / w_i ]``
with cosine similarities ``s``, class positions ``pos`` (the cumulative sum of the ``C - 1``
adjacent margins, ``pos_0 = 0``), ``w_i = |P_i| |N_i|^2`` (the official reduction) or
``|P_i| |N_i|`` ('mean'); an anchor with no positive or no negative gives 0.

:func:`cloc_reference_loss`, reference: ``dpitawela/CLOC`` ``loss.py`` (``OrdinalContrastiveLoss_mm``), the code
released with Pitawela, Carneiro, Chen, "CLOC: Contrastive Learning for Ordinal
Classification with Multi-Margin N-pair Loss", CVPR 2025 (arXiv:2504.17813).

That function re-expresses the *same algorithm* in our own code so that the
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

The tests use the loops above as the correctness oracle; the benchmark checks that ours
equals :func:`cloc_reference_loss` on its inputs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F

__all__ = ["cloc_loop_reference", "cloc_dense_reference", "cloc_reference_loss", "softplus_reference"]

F64 = torch.float64


def softplus_reference(t: torch.Tensor) -> torch.Tensor:
    """``log(1 + exp(t))`` written out (the raw-to-margin map of a learnable CLOC margin)."""
    return torch.log1p(torch.exp(t))


def cloc_loop_reference(
    x: torch.Tensor, y: Sequence[int], adjacent: Sequence[torch.Tensor] | torch.Tensor, reduction: str = "official"
) -> torch.Tensor:
    """The formula above, one (anchor, positive, negative) triple at a time, in float64.

    ``x``: [N, D] float64; ``y``: the N labels; ``adjacent``: the C-1 adjacent margins (0-d
    float64 tensors, or a 1-d tensor); ``reduction``: ``'official'`` or ``'mean'``.
    """
    n = x.shape[0]
    y = [int(v) for v in y]
    unit = [x[i] / torch.sqrt((x[i] * x[i]).sum()) for i in range(n)]
    pos = [torch.zeros((), dtype=F64)]
    for m in adjacent:
        pos.append(pos[-1] + m)
    total = torch.zeros((), dtype=F64)
    for i in range(n):
        positives = [j for j in range(n) if j != i and y[j] == y[i]]
        negatives = [k for k in range(n) if y[k] != y[i]]
        if not positives or not negatives:
            continue
        sim = {j: (unit[i] * unit[j]).sum() for j in range(n)}
        acc = torch.zeros((), dtype=F64)
        for j in positives:
            for k in negatives:
                acc = acc + torch.relu(sim[k] - sim[j] + torch.abs(pos[y[i]] - pos[y[k]]))
        w = len(positives) * len(negatives) ** (2 if reduction == "official" else 1)
        total = total + acc / w
    return total / n


def cloc_dense_reference(x: torch.Tensor, y: torch.Tensor, adjacent: torch.Tensor, reduction: str = "official") -> torch.Tensor:
    """The same formula, one anchor at a time with its (positive, negative) pairs as a dense matrix."""
    x = x.to(F64)
    unit = x / x.norm(dim=1, keepdim=True)
    sim = unit @ unit.T
    pos = torch.cat([adjacent.new_zeros(1), torch.cumsum(adjacent.to(F64), 0)])
    per_anchor = []
    for i in range(x.shape[0]):
        p_mask = y == y[i]
        p_mask[i] = False
        n_mask = y != y[i]
        n_p, n_n = int(p_mask.sum()), int(n_mask.sum())
        if n_p == 0 or n_n == 0:
            per_anchor.append(sim[i, i] * 0)
            continue
        margin = (pos[y[i]] - pos[y[n_mask]]).abs()
        hinge = torch.relu(sim[i, n_mask][None, :] + margin[None, :] - sim[i, p_mask][:, None])
        per_anchor.append(hinge.sum() / (n_p * n_n ** (2 if reduction == "official" else 1)))
    return torch.stack(per_anchor).mean()


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
