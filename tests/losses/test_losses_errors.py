"""Reliability of the losses: bad labels, degenerate batches, NaN/inf features, low-precision inputs.

Degenerate-batch values are checked against the independent references of ``benchmarks/reference/``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from benchmarks.reference.cloc import cloc_loop_reference
from benchmarks.reference.ordinal_clip import ordinal_clip_loss_reference
from benchmarks.reference.sigmoid import sigmoid_loop_reference
from benchmarks.reference.supcon import supcon_loop_reference
from cloc_lightning.losses import (
    OrdinalCLIPLoss,
    OrdinalContrastiveLoss_mm,
    OrdinalContrastiveLoss_sm,
    SigmoidContrastiveLoss,
    SupConLoss,
    sigmoid_contrastive_loss,
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

# ---------------------------------------------------------------- degenerate batches
def _grad_check(loss: torch.Tensor, leaf: torch.Tensor) -> None:
    assert loss.dim() == 0 and bool(torch.isfinite(loss)), float(loss)
    loss.backward()
    assert leaf.grad is not None and bool(torch.isfinite(leaf.grad).all())


@pytest.mark.parametrize("mode", ["mm", "sm"])
@pytest.mark.parametrize("n", [1, 2, 6])
def test_cloc_batch_of_one_and_single_class(mode: str, n: int) -> None:
    torch.manual_seed(n)
    crit = OrdinalContrastiveLoss_mm(4) if mode == "mm" else OrdinalContrastiveLoss_sm(4)
    for y in (torch.zeros(n, dtype=torch.long), torch.full((n,), 3, dtype=torch.long)):
        x = torch.randn(n, 5, dtype=torch.float64, requires_grad=True)
        loss = crit(x, y)
        ref = float(cloc_loop_reference(x.detach(), y.tolist(), crit.margins().detach().double()))
        assert ref == 0.0 and float(loss.detach()) == 0.0  # no negatives (or no positives): nothing to separate
        _grad_check(loss, x)
    # two samples of two classes: each anchor has a negative but no positive -> 0 as well
    x = torch.randn(2, 5, dtype=torch.float64, requires_grad=True)
    y = torch.tensor([0, 2])
    loss = crit(x, y)
    assert float(loss.detach()) == float(cloc_loop_reference(x.detach(), y.tolist(), crit.margins().detach().double())) == 0.0
    _grad_check(loss, x)


@pytest.mark.parametrize("method", ["supcon", "simclr"])
@pytest.mark.parametrize("n, views", [(1, 1), (1, 2), (2, 1), (2, 2), (6, 2)])
def test_supcon_batch_of_one_and_single_class(method: str, n: int, views: int) -> None:
    torch.manual_seed(10 * n + views)
    f = F.normalize(torch.randn(n, views, 8, dtype=torch.float64), dim=-1).requires_grad_(True)
    labels = torch.zeros(n, dtype=torch.long) if method == "supcon" else None
    loss = SupConLoss(temperature=0.05)(f, labels)
    ref = float(supcon_loop_reference(f.detach(), labels, temperature=0.05))
    assert float(loss.detach()) == pytest.approx(ref, abs=1e-9)
    _grad_check(loss, f)


@pytest.mark.parametrize("n", [1, 2, 5])
def test_ordinal_clip_loss_batch_of_one_and_single_class(n: int) -> None:
    torch.manual_seed(n)
    logits = (torch.randn(n, 4, dtype=torch.float64) * 5).requires_grad_(True)
    y = torch.full((n,), 2, dtype=torch.long)
    loss = OrdinalCLIPLoss()(logits, y)
    assert float(loss.detach()) == pytest.approx(ordinal_clip_loss_reference(logits.detach().numpy(), y.numpy())[0], rel=1e-6)
    _grad_check(loss, logits)


@pytest.mark.parametrize("case", ["one", "two-identical", "four-identical", "two"])
def test_sigmoid_loss_batch_of_one_and_identical_samples(case: str) -> None:
    """No labels here: a batch of one has only its positive; identical samples make every negative look positive."""
    torch.manual_seed(3)
    n = {"one": 1, "two-identical": 2, "four-identical": 4, "two": 2}[case]
    x = torch.randn(1 if "identical" in case else n, 8, dtype=torch.float64).expand(n, 8).clone().requires_grad_(True)
    xp = (x.detach() + 0.1 * torch.randn(n, 8, dtype=torch.float64)).requires_grad_(True)
    tau = torch.tensor(math.log(5.0), dtype=torch.float64, requires_grad=True)
    b = torch.tensor(-5.0, dtype=torch.float64, requires_grad=True)
    loss, kl = sigmoid_contrastive_loss(x, xp, tau, b, alpha=1.0, gamma=1.0)
    ref = sigmoid_loop_reference(x.detach().numpy(), xp.detach().numpy(), math.log(5.0), -5.0, alpha=1.0, gamma=1.0)[0]
    assert float(loss.detach()) == pytest.approx(ref, rel=1e-9)
    if n == 1:
        assert float(kl.detach()) == 0.0  # one row: both soft-maxes are 1
    _grad_check(loss, x)
    assert all(t.grad is not None and bool(torch.isfinite(t.grad).all()) for t in (xp, tau, b))


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


@pytest.mark.parametrize("bad", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_sigmoid_loss_propagates_non_finite_features(bad: float) -> None:
    """Documented behaviour: the sigmoid loss has no input check (its hot path); NaN/inf gives a NaN loss,
    which every module's ``check_finite_loss`` stops before the update (``test_nan_inputs_stop_every_module...``)."""
    x = torch.randn(4, 8)
    x[1, 2] = bad
    loss, terms = SigmoidContrastiveLoss(alpha=1.0, gamma=1.0).compute(x, torch.randn(4, 8))
    kl = terms["invariance"]
    assert bool(torch.isnan(loss)) and bool(torch.isnan(kl))


