"""Sigmoid contrastive loss (ReLIC-sigmoid, seed ``scl_loss``) against independent references.

* ``sigmoid_loop_reference`` (:mod:`tests.references.sigmoid`): one Python step per
  (row, column) pair of the formula in float64 NumPy; its gradients are central finite
  differences of the same loop (nothing shared with torch's autograd or with the fused
  implementation).
* ``scl_reference`` (the same module): the formula as the seed repository writes it (explicit labels
  ``2I - 1``, ``(1 - sigmoid) ** gamma``, ``F.logsigmoid``, ``F.kl_div``) in float64 with
  autograd, for larger sizes and for the DDP check.
* open_clip's ``SigLipLoss`` at ``gamma = alpha = 0``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import cloc_lightning.distributed as D
import cloc_lightning.losses.sigmoid as sigmoid_mod
from cloc_lightning.losses import SigmoidContrastiveLoss, sigmoid_contrastive_loss
from tests._ddp import run_distributed
from tests.losses.conftest import grad_check
from tests.references.sigmoid import scl_reference, sigmoid_loop_reference


def numpy_value_and_grads(
    x: np.ndarray, xp: np.ndarray, tau: float, b: float, h: float = 1e-6, which: int = 0, **kw: float
) -> tuple[float, float, np.ndarray, np.ndarray, float, float]:
    """Reference ``(loss, KL)`` and central-difference gradients of output ``which`` (0 loss, 1 KL)."""

    def f(xx: np.ndarray, xxp: np.ndarray, t: float, bb: float) -> float:
        return sigmoid_loop_reference(xx, xxp, t, bb, **kw)[which]  # type: ignore[arg-type]

    loss, kl = sigmoid_loop_reference(x, xp, tau, b, **kw)  # type: ignore[arg-type]
    gx, gxp = np.zeros_like(x), np.zeros_like(xp)
    for arr, grad in ((x, gx), (xp, gxp)):
        for idx in np.ndindex(arr.shape):
            old = arr[idx]
            arr[idx] = old + h
            up = f(x, xp, tau, b)
            arr[idx] = old - h
            down = f(x, xp, tau, b)
            arr[idx] = old
            grad[idx] = (up - down) / (2 * h)
    g_tau = (f(x, xp, tau + h, b) - f(x, xp, tau - h, b)) / (2 * h)
    g_b = (f(x, xp, tau, b + h) - f(x, xp, tau, b - h)) / (2 * h)
    return loss, kl, gx, gxp, g_tau, g_b


def _problem(n: int, d: int, seed: int, dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=torch.float64)
    xp = 0.6 * x + torch.randn(n, d, generator=g, dtype=torch.float64)  # correlated views
    return x.to(dtype), xp.to(dtype)


def _ours(
    x: torch.Tensor, xp: torch.Tensor, tau: float, b: float, which: int = 0, **kw: object
) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """Our ``(loss, KL)`` and the gradients of output ``which`` w.r.t. ``x, x', tau, b``."""
    xx = x.clone().requires_grad_(True)
    xxp = xp.clone().requires_grad_(True)
    t = torch.tensor(tau, dtype=torch.float64, requires_grad=True)
    bb = torch.tensor(b, dtype=torch.float64, requires_grad=True)
    loss, kl = sigmoid_contrastive_loss(xx, xxp, t, bb, **kw)  # type: ignore[arg-type]
    grads = torch.autograd.grad((loss, kl)[which], [xx, xxp, t, bb])
    return loss.detach(), kl.detach(), list(grads)


