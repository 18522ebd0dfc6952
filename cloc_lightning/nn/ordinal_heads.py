"""Ordinal regression heads with ``K - 1`` outputs: CORAL (shared weights, K - 1 biases) and CORN (a linear layer).

Their logits go to :class:`~cloc_lightning.losses.ordinal_regression.CORALLoss` /
:class:`~cloc_lightning.losses.ordinal_regression.CORNLoss`; the probabilities ``P(y > k)`` come
from :func:`~cloc_lightning.losses.ordinal_regression.coral_exceedance` /
:func:`~cloc_lightning.losses.ordinal_regression.corn_exceedance`.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from cloc_lightning.validation import check_int

__all__ = ["CORALHead", "CORNHead"]


class CORALHead(nn.Module):
    """CORAL's output layer (Cao et al. 2020): ``z_k = w . x + b_k`` for k = 0..K-2.

    One weight vector shared by the K - 1 binary tasks (what makes the predicted exceedance
    probabilities rank-consistent at the optimum: the biases are then non-increasing) and one
    bias per task.  The biases start at ``0, -1/(K-1), ..., -(K-2)/(K-1)`` -- ordered, as the
    consistency argument wants -- and the weight as ``nn.Linear``'s.

    Args:
        in_features: feature dimension.
        num_classes: K (>= 2).
    """

    def __init__(self, in_features: int, num_classes: int) -> None:
        super().__init__()
        self.in_features = check_int("in_features", in_features, 1)
        self.num_classes = check_int("num_classes", num_classes, 2)
        self.linear = nn.Linear(self.in_features, 1, bias=False)
        self.biases = nn.Parameter(-torch.arange(self.num_classes - 1, dtype=torch.float32) / (self.num_classes - 1))

    def forward(self, x: Tensor) -> Tensor:
        """``[N, in_features]`` -> ``[N, K-1]`` logits of the events ``y > k``."""
        out: Tensor = self.linear(x) + self.biases.to(x.dtype)
        return out


class CORNHead(nn.Linear):
    """CORN's output layer (Shi et al. 2023): a plain ``nn.Linear(in_features, K - 1)``; each output is
    the logit of the conditional event ``y > k | y >= k``.

    Args:
        in_features: feature dimension.
        num_classes: K (>= 2).
    """

    def __init__(self, in_features: int, num_classes: int) -> None:
        k = check_int("num_classes", num_classes, 2)
        super().__init__(check_int("in_features", in_features, 1), k - 1)
        self.num_classes = k
