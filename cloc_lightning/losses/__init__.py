"""Contrastive and ordinal losses (each checked against an independent reference in ``tests/``).

- :class:`OrdinalContrastiveLoss_mm` / :class:`OrdinalContrastiveLoss_sm` — CLOC (Pitawela et al., CVPR 2025)
- :class:`SupConLoss` / :func:`supcon_loss` — SupCon and SimCLR (Khosla et al., NeurIPS 2020)
- :class:`OrdinalCLIPLoss` — OrdinalCLIP's CE + KL rank loss (Li et al., NeurIPS 2022)
- :class:`SigmoidContrastiveLoss` / :func:`sigmoid_contrastive_loss` — ReLIC's sigmoid loss with
  confidence penalty and KL invariance term (Basara 2024; SigLIP, Zhai et al. 2023; ReLIC, Mitrovic et al. 2020)
- :class:`CORALLoss` / :class:`CORNLoss` — rank-consistent ordinal regression (Cao et al. 2020; Shi et al. 2023)
- :class:`RnCLoss` / :func:`rnc_loss` — Rank-N-Contrast (Zha et al., NeurIPS 2023)

Every loss class follows one return contract (:mod:`cloc_lightning.losses.base`): calling it
returns the scalar to minimise; ``.compute(...)`` returns a :class:`LossOutput` with that
scalar and the named parts a method logs.
"""

from cloc_lightning.losses.base import Loss, LossOutput
from cloc_lightning.losses.cloc import OrdinalContrastiveLoss_mm, OrdinalContrastiveLoss_sm
from cloc_lightning.losses.cloc_margins import CLOCMargins, load_learnable_map
from cloc_lightning.losses.ordinal_regression import (
    CORALLoss,
    CORNLoss,
    class_probabilities_from_exceedance,
    coral_exceedance,
    coral_loss,
    corn_exceedance,
    corn_loss,
    rank_from_exceedance,
)
from cloc_lightning.losses.rank_prompt import OrdinalCLIPLoss, ordinal_clip_loss
from cloc_lightning.losses.rnc import RnCLoss, rnc_loss
from cloc_lightning.losses.sigmoid import SigmoidContrastiveLoss, sigmoid_contrastive_loss
from cloc_lightning.losses.supcon import SupConLoss, supcon_loss

__all__ = [
    "OrdinalContrastiveLoss_mm",
    "OrdinalContrastiveLoss_sm",
    "CLOCMargins",
    "load_learnable_map",
    "Loss",
    "LossOutput",
    "OrdinalCLIPLoss",
    "ordinal_clip_loss",
    "SupConLoss",
    "supcon_loss",
    "SigmoidContrastiveLoss",
    "sigmoid_contrastive_loss",
    "CORALLoss",
    "CORNLoss",
    "coral_loss",
    "corn_loss",
    "coral_exceedance",
    "corn_exceedance",
    "rank_from_exceedance",
    "class_probabilities_from_exceedance",
    "RnCLoss",
    "rnc_loss",
]