@pytest.fixture(params=[2**16, 5], ids=["one-block", "tiny-blocks"])
def block_elements(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> int:
    """Run a test with the default CPU row blocks and with blocks of one or two rows."""
    monkeypatch.setattr(sigmoid_mod, "BLOCK_ELEMENTS", request.param)
    return int(request.param)


@pytest.fixture(params=[2**16, 1500], ids=["default-blocks", "small-blocks"])
def block_elements_large(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> int:
    """Default row blocks, and blocks of a few rows (a ragged last block) for the larger batches."""
    monkeypatch.setattr(sigmoid_mod, "BLOCK_ELEMENTS", request.param)
    return int(request.param)


# ----------------------------------------------------------------------------
# values and gradients against the NumPy loop
# ----------------------------------------------------------------------------
@pytest.mark.parametrize("n,d", [(1, 3), (2, 5), (5, 3), (6, 8)])
@pytest.mark.parametrize("gamma", [0.0, 0.5, 1.0, 2.0])
@pytest.mark.parametrize("alpha", [0.0, 1.0])
def test_values_and_gradients_match_numpy_loop(n: int, d: int, gamma: float, alpha: float, block_elements: int) -> None:
    x, xp = _problem(n, d, seed=n * 100 + d)
    tau, b = math.log(3.0), -1.5
    loss, kl, grads = _ours(x, xp, tau, b, alpha=alpha, gamma=gamma)
    r_loss, r_kl, gx, gxp, g_tau, g_b = numpy_value_and_grads(x.numpy(), xp.numpy(), tau, b, alpha=alpha, gamma=gamma)
    assert loss.item() == pytest.approx(r_loss, rel=1e-10, abs=1e-12)
    assert kl.item() == pytest.approx(r_kl, rel=1e-9, abs=1e-12)
    for got, want in zip(grads, (gx, gxp, g_tau, g_b), strict=True):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-6, atol=1e-7)
    if n > 1:  # the KL is not trivially zero and the gradients are not trivially zero
        assert r_kl > 1e-4 and np.abs(gx).max() > 1e-3


@pytest.mark.parametrize("alpha", [0.0, 0.7])
def test_invariance_loss_is_differentiable_on_its_own(alpha: float) -> None:
    """``invariance_loss`` carries the KL's own gradient (the seed returns it with its graph)."""
    x, xp = _problem(5, 4, seed=3)
    tau, b = 0.4, -2.0
    _loss, kl, grads = _ours(x, xp, tau, b, which=1, alpha=alpha, gamma=1.0)
    _r_loss, r_kl, gx, gxp, g_tau, g_b = numpy_value_and_grads(x.numpy(), xp.numpy(), tau, b, which=1, alpha=alpha, gamma=1.0)
    assert kl.item() == pytest.approx(r_kl, rel=1e-9)
    for got, want in zip(grads, (gx, gxp, g_tau, g_b), strict=True):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-6, atol=1e-7)
    assert abs(g_b) < 1e-6  # the KL does not depend on b


def test_both_outputs_backpropagated_together() -> None:
    x, xp = _problem(7, 5, seed=11)
    xx, xxp = x.clone().requires_grad_(True), xp.clone().requires_grad_(True)
    t = torch.tensor(0.9, dtype=torch.float64, requires_grad=True)
    bb = torch.tensor(-3.0, dtype=torch.float64, requires_grad=True)
    loss, kl = sigmoid_contrastive_loss(xx, xxp, t, bb, alpha=0.5, gamma=1.5)
    (2.0 * loss - 3.0 * kl).backward()
    rx, rxp = x.clone().requires_grad_(True), xp.clone().requires_grad_(True)
    rt, rb = t.detach().clone().requires_grad_(True), bb.detach().clone().requires_grad_(True)
    r_loss, r_kl = scl_reference(rx, rxp, rt, rb, alpha=0.5, gamma=1.5)
    (2.0 * r_loss - 3.0 * r_kl).backward()
    for got, want in ((xx, rx), (xxp, rxp), (t, rt), (bb, rb)):
        torch.testing.assert_close(got.grad, want.grad, rtol=1e-10, atol=1e-12)


