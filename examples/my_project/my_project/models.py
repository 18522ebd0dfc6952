"""A new supervised method: the mean-variance loss of Pan et al. (CVPR 2018) on cloc-lightning's CE module."""

from typing import Any

import torch
from torch import nn

from cloc_lightning.methods import CEModule


class MeanVarianceLoss(nn.Module):
    """Cross-entropy + ``lambda_mean`` x the squared error of the softmax mean + ``lambda_var`` x its variance.

    Pan, Han, Shan, Chen: "Mean-Variance Loss for Deep Age Estimation from a Face", CVPR 2018 (eq. 1-5).
    """

    def __init__(self, lambda_mean: float, lambda_var: float) -> None:
        super().__init__()
        self.lambda_mean = lambda_mean
        self.lambda_var = lambda_var

    def forward(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        p = logits.softmax(dim=1)
        ranks = torch.arange(logits.shape[1], device=logits.device, dtype=p.dtype)
        mean = p @ ranks
        var = (p * (ranks - mean[:, None]) ** 2).sum(dim=1)
        mean_loss = 0.5 * (mean - labels.to(p.dtype)) ** 2
        ce = nn.functional.cross_entropy(logits, labels)
        return ce + self.lambda_mean * mean_loss.mean() + self.lambda_var * var.mean()


class MeanVarianceModule(CEModule):
    """CE's backbone, head, metrics and logging, trained with the mean-variance loss.

    Args:
        lambda_mean: weight of the mean loss.
        lambda_var: weight of the variance loss.
    """

    def __init__(self, lambda_mean: float = 0.2, lambda_var: float = 0.05, **kwargs: Any) -> None:
        self.lambda_mean = lambda_mean  # before super().__init__: the base calls build_loss from its constructor
        self.lambda_var = lambda_var
        super().__init__(**kwargs)

    def build_loss(self) -> nn.Module:
        return MeanVarianceLoss(self.lambda_mean, self.lambda_var)
