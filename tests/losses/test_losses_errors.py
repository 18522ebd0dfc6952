"""Bad input every loss with labels checks alike: labels out of range or not integers, NaN/inf features.

Each loss's own degenerate batches (a batch of one, a single class) are tested beside it (``test_cloc.py``,
``test_supcon.py``, ``test_sigmoid.py``, ``test_rank_prompt.py``); low-precision inputs in
``test_autocast.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from cloc_lightning.losses import (
    OrdinalCLIPLoss,
    OrdinalContrastiveLoss_mm,
    OrdinalContrastiveLoss_sm,
    SupConLoss,
)

# =============================================================================================
# bad input
# =============================================================================================
LABEL_LOSSES: dict[str, Callable[[torch.Tensor, torch.Tensor], Any]] = {
    "cloc_mm": lambda x, y: OrdinalContrastiveLoss_mm(4)(x, y),
    "cloc_sm": lambda x, y: OrdinalContrastiveLoss_sm(4)(x, y),
    "supcon": lambda x, y: SupConLoss(0.1)(F.normalize(x, dim=-1).unsqueeze(1), y),
    "ordinal_clip": lambda x, y: OrdinalCLIPLoss()(x, y),
}


@pytest.mark.parametrize("loss", sorted(LABEL_LOSSES))
@pytest.mark.parametrize(
    "labels, error, match",
    [
        ([0, 1, 4, 2], ValueError, r"\[0, 4\)"),  # one past the last class
        ([0, -1, 2, 3], ValueError, r"\[0, 4\)"),  # negative
        ([0.0, 1.0, 2.0, 3.0], TypeError, r"\.long\(\)"),  # float labels
        ([True, False, True, True], TypeError, r"\.long\(\)"),  # bool labels
    ],
    ids=["too-large", "negative", "float", "bool"],
)
def test_labels_out_of_range_or_not_integer(loss: str, labels: list, error: type, match: str) -> None:
    x = torch.randn(4, 4)
    y = torch.tensor(labels)
    if loss == "supcon" and error is ValueError:
        # SupCon labels are class *ids* (any integers; the module maps unlabelled -1 to own ids): no range
        value = LABEL_LOSSES[loss](x, y)
        assert torch.isfinite(value)
        return
    with pytest.raises(error, match=match):
        LABEL_LOSSES[loss](x, y)


# ---------------------------------------------------------------- NaN / inf
NAN_LOSSES: dict[str, Callable[[torch.Tensor], Any]] = {
    "cloc_mm": lambda x: OrdinalContrastiveLoss_mm(4)(x, torch.tensor([0, 1, 2, 3])),
    "cloc_sm": lambda x: OrdinalContrastiveLoss_sm(4)(x, torch.tensor([0, 1, 2, 3])),
    "supcon": lambda x: SupConLoss(0.1)(x.unsqueeze(1), torch.tensor([0, 1, 2, 3])),
    "simclr": lambda x: SupConLoss(0.1)(torch.stack([x, x], 1)),
    "ordinal_clip": lambda x: OrdinalCLIPLoss()(x, torch.tensor([0, 1, 2, 3])),
}


@pytest.mark.parametrize("loss", sorted(NAN_LOSSES))
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")], ids=["nan", "inf", "-inf"])
def test_non_finite_features_are_a_clear_error(loss: str, bad: float) -> None:
    x = torch.randn(4, 4)
    x[2, 1] = bad
    with pytest.raises(ValueError, match="NaN or inf|NaN/inf") as info:
        NAN_LOSSES[loss](x)
    assert "learning rate" in str(info.value)  # names the fix
