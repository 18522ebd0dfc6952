"""Projection heads shared by the methods."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from cloc_lightning.validation import check_int

__all__ = ["MLPHead"]


class MLPHead(nn.Module):
    """``Linear -> [BatchNorm1d] -> ReLU -> ... -> Linear``, optionally L2-normalised.

    The projectors of the methods here are instances of it:

    * SupCon/SimCLR (Khosla et al. 2020; Chen et al. 2020):
      ``MLPHead(d, d, 128, normalize=True)`` (``d -> d -> 128``, biases, no BN).
    * ReLIC-sigmoid (Mitrovic et al. 2020; seed ``scl_train``):
      ``MLPHead(d, 512, 64, batch_norm=True, bias=False)``
      (Linear without bias -> BatchNorm1d -> ReLU -> Linear without bias).

    Args:
        in_dim: input features ``[B, in_dim]``.
        hidden_dim: width of the hidden layer(s).
        out_dim: output features ``[B, out_dim]``.
        num_layers: number of Linear layers (>= 1; 1 is a linear projection).
        batch_norm: BatchNorm1d after every hidden Linear.
        bias: bias in the Linear layers.
        normalize: L2-normalise the output along the last dimension.
    """

    def __init__(
        self,
        in_dim: int,
        hidden_dim: int,
        out_dim: int,
        num_layers: int = 2,
        batch_norm: bool = False,
        bias: bool = True,
        normalize: bool = False,
    ) -> None:
        super().__init__()
        check_int("num_layers", num_layers, 1)
        layers: list[nn.Module] = []
        dim = in_dim
        for _ in range(num_layers - 1):
            layers.append(nn.Linear(dim, hidden_dim, bias=bias))
            if batch_norm:
                layers.append(nn.BatchNorm1d(hidden_dim))
            layers.append(nn.ReLU(inplace=True))
            dim = hidden_dim
        layers.append(nn.Linear(dim, out_dim, bias=bias))
        self.net = nn.Sequential(*layers)
        self.normalize = normalize
        self.out_dim = out_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, in_dim] -> [B, out_dim]``."""
        y = self.net(x)
        return F.normalize(y, dim=-1) if self.normalize else y
