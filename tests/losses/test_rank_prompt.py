"""The OrdinalCLIP loss (``cloc_lightning/losses/rank_prompt.py``): CE + KL over the ranks against the NumPy
reference of ``tests/references/ordinal_clip.py`` (values and gradients), bf16 inputs, degenerate batches,
bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cloc_lightning.losses.rank_prompt import OrdinalCLIPLoss, ordinal_clip_loss
from tests.losses.conftest import grad_check
from tests.references.ordinal_clip import ordinal_clip_loss_reference


@pytest.mark.parametrize("N", [1, 2, 7, 32])
@pytest.mark.parametrize("R", [2, 5, 17])
@pytest.mark.parametrize("weights", [(1.0, 1.0), (1.0, 0.0), (0.3, 2.0)])
@pytest.mark.parametrize("sharpness", [10.0, 1.0])
def test_loss_matches_numpy_reference(N, R, weights, sharpness):
    g = torch.Generator().manual_seed(N * 100 + R)
    logits = (torch.randn(N, R, generator=g, dtype=torch.float64) * 5).requires_grad_(True)
    labels = torch.randint(0, R, (N,), generator=g)
    if N == 7:
        labels[:4] = labels[0]  # repeated ranks
    total, parts = OrdinalCLIPLoss(*weights, target_sharpness=sharpness).compute(logits, labels)
    total.backward()
    ref_total, ref_ce, ref_kl, ref_grad = ordinal_clip_loss_reference(logits.detach().numpy(), labels.numpy(), *weights, sharpness)
    assert total.dtype == torch.float64  # float64 logits (64-true) are computed in float64
    np.testing.assert_allclose(total.item(), ref_total, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(parts["ce"].item(), ref_ce, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(parts["kl"].item(), ref_kl, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(logits.grad.numpy(), ref_grad, rtol=1e-8, atol=1e-12)


def test_numpy_reference_gradient_is_the_derivative():
    """The analytic gradient of the NumPy reference agrees with central differences of its value."""
    rng = np.random.default_rng(0)
    logits, labels = rng.normal(size=(6, 4)) * 2, np.array([0, 0, 2, 3, 3, 3])
    _, _, _, grad = ordinal_clip_loss_reference(logits, labels, 0.7, 1.3, 10.0)
    num = np.zeros_like(logits)
    for i in range(6):
        for r in range(4):
            e = np.zeros_like(logits)
            e[i, r] = 1e-6
            num[i, r] = (
                ordinal_clip_loss_reference(logits + e, labels, 0.7, 1.3, 10.0)[0]
                - ordinal_clip_loss_reference(logits - e, labels, 0.7, 1.3, 10.0)[0]
            ) / 2e-6
    np.testing.assert_allclose(grad, num, rtol=1e-5, atol=1e-8)


def test_loss_bf16_stays_finite_and_float32():
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(16, 10, generator=g) * 100).bfloat16().requires_grad_(True)  # scale 1/0.01
    labels = torch.randint(0, 10, (16,), generator=g)
    total, _parts = ordinal_clip_loss(logits, labels)
    assert total.dtype == torch.float32 and torch.isfinite(total)
    total.backward()
    assert torch.isfinite(logits.grad.float()).all()
    ref_total = ordinal_clip_loss_reference(logits.detach().double().numpy(), labels.numpy(), 1.0, 1.0, 10.0)[0]
    np.testing.assert_allclose(total.item(), ref_total, rtol=1e-4)


def test_loss_bad_inputs():
    loss = OrdinalCLIPLoss()
    logits, labels = torch.randn(4, 3), torch.tensor([0, 1, 2, 1])
    with pytest.raises(ValueError, match="NaN"):
        loss(torch.full((4, 3), float("nan")), labels)
    with pytest.raises(ValueError, match="ranks in"):
        loss(logits, torch.tensor([0, 1, 3, 1]))
    with pytest.raises(ValueError, match="ranks in"):
        loss(logits, torch.tensor([0, -1, 2, 1]))
    with pytest.raises(TypeError, match="integer"):
        loss(logits, labels.float())
    with pytest.raises(ValueError, match="labels"):
        loss(logits, labels[:3])
    with pytest.raises(ValueError, match=r"\[N, R\]"):
        loss(logits[0], labels)
    with pytest.raises(ValueError, match="ce_weight"):
        OrdinalCLIPLoss(ce_weight=-1.0)
    with pytest.raises(ValueError, match="both 0"):
        OrdinalCLIPLoss(ce_weight=0.0, kl_weight=0.0)
    # the check can be turned off
    total = OrdinalCLIPLoss(check_finite=False)(torch.full((4, 3), float("nan")), labels)
    assert torch.isnan(total)


# ---------------------------------------------------------------- degenerate batches
@pytest.mark.parametrize("n", [1, 2, 5])
def test_ordinal_clip_loss_batch_of_one_and_single_class(n: int) -> None:
    torch.manual_seed(n)
    logits = (torch.randn(n, 4, dtype=torch.float64) * 5).requires_grad_(True)
    y = torch.full((n,), 2, dtype=torch.long)
    loss = OrdinalCLIPLoss()(logits, y)
    assert float(loss.detach()) == pytest.approx(ordinal_clip_loss_reference(logits.detach().numpy(), y.numpy())[0], rel=1e-6)
    grad_check(loss, logits)
