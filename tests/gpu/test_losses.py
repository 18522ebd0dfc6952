"""Every loss on the device under ``torch.autocast`` against its float64 reference on the CPU (``pytest -m gpu``).

The inputs are drawn in float64 and rounded to the dtype of the case (what a projector under
``16-mixed`` / ``bf16-mixed`` hands the loss), then

* the loss runs on the device inside ``torch.autocast("cuda", dtype)`` (``float32``: no autocast),
* the independent reference of :mod:`tests.references` gets the *same rounded values* in float64
  on the CPU: :func:`~tests.references.cloc.cloc_dense_reference` (CLOC mm / sm, learnable
  margins), :func:`~tests.references.supcon.supcon_loop_reference` and
  :func:`~tests.references.supcon.supcontrast_reference` (SupCon, SimCLR),
  :func:`~tests.references.sigmoid.scl_reference` (the sigmoid loss, with τ and b) and
  :func:`~tests.references.ordinal_clip.ordinal_clip_loss_reference` (OrdinalCLIP, with its
  analytic gradient).

The loss must come back as float32 and equal the reference to 2e-5 (relative): the losses compute
in float32 inside autocast.  The gradients w.r.t. the inputs (returned in the input dtype) and the
loss's own parameters must match to a few roundings of the dtype: max |error| / max |reference
gradient| below 4 eps (fp16 2e-3, bf16 1.6e-2, fp32 5e-7 → 1e-5 floor).  Each case is a row of
``gpu_losses.{json,md}``.
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
from tests.gpu.conftest import CUDA, Table, requires_gpu
from tests.references.cloc import cloc_dense_reference, softplus_reference
from tests.references.ordinal_clip import ordinal_clip_loss_reference
from tests.references.sigmoid import scl_reference
from tests.references.supcon import supcon_loop_reference, supcontrast_reference

pytestmark = [pytest.mark.gpu, requires_gpu]

F64 = torch.float64
DEVICE = "cuda" if CUDA else "cpu"
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
EPS = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8, torch.float32: 2.0**-24}
LOSS_RTOL = 2e-5


def _rounded(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x`` (float64) rounded to ``dtype``: the low-precision input and, as float64, the reference's input."""
    return x.to(dtype)


def _grad_error(got: torch.Tensor, want: torch.Tensor) -> float:
    scale = float(want.abs().max())
    return float((got.detach().to("cpu", F64) - want).abs().max()) / max(scale, 1e-30)


class Case:
    """One loss × input: ``device_fn(inputs on the device) -> (loss, parameters)``, ``reference_fn(float64 inputs) -> (loss, grads)``."""

    def __init__(
        self,
        name: str,
        shape: str,
        reference: str,
        make: Callable[[torch.Generator], list[torch.Tensor]],
        device_fn: Callable[[list[torch.Tensor]], tuple[torch.Tensor, list[torch.Tensor]]],
        reference_fn: Callable[[list[torch.Tensor], list[torch.Tensor]], tuple[torch.Tensor, list[torch.Tensor]]],
    ) -> None:
        self.name, self.shape, self.reference = name, shape, reference
        self.make, self.device_fn, self.reference_fn = make, device_fn, reference_fn


def _labels(n: int, classes: int, g: torch.Generator) -> torch.Tensor:
    return torch.randint(0, classes, (n,), generator=g)


