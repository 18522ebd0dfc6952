"""SupCon / SimCLR loss references (Khosla et al., "Supervised Contrastive Learning", NeurIPS 2020).

* :func:`supcon_loop_reference` / :func:`supcon_loop_reference_per_anchor` -- eq. 2 (``L_out``)
  walking anchors, contrast entries and positives one by one (float64 in the tests; autograd
  through the loop gives the gradients).  Anchors are the views stacked view-major (the
  paper's 2N batch); positives are the other entries with the same label, the other views
  of the same image without labels (SimCLR), or the weights of an explicit mask.  Anchors
  without positives contribute 0 and the mean runs over all anchors (SupContrast PR #142).
  As SupContrast's ``losses.py``, the loss is scaled by ``temperature / base_temperature``
  with ``base_temperature`` 0.07 by default (``None``: tied to the temperature, no scaling).
* :func:`supcontrast_reference` -- the SupContrast dense computation, for the benchmark.

:func:`supcontrast_reference` is a faithful reimplementation (our own code) of the dense computation in the
authors' reference ``HobbitLong/SupContrast`` ``losses.py`` (Khosla et al.,
"Supervised Contrastive Learning", NeurIPS 2020), with the fix of its PR #142
(anchors without positives divide by 1 instead of 0).  It performs the same
tensor operations as that code so that its speed and memory are representative:
the full ``[N_a, N]`` logits, the tiled ``[N_a, N]`` positive mask built with
``repeat``, the ``[N_a, N]`` self-exclusion mask built with ``scatter``, the
masked ``exp`` and the masked ``log_prob``.  ``base_temperature`` defaults to 0.07
as in the reference (and in :class:`cloc_lightning.losses.SupConLoss`).  Not used by the library; see
:mod:`cloc_lightning.losses.supcon` for the real loss.
"""

from __future__ import annotations

import torch

__all__ = ["supcon_loop_reference", "supcon_loop_reference_per_anchor", "supcontrast_reference"]


def supcon_loop_reference_per_anchor(
    features: torch.Tensor,
    labels: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
    temperature: float = 0.07,
    contrast_mode: str = "all",
    base_temperature: float | None = 0.07,
) -> torch.Tensor:
    """Per-anchor losses of ``features`` [bsz, n_views, dim], one Python step per anchor / contrast entry / positive."""
    bsz, n_views, _ = features.shape
    base = temperature if base_temperature is None else base_temperature
    entries = [(v, i) for v in range(n_views) for i in range(bsz)]  # view-major, as the paper's 2N batch
    anchors = entries if contrast_mode == "all" else [(0, i) for i in range(bsz)]

    def weight(i: int, j: int) -> float:
        if mask is not None:
            return float(mask[i, j])
        if labels is not None:
            return 1.0 if int(labels[i]) == int(labels[j]) else 0.0
        return 1.0 if i == j else 0.0  # SimCLR: the other views of the same image

    losses = []
    for va, ia in anchors:
        za = features[ia, va]
        others = [(v, j) for (v, j) in entries if (v, j) != (va, ia)]
        if not others:
            losses.append(features.new_zeros(()))
            continue
        logits = [torch.dot(za, features[j, v]) / temperature for (v, j) in others]
        log_denominator = torch.logsumexp(torch.stack(logits), dim=0)
        total, n_pos = features.new_zeros(()), 0.0
        for (_v, j), logit in zip(others, logits, strict=True):
            w = weight(ia, j)
            if w > 0:
                total = total + w * (logit - log_denominator)
                n_pos += w
        losses.append(-(temperature / base) * total / n_pos if n_pos > 0 else features.new_zeros(()))
    return torch.stack(losses) + 0.0 * features.sum()  # keep the graph connected for .grad


def supcon_loop_reference(features: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
    """The mean of :func:`supcon_loop_reference_per_anchor` over the anchors: the loss."""
    return supcon_loop_reference_per_anchor(features, *args, **kwargs).mean()  # type: ignore[arg-type]


def supcontrast_reference(
    features: torch.Tensor,
    labels: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
    temperature: float = 0.07,
    contrast_mode: str = "all",
    base_temperature: float = 0.07,
) -> torch.Tensor:
    """SupCon ``L_out`` as the reference computes it.

    Args:
        features: [bsz, n_views, dim] (L2-normalised).
        labels: [bsz] integer ids, or ``None``.
        mask: [bsz, bsz] positives mask, or ``None`` (both ``None``: SimCLR).

    Returns:
        Scalar loss.
    """
    device = features.device
    bsz, n_views = features.shape[0], features.shape[1]
    if labels is not None and mask is not None:
        raise ValueError("labels and mask are exclusive")
    if labels is None and mask is None:
        pos = torch.eye(bsz, dtype=torch.float32, device=device)
    elif labels is not None:
        col = labels.contiguous().view(-1, 1)
        pos = torch.eq(col, col.T).float().to(device)
    else:
        pos = mask.float().to(device)

    # view-major stack of every view: rows v * bsz + i
    contrast_feature = torch.cat(torch.unbind(features, dim=1), dim=0)
    if contrast_mode == "one":
        anchor_feature = features[:, 0]
        anchor_count = 1
    else:
        anchor_feature = contrast_feature
        anchor_count = n_views

    logits_raw = torch.div(torch.matmul(anchor_feature, contrast_feature.T), temperature)
    row_max, _ = torch.max(logits_raw, dim=1, keepdim=True)
    logits = logits_raw - row_max.detach()

    pos = pos.repeat(anchor_count, n_views)
    not_self = torch.scatter(torch.ones_like(pos), 1, torch.arange(bsz * anchor_count, device=device).view(-1, 1), 0)
    pos = pos * not_self

    exp_logits = torch.exp(logits) * not_self
    log_prob = logits - torch.log(exp_logits.sum(1, keepdim=True))

    n_pos = pos.sum(1)
    n_pos = torch.where(n_pos < 1e-6, torch.ones_like(n_pos), n_pos)  # PR #142
    mean_log_prob_pos = (pos * log_prob).sum(1) / n_pos

    loss = -(temperature / base_temperature) * mean_log_prob_pos
    return loss.view(anchor_count, bsz).mean()
