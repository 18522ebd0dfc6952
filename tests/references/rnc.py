r"""Rank-N-Contrast reference: the authors' computation, for the benchmark.

K. Zha, P. Cao, J. Son, Y. Yang, D. Katabi, *Rank-N-Contrast: Learning Continuous Representations
for Regression*, NeurIPS 2023 (arXiv:2210.01189); reference code
https://github.com/kaiwenzha/Rank-N-Contrast (``loss.py``).

:func:`rnc_authors_reference` is our own reimplementation of the structure of the authors'
computation, written from the paper's eq. 2 and the description of their loop, so that its speed
and memory are representative of it: the two views are stacked view-major into ``M = 2 bsz``
rows; the ``[M, M]`` label distances (L1) and logits (negative L2 feature distance over ``tau``,
shifted by each row's detached maximum) are built densely, the diagonal is dropped by a
boolean mask to ``[M, M - 1]``, and then **a Python loop over the ``M - 1`` positive columns**
builds, per column, the ``[M, M - 1]`` mask of the views at least as far in label space as that
positive and the masked sum of ``exp`` logits for its denominator.  O(M^3) time; every loop step
keeps its ``[M, M - 1]`` mask and product for the backward pass, so the autograd graph holds
O(M^3) memory as well.  The loss is the sum over all ``(i, j)`` of
``-log(exp(s_ij) / sum_{k in S_ij} exp(s_ik)) / (M (M - 1))``.

Not used by the library (:mod:`cloc_lightning.losses.rnc` is the real loss, with sorted running
log-sum-exp denominators instead of the loop); the tests check the library against their own
triple loop of eq. 2 (``tests/losses/test_rnc.py``).
"""

from __future__ import annotations

import torch

__all__ = ["rnc_authors_reference"]


def rnc_authors_reference(features: torch.Tensor, labels: torch.Tensor, temperature: float = 2.0) -> torch.Tensor:
    """RnC loss of ``features`` ``[bsz, 2, dim]`` and ``labels`` ``[bsz]`` / ``[bsz, L]`` the authors' way (L1 labels, L2 features).

    Two views only (as the authors' code): ``M = 2 bsz`` rows, view 0 of every image first.
    """
    if features.dim() != 3 or features.shape[1] != 2:
        raise ValueError(f"features must be [bsz, 2, dim], got {tuple(features.shape)}")
    bsz = features.shape[0]
    rows = torch.cat([features[:, 0], features[:, 1]], dim=0)  # [M, dim], view-major
    y = labels.reshape(bsz, -1).to(rows.dtype).repeat(2, 1)  # [M, L]
    m = rows.shape[0]

    label_diffs = (y[:, None, :] - y[None, :, :]).abs().sum(dim=-1)  # [M, M] L1 label distances
    logits = -(rows[:, None, :] - rows[None, :, :]).norm(2, dim=-1) / temperature  # [M, M]
    logits = logits - logits.max(dim=1, keepdim=True).values.detach()  # a per-row shift: the ratios are unchanged
    exp_logits = logits.exp()

    off_diagonal = ~torch.eye(m, dtype=torch.bool, device=rows.device)
    logits = logits.masked_select(off_diagonal).view(m, m - 1)
    exp_logits = exp_logits.masked_select(off_diagonal).view(m, m - 1)
    label_diffs = label_diffs.masked_select(off_diagonal).view(m, m - 1)

    loss = rows.new_zeros(())
    for k in range(m - 1):  # column k of every row: the positive j; its negatives: the views at least as far
        positive = logits[:, k]
        negatives = (label_diffs >= label_diffs[:, k : k + 1]).to(rows.dtype)  # [M, M - 1]
        log_probability = positive - torch.log((negatives * exp_logits).sum(dim=-1))
        loss = loss - log_probability.sum() / (m * (m - 1))
    return loss