# ------------------------------------------------------------------------------------------ CLOC
def _cloc(mode: str) -> Case:
    n, c = 64, 8
    labels = _labels(n, c, torch.Generator().manual_seed(7))

    def make(g: torch.Generator) -> list[torch.Tensor]:
        return [torch.randn(n, c, generator=g, dtype=F64) * 3.0]  # logits (cloc_on: logits, as the configs)

    def crit_of() -> torch.nn.Module:
        torch.manual_seed(0)
        if mode == "mm":
            return OrdinalContrastiveLoss_mm(c, learnable_map=None).to(DEVICE)  # all margins learnable, U(0.5, 1)
        return OrdinalContrastiveLoss_sm(c, learnable_map=[["learnable", 0.47]]).to(DEVICE)

    state: dict[str, Any] = {}

    def device_fn(xs: list[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        crit = crit_of()
        raw = crit.learnables if mode == "mm" else crit.distance
        state["raw"] = raw.detach().to("cpu", F64)
        return crit(xs[0], labels.to(DEVICE)), [raw]

    def reference_fn(xs: list[torch.Tensor], _: list[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        leaf = state["raw"].clone().requires_grad_(True)
        adjacent = softplus_reference(leaf) if mode == "mm" else softplus_reference(leaf).expand(c - 1)
        x = xs[0].clone().requires_grad_(True)
        loss = cloc_dense_reference(x, labels, adjacent, "official")
        return loss, list(torch.autograd.grad(loss, [x, leaf]))

    return Case(f"cloc_{mode} (learnable margins)", f"logits [{n}, {c}]", "cloc_dense_reference", make, device_fn, reference_fn)


# ------------------------------------------------------------------------------------------ SupCon / SimCLR
def _supcon(name: str, bsz: int, temperature: float, supervised: bool, dense: bool) -> Case:
    views, dim, classes = 2, 128, 10
    labels = _labels(bsz, classes, torch.Generator().manual_seed(3)) if supervised else None

    def make(g: torch.Generator) -> list[torch.Tensor]:
        return [F.normalize(torch.randn(bsz, views, dim, generator=g, dtype=F64), dim=-1)]

    def device_fn(xs: list[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        return SupConLoss(temperature)(xs[0], None if labels is None else labels.to(DEVICE)), []

    def reference_fn(xs: list[torch.Tensor], _: list[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        x = xs[0].clone().requires_grad_(True)
        ref = supcontrast_reference if dense else supcon_loop_reference
        loss = ref(x, labels, temperature=temperature)
        return loss, list(torch.autograd.grad(loss, [x]))

    reference = "supcontrast_reference (dense)" if dense else "supcon_loop_reference"
    return Case(name, f"features [{bsz}, {views}, {dim}]", reference, make, device_fn, reference_fn)


# ------------------------------------------------------------------------------------------ sigmoid
def _sigmoid(name: str, tau: float, b: float, max_tau: float) -> Case:
    n, dim = 256, 64

    def make(g: torch.Generator) -> list[torch.Tensor]:
        return [torch.randn(n, dim, generator=g, dtype=F64), torch.randn(n, dim, generator=g, dtype=F64)]

    def device_fn(xs: list[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        crit = SigmoidContrastiveLoss(init_tau=tau, init_b=b, max_tau=max_tau, alpha=1.0, gamma=1.0).to(DEVICE)
        return crit(xs[0], xs[1]), [crit.tau, crit.b]

    def reference_fn(xs: list[torch.Tensor], params: list[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        x, xp = (v.clone().requires_grad_(True) for v in xs)
        t, bb = (p.detach().to("cpu", F64).clone().requires_grad_(True) for p in params)
        loss, _ = scl_reference(x, xp, t, bb, alpha=1.0, max_tau=max_tau, gamma=1.0)
        return loss, list(torch.autograd.grad(loss, [x, xp, t, bb]))

    return Case(name, f"x, x' [{n}, {dim}]", "scl_reference", make, device_fn, reference_fn)


# ------------------------------------------------------------------------------------------ OrdinalCLIP
def _ordinal_clip() -> Case:
    n, ranks = 64, 80
    labels = _labels(n, ranks, torch.Generator().manual_seed(5))

    def make(g: torch.Generator) -> list[torch.Tensor]:
        return [100.0 * (torch.rand(n, ranks, generator=g, dtype=F64) * 0.6 - 0.1)]  # exp(logit_scale) = 100 times cosines

    def device_fn(xs: list[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        return OrdinalCLIPLoss()(xs[0], labels.to(DEVICE)), []

    def reference_fn(xs: list[torch.Tensor], _: list[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        total, _, _, grad = ordinal_clip_loss_reference(xs[0].numpy(), labels.numpy())
        return torch.tensor(total, dtype=F64), [torch.from_numpy(np.asarray(grad, dtype=np.float64))]

    return Case("ordinal_clip (CE + KL)", f"logits [{n}, {ranks}], scale 100", "ordinal_clip_loss_reference", make, device_fn, reference_fn)


CASES = {
    c.name: c
    for c in [
        _cloc("mm"),
        _cloc("sm"),
        _supcon("supcon T=0.1", 16, 0.1, True, dense=False),
        _supcon("supcon T=0.05", 256, 0.05, True, dense=True),
        _supcon("simclr T=0.5", 256, 0.5, False, dense=True),
        _sigmoid("sigmoid (init: scale 5, b -5)", 1.6094379124341003, -5.0, 5.0),
        _sigmoid("sigmoid (scale 100, b 10)", 4.605170185988092, 10.0, 100.0),
        _ordinal_clip(),
    ]
}


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("name", list(CASES))
def test_loss_under_autocast_matches_float64_reference(name: str, dtype_name: str, losses_table: Table) -> None:
    """The loss and its gradients on the device (autocast ``dtype``) equal the float64 CPU reference on the same inputs."""
    dtype = DTYPES[dtype_name]
    if dtype == torch.float16 and not CUDA:
        pytest.skip("float16 autocast: on a CUDA device")
    case = CASES[name]
    exact = case.make(torch.Generator().manual_seed(11))
    low = [_rounded(x, dtype) for x in exact]
    leaves = [x.detach().clone().to(DEVICE).requires_grad_(True) for x in low]
    with torch.autocast(DEVICE, dtype=dtype, enabled=dtype != torch.float32):
        loss, params = case.device_fn(leaves)
    assert loss.dtype == torch.float32, f"{name}: the loss comes back as {loss.dtype}, not float32"
    grads = torch.autograd.grad(loss, leaves + params)
    ref_loss, ref_grads = case.reference_fn([x.detach().to(F64) for x in low], params)

    value, want = float(loss.detach()), float(ref_loss.detach())
    rel = abs(value - want) / max(abs(want), 1e-12)
    for g, leaf in zip(grads[: len(leaves)], leaves, strict=True):
        assert g.dtype == leaf.dtype, f"{name}: input gradient in {g.dtype}, input {leaf.dtype}"
    errors = [_grad_error(g, r) for g, r in zip(grads, ref_grads, strict=True)]
    tol = max(4 * EPS[dtype], 1e-5)
    losses_table.add(
        {
            "loss": name,
            "dtype": dtype_name,
            "shape": case.shape,
            "reference": case.reference,
            "value": value,
            "rel_err": rel,
            "grad_rel_err": max(errors),
            "grad_tol": tol,
        }
    )
    assert all(bool(torch.isfinite(g).all()) for g in grads), f"{name}: non-finite gradients"
    assert rel <= LOSS_RTOL, f"{name} under {dtype_name}: loss {value} vs float64 reference {want} (relative error {rel:.2e})"
    assert max(errors) <= tol, f"{name} under {dtype_name}: gradient errors {errors} (relative to max |gradient|) above {tol:.1e}"