def _views(x: torch.Tensor) -> torch.Tensor:
    return F.normalize(x.view(-1, 2, x.shape[1]), dim=-1)


#: (prepare the loss input from [32, 16] float64 data, the loss of that input and labels [32] % 6)
LOW_PRECISION_LOSSES: dict[
    str, tuple[Callable[[torch.Tensor], torch.Tensor], Callable[[torch.Tensor, torch.Tensor], torch.Tensor]]
] = {
    "cloc_mm": (lambda x: x, lambda x, y: OrdinalContrastiveLoss_mm(6, x.device, [["fixed", 0.3]] * 5)(x, y)),
    "cloc_sm": (lambda x: x, lambda x, y: OrdinalContrastiveLoss_sm(6, x.device, [["fixed", 0.3]])(x, y)),
    "supcon_t0.05": (_views, lambda f, y: SupConLoss(0.05)(f, y[::2])),
    "simclr_t0.05": (_views, lambda f, y: SupConLoss(0.05)(f)),
    "ordinal_clip": (lambda x: x[:, :6] * 30.0, lambda z, y: OrdinalCLIPLoss()(z, y)),
    "sigmoid": (lambda x: x, lambda z, y: SigmoidContrastiveLoss(alpha=1.0, gamma=1.0).to(z.device)(z[:16], z[16:])),
}


def _check_float32_inside(loss: str, dtype: torch.dtype, device: str) -> None:
    torch.manual_seed(0)
    prepare, fn = LOW_PRECISION_LOSSES[loss]
    z = prepare(torch.randn(32, 16, dtype=torch.float64)).to(device=device, dtype=dtype)
    y = (torch.arange(32) % 6).to(device)
    leaf = z.clone().requires_grad_(True)
    with torch.autocast(device, dtype=dtype):
        low = fn(leaf, y)
    assert low.dtype == torch.float32 and bool(torch.isfinite(low))
    low.backward()
    assert leaf.grad is not None and bool(torch.isfinite(leaf.grad).all())
    exact = fn(z.double(), y)  # the same low-precision-representable values, computed in float64
    assert float(low.detach()) == pytest.approx(float(exact.detach()), rel=2e-6, abs=1e-6)


@pytest.mark.parametrize("loss", sorted(LOW_PRECISION_LOSSES))
def test_losses_compute_in_float32_from_bf16_inputs(loss: str) -> None:
    """bf16 inputs under bf16 autocast give the float32 result (~1e-6), not a bf16 one (~1e-2 off), and stay finite."""
    _check_float32_inside(loss, torch.bfloat16, "cpu")


@pytest.mark.gpu  # also run by the GPU tier (`pytest -m gpu`, docs/gpu.md)
@pytest.mark.skipif(not torch.cuda.is_available(), reason="16-mixed needs a CUDA GPU")
@pytest.mark.parametrize("loss", sorted(LOW_PRECISION_LOSSES))
def test_losses_compute_in_float32_from_fp16_inputs_on_gpu(loss: str) -> None:
    """The same under fp16 autocast on a GPU (``16-mixed``): no overflow at temperature 0.05."""
    _check_float32_inside(loss, torch.float16, "cuda")