# ----------------------------------------------------------------------------
# larger sizes, float32, clamp, filtering
# ----------------------------------------------------------------------------
@pytest.mark.parametrize("n,d", [(33, 16), (257, 32)])
@pytest.mark.parametrize("gamma,alpha", [(0.0, 0.0), (1.0, 1.0), (2.0, 0.5), (0.5, 0.0)])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_larger_batches_match_the_seed_formula(
    n: int, d: int, gamma: float, alpha: float, dtype: torch.dtype, block_elements_large: int
) -> None:
    x, xp = _problem(n, d, seed=n + d, dtype=dtype)
    tau, b = math.log(4.0), -5.0  # off the clamp edge exp(tau) == max_tau (float32 rounding decides there)
    xx, xxp = x.clone().requires_grad_(True), xp.clone().requires_grad_(True)
    t = torch.tensor(tau, requires_grad=True)  # float32 parameters, as in a module
    bb = torch.tensor(b, requires_grad=True)
    loss, kl = sigmoid_contrastive_loss(xx, xxp, t, bb, alpha=alpha, gamma=gamma)
    loss.backward()
    assert loss.dtype == dtype and xx.grad is not None and xx.grad.dtype == dtype
    rx, rxp = x.double().requires_grad_(True), xp.double().requires_grad_(True)
    rt = t.detach().double().requires_grad_(True)  # the same (float32-rounded) values
    rb = bb.detach().double().requires_grad_(True)
    r_loss, r_kl = scl_reference(rx, rxp, rt, rb, alpha=alpha, gamma=gamma)
    r_loss.backward()
    tight = dtype == torch.float64
    rtol, atol = (1e-10, 1e-13) if tight else (2e-5, 1e-7)
    torch.testing.assert_close(loss.double(), r_loss.detach(), rtol=rtol, atol=atol)
    torch.testing.assert_close(kl.double(), r_kl.detach(), rtol=rtol if tight else 1e-4, atol=atol if tight else 1e-6)
    torch.testing.assert_close(xx.grad.double(), rx.grad, rtol=rtol if tight else 1e-4, atol=atol if tight else 1e-7)
    torch.testing.assert_close(xxp.grad.double(), rxp.grad, rtol=rtol if tight else 1e-4, atol=atol if tight else 1e-7)
    for got, want in ((t.grad, rt.grad), (bb.grad, rb.grad)):
        # tau and b are float32 parameters: their gradients come back rounded to float32
        torch.testing.assert_close(got.double(), want, rtol=1e-6 if tight else 1e-4, atol=1e-9 if tight else 1e-6)


@pytest.mark.parametrize(
    "tau,max_tau,tau_grad_zero",
    [(math.log(8.0), 5.0, True), (math.log(4.0), 5.0, False), (math.log(60.0), 50.0, True), (math.log(45.0), 50.0, False)],
)
def test_logit_scale_clamp(tau: float, max_tau: float, tau_grad_zero: bool) -> None:
    """``exp(tau) > max_tau`` clamps the scale and stops the gradient to ``tau`` (large scales also test the row-max path)."""
    x, xp = _problem(6, 4, seed=7)
    b = -1.0
    loss, _kl, grads = _ours(x, xp, tau, b, alpha=1.0, gamma=1.0, max_tau=max_tau)
    r_loss, _r_kl, gx, gxp, g_tau, g_b = numpy_value_and_grads(x.numpy(), xp.numpy(), tau, b, alpha=1.0, gamma=1.0, max_tau=max_tau)
    assert loss.item() == pytest.approx(r_loss, rel=1e-10)
    for got, want in zip(grads, (gx, gxp, g_tau, g_b), strict=True):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-6, atol=1e-6)
    if tau_grad_zero:
        assert grads[2].item() == 0.0
    else:
        assert abs(grads[2].item()) > 1e-4


