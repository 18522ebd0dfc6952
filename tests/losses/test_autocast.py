"""Every loss under ``torch.autocast("cpu", dtype=torch.bfloat16)`` against its float64 reference, values and gradients.

What a ``bf16-mixed`` training step hands a loss: bf16 tensors (the last linear layer ran under autocast) or float32
ones holding bf16 values.  Each loss must compute in float32 with autocast off, so its value equals the float64
value of the *same* (bf16-representable) inputs up to float32 rounding, not up to bf16 rounding (~4e-3).  The
references are the independent ones of ``tests/references/`` (loops, the seeds' op-by-op code, NumPy), run in
float64 on those inputs upcast; the grid covers small and mid sizes (several row blocks where a loss has them).

Tolerances, from the roundings involved:

* loss value: ``rtol 2e-5`` -- float32 sums and exponentials of exactly representable inputs (float32 eps 6e-8,
  amplified by the sums over a few hundred terms and by ``exp``/``log``);
* gradients of float32 leaves: ``2e-4 * |ref| + 2e-5 * max|ref|`` -- float32 arithmetic, with the larger
  relative error of entries that are small differences of large terms;
* gradients of bf16 leaves: autograd hands back bf16, one rounding of the float32 gradient: within
  ``2**-9 * |g|``, so ``2**-8 * |ref|`` plus the float32 allowance above.

The backward pass runs outside the autocast region, as Lightning's does (``precision_plugin.forward_context``
wraps only the step; PyTorch's AMP docs advise against backward under autocast), and also inside it for the
losses whose gradients are all their own (SupCon's and the sigmoid loss's analytic backward turn autocast off,
OrdinalCLIP has no products).  CLOC's similarity matrix is a plain ``x @ x.T`` whose built-in backward would run
in bf16 inside an autocast region: it is checked the way Lightning runs it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from cloc_lightning.losses import (
    OrdinalCLIPLoss,
    OrdinalContrastiveLoss_mm,
    OrdinalContrastiveLoss_sm,
    SigmoidContrastiveLoss,
    SupConLoss,
)
from tests.references.cloc import cloc_dense_reference, softplus_reference
from tests.references.ordinal_clip import ordinal_clip_loss_reference
from tests.references.sigmoid import scl_reference
from tests.references.supcon import supcon_loop_reference, supcontrast_reference

F64 = torch.float64
VALUE_RTOL = 2e-5
GRAD_RTOL = {torch.float32: 2e-4, torch.bfloat16: 2.0**-8 + 2e-4}
GRAD_ATOL_OF_MAX = 2e-5


#: the references run many small ops; on a shared 2-core machine one thread is faster
pytestmark = pytest.mark.usefixtures("one_thread")


def _leaf(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``values`` rounded to bf16, held in ``dtype`` (bf16 or float32), as a leaf that requires grad."""
    return values.bfloat16().to(dtype).requires_grad_(True)


def _assert_grad(got: torch.Tensor | None, want: torch.Tensor, dtype: torch.dtype, what: str) -> None:
    assert got is not None, what
    got64 = got.detach().to(F64)
    assert bool(torch.isfinite(got64).all()), what
    bound = GRAD_RTOL[dtype] * want.abs() + GRAD_ATOL_OF_MAX * want.abs().max() + 1e-12
    excess = (got64 - want).abs() - bound
    assert bool((excess <= 0).all()), f"{what}: max |diff| {float((got64 - want).abs().max()):.3g}, max |ref| {float(want.abs().max()):.3g}"


def _run(loss_fn: Callable[[], torch.Tensor], leaves: list[torch.Tensor], backward_inside: bool) -> tuple[float, list[Any]]:
    """The loss under bf16 autocast (float32, finite) and the gradients of ``leaves``."""
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = loss_fn()
        if backward_inside:
            loss.backward()
    assert loss.dtype == torch.float32 and bool(torch.isfinite(loss))
    if not backward_inside:
        loss.backward()
    return float(loss.detach()), [leaf.grad for leaf in leaves]


