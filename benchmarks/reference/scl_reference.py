"""The seed's ``scl_loss``, reimplemented for the benchmark only.

A faithful reimplementation (our own code) of the straightforward computation in
"Sigmoid Contrastive Loss for Vision" (F. Basara, https://github.com/filipbasara0/sigmoid-contrastive-loss,
``scl/scl.py`` ``scl_loss``; package ``sigmoid-contrastive-learning``).  It performs the
same tensor operations, so its speed and memory are representative: normalisation, an
``[n, n]`` label matrix ``2I - 1`` built with ``torch.eye``, ``labels * logits``,
``sigmoid``, the penalty ``(1 - p) ** gamma``, ``F.logsigmoid`` and the masked sum, then
the invariance term as ``F.kl_div(F.log_softmax(logits, 1), F.softmax(logits, 0).t(),
reduction="batchmean")``, each a separate op that autograd differentiates.  Penalty
filtering (the seed's later ``penalty_filtering`` option, from ``global_step >
filtering_warmup_steps`` on) sums the kept pairs' ``-logsigmoid`` -- keep-mask ``(penalty >
threshold) | positives`` -- without the penalty weight.  Not used by the library; see
:mod:`cloc_lightning.losses.sigmoid` for the real loss.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def scl_reference(
    x: torch.Tensor,
    x_prime: torch.Tensor,
    tau: torch.Tensor,
    b: torch.Tensor,
    alpha: float = 0.0,
    max_tau: float = 5.0,
    gamma: float = 0.0,
    global_step: int = -1,
    penalty_filtering: bool = False,
    filtering_warmup_steps: int = 5000,
    filtering_threshold: float = 0.05,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(loss, invariance_loss)`` computed op by op as the seed does.

    Args:
        x: online projections [n, dim]; x_prime: target projections [n, dim].
        tau: log logit scale (0-d tensor); b: logit bias (0-d tensor).

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
    if penalty_filtering and global_step > filtering_warmup_steps:
        keep = (penalty > filtering_threshold) | (labels > 0)
        terms = F.logsigmoid(signed) * keep  # the penalty selects; kept pairs are unweighted
    else:
        terms = penalty * F.logsigmoid(signed)
    loss = -torch.sum(terms) / n

    log_p = F.log_softmax(logits, dim=1)
    target = F.softmax(logits, dim=0).t()
    invariance = F.kl_div(log_p, target, reduction="batchmean")
    return loss + alpha * invariance, invariance