@pytest.mark.parametrize("gamma", [0.5, 1.0, 2.0])
def test_penalty_filtering_before_and_after_warmup(gamma: float, block_elements: int) -> None:
    x, xp = _problem(12, 6, seed=5)
    tau, b, thr, warmup = math.log(4.0), -1.0, 0.3, 100
    kw = dict(alpha=1.0, gamma=gamma, penalty_filtering=True, filtering_warmup_steps=warmup, filtering_threshold=thr)
    plain = numpy_value_and_grads(x.numpy(), xp.numpy(), tau, b, alpha=1.0, gamma=gamma)
    filtered = numpy_value_and_grads(x.numpy(), xp.numpy(), tau, b, alpha=1.0, gamma=gamma, threshold=thr)
    assert abs(plain[0] - filtered[0]) > 1e-3  # the threshold really drops negatives here
    # the seed filters when global_step > warm-up: the warm-up step itself is still weighted
    for step, want in ((-1, plain), (0, plain), (warmup, plain), (warmup + 1, filtered), (10 * warmup, filtered)):
        loss, kl, grads = _ours(x, xp, tau, b, global_step=step, **kw)
        assert loss.item() == pytest.approx(want[0], rel=1e-10), step
        assert kl.item() == pytest.approx(want[1], rel=1e-9), step
        for got, ref in zip(grads, want[2:], strict=True):
            np.testing.assert_allclose(got.numpy(), ref, rtol=1e-6, atol=1e-7)


def test_penalty_filtering_at_gamma_zero() -> None:
    """``gamma = 0``: every penalty is 1, so a threshold < 1 keeps everything and >= 1 keeps positives only."""
    x, xp = _problem(8, 4, seed=9)
    tau, b = 1.0, -2.0
    kw = dict(gamma=0.0, penalty_filtering=True, filtering_warmup_steps=0, global_step=3)
    keep_all, _, _ = _ours(x, xp, tau, b, filtering_threshold=0.05, **kw)
    assert keep_all.item() == pytest.approx(sigmoid_loop_reference(x.numpy(), xp.numpy(), tau, b)[0], rel=1e-12)
    pos_only, _, grads = _ours(x, xp, tau, b, filtering_threshold=1.0, **kw)
    ref = numpy_value_and_grads(x.numpy(), xp.numpy(), tau, b, threshold=1.0)
    assert pos_only.item() == pytest.approx(ref[0], rel=1e-10)
    for got, want in zip(grads, ref[2:], strict=True):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-6, atol=1e-7)


# ----------------------------------------------------------------------------
# open_clip SigLipLoss
# ----------------------------------------------------------------------------
@pytest.mark.parametrize("n,d", [(1, 4), (16, 8), (96, 32)])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_equals_open_clip_siglip_at_gamma_alpha_zero(n: int, d: int, dtype: torch.dtype) -> None:
    """``SigLipLoss(img, txt, logit_scale, logit_bias)`` multiplies by ``logit_scale`` as given (no exp)
    and divides the summed ``-logsigmoid`` by the number of rows: feed it the L2-normalised
    features, ``logit_scale = clamp(exp(tau), 0, max_tau)`` and ``logit_bias = b``."""
    open_clip_loss = pytest.importorskip("open_clip.loss")
    x, xp = _problem(n, d, seed=n, dtype=dtype)
    xx, xxp = x.clone().requires_grad_(True), xp.clone().requires_grad_(True)
    t = torch.tensor(math.log(5.0), dtype=dtype, requires_grad=True)
    bb = torch.tensor(-5.0, dtype=dtype, requires_grad=True)
    loss, _ = sigmoid_contrastive_loss(xx, xxp, t, bb, alpha=0.0, gamma=0.0)
    loss.backward()
    sx, sxp = x.clone().requires_grad_(True), xp.clone().requires_grad_(True)
    st, sb = t.detach().clone().requires_grad_(True), bb.detach().clone().requires_grad_(True)
    siglip = open_clip_loss.SigLipLoss()(F.normalize(sx, dim=-1), F.normalize(sxp, dim=-1), st.exp().clamp(0, 5.0), sb)
    siglip.backward()
    rtol, atol = (1e-12, 1e-14) if dtype == torch.float64 else (1e-5, 1e-7)
    torch.testing.assert_close(loss, siglip.detach(), rtol=rtol, atol=atol)
    for got, want in ((xx.grad, sx.grad), (xxp.grad, sxp.grad), (t.grad, st.grad), (bb.grad, sb.grad)):
        torch.testing.assert_close(got, want, rtol=rtol if dtype == torch.float64 else 1e-4, atol=atol)


