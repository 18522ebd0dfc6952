r"""Rank-N-Contrast (RnC): a contrastive loss that ranks samples by their label distance.

Zha, Cao, Son, Yang, Katabi, "Rank-N-Contrast: Learning Continuous Representations for
Regression", NeurIPS 2023 (arXiv 2210.01189); reference code https://github.com/kaiwenzha/Rank-N-Contrast
(``loss.py``: ``RnCLoss``).  For the ``M`` views in the batch (every image twice, under two
augmentations), anchor ``i`` and any other view ``j``:

.. math::
    \ell_{ij} = -\log \frac{\exp(s_{ij}/\tau)}{\sum_{k \ne i,\; d(y_i, y_k) \ge d(y_i, y_j)} \exp(s_{ik}/\tau)},
    \qquad L = \frac{1}{M (M - 1)} \sum_i \sum_{j \ne i} \ell_{ij},

so every ``j`` is a positive whose negatives are the views at least as far from ``i`` in label
space: features are pulled together in the order of their labels.  ``s`` is the negative
Euclidean distance of the features (the paper's default; ``feature_similarity='cosine'`` uses
the cosine similarity) and ``d`` the L1 distance of the labels (``'l2'``: Euclidean), with the
view of ``i`` itself excluded from both sums and ``tau = 2`` by default.

The denominators are computed for all ``(i, j)`` at once without the reference's loop over
``j``: each anchor's row is sorted by label distance (descending), a running log-sum-exp of
its logits gives, at position ``c - 1``, the log of the sum over the ``c`` views farthest from
``i``, and ``c_ij = #{k: d_ik >= d_ij}`` (ties included) is found with ``searchsorted``.  O(M^2
log M) time and O(M^2) memory instead of O(M^3); no host read.  Under DDP
(``gather_distributed=True``) the contrast set is the global batch of views (gathered with
gradients) and each rank's anchors are its own views; the returned value is this rank's share of
the global mean, so that the mean over ranks equals one process on the global batch.
Computed in float32 (float64 for float64 features) with autocast off.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from cloc_lightning import distributed as dist_utils
from cloc_lightning.checks import require
from cloc_lightning.losses.base import Loss, compute_dtype
from cloc_lightning.validation import check_choice, check_float, check_tensor

__all__ = ["RnCLoss", "rnc_loss", "LabelDistance", "FeatureSimilarity"]

LabelDistance = Literal["l1", "l2"]
FeatureSimilarity = Literal["l2", "cosine"]


def _label_distances(a: Tensor, b: Tensor, kind: str) -> Tensor:
    """``[n, m]`` distances between label rows ``a [n, L]`` and ``b [m, L]``."""
    diff = a[:, None, :] - b[None, :, :]
    return diff.abs().sum(-1) if kind == "l1" else diff.pow(2).sum(-1).sqrt()


def _similarities(a: Tensor, b: Tensor, kind: str) -> Tensor:
    """``[n, m]`` feature similarities: negative Euclidean distance (``'l2'``) or cosine."""
    if kind == "cosine":
        return torch.nn.functional.normalize(a, dim=-1) @ torch.nn.functional.normalize(b, dim=-1).T
    # ||a - b|| from the differences themselves (not the expanded dot product, which cancels catastrophically for
    # close features), without materialising the [n, m, dim] difference tensor; cdist's gradient at distance 0 is 0
    return -torch.cdist(a, b, p=2.0, compute_mode="donot_use_mm_for_euclid_dist")


def rnc_loss(
    features: Tensor,
    labels: Tensor,
    temperature: float = 2.0,
    label_distance: LabelDistance = "l1",
    feature_similarity: FeatureSimilarity = "l2",
    gather_distributed: bool = False,
    check_finite: bool = True,
) -> Tensor:
    """Rank-N-Contrast loss (see the module docstring).

    Args:
        features: ``[bsz, n_views, dim]`` embeddings (not normalised for ``'l2'``, as in the reference).
        labels: ``[bsz]`` or ``[bsz, label_dim]`` regression targets or ordinal ranks (any numeric dtype).
        temperature: tau > 0 (reference default 2).
        label_distance: ``'l1'`` (reference default) or ``'l2'``.
        feature_similarity: ``'l2'`` (negative Euclidean distance, reference default) or ``'cosine'``.
        gather_distributed: contrast against the views of every process (DDP); see the module docstring.
        check_finite: check for NaN/inf features and labels (deferred inside a Trainer's step).

    Returns:
        a float32 scalar with gradient (float64 for float64 features); 0 for a single view in the
        whole batch (nothing to rank against).
    """
    check_tensor("features", features, dim=3, floating=True, layout="[bsz, n_views, dim]", hint="two augmented views per image")
    bsz, n_views, _ = features.shape
    if bsz == 0:
        raise ValueError("Rank-N-Contrast loss: features hold no samples")
    y = labels.reshape(bsz, -1) if labels.dim() <= 2 and labels.shape[0] == bsz else None
    if y is None:
        raise ValueError(f"Rank-N-Contrast loss: labels must be [bsz]={bsz} or [bsz, label_dim], got shape {tuple(labels.shape)}")
    temperature = check_float("temperature", temperature, minimum=0.0, strict_minimum=True)
    check_choice("label_distance", label_distance, LabelDistance)
    check_choice("feature_similarity", feature_similarity, FeatureSimilarity)
    dtype = compute_dtype(features)
    with torch.autocast(device_type=features.device.type, enabled=False):
        f = features.to(dtype)
        y = y.to(device=f.device, dtype=dtype)
        distributed = gather_distributed and dist_utils.is_distributed()
        gathered = dist_utils.gather(f) if distributed else f
        all_y = dist_utils.gather_no_grad(y) if distributed else y
        offset = dist_utils.local_offset(bsz, f.device) if distributed else 0
        if check_finite:  # on the gathered batch: every rank raises together
            require(
                torch.isfinite(gathered),
                "Rank-N-Contrast loss: features contain NaN or inf (training diverged?); lower "
                "the learning rate, use gradient clipping, or check the inputs",
            )
            require(torch.isfinite(all_y), "Rank-N-Contrast loss: labels contain NaN or inf; check the data's targets")
        n_global = gathered.shape[0]
        # views, view-major: entry v * B + s is view v of sample s (anchors: this rank's views)
        contrast = gathered.transpose(0, 1).reshape(n_views * n_global, -1)
        contrast_y = all_y.repeat(n_views, 1)
        anchors = f.transpose(0, 1).reshape(n_views * bsz, -1)
        anchor_y = y.repeat(n_views, 1)
        m = contrast.shape[0]
        if m < 2:
            return f.sum() * 0.0
        views = torch.arange(n_views, device=f.device).repeat_interleave(bsz)
        self_idx = views * n_global + offset + torch.arange(bsz, device=f.device).repeat(n_views)  # [n_anchor]
        logits = _similarities(anchors, contrast, feature_similarity) / temperature  # [n_anchor, m]
        dist = _label_distances(anchor_y, contrast_y, label_distance)  # [n_anchor, m]
        is_self = torch.zeros_like(dist, dtype=torch.bool).scatter_(1, self_idx[:, None], True)
        dist = dist.masked_fill(is_self, float("-inf"))  # never a negative of anyone, never counted
        # c_ij = #{k != i: d_ik >= d_ij}; the c_ij farthest views lead the descending order
        ascending, _ = torch.sort(dist, dim=1)
        count = m - torch.searchsorted(ascending, dist.contiguous(), right=False)  # [n_anchor, m], >= 1 off the diagonal
        order = torch.argsort(dist, dim=1, descending=True)
        running = torch.logcumsumexp(torch.gather(logits, 1, order), dim=1)  # log sum over the first c farthest
        log_denominator = torch.gather(running, 1, (count - 1).clamp(0, m - 1))
        terms = (logits - log_denominator).masked_fill(is_self, 0.0)
        per_anchor = -terms.sum(dim=1) / (m - 1)
    if gather_distributed:
        return dist_utils.global_mean(per_anchor)
    return per_anchor.mean()


class RnCLoss(Loss):
    """Rank-N-Contrast loss (Zha et al., NeurIPS 2023; see :func:`rnc_loss`).

    Args:
        temperature: tau > 0 (reference default 2).
        label_distance: ``'l1'`` (default) or ``'l2'``.
        feature_similarity: ``'l2'`` (negative Euclidean distance, default) or ``'cosine'``.
        gather_distributed: contrast against every process's views under DDP.
        check_finite: check for NaN/inf features and labels.

    Shapes: ``forward(features [bsz, n_views, dim], labels [bsz] or [bsz, L]) -> loss []``.

    Example:
        >>> loss_fn = RnCLoss(temperature=2.0)
        >>> z = torch.randn(8, 2, 16, requires_grad=True)
        >>> loss_fn(z, torch.randint(0, 5, (8,))).backward()
    """

    def __init__(
        self,
        temperature: float = 2.0,
        label_distance: LabelDistance = "l1",
        feature_similarity: FeatureSimilarity = "l2",
        gather_distributed: bool = False,
        check_finite: bool = True,
    ) -> None:
        super().__init__()
        self.temperature = check_float("temperature", temperature, minimum=0.0, strict_minimum=True)
        self.label_distance = check_choice("label_distance", label_distance, LabelDistance)
        self.feature_similarity = check_choice("feature_similarity", feature_similarity, FeatureSimilarity)
        self.gather_distributed = bool(gather_distributed)
        self.check_finite = bool(check_finite)

    def forward(self, features: Tensor, labels: Tensor) -> Tensor:
        return rnc_loss(
            features, labels, self.temperature, self.label_distance, self.feature_similarity, self.gather_distributed, self.check_finite
        )
