"""OrdinalCLIP training loss: cross-entropy over ranks + KL over the batch for each rank.

OrdinalCLIP (Li et al., NeurIPS 2022, arXiv 2206.02338; reference code
https://github.com/xk-huang/OrdinalCLIP, ``ordinalclip/runner/runner.py``:
``compute_losses`` / ``compute_kl_loss``) trains with two terms on the image–prototype logits
``[N, R]`` (N images, R ranks):

* **CE**: ``mean_i  -log softmax_r(logits[i])[y_i]`` (image → text direction);
* **KL** (text → image direction): for every rank r *present in the batch*, the distribution
  over the batch ``p_r = softmax_i(logits[:, r])`` is pulled towards the soft target
  ``q_r = softmax_i(s * 1[y_i == r])`` (s = ``target_sharpness`` = 10 in the reference):

      KL = (1 / |present|) * sum_{r present} sum_i q_r[i] * (log q_r[i] - log p_r[i])

  i.e. ``KLDivLoss(reduction="sum")(log_softmax(logits.T, -1), q) / num_present`` with
  ``q`` zero for absent ranks — exactly the reference. The KL is ``KL(q || p)``
  (target first), its reduction is a sum over ranks and images divided by the number of
  present ranks (not by N or R).

Total = ``ce_weight * CE + kl_weight * KL``. Computed in float32 (float64 for float64 logits) with
autocast off, whatever the input dtype.
The KL term is per process (the batch softmax runs over the local batch), as in the reference.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from cloc_lightning.losses.base import Loss, LossOutput, check_rank_labels, compute_dtype
from cloc_lightning.validation import check_float, check_tensor

__all__ = ["ordinal_clip_loss", "OrdinalCLIPLoss"]


def ordinal_clip_loss(
    logits: Tensor,
    labels: Tensor,
    ce_weight: float = 1.0,
    kl_weight: float = 1.0,
    target_sharpness: float = 10.0,
    check_finite: bool = True,
) -> tuple[Tensor, dict[str, Tensor]]:
    """OrdinalCLIP loss ``ce_weight * CE + kl_weight * KL`` (see the module docstring).

    Args:
        logits: ``[N, R]`` image–prototype logits (``exp(logit_scale) * cos``), any float dtype.
        labels: ``[N]`` integer ranks in ``[0, R)``.
        ce_weight: weight of the cross-entropy term (>= 0).
        kl_weight: weight of the KL term (>= 0).
        target_sharpness: s in the soft target ``softmax_i(s * onehot)``; 10 in the reference.
        check_finite: raise a ValueError on NaN/inf logits or out-of-range labels (one
            device sync); turn off to skip the check.

    Returns:
        ``(total, {"ce": ce, "kl": kl})``: ``total`` a float32 scalar with gradient (float64 for
        float64 logits); the parts are detached scalars of the same dtype, for logging.
    """
    check_tensor("logits", logits, dim=2, floating=True, layout="[N, R]", hint="images x ranks")
    n, num_ranks = logits.shape
    if n == 0 or num_ranks < 2:
        raise ValueError(f"logits must have N >= 1 rows and R >= 2 columns, got shape {tuple(logits.shape)}")
    labels = check_rank_labels(logits, labels, num_ranks, "OrdinalCLIP loss", check_finite)

    dtype = compute_dtype(logits)  # float32 (float64 for float64 logits), autocast off
    with torch.autocast(device_type=logits.device.type, enabled=False):
        x = logits.to(dtype)
        ce = F.cross_entropy(x, labels)

        onehot = F.one_hot(labels, num_ranks).to(dtype)  # [N, R]
        present = onehot.sum(dim=0) > 0  # [R]
        log_q = torch.log_softmax(target_sharpness * onehot, dim=0)  # soft targets over the batch, per rank
        log_p = torch.log_softmax(x, dim=0)  # model distribution over the batch, per rank
        kl_per_rank = (log_q.exp() * (log_q - log_p)).sum(dim=0)  # [R]
        kl = kl_per_rank.masked_fill(~present, 0.0).sum() / present.sum().to(dtype)

        total = ce_weight * ce + kl_weight * kl
    return total, {"ce": ce.detach(), "kl": kl.detach()}


class OrdinalCLIPLoss(Loss):
    """OrdinalCLIP's CE + KL rank loss on image–prototype logits (Li et al. 2022, arXiv 2206.02338).

    See :func:`ordinal_clip_loss` for the formula; reference ``Runner.compute_losses`` in
    xk-huang/OrdinalCLIP (``ce_loss`` + ``kl_loss``, both weight 1 by default).

    Args:
        ce_weight: weight of the cross-entropy over ranks (>= 0).
        kl_weight: weight of the KL over the batch per present rank (>= 0).
        target_sharpness: s of the soft targets ``softmax_i(s * 1[y_i == r])`` (reference: 10).
        check_finite: raise a clear ValueError on NaN/inf logits or labels out of range.

    Shapes:
        ``forward(logits [N, R], labels [N]) -> total []``;
        ``compute(logits, labels) -> LossOutput(total [], {"ce": [], "kl": []})``.

    Example:
        >>> loss_fn = OrdinalCLIPLoss(ce_weight=1.0, kl_weight=1.0)
        >>> logits = torch.randn(8, 5, requires_grad=True)
        >>> total, parts = loss_fn.compute(logits, torch.randint(0, 5, (8,)))
        >>> total.backward()
    """

    def __init__(
        self,
        ce_weight: float = 1.0,
        kl_weight: float = 1.0,
        target_sharpness: float = 10.0,
        check_finite: bool = True,
    ) -> None:
        super().__init__()
        self.ce_weight = check_float("ce_weight", ce_weight, minimum=0.0)
        self.kl_weight = check_float("kl_weight", kl_weight, minimum=0.0)
        if self.ce_weight == 0 and self.kl_weight == 0:
            raise ValueError("ce_weight and kl_weight are both 0; at least one term must be used")
        self.target_sharpness = check_float("target_sharpness", target_sharpness, minimum=0.0)
        self.check_finite = bool(check_finite)

    def compute(self, logits: Tensor, labels: Tensor) -> LossOutput:
        """``logits [N, R]``, ``labels [N]`` → ``LossOutput(total, {"ce", "kl"})`` (see :func:`ordinal_clip_loss`)."""
        total, parts = ordinal_clip_loss(logits, labels, self.ce_weight, self.kl_weight, self.target_sharpness, self.check_finite)
        return LossOutput(total, parts)

    def forward(self, logits: Tensor, labels: Tensor) -> Tensor:
        """The total ``ce_weight * CE + kl_weight * KL`` (the parts: :meth:`compute`)."""
        return self.compute(logits, labels).loss

    def extra_repr(self) -> str:
        return f"ce_weight={self.ce_weight}, kl_weight={self.kl_weight}, target_sharpness={self.target_sharpness}"