BACKWARD = [pytest.param(False, id="backward-outside"), pytest.param(True, id="backward-inside")]
LEAF_DTYPES = [pytest.param(torch.bfloat16, id="bf16-leaf"), pytest.param(torch.float32, id="f32-leaf")]


# ----------------------------------------------------------------------------------- CLOC
@pytest.mark.parametrize("backward_inside", [False])
@pytest.mark.parametrize("leaf_dtype", LEAF_DTYPES)
@pytest.mark.parametrize("n, n_classes, dim, variant", [(12, 4, 8, "mm"), (64, 6, 32, "mm-mean"), (200, 8, 16, "sm")])
def test_cloc(n: int, n_classes: int, dim: int, variant: str, leaf_dtype: torch.dtype, backward_inside: bool) -> None:
    g = torch.Generator().manual_seed(n)
    torch.manual_seed(n)
    reduction = "mean" if variant == "mm-mean" else "official"
    crit = (OrdinalContrastiveLoss_sm if variant == "sm" else OrdinalContrastiveLoss_mm)(n_classes, reduction=reduction)
    raw = next(p for p in crit.parameters() if p.requires_grad)  # the learnable raw margins (float32)
    y = torch.randint(0, n_classes, (n,), generator=g)
    x = _leaf(torch.randn(n, dim, generator=g), leaf_dtype)
    value, (gx, graw) = _run(lambda: crit(x, y), [x, raw], backward_inside)

    xr = x.detach().to(F64).requires_grad_(True)
    leaf = raw.detach().to(F64).requires_grad_(True)
    adjacent = softplus_reference(leaf).expand(n_classes - 1) if variant == "sm" else softplus_reference(leaf)
    ref = cloc_dense_reference(xr, y, adjacent, reduction)
    rx, rraw = torch.autograd.grad(ref, [xr, leaf])
    assert value == pytest.approx(float(ref.detach()), rel=VALUE_RTOL, abs=1e-9)
    _assert_grad(gx, rx, leaf_dtype, "d/dx")
    _assert_grad(graw, rraw, torch.float32, "d/d raw margins")


# ----------------------------------------------------------------------------------- SupCon / SimCLR
@pytest.mark.parametrize("backward_inside", BACKWARD)
@pytest.mark.parametrize("leaf_dtype", LEAF_DTYPES)
@pytest.mark.parametrize(
    "bsz, views, dim, temperature, labelled, tile",
    [(6, 2, 8, 0.07, True, None), (6, 2, 8, 0.5, False, None), (48, 2, 32, 0.05, True, 16), (96, 3, 16, 0.1, False, None)],
)
def test_supcon(
    bsz: int, views: int, dim: int, temperature: float, labelled: bool, tile: int | None, leaf_dtype: torch.dtype, backward_inside: bool
) -> None:
    g = torch.Generator().manual_seed(bsz)
    labels = torch.randint(0, 4, (bsz,), generator=g) if labelled else None
    f = _leaf(F.normalize(torch.randn(bsz, views, dim, generator=g), dim=-1), leaf_dtype)
    crit = SupConLoss(temperature, tile_size=tile)
    value, (gf,) = _run(lambda: crit(f, labels), [f], backward_inside)

    fr = f.detach().to(F64).requires_grad_(True)
    # small batches: the loop over anchors / entries / positives; larger: SupContrast's dense computation
    reference = supcon_loop_reference if bsz <= 8 else supcontrast_reference
    ref = reference(fr, labels, None, temperature)
    (rf,) = torch.autograd.grad(ref, [fr])
    assert value == pytest.approx(float(ref.detach()), rel=VALUE_RTOL, abs=1e-9)
    _assert_grad(gf, rf, leaf_dtype, "d/dfeatures")


