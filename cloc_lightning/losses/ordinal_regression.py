"""Rank-consistent ordinal regression losses: CORAL and CORN (K classes -> K - 1 binary tasks).

Both predict, for an ordinal label ``y`` in ``0..K-1``, the K - 1 binary events "y > k"
(k = 0..K-2) from K - 1 logits per sample, and read the rank as the number of events
predicted true.

* **CORAL** (Cao, Mirjalili, Raschka, "Rank consistent ordinal regression for neural networks
  with application to age estimation", Pattern Recognition Letters 2020; arXiv 1901.07884).
  The K - 1 logits share one weight vector and differ by their biases (the head:
  :class:`~cloc_lightning.nn.ordinal_heads.CORALHead`); every sample trains every task with the
  binary target ``1[y > k]``:

      L = -(1/N) sum_i sum_k  lambda_k * [ t_ik log s(z_ik) + (1 - t_ik) log(1 - s(z_ik)) ],   t_ik = 1[y_i > k]

  with ``s`` the logistic sigmoid and ``lambda_k`` optional task weights (1 by default, as in
  the paper's experiments).  ``P(y > k) = s(z_k)``.

* **CORN** (Shi, Cao, Raschka, "Deep neural networks for rank-consistent ordinal regression
  based on conditional training", Pattern Analysis and Applications 2023; arXiv 2111.08851).
  Task k is trained only on the samples with ``y >= k`` (``y > k - 1``), so its logit models
  the *conditional* probability ``P(y > k | y > k - 1)``; the loss is the binary cross-entropy
  summed over every (sample, task) pair in the conditional subsets, divided by the number of
  such pairs:

      L = - sum_k sum_{i: y_i >= k} [ t_ik log s(z_ik) + (1 - t_ik) log(1 - s(z_ik)) ]  /  sum_k |{i: y_i >= k}|

  ``P(y > k) = prod_{j <= k} s(z_j)`` (the chain rule), non-increasing in k by construction.

The reference implementation of both is ``coral_pytorch`` (``coral_pytorch.losses.coral_loss``,
``corn_loss``; ``coral_pytorch.dataset.corn_label_from_logits``); the tests compare with
loops of the formulas above and, where it installs, with ``coral_pytorch`` itself.  The
subsets are masks here, not boolean indexing, so the step never reads a device value.
Computed in float32 (float64 for float64 logits) with autocast off.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from cloc_lightning.losses.base import Loss, check_rank_labels, compute_dtype
from cloc_lightning.validation import check_int, check_tensor

__all__ = [
    "CORALLoss",
    "CORNLoss",
    "coral_loss",
    "corn_loss",
    "coral_exceedance",
    "corn_exceedance",
    "rank_from_exceedance",
    "class_probabilities_from_exceedance",
]


def _check(logits: Tensor, labels: Tensor, owner: str, check_finite: bool) -> tuple[int, Tensor]:
    """``(K, labels as long)`` after the shape, dtype and (device-side) value checks."""
    check_tensor("logits", logits, dim=2, floating=True, layout="[N, K-1]", hint="one logit per threshold 'y > k'")
    n, tasks = logits.shape
    if n == 0 or tasks < 1:
        raise ValueError(f"{owner}: logits must have N >= 1 rows and K - 1 >= 1 columns, got shape {tuple(logits.shape)}")
    per_sample = f" for {tasks} logits per sample (K - 1 for K classes)"
    return tasks + 1, check_rank_labels(logits, labels, tasks + 1, owner, check_finite, per_sample)


def _binary_log_likelihood(z: Tensor, target: Tensor) -> Tensor:
    """``t log s(z) + (1 - t) log(1 - s(z))`` elementwise, stably (``log(1 - s(z)) = log s(z) - z``)."""
    log_s = F.logsigmoid(z)
    return target * log_s + (1.0 - target) * (log_s - z)


def coral_loss(logits: Tensor, labels: Tensor, importance_weights: Tensor | None = None, check_finite: bool = True) -> Tensor:
    """CORAL loss (see the module docstring): mean over samples of the weighted binary cross-entropies of all K - 1 tasks.

    Args:
        logits: ``[N, K-1]`` logits of the events ``y > k``, any float dtype.
        labels: ``[N]`` integer ranks in ``[0, K)``.
        importance_weights: optional ``[K-1]`` task weights ``lambda_k`` (default all 1).
        check_finite: check for NaN/inf logits and labels out of range (deferred inside a Trainer's step).

    Returns:
        a float32 scalar with gradient (float64 for float64 logits).
    """
    num_classes, labels = _check(logits, labels, "CORAL loss", check_finite)
    dtype = compute_dtype(logits)
    with torch.autocast(device_type=logits.device.type, enabled=False):
        z = logits.to(dtype)
        thresholds = torch.arange(num_classes - 1, device=z.device)
        target = (labels[:, None] > thresholds[None, :]).to(dtype)  # [N, K-1]: 1[y > k]
        ll = _binary_log_likelihood(z, target)
        if importance_weights is not None:
            w = importance_weights.to(device=z.device, dtype=dtype)
            if w.shape != (num_classes - 1,):
                raise ValueError(f"importance_weights must have shape [K-1]=[{num_classes - 1}], got {tuple(w.shape)}")
            ll = ll * w
        return -ll.sum(dim=1).mean()


def corn_loss(logits: Tensor, labels: Tensor, check_finite: bool = True) -> Tensor:
    """CORN loss (see the module docstring): binary cross-entropy over the conditional subsets ``y >= k``, per pair.

    Args:
        logits: ``[N, K-1]`` logits of the conditional events ``y > k | y >= k``, any float dtype.
        labels: ``[N]`` integer ranks in ``[0, K)``.
        check_finite: check for NaN/inf logits and labels out of range (deferred inside a Trainer's step).

    Returns:
        a float32 scalar with gradient (float64 for float64 logits); 0 if no sample is in any subset
        (impossible: every sample is in subset 0).
    """
    num_classes, labels = _check(logits, labels, "CORN loss", check_finite)
    dtype = compute_dtype(logits)
    with torch.autocast(device_type=logits.device.type, enabled=False):
        z = logits.to(dtype)
        thresholds = torch.arange(num_classes - 1, device=z.device)
        in_subset = (labels[:, None] >= thresholds[None, :]).to(dtype)  # [N, K-1]: task k sees y >= k
        target = (labels[:, None] > thresholds[None, :]).to(dtype)
        ll = _binary_log_likelihood(z, target) * in_subset
        return -ll.sum() / in_subset.sum().clamp_min(1.0)


def coral_exceedance(logits: Tensor) -> Tensor:
    """``P(y > k)`` ``[N, K-1]`` of CORAL logits: ``sigmoid(z_k)``."""
    return torch.sigmoid(logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits)


def corn_exceedance(logits: Tensor) -> Tensor:
    """``P(y > k)`` ``[N, K-1]`` of CORN logits: the cumulative product of the conditional ``sigmoid(z_j)``, j <= k."""
    return torch.cumprod(coral_exceedance(logits), dim=1)


def rank_from_exceedance(exceedance: Tensor) -> Tensor:
    """The predicted rank ``[N]``: the number of events ``y > k`` with probability > 0.5 (both papers' rule)."""
    return (exceedance > 0.5).sum(dim=1)


def class_probabilities_from_exceedance(exceedance: Tensor) -> Tensor:
    """``P(y = k)`` ``[N, K]`` from ``P(y > k)`` ``[N, K-1]``: ``P(y > k-1) - P(y > k)`` with ``P(y > -1) = 1``, ``P(y > K-1) = 0``.

    Non-negative for CORN (its exceedance is non-increasing); for CORAL only when its biases are
    ordered, so negative differences are clamped to 0 and the rows renormalised.  The expected
    rank ``sum_k P(y > k)`` equals ``sum_k k P(y = k)`` whenever no clamping was needed.
    """
    ones = torch.ones_like(exceedance[:, :1])
    upper = torch.cat([ones, exceedance], dim=1)
    lower = torch.cat([exceedance, torch.zeros_like(ones)], dim=1)
    probs = (upper - lower).clamp_min(0.0)
    return probs / probs.sum(dim=1, keepdim=True).clamp_min(torch.finfo(probs.dtype).tiny)


class CORALLoss(Loss):
    """CORAL's loss over ``K - 1`` logits (Cao et al. 2020, arXiv 1901.07884; see :func:`coral_loss`).

    Args:
        num_classes: K (>= 2): the logits have ``K - 1`` columns.
        importance_weights: optional ``K - 1`` task weights (default all 1).
        check_finite: check for NaN/inf logits and labels out of range.

    Shapes: ``forward(logits [N, K-1], labels [N]) -> loss []``.

    Example:
        >>> loss_fn = CORALLoss(num_classes=5)
        >>> logits = torch.randn(8, 4, requires_grad=True)
        >>> loss_fn(logits, torch.randint(0, 5, (8,))).backward()
    """

    importance_weights: Tensor | None

    def __init__(self, num_classes: int, importance_weights: list[float] | None = None, check_finite: bool = True) -> None:
        super().__init__()
        self.num_classes = check_int("num_classes", num_classes, 2)
        if importance_weights is not None:
            w = torch.as_tensor(importance_weights, dtype=torch.float32)
            if w.shape != (self.num_classes - 1,) or not bool(torch.isfinite(w).all()) or bool((w < 0).any()):
                raise ValueError(
                    f"importance_weights must be {self.num_classes - 1} finite numbers >= 0 (one per threshold "
                    f"'y > k' of num_classes={self.num_classes}), got {importance_weights!r}"
                )
            self.register_buffer("importance_weights", w)
        else:
            self.importance_weights = None
        self.check_finite = bool(check_finite)

    def forward(self, logits: Tensor, labels: Tensor) -> Tensor:
        if logits.dim() == 2 and logits.shape[1] != self.num_classes - 1:
            raise ValueError(
                f"CORALLoss(num_classes={self.num_classes}) needs [N, {self.num_classes - 1}] logits, got {tuple(logits.shape)}"
            )
        return coral_loss(logits, labels, self.importance_weights, self.check_finite)


class CORNLoss(Loss):
    """CORN's conditional loss over ``K - 1`` logits (Shi et al. 2023, arXiv 2111.08851; see :func:`corn_loss`).

    Args:
        num_classes: K (>= 2): the logits have ``K - 1`` columns.
        check_finite: check for NaN/inf logits and labels out of range.

    Shapes: ``forward(logits [N, K-1], labels [N]) -> loss []``.
    """

    def __init__(self, num_classes: int, check_finite: bool = True) -> None:
        super().__init__()
        self.num_classes = check_int("num_classes", num_classes, 2)
        self.check_finite = bool(check_finite)

    def forward(self, logits: Tensor, labels: Tensor) -> Tensor:
        if logits.dim() == 2 and logits.shape[1] != self.num_classes - 1:
            raise ValueError(
                f"CORNLoss(num_classes={self.num_classes}) needs [N, {self.num_classes - 1}] logits, got {tuple(logits.shape)}"
            )
        return corn_loss(logits, labels, self.check_finite)
