"""The CORAL and CORN heads (``cloc_lightning/nn/ordinal_heads.py``); their losses: ``tests/losses/test_ordinal_regression.py``."""

from __future__ import annotations

import pytest
import torch

from cloc_lightning.nn.ordinal_heads import CORALHead, CORNHead


def test_heads() -> None:
    x = torch.randn(7, 12)
    coral = CORALHead(12, 5)
    out = coral(x)
    assert out.shape == (7, 4)
    # shared weights: the logits of one sample differ by the (ordered) biases only
    torch.testing.assert_close(out[:, 0:1] - out, (coral.biases[0] - coral.biases).expand(7, 4))
    assert torch.all(coral.biases[:-1] > coral.biases[1:])
    corn = CORNHead(12, 5)
    assert corn(x).shape == (7, 4) and corn.num_classes == 5
    with pytest.raises(ValueError, match="num_classes"):
        CORALHead(12, 1)
