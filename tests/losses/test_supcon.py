"""SupConLoss against an independent loop reference of Khosla et al. 2020, eq. 2 (L_out).

The reference (:func:`tests.references.supcon.supcon_loop_reference`) walks anchors, contrast entries and positives one by one in
float64 (autograd through the loop gives its gradients); it shares no code with
``cloc_lightning.losses.supcon``.  Anchors without positives contribute 0 and the
mean runs over all anchors (SupContrast PR #142).  As SupContrast's ``losses.py``, the
loss is scaled by ``temperature / base_temperature`` with ``base_temperature`` 0.07 by
default (``None``: tied to the temperature, no scaling).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from cloc_lightning import distributed as D
from cloc_lightning.losses import supcon as supcon_module
from cloc_lightning.losses.supcon import AUTO_DENSE_MAX_ELEMENTS, AUTO_TILE_ELEMENTS, SupConLoss, _choose_tile, supcon_loss
from tests._ddp import run_distributed
from tests.losses.conftest import grad_check
from tests.references.supcon import supcon_loop_reference
from tests.references.supcon import supcon_loop_reference as reference_loss
from tests.references.supcon import supcon_loop_reference_per_anchor as reference_per_anchor


def _features(bsz: int, views: int, dim: int = 6, seed: int = 0, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return F.normalize(torch.randn(bsz, views, dim, generator=g, dtype=dtype), dim=-1)


def _labels(bsz: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed + 100)
    # few classes so most anchors have positives; with odd sizes some classes are singletons
    return torch.randint(0, max(1, (bsz + 1) // 2), (bsz,), generator=g)


def _mask(bsz: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed + 200)
    return (torch.rand(bsz, bsz, generator=g) > 0.6).to(torch.float64)


def _targets(kind: str, bsz: int) -> dict[str, torch.Tensor | None]:
    if kind == "simclr":
        return {"labels": None, "mask": None}
    if kind == "supervised":
        return {"labels": _labels(bsz), "mask": None}
    return {"labels": None, "mask": _mask(bsz)}


def _ours_and_grad(features: torch.Tensor, loss: SupConLoss, **targets: torch.Tensor | None):
    x = features.clone().requires_grad_(True)
    value = loss(x, **targets)
    value.backward()
    return value.detach(), x.grad


def _ref_and_grad(features: torch.Tensor, **kwargs: object):
    x = features.clone().requires_grad_(True)
    value = reference_loss(x, **kwargs)
    value.backward()
    return value.detach(), x.grad


def _close(a: torch.Tensor, b: torch.Tensor, tol: float = 1e-10) -> None:
    torch.testing.assert_close(a, b, rtol=tol, atol=tol)


# ----------------------------------------------------------------------------
# values and gradients
# ----------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["simclr", "supervised", "mask"])
@pytest.mark.parametrize("mode", ["all", "one"])
@pytest.mark.parametrize("views", [1, 2, 3])
@pytest.mark.parametrize("bsz", [1, 2, 5, 17])
def test_matches_loop_reference_grid(bsz: int, views: int, mode: str, kind: str) -> None:
    feats = _features(bsz, views, seed=bsz * 10 + views)
    targets = _targets(kind, bsz)
    ref, ref_grad = _ref_and_grad(feats, temperature=0.07, contrast_mode=mode, **targets)
    assert torch.isfinite(ref)
    for tile in (None, 1, 4, "auto"):  # dense, tiled (1 row, non-dividing 4), automatic
        ours, grad = _ours_and_grad(feats, SupConLoss(0.07, mode, tile_size=tile), **targets)
        _close(ours, ref)
        _close(grad, ref_grad)


@pytest.mark.parametrize("mode", ["all", "one"])
@pytest.mark.parametrize("base_temperature", [None, 0.07, 0.3])
@pytest.mark.parametrize("temperature", [0.05, 0.07, 0.5])
def test_temperatures_and_base_temperature(temperature: float, base_temperature: float | None, mode: str) -> None:
    feats = _features(7, 2, seed=3)
    labels = _labels(7, seed=3)
    ref, ref_grad = _ref_and_grad(feats, labels=labels, temperature=temperature, contrast_mode=mode, base_temperature=base_temperature)
    for tile in (None, 3):
        loss = SupConLoss(temperature, mode, base_temperature, tile_size=tile)
        ours, grad = _ours_and_grad(feats, loss, labels=labels)
        _close(ours, ref)
        _close(grad, ref_grad)


def test_base_temperature_none_means_no_rescaling_and_the_default_is_the_references() -> None:
    feats, labels = _features(6, 2, seed=4), _labels(6, seed=4)
    plain = supcon_loss(feats, labels, temperature=0.5, base_temperature=None)
    default = supcon_loss(feats, labels, temperature=0.5)
    # SupContrast's fixed base 0.07 (our default) multiplies the loss by T / 0.07
    _close(default, plain * (0.5 / 0.07))
    _close(supcon_loss(feats, labels, temperature=0.5, base_temperature=0.07), default)
    _close(plain, reference_loss(feats, labels, temperature=0.5, base_temperature=0.5))


def test_supervised_with_distinct_labels_equals_simclr() -> None:
    feats = _features(9, 3, seed=5)
    for mode in ("all", "one"):
        _close(supcon_loss(feats, torch.arange(9) * 7 - 3, contrast_mode=mode), supcon_loss(feats, contrast_mode=mode))
        _close(supcon_loss(feats, mask=torch.eye(9, dtype=torch.bool), contrast_mode=mode), supcon_loss(feats, contrast_mode=mode))


def test_label_mask_equals_labels_and_bool_mask_equals_float_mask() -> None:
    feats, labels = _features(8, 2, seed=6), _labels(8, seed=6)
    eq = labels[:, None] == labels[None, :]
    _close(supcon_loss(feats, mask=eq), supcon_loss(feats, labels))
    _close(supcon_loss(feats, mask=eq.double()), supcon_loss(feats, labels))


def test_weighted_asymmetric_mask_matches_reference() -> None:
    feats = _features(6, 2, seed=7)
    g = torch.Generator().manual_seed(7)
    weights = torch.rand(6, 6, generator=g, dtype=torch.float64) * (torch.rand(6, 6, generator=g) > 0.4)
    ref, ref_grad = _ref_and_grad(feats, mask=weights, temperature=0.1)
    for tile in (None, 5):
        ours, grad = _ours_and_grad(feats, SupConLoss(0.1, tile_size=tile), mask=weights)
        _close(ours, ref)
        _close(grad, ref_grad)


def test_anchors_without_positives_contribute_zero_and_count_in_the_mean() -> None:
    # one view, labels [0, 1, 1, 2]: anchors 0 and 3 have no positive (SupContrast PR #142 case)
    feats = _features(4, 1, seed=8)
    labels = torch.tensor([0, 1, 1, 2])
    per_anchor = reference_per_anchor(feats, labels, temperature=0.1)
    assert per_anchor[0] == 0 and per_anchor[3] == 0 and per_anchor[1] > 0 and per_anchor[2] > 0
    for tile in (None, 1):
        ours, grad = _ours_and_grad(feats, SupConLoss(0.1, tile_size=tile), labels=labels)
        _close(ours, (per_anchor[1] + per_anchor[2]) / 4)  # mean over all 4 anchors, not over the 2 with positives
        assert torch.isfinite(grad).all()


@pytest.mark.parametrize("tile", [None, 2])
def test_no_anchor_has_a_positive_gives_zero_loss_and_zero_grads(tile: int | None) -> None:
    feats = _features(5, 1, seed=9)
    for targets in ({"labels": torch.arange(5)}, {"mask": torch.zeros(5, 5)}, {}):
        ours, grad = _ours_and_grad(feats, SupConLoss(0.05, tile_size=tile), **targets)
        assert ours == 0
        assert torch.equal(grad, torch.zeros_like(grad))
    # a single sample with a single view: nothing to contrast with at all
    ours, grad = _ours_and_grad(_features(1, 1), SupConLoss(tile_size=tile), labels=torch.tensor([3]))
    assert ours == 0 and torch.equal(grad, torch.zeros_like(grad))


def test_single_class_batch_is_finite() -> None:
    feats = _features(6, 2, seed=10)
    labels = torch.zeros(6, dtype=torch.long)
    ref, ref_grad = _ref_and_grad(feats, labels=labels, temperature=0.05)
    ours, grad = _ours_and_grad(feats, SupConLoss(0.05), labels=labels)
    _close(ours, ref)
    _close(grad, ref_grad)


# ----------------------------------------------------------------------------
# dense == tiled, 'auto' selection
# ----------------------------------------------------------------------------
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 2e-6)])
@pytest.mark.parametrize("mode", ["all", "one"])
def test_tiled_equals_dense_values_and_grads(mode: str, dtype: torch.dtype, tol: float) -> None:
    feats = _features(33, 3, dim=16, seed=11, dtype=dtype)
    labels = _labels(33, seed=11)
    dense, dense_grad = _ours_and_grad(feats, SupConLoss(0.05, mode, tile_size=None), labels=labels)
    n_anchor = 33 * (3 if mode == "all" else 1)
    for tile in (1, 2, 7, 32, n_anchor - 1, n_anchor, 500):  # dividing and non-dividing, larger than N
        tiled, tiled_grad = _ours_and_grad(feats, SupConLoss(0.05, mode, tile_size=tile), labels=labels)
        _close(tiled, dense, tol)
        _close(tiled_grad, dense_grad, tol)


def test_auto_tile_choice() -> None:
    assert _choose_tile(None, 10**6, 10**6) is None
    assert _choose_tile(7, 4, 4) == 7
    assert _choose_tile("auto", 4096, 4096) is None  # batch 2048 x 2 views stays dense
    n = 16384  # batch 8192 x 2 views: tiled, about AUTO_TILE_ELEMENTS per block
    assert n * n > AUTO_DENSE_MAX_ELEMENTS
    assert _choose_tile("auto", n, n) == AUTO_TILE_ELEMENTS // n
    assert _choose_tile("auto", 10**6, 10**6) == 32


def test_auto_uses_the_tiled_function_above_the_threshold(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    dense_apply, tiled_apply = supcon_module._DenseLSE.apply, supcon_module._TiledLSE.apply
    monkeypatch.setattr(supcon_module._DenseLSE, "apply", lambda *a: calls.append("dense") or dense_apply(*a))
    monkeypatch.setattr(supcon_module._TiledLSE, "apply", lambda *a: calls.append("tiled") or tiled_apply(*a))
    feats, labels = _features(10, 2, seed=12), _labels(10, seed=12)
    ref = reference_loss(feats, labels, temperature=0.07)
    _close(supcon_loss(feats, labels), ref)
    monkeypatch.setattr(supcon_module, "AUTO_DENSE_MAX_ELEMENTS", 100)  # 20 x 20 > 100 -> tiled
    _close(supcon_loss(feats, labels), ref)
    assert calls == ["dense", "tiled"]


# ----------------------------------------------------------------------------
# mixed precision
# ----------------------------------------------------------------------------
@pytest.mark.parametrize("tile", [None, 8])
def test_bf16_autocast_small_temperature_is_finite_and_float32(tile: int | None) -> None:
    feats = _features(32, 2, dim=16, seed=13, dtype=torch.float32)
    # nearly collapsed features: the largest logits at T = 0.05 overflow bf16 exp range if not upcast
    feats = F.normalize(feats + 3.0, dim=-1).to(torch.bfloat16)
    labels = _labels(32, seed=13)
    x = feats.clone().requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = SupConLoss(0.05, tile_size=tile)(x, labels)
        loss.backward()
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    assert x.grad is not None and torch.isfinite(x.grad.float()).all()
    ref = reference_loss(feats.double(), labels, temperature=0.05)
    torch.testing.assert_close(loss.double(), ref, rtol=1e-5, atol=1e-5)


def test_float32_inside_autocast_is_computed_in_float32() -> None:
    feats = _features(24, 2, dim=32, seed=14, dtype=torch.float32)
    labels = _labels(24, seed=14)
    for tile in (None, 5):
        plain, plain_grad = _ours_and_grad(feats, SupConLoss(0.05, tile_size=tile), labels=labels)
        x = feats.clone().requires_grad_(True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = SupConLoss(0.05, tile_size=tile)(x, labels)
            loss.backward()  # backward inside autocast too: the analytic backward must not drop to bf16
        torch.testing.assert_close(loss.detach(), plain, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(x.grad, plain_grad, rtol=1e-6, atol=1e-7)


def test_half_inputs_without_autocast() -> None:
    feats = _features(8, 2, seed=15, dtype=torch.float32).half()
    loss = supcon_loss(feats, _labels(8, seed=15), temperature=0.05)
    assert loss.dtype == torch.float32 and torch.isfinite(loss)


# ----------------------------------------------------------------------------
# bad input
# ----------------------------------------------------------------------------
_F = _features(4, 2, dtype=torch.float32)

BAD_INPUTS = [
    ("2-D features", lambda: supcon_loss(_F[:, 0]), ValueError, "unsqueeze(1)"),
    ("4-D features", lambda: supcon_loss(_F[..., None]), ValueError, "flatten(2)"),
    ("integer features", lambda: supcon_loss(torch.ones(4, 2, 3, dtype=torch.long)), TypeError, ".float()"),
    ("not a tensor", lambda: supcon_loss([[1.0]]), TypeError, "torch.Tensor"),  # type: ignore[arg-type]
    ("empty batch", lambda: supcon_loss(torch.zeros(0, 2, 3)), ValueError, "non-empty"),
    ("float labels", lambda: supcon_loss(_F, torch.zeros(4)), TypeError, ".long()"),
    ("bool labels", lambda: supcon_loss(_F, torch.zeros(4, dtype=torch.bool)), TypeError, "integer"),
    ("2-D labels", lambda: supcon_loss(_F, torch.zeros(4, 1, dtype=torch.long)), ValueError, "view(-1)"),
    ("label/batch mismatch", lambda: supcon_loss(_F, torch.zeros(8, dtype=torch.long)), ValueError, "one label per sample"),
    ("labels and mask", lambda: supcon_loss(_F, torch.zeros(4, dtype=torch.long), torch.eye(4)), ValueError, "not both"),
    ("mask shape", lambda: supcon_loss(_F, mask=torch.eye(8)), ValueError, "[4, 4]"),
    ("negative mask", lambda: supcon_loss(_F, mask=-torch.eye(4)), ValueError, ">= 0"),
    ("NaN mask", lambda: supcon_loss(_F, mask=torch.full((4, 4), math.nan)), ValueError, "finite"),
    (
        "mask with gather_distributed",
        lambda: supcon_loss(_F, mask=torch.eye(4), gather_distributed=True),
        ValueError,
        "pass labels instead",
    ),
    ("NaN features", lambda: supcon_loss(torch.where(_F > 0.5, math.nan, _F)), ValueError, "diverged"),
    ("inf features", lambda: supcon_loss(torch.where(_F > 0.5, math.inf, _F), torch.arange(4)), ValueError, "gradient clipping"),
    ("temperature 0", lambda: SupConLoss(0.0), ValueError, "positive"),
    ("temperature nan", lambda: SupConLoss(math.nan), ValueError, "positive"),
    ("temperature str", lambda: SupConLoss("0.1"), TypeError, "float"),  # type: ignore[arg-type]
    ("base_temperature < 0", lambda: SupConLoss(0.1, base_temperature=-1.0), ValueError, "base_temperature"),
    ("contrast_mode", lambda: SupConLoss(0.1, "both"), ValueError, "'all'"),  # type: ignore[arg-type]
    ("tile_size 0", lambda: SupConLoss(tile_size=0), ValueError, ">= 1"),
    ("tile_size bool", lambda: SupConLoss(tile_size=True), TypeError, "tile_size"),
    ("tile_size str", lambda: SupConLoss(tile_size="big"), TypeError, "'auto'"),  # type: ignore[arg-type]
]


@pytest.mark.parametrize("name,call,exc,needle", BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_bad_input_raises_with_a_message_naming_the_fix(name: str, call, exc: type, needle: str) -> None:
    with pytest.raises(exc) as info:
        call()
    assert needle in str(info.value), f"{name}: {info.value}"


def test_check_finite_false_skips_the_check() -> None:
    feats = _F.clone()
    feats[0, 0, 0] = math.nan
    assert torch.isnan(supcon_loss(feats, torch.arange(4), check_finite=False))


def test_module_repr_and_defaults() -> None:
    loss = SupConLoss()
    assert loss.temperature == 0.07 and loss.base_temperature == 0.07 and loss.contrast_mode == "all"
    assert SupConLoss(0.5, base_temperature=None).base_temperature is None  # tied to the temperature
    assert "tile_size='auto'" in repr(loss)
    assert list(loss.parameters()) == []


# ----------------------------------------------------------------------------
# DDP: 2 gloo processes == one process on the concatenated batch
# ----------------------------------------------------------------------------
DDP_SCENARIOS = [
    # (rank sizes, views, supervised, contrast_mode, tile_size)
    ((3, 3), 2, True, "all", None),
    ((4, 2), 2, True, "all", None),
    ((3, 3), 2, False, "all", None),
    ((5, 2), 3, False, "all", 4),
    ((4, 3), 2, True, "one", 2),
    ((2, 5), 1, True, "all", "auto"),
]


def _ddp_problem(sizes: tuple[int, ...], views: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    n = sum(sizes)
    return _features(n, views, dim=5, seed=seed), _labels(n, seed=seed)


def _ddp_rank_fn(rank: int, world: int) -> dict:
    out: dict = {"scenarios": []}
    for k, (sizes, views, supervised, mode, tile) in enumerate(DDP_SCENARIOS):
        feats, labels = _ddp_problem(sizes, views, seed=k)
        start = sum(sizes[:rank])
        xl = feats[start : start + sizes[rank]].clone().requires_grad_(True)
        yl = labels[start : start + sizes[rank]] if supervised else None
        loss = SupConLoss(0.1, mode, gather_distributed=True, tile_size=tile)(xl, yl)
        loss.backward()
        out["scenarios"].append(
            {"loss_mean": D.all_reduce_sum(loss.detach()) / world, "grad": xl.grad / world}  # DDP divides by W
        )
    # NaN on one rank only: every rank must raise (checked on the gathered batch), none may hang
    x = _features(3, 2, seed=99)
    if rank == 1:
        x[0, 0, 0] = math.nan
    try:
        SupConLoss(gather_distributed=True)(x, torch.arange(3))
        out["nan_error"] = None
    except ValueError as err:
        out["nan_error"] = str(err)
    return out


@pytest.mark.slow  # 2-process DDP: the long tier (pytest -m slow)
@pytest.mark.ddp
def test_ddp_equals_single_process_on_the_concatenated_batch() -> None:
    results = run_distributed(_ddp_rank_fn, 2)
    for k, (sizes, views, supervised, mode, _) in enumerate(DDP_SCENARIOS):
        feats, labels = _ddp_problem(sizes, views, seed=k)
        ref, ref_grad = _ref_and_grad(feats, labels=labels if supervised else None, temperature=0.1, contrast_mode=mode)
        for r, res in enumerate(results):
            got = res["scenarios"][k]
            torch.testing.assert_close(got["loss_mean"], ref, rtol=1e-5, atol=1e-9)
            start = sum(sizes[:r])
            torch.testing.assert_close(got["grad"], ref_grad[start : start + sizes[r]], rtol=1e-5, atol=1e-9)
    for res in results:
        assert res["nan_error"] is not None and "NaN or inf" in res["nan_error"]


# ---------------------------------------------------------------- degenerate batches: a batch of one, a single class
@pytest.mark.parametrize("method", ["supcon", "simclr"])
@pytest.mark.parametrize("n, views", [(1, 1), (1, 2), (2, 1), (2, 2), (6, 2)])
def test_supcon_batch_of_one_and_single_class(method: str, n: int, views: int) -> None:
    torch.manual_seed(10 * n + views)
    f = F.normalize(torch.randn(n, views, 8, dtype=torch.float64), dim=-1).requires_grad_(True)
    labels = torch.zeros(n, dtype=torch.long) if method == "supcon" else None
    loss = SupConLoss(temperature=0.05)(f, labels)
    ref = float(supcon_loop_reference(f.detach(), labels, temperature=0.05))
    assert float(loss.detach()) == pytest.approx(ref, abs=1e-9)
    grad_check(loss, f)