# ----------------------------------------------------------------------------------- sigmoid (ReLIC / SigLIP)
@pytest.mark.parametrize("backward_inside", BACKWARD)
@pytest.mark.parametrize("leaf_dtype", LEAF_DTYPES)
@pytest.mark.parametrize("n, dim, gamma, alpha", [(8, 16, 0.0, 0.0), (64, 64, 1.0, 1.0), (300, 16, 0.5, 2.0)])
def test_sigmoid(n: int, dim: int, gamma: float, alpha: float, leaf_dtype: torch.dtype, backward_inside: bool) -> None:
    g = torch.Generator().manual_seed(n)
    base = torch.randn(n, dim, generator=g)
    x = _leaf(base, leaf_dtype)
    xp = _leaf(0.5 * base + torch.randn(n, dim, generator=g), leaf_dtype)  # correlated views
    crit = SigmoidContrastiveLoss(alpha=alpha, gamma=gamma)
    value, (gx, gxp, gtau, gb) = _run(lambda: crit(x, xp), [x, xp, crit.tau, crit.b], backward_inside)

    xr, xpr = x.detach().to(F64).requires_grad_(True), xp.detach().to(F64).requires_grad_(True)
    tau, b = crit.tau.detach().to(F64).requires_grad_(True), crit.b.detach().to(F64).requires_grad_(True)
    ref, _ = scl_reference(xr, xpr, tau, b, alpha=alpha, max_tau=crit.max_tau, gamma=gamma)  # the seed's op-by-op code
    rx, rxp, rtau, rb = torch.autograd.grad(ref, [xr, xpr, tau, b])
    assert value == pytest.approx(float(ref.detach()), rel=VALUE_RTOL, abs=1e-9)
    _assert_grad(gx, rx, leaf_dtype, "d/dx")
    _assert_grad(gxp, rxp, leaf_dtype, "d/dx'")
    _assert_grad(gtau, rtau, torch.float32, "d/dtau")
    _assert_grad(gb, rb, torch.float32, "d/db")


# ----------------------------------------------------------------------------------- OrdinalCLIP (rank prompts)
@pytest.mark.parametrize("backward_inside", BACKWARD)
@pytest.mark.parametrize("leaf_dtype", LEAF_DTYPES)
@pytest.mark.parametrize("n, ranks, scale", [(8, 5, 10.0), (32, 17, 100.0), (64, 10, 30.0)])
def test_ordinal_clip(n: int, ranks: int, scale: float, leaf_dtype: torch.dtype, backward_inside: bool) -> None:
    g = torch.Generator().manual_seed(n)
    labels = torch.randint(0, ranks, (n,), generator=g)
    cos = F.normalize(torch.randn(n, 8, generator=g), dim=1) @ F.normalize(torch.randn(ranks, 8, generator=g), dim=1).T
    logits = _leaf(scale * cos, leaf_dtype)  # exp(logit_scale) * cos, as the prototype head gives
    crit = OrdinalCLIPLoss(ce_weight=1.0, kl_weight=0.7)
    value, (grad,) = _run(lambda: crit(logits, labels), [logits], backward_inside)

    total, _, _, ref_grad = ordinal_clip_loss_reference(logits.detach().to(F64).numpy(), labels.numpy(), 1.0, 0.7, 10.0)
    assert value == pytest.approx(total, rel=VALUE_RTOL, abs=1e-9)
    _assert_grad(grad, torch.from_numpy(np.asarray(ref_grad, dtype=np.float64)), leaf_dtype, "d/dlogits")


# ---------------------------------------------------------------- low-precision inputs give the float32 result
def _views(x: torch.Tensor) -> torch.Tensor:
    return F.normalize(x.view(-1, 2, x.shape[1]), dim=-1)


#: (prepare the loss input from [32, 16] float64 data, the loss of that input and labels [32] % 6)
LOW_PRECISION_LOSSES: dict[str, tuple[Callable[[torch.Tensor], torch.Tensor], Callable[[torch.Tensor, torch.Tensor], torch.Tensor]]] = {
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