# ----------------------------------------------------------------------------
# mixed precision
# ----------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_inputs_at_small_temperature_stay_finite(dtype: torch.dtype) -> None:
    """Scale 100 (temperature 0.01), ``b = 10``: computed in float32, finite, gradients in the input dtype."""
    x, xp = _problem(64, 32, seed=1, dtype=torch.float32)
    x, xp = x.to(dtype), xp.to(dtype)
    xx, xxp = x.clone().requires_grad_(True), xp.clone().requires_grad_(True)
    t = torch.tensor(math.log(100.0), requires_grad=True)
    bb = torch.tensor(10.0, requires_grad=True)
    loss, kl = sigmoid_contrastive_loss(xx, xxp, t, bb, alpha=1.0, gamma=1.0, max_tau=100.0)
    loss.backward()
    assert loss.dtype == torch.float32 and kl.dtype == torch.float32
    assert xx.grad is not None and xx.grad.dtype == dtype
    for v in (loss, kl, xx.grad, xxp.grad, t.grad, bb.grad):
        assert bool(torch.isfinite(v).all())
    # equals the float64 reference on the same (rounded) inputs
    r_loss, r_kl = scl_reference(x.double(), xp.double(), t.detach().double(), bb.detach().double(), 1.0, 100.0, 1.0)
    torch.testing.assert_close(loss.double(), r_loss, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(kl.double(), r_kl, rtol=1e-4, atol=1e-5)


def test_autocast_bf16_runs_in_float32() -> None:
    x, xp = _problem(32, 16, seed=2, dtype=torch.float32)
    crit = SigmoidContrastiveLoss(init_tau=math.log(50.0), max_tau=50.0, alpha=1.0, gamma=1.0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, _ = crit.compute(x.requires_grad_(True), xp)
    loss.backward()
    assert loss.dtype == torch.float32 and bool(torch.isfinite(loss))
    ref, _ = scl_reference(x.detach().double(), xp.double(), crit.tau.detach().double(), crit.b.detach().double(), 1.0, 50.0, 1.0)
    torch.testing.assert_close(loss.double(), ref, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------
# module
# ----------------------------------------------------------------------------
def test_module_defaults_parameters_and_forward() -> None:
    crit = SigmoidContrastiveLoss()
    assert isinstance(crit.tau, torch.nn.Parameter) and isinstance(crit.b, torch.nn.Parameter)
    assert crit.tau.item() == pytest.approx(math.log(5.0)) and crit.b.item() == pytest.approx(-5.0)
    assert crit.max_tau == 5.0 and crit.temperature == pytest.approx(0.2)
    assert set(crit.state_dict()) == {"tau", "b"}
    fixed = SigmoidContrastiveLoss(learnable=False, init_tau=0.0)
    assert list(fixed.parameters()) == [] and set(fixed.state_dict()) == {"tau", "b"}
    assert fixed.temperature == pytest.approx(1.0)

    x, xp = _problem(10, 6, seed=4, dtype=torch.float32)
    crit = SigmoidContrastiveLoss(alpha=1.0, gamma=1.0, penalty_filtering=True, filtering_warmup_steps=2, filtering_threshold=0.2)
    for gamma_override, step in ((None, 0), (0.25, 0), (0.25, 5)):
        loss, terms = crit.compute(x, xp, gamma=gamma_override, global_step=step)
        kl = terms["invariance"]
        g = 1.0 if gamma_override is None else gamma_override
        ref = sigmoid_loop_reference(
            x.double().numpy(),
            xp.double().numpy(),
            math.log(5.0),
            -5.0,
            alpha=1.0,
            gamma=g,
            threshold=0.2 if step > 2 else None,
        )
        assert loss.item() == pytest.approx(ref[0], rel=1e-5)
        assert kl.item() == pytest.approx(ref[1], rel=1e-4, abs=1e-6)
    loss = crit(x, xp)
    loss.backward()
    assert crit.tau.grad is not None and crit.b.grad is not None
    # as in the seed: float32(log 5) rounds up, exp of it is 5.0000002 > max_tau = 5, so the
    # default scale starts clamped and tau gets no gradient until it moves below log 5
    assert math.exp(crit.tau.item()) > 5.0 and crit.tau.grad.item() == 0.0
    assert crit.b.grad.item() != 0.0


# ----------------------------------------------------------------------------
# bad inputs
# ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "x,xp,kw,err,match",
    [
        (torch.randn(4, 3), torch.randn(5, 3), {}, ValueError, "same shape"),
        (torch.randn(4), torch.randn(4), {}, ValueError, r"\[n, dim\]"),
        (torch.randn(2, 4, 3), torch.randn(2, 4, 3), {}, ValueError, "flatten"),
        (torch.randn(0, 3), torch.randn(0, 3), {}, ValueError, "n >= 1"),
        (torch.randint(0, 3, (4, 3)), torch.randn(4, 3), {}, TypeError, "floating-point"),
        ([[1.0]], torch.randn(1, 1), {}, TypeError, "torch.Tensor"),
        (torch.randn(4, 3), torch.randn(4, 3), {"gamma": -1.0}, ValueError, "gamma"),
        (torch.randn(4, 3), torch.randn(4, 3), {"gamma": math.nan}, ValueError, "gamma"),
        (torch.randn(4, 3), torch.randn(4, 3), {"alpha": -0.5}, ValueError, "alpha"),
        (torch.randn(4, 3), torch.randn(4, 3), {"max_tau": 0.0}, ValueError, "max_tau"),
        (torch.randn(4, 3), torch.randn(4, 3), {"filtering_threshold": -0.1}, ValueError, "filtering_threshold"),
        (torch.randn(4, 3), torch.randn(4, 3), {"filtering_warmup_steps": -1}, ValueError, "filtering_warmup_steps"),
        (torch.randn(4, 3), torch.randn(4, 3), {"global_step": 1.5}, TypeError, "global_step"),
        (torch.randn(4, 3), torch.randn(4, 3), {"gamma": "1"}, TypeError, "gamma"),
    ],
)
def test_bad_inputs_raise_clear_errors(x: object, xp: object, kw: dict, err: type, match: str) -> None:
    with pytest.raises(err, match=match):
        sigmoid_contrastive_loss(x, xp, torch.tensor(0.0), torch.tensor(0.0), **kw)  # type: ignore[arg-type]


def test_bad_tau_and_b_and_module_arguments() -> None:
    x = torch.randn(3, 2)
    with pytest.raises(ValueError, match="tau must be a scalar"):
        sigmoid_contrastive_loss(x, x, torch.zeros(2), torch.tensor(0.0))
    with pytest.raises(TypeError, match="b must be a floating-point"):
        sigmoid_contrastive_loss(x, x, torch.tensor(0.0), torch.tensor(1))
    with pytest.raises(ValueError, match="gamma"):
        SigmoidContrastiveLoss(gamma=-1.0)
    with pytest.raises(ValueError, match="max_tau"):
        SigmoidContrastiveLoss(max_tau=-1.0)
    with pytest.raises(ValueError, match="gamma"):
        SigmoidContrastiveLoss()(x, x, gamma=-0.1)
    # numbers are accepted for tau and b, and a one-element tau (the seed's nn.Parameter(torch.ones([]) * v) or [1])
    a, _ = sigmoid_contrastive_loss(x, x, 0.5, -1.0)
    c, _ = sigmoid_contrastive_loss(x, x, torch.tensor([0.5]), torch.tensor(-1.0))
    torch.testing.assert_close(a, c)


# ----------------------------------------------------------------------------
# DDP: 2 gloo processes == one process on the concatenated batch
# ----------------------------------------------------------------------------
DDP_SCENARIOS = [
    # (rank sizes, gamma, alpha, filtering threshold or None, dtype)
    ((4, 4), 0.0, 0.0, None, torch.float64),
    ((3, 5), 1.0, 1.0, None, torch.float64),
    ((5, 2), 2.0, 0.5, 0.2, torch.float64),
    ((1, 6), 0.5, 1.0, None, torch.float64),
    ((6, 6), 1.0, 1.0, None, torch.float32),
]
DDP_TAU, DDP_B = math.log(4.0), -2.0


def _ddp_problem(sizes: tuple[int, ...], seed: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    return _problem(sum(sizes), 5, seed=100 + seed, dtype=dtype)


def _ddp_rank_fn(rank: int, world: int) -> dict:
    out: dict = {"scenarios": []}
    for k, (sizes, gamma, alpha, thr, dtype) in enumerate(DDP_SCENARIOS):
        x, xp = _ddp_problem(sizes, k, dtype)
        start = sum(sizes[:rank])
        xl = x[start : start + sizes[rank]].clone().requires_grad_(True)
        xpl = xp[start : start + sizes[rank]].clone().requires_grad_(True)
        crit = SigmoidContrastiveLoss(
            init_tau=DDP_TAU,
            init_b=DDP_B,
            alpha=alpha,
            gamma=gamma,
            gather_distributed=True,
            penalty_filtering=thr is not None,
            filtering_warmup_steps=0,
            filtering_threshold=thr or 0.0,
        )
        loss, terms = crit.compute(xl, xpl, global_step=1)
        kl = terms["invariance"]
        loss.backward()
        out["scenarios"].append(
            {
                "loss_mean": D.all_reduce_sum(loss.detach()) / world,
                "kl_mean": D.all_reduce_sum(kl.detach()) / world,
                # DDP averages parameter gradients over ranks; inputs get W x their share
                "tau_grad": D.all_reduce_sum(crit.tau.grad) / world,
                "b_grad": D.all_reduce_sum(crit.b.grad) / world,
                "x_grad": xl.grad / world,
                "xp_grad": xpl.grad / world,
            }
        )
    return out


@pytest.mark.slow  # 2-process DDP: the long tier (pytest -m slow)
@pytest.mark.ddp
def test_ddp_equals_single_process_on_the_concatenated_batch() -> None:
    results = run_distributed(_ddp_rank_fn, 2)
    for k, (sizes, gamma, alpha, thr, dtype) in enumerate(DDP_SCENARIOS):
        x, xp = _ddp_problem(sizes, k, dtype)
        rx, rxp = x.double().requires_grad_(True), xp.double().requires_grad_(True)
        rt = torch.tensor(DDP_TAU, dtype=torch.float64, requires_grad=True)
        rb = torch.tensor(DDP_B, dtype=torch.float64, requires_grad=True)
        r_loss, r_kl = scl_reference(rx, rxp, rt, rb, alpha=alpha, gamma=gamma, threshold=thr)
        r_loss.backward()
        tol = dict(rtol=1e-5, atol=1e-9) if dtype == torch.float64 else dict(rtol=1e-5, atol=1e-6)
        for r, res in enumerate(results):
            got = res["scenarios"][k]
            torch.testing.assert_close(got["loss_mean"].double(), r_loss.detach(), **tol)
            torch.testing.assert_close(got["kl_mean"].double(), r_kl.detach(), **tol)
            torch.testing.assert_close(got["tau_grad"].double(), rt.grad, **tol)
            torch.testing.assert_close(got["b_grad"].double(), rb.grad, **tol)
            start = sum(sizes[:r])
            rows = slice(start, start + sizes[r])
            torch.testing.assert_close(got["x_grad"].double(), rx.grad[rows], **tol)
            torch.testing.assert_close(got["xp_grad"].double(), rxp.grad[rows], **tol)


def test_gather_distributed_is_a_no_op_on_one_process() -> None:
    x, xp = _problem(9, 4, seed=12, dtype=torch.float64)
    a = sigmoid_contrastive_loss(x, xp, 0.3, -1.0, alpha=1.0, gamma=1.0, gather_distributed=True)
    c = sigmoid_contrastive_loss(x, xp, 0.3, -1.0, alpha=1.0, gamma=1.0)
    torch.testing.assert_close(a, c, rtol=0, atol=0)


@pytest.mark.parametrize("n,d", [(1, 3), (5, 3), (40, 16)])
@pytest.mark.parametrize("gamma", [0.0, 1.0, 2.0])
def test_compute_invariance_false_skips_the_kl_and_keeps_the_loss(n: int, d: int, gamma: float, block_elements: int) -> None:
    """``compute_invariance=False`` (alpha = 0): the same loss and gradients as the seed's formula, no KL."""
    x, xp = _problem(n, d, seed=7 * n + d)
    xx, xxp = x.clone().requires_grad_(True), xp.clone().requires_grad_(True)
    t = torch.tensor(math.log(3.0), dtype=torch.float64, requires_grad=True)
    bb = torch.tensor(-1.5, dtype=torch.float64, requires_grad=True)
    loss, kl = sigmoid_contrastive_loss(xx, xxp, t, bb, gamma=gamma, compute_invariance=False)
    assert kl is None
    got = torch.autograd.grad(loss, [xx, xxp, t, bb])
    rx, rxp = x.clone().requires_grad_(True), xp.clone().requires_grad_(True)
    rt = torch.tensor(math.log(3.0), dtype=torch.float64, requires_grad=True)
    rb = torch.tensor(-1.5, dtype=torch.float64, requires_grad=True)
    r_loss, _ = scl_reference(rx, rxp, rt, rb, gamma=gamma)
    want = torch.autograd.grad(r_loss, [rx, rxp, rt, rb])
    assert loss.item() == pytest.approx(r_loss.item(), rel=1e-10, abs=1e-12)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-8, atol=1e-12)


def test_compute_invariance_false_needs_alpha_zero() -> None:
    x, xp = _problem(4, 3, seed=0)
    with pytest.raises(ValueError, match="compute_invariance=False skips the KL term.*set alpha=0.0"):
        sigmoid_contrastive_loss(x, xp, 0.0, 0.0, alpha=0.5, compute_invariance=False)


# ---------------------------------------------------------------- degenerate batches, non-finite features
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
    grad_check(loss, x)
    assert all(t.grad is not None and bool(torch.isfinite(t.grad).all()) for t in (xp, tau, b))


@pytest.mark.parametrize("bad", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_sigmoid_loss_propagates_non_finite_features(bad: float) -> None:
    """Documented behaviour: the sigmoid loss has no input check (its hot path); NaN/inf gives a NaN loss,
    which every module's ``check_finite_loss`` stops before the update (``test_nan_inputs_stop_every_module...``)."""
    x = torch.randn(4, 8)
    x[1, 2] = bad
    loss, terms = SigmoidContrastiveLoss(alpha=1.0, gamma=1.0).compute(x, torch.randn(4, 8))
    kl = terms["invariance"]
    assert bool(torch.isnan(loss)) and bool(torch.isnan(kl))
