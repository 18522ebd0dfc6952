"""CLOC loss (issue 3 "The loss", issue 7 DDP, issue 9 mixed precision / bad input).

Values and gradients are checked against the independent references of
:mod:`tests.references.cloc`, never against the code under test:

* :func:`cloc_loop_reference` -- issue 3's formula as a plain triple loop in float64
  (anchor i, positive j, negative k), differentiated by autograd;
* :func:`cloc_dense_reference` -- the same formula with the (j, k) pairs of one anchor
  as a small dense matrix (a loop over anchors), for mid-size batches.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
import torch.nn.functional as F
import yaml

from cloc_lightning import distributed as D
from cloc_lightning.losses import cloc as cloc_mod
from cloc_lightning.losses.cloc import (
    OrdinalContrastiveLoss_mm,
    OrdinalContrastiveLoss_sm,
    cloc_pair_hinge_sums,
)
from tests._ddp import run_distributed
from tests.losses.conftest import grad_check
from tests.references.cloc import cloc_dense_reference, cloc_loop_reference
from tests.references.cloc import softplus_reference as _ref_softplus

F64 = torch.float64


#: the references run thousands of tiny ops; with 2 OpenMP threads on a shared 2-core
#: machine they can be 10x slower (spin-waiting), so these tests use one thread
pytestmark = pytest.mark.usefixtures("one_thread")


# ----------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------
MM_MAPS = ("none", "learnable_values", "mixed", "all_fixed")
SM_MAPS = ("sm_none", "sm_learnable", "sm_fixed")


def _make_map(kind: str, n_classes: int) -> list[list[Any]] | None:
    c = n_classes - 1
    if kind in ("none", "sm_none"):
        return None
    if kind == "learnable_values":
        return [["learnable", None if i % 3 == 2 else 0.2 + 0.15 * i] for i in range(c)]
    if kind == "mixed":
        return [["fixed", 0.1 + 0.1 * i] if i % 2 == 0 else ["learnable", None if i % 4 == 3 else 0.35] for i in range(c)]
    if kind == "all_fixed":
        return [["fixed", 0.3 + 0.05 * i] for i in range(c)]
    if kind == "sm_learnable":
        return [["learnable", 0.47]]
    if kind == "sm_fixed":
        return [["fixed", 0.47]]
    raise AssertionError(kind)


def _make_crit(kind: str, n_classes: int, **kw: Any) -> torch.nn.Module:
    cls = OrdinalContrastiveLoss_sm if kind.startswith("sm") else OrdinalContrastiveLoss_mm
    return cls(n_classes, learnable_map=_make_map(kind, n_classes), **kw)


def _ref_margins(crit: torch.nn.Module, kind: str) -> tuple[list[torch.Tensor], torch.Tensor | None]:
    """Adjacent margins built from the stored raw values (public parameters/buffers) and the map's kinds.

    The reference applies its own softplus; it never calls the code's ``margins()``.  (Fixed
    values are read from the float32 buffer, so the map's ``v`` is matched up to float32
    rounding; that ``softplus(raw) == v`` is tested separately.)
    Returns (margins as 0-d float64 tensors, the float64 leaf standing for the raw learnable params).
    """
    n = crit.n_classes
    if kind.startswith("sm"):
        leaf = crit.distance.detach().to(F64).clone().requires_grad_(kind != "sm_fixed")
        return [_ref_softplus(leaf[0])] * (n - 1), (leaf if kind != "sm_fixed" else None)
    entries = _make_map(kind, n) or [["learnable", None]] * (n - 1)
    leaf = crit.learnables.detach().to(F64).clone().requires_grad_(True)
    out, k = [], 0
    for i, (kind_i, _) in enumerate(entries):
        if kind_i == "fixed":
            out.append(_ref_softplus(crit.fixed_raw[i].detach().to(F64)))
        else:
            out.append(_ref_softplus(leaf[k]))
            k += 1
    assert k == leaf.numel()
    return out, (leaf if k > 0 else None)


def _raw_param(crit: torch.nn.Module) -> torch.Tensor | None:
    params = [p for p in crit.parameters() if p.requires_grad]
    assert len(params) <= 1
    return params[0] if params else None


def _labels(n: int, n_classes: int, g: torch.Generator, mode: str) -> torch.Tensor:
    if mode == "single":
        return torch.full((n,), int(torch.randint(0, n_classes, (1,), generator=g)), dtype=torch.long)
    return torch.randint(0, n_classes, (n,), generator=g)


# ----------------------------------------------------------------------------
# values and gradients over the grid (float64 -> the torch.sort path)
# ----------------------------------------------------------------------------
SIZES = ((1, "random"), (2, "random"), (3, "random"), (5, "single"), (6, "random"), (9, "random"), (12, "random"))


@pytest.mark.parametrize("n_classes", list(range(2, 11)))
@pytest.mark.parametrize("kind", MM_MAPS + SM_MAPS)
def test_value_and_gradients_match_loop_reference(n_classes: int, kind: str) -> None:
    g = torch.Generator().manual_seed(1000 * n_classes + len(kind))
    torch.manual_seed(n_classes)
    for idx, (n, mode) in enumerate(SIZES):
        reduction = ("official", "mean")[idx % 2]
        crit = _make_crit(kind, n_classes, reduction=reduction).to(F64)
        x = torch.randn(n, 4, generator=g, dtype=F64)
        y = _labels(n, n_classes, g, mode)
        xa = x.clone().requires_grad_(True)
        loss = crit(xa, y)
        raw = _raw_param(crit)
        wrt = [xa] + ([raw] if raw is not None else [])
        grads = torch.autograd.grad(loss, wrt, allow_unused=True)

        xr = x.clone().requires_grad_(True)
        margins, leaf = _ref_margins(crit, kind)
        ref = cloc_loop_reference(xr, y.tolist(), margins, reduction)
        assert torch.isfinite(loss) and loss.dtype == F64
        torch.testing.assert_close(loss.detach(), ref.detach(), rtol=1e-10, atol=1e-12)
        if ref.requires_grad:
            ref_wrt = [xr] + ([leaf] if leaf is not None else [])
            ref_grads = torch.autograd.grad(ref, ref_wrt, allow_unused=True)
        else:  # no (positive, negative) pair at all: the loss is a constant 0
            ref_grads = [torch.zeros_like(xr)] + ([torch.zeros_like(leaf)] if leaf is not None else [])
        assert (raw is None) == (leaf is None)
        for got, want in zip(grads, ref_grads, strict=True):
            got = torch.zeros_like(want) if got is None else got
            want = torch.zeros_like(got) if want is None else want
            torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("kind", ["none", "mixed", "sm_learnable"])
@pytest.mark.parametrize("reduction", ["official", "mean"])
def test_float32_fast_path_matches_loop_reference(kind: str, reduction: str) -> None:
    """float32 CPU inputs take the packed-key sort; compare with the float64 loop."""
    g = torch.Generator().manual_seed(7)
    for n_classes, n in [(2, 7), (5, 11), (10, 13)]:
        torch.manual_seed(n)
        crit = _make_crit(kind, n_classes, reduction=reduction)
        x = torch.randn(n, 6, generator=g)
        y = torch.randint(0, n_classes, (n,), generator=g)
        xa = x.clone().requires_grad_(True)
        loss = crit(xa, y)
        assert loss.dtype == torch.float32
        raw = _raw_param(crit)  # None for 'mixed' at C = 2 (its single margin is fixed)
        grads = torch.autograd.grad(loss, [xa] + ([raw] if raw is not None else []))
        xr = x.to(F64).requires_grad_(True)
        margins, leaf = _ref_margins(crit, kind)
        ref = cloc_loop_reference(xr, y.tolist(), margins, reduction)
        ref_grads = torch.autograd.grad(ref, [xr] + ([leaf] if leaf is not None else []))
        assert len(grads) == len(ref_grads)
        torch.testing.assert_close(loss.double(), ref.detach(), rtol=2e-6, atol=1e-7)
        for got, want in zip(grads, ref_grads, strict=True):
            torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_mid_size_batches_match_dense_reference(dtype: torch.dtype) -> None:
    """Hundreds of samples, imbalanced classes and duplicated rows; float32 and float64 paths."""
    g = torch.Generator().manual_seed(3)
    for n, n_classes, reduction in [(300, 8, "official"), (257, 3, "mean")]:
        torch.manual_seed(n)
        crit = OrdinalContrastiveLoss_mm(n_classes, reduction=reduction).to(dtype)
        probs = torch.linspace(1.0, 3.0, n_classes)
        y = torch.multinomial(probs, n, replacement=True, generator=g)
        x = torch.randn(n, 16, generator=g, dtype=dtype)
        x[1] = x[0]  # exact duplicates give tied similarities
        y[1] = y[0]
        xa = x.clone().requires_grad_(True)
        loss = crit(xa, y)
        gx, gm = torch.autograd.grad(loss, [xa, crit.learnables])
        xr = x.to(F64).requires_grad_(True)
        leaf = crit.learnables.detach().to(F64).requires_grad_(True)
        ref = cloc_dense_reference(xr, y, _ref_softplus(leaf), reduction)
        rx, rm = torch.autograd.grad(ref, [xr, leaf])
        tol = dict(rtol=1e-5, atol=1e-7) if dtype == torch.float32 else dict(rtol=1e-10, atol=1e-13)
        torch.testing.assert_close(loss.double(), ref.detach(), **tol)
        torch.testing.assert_close(gx.double(), rx, rtol=tol["rtol"] * 10, atol=tol["atol"])
        torch.testing.assert_close(gm.double(), rm, rtol=tol["rtol"] * 10, atol=tol["atol"])


def test_row_blocks_give_the_same_result(monkeypatch: pytest.MonkeyPatch) -> None:
    """The forward works on row blocks to bound memory; tiny blocks must not change anything."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(90, 8, generator=g)
    y = torch.randint(0, 4, (90,), generator=g)
    crit = OrdinalContrastiveLoss_mm(4, learnable_map=[["learnable", 0.3], ["fixed", 0.6], ["learnable", 0.9]])
    xr = x.to(F64).requires_grad_(True)
    leaf = crit.learnables.detach().to(F64).requires_grad_(True)
    adjacent = torch.stack([_ref_softplus(leaf[0]), torch.tensor(0.6, dtype=F64), _ref_softplus(leaf[1])])
    ref = cloc_dense_reference(xr, y, adjacent, "official")
    rx, rm = torch.autograd.grad(ref, [xr, leaf])
    monkeypatch.setattr(cloc_mod, "_BLOCK_ELEMENTS", 500)  # about 4 rows per block
    xa = x.clone().requires_grad_(True)
    loss = crit(xa, y)
    gx, gm = torch.autograd.grad(loss, [xa, crit.learnables])
    torch.testing.assert_close(loss.double(), ref.detach(), rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(gx.double(), rx, rtol=1e-4, atol=1e-7)
    torch.testing.assert_close(gm.double(), rm, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_ties_have_zero_relu_derivative(dtype: torch.dtype) -> None:
    """Exact ties a_k == b_j (dyadic values, incl. -0.0) count 0 in value and gradient, like torch.relu."""
    g = torch.Generator().manual_seed(11)
    values = torch.tensor([-0.5, -0.25, -0.0, 0.0, 0.25, 0.5, 0.75], dtype=dtype)
    y = torch.tensor([0, 0, 1, 1, 1, 2, 2, 0])
    n = y.numel()
    s = values[torch.randint(0, values.numel(), (n, n), generator=g)]
    adjacent = torch.tensor([0.25, 0.5], dtype=dtype)
    pos = torch.cat([adjacent.new_zeros(1), torch.cumsum(adjacent, 0)])
    dmat = (pos[None, :] - pos[:, None]).abs()

    sa = s.clone().requires_grad_(True)
    da = dmat.clone().requires_grad_(True)
    sums, n_pos, n_neg = cloc_pair_hinge_sums(sa, da, y, y, torch.arange(n))
    weights = torch.randn(n, generator=g, dtype=dtype)
    gs, gd = torch.autograd.grad((sums * weights).sum(), [sa, da])

    sr = s.to(F64).clone().requires_grad_(True)
    dr = dmat.to(F64).clone().requires_grad_(True)
    ref_sums, ties = [], 0
    for i in range(n):
        acc = torch.zeros((), dtype=F64)
        for j in range(n):
            if j == i or y[j] != y[i]:
                continue
            for k in range(n):
                if y[k] == y[i]:
                    continue
                arg = sr[i, k] + dr[y[i], y[k]] - sr[i, j]
                ties += int(arg.item() == 0.0)
                acc = acc + torch.relu(arg)
        ref_sums.append(acc)
    ref = torch.stack(ref_sums)
    rs, rd = torch.autograd.grad((ref * weights.to(F64)).sum(), [sr, dr])
    assert ties > 5  # the test really exercises ties
    torch.testing.assert_close(sums.double(), ref.detach())
    torch.testing.assert_close(gs.double(), rs)
    torch.testing.assert_close(gd.double(), rd)
    assert n_pos.tolist() == [2, 2, 2, 2, 2, 1, 1, 2]
    assert n_neg.tolist() == [5, 5, 5, 5, 5, 6, 6, 5]


@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_row_argsort_orders_by_value_then_flag_then_column(dtype: torch.dtype) -> None:
    """The sort behind the fast path (packed int64 keys for float32, two stable sorts otherwise)
    against Python's sorted(); -0.0 equals 0.0, at equal values unflagged entries come first."""
    g = torch.Generator().manual_seed(4)
    pool = torch.tensor([-3.5, -1.0, -0.0, 0.0, 1e-30, 0.25, 1.0, 3e37], dtype=dtype)
    vals = pool[torch.randint(0, pool.numel(), (6, 40), generator=g)]
    flag = torch.rand(6, 40, generator=g) < 0.4
    idx = cloc_mod._argsort_rows(vals, flag)
    for r in range(6):
        row, fl = vals[r].tolist(), flag[r].tolist()
        expected = sorted(range(40), key=lambda c: (row[c], fl[c], c))
        assert idx[r].tolist() == expected


def test_large_batch_float32_agrees_with_float64() -> None:
    """Counts in the thousands: float32 sums stay accurate (no cancellation, no overflow)."""
    g = torch.Generator().manual_seed(2)
    x = torch.randn(1500, 32, generator=g)
    y = torch.randint(0, 6, (1500,), generator=g)
    c32 = OrdinalContrastiveLoss_mm(6)
    c64 = OrdinalContrastiveLoss_mm(6)
    c64.load_state_dict(c32.state_dict())
    c64 = c64.to(F64)
    x32 = x.clone().requires_grad_(True)
    x64 = x.to(F64).requires_grad_(True)
    l32, l64 = c32(x32, y), c64(x64, y)
    l32.backward()
    l64.backward()
    torch.testing.assert_close(l32.double(), l64.detach(), rtol=1e-5, atol=0)
    torch.testing.assert_close(x32.grad.double(), x64.grad, rtol=1e-4, atol=1e-8)
    torch.testing.assert_close(c32.learnables.grad.double(), c64.learnables.grad, rtol=1e-4, atol=0)


# ----------------------------------------------------------------------------
# degenerate batches
# ----------------------------------------------------------------------------
@pytest.mark.parametrize("cls", [OrdinalContrastiveLoss_mm, OrdinalContrastiveLoss_sm])
@pytest.mark.parametrize("case", ["batch1", "single_class", "all_distinct"])
def test_degenerate_batches_give_finite_zero(cls: type, case: str) -> None:
    n = {"batch1": 1, "single_class": 7, "all_distinct": 4}[case]
    y = {"batch1": torch.tensor([2]), "single_class": torch.full((7,), 3), "all_distinct": torch.arange(4)}[case]
    crit = cls(5)
    x = torch.randn(n, 5, requires_grad=True)
    loss = crit(x, y)
    assert torch.isfinite(loss) and float(loss.detach()) == 0.0
    loss.backward()
    assert x.grad is not None and torch.count_nonzero(x.grad) == 0


# ----------------------------------------------------------------------------
# parameters, buffers, state_dict, dtype
# ----------------------------------------------------------------------------
def test_fixed_margins_get_no_gradient_and_do_not_move() -> None:
    lmap = [["fixed", 0.12], ["learnable", None], ["fixed", 0.40], ["learnable", 0.32]]
    crit = OrdinalContrastiveLoss_mm(5, learnable_map=lmap)
    params = dict(crit.named_parameters())
    assert list(params) == ["learnables"] and params["learnables"].shape == (2,)
    assert not crit.fixed_raw.requires_grad
    before = crit.margins().detach().clone()
    opt = torch.optim.SGD(crit.parameters(), lr=0.5)
    g = torch.Generator().manual_seed(0)
    for _ in range(3):
        x = torch.randn(20, 5, generator=g)
        y = torch.randint(0, 5, (20,), generator=g)
        opt.zero_grad()
        crit(x, y).backward()
        assert crit.learnables.grad is not None and crit.fixed_raw.grad is None
        assert torch.count_nonzero(crit.learnables.grad) == 2
        opt.step()
    after = crit.margins().detach()
    assert torch.equal(after[[0, 2]], before[[0, 2]])
    assert not torch.allclose(after[[1, 3]], before[[1, 3]])


def test_all_fixed_maps_have_no_trainable_parameters() -> None:
    mm = OrdinalContrastiveLoss_mm(4, learnable_map=[["fixed", 0.2], ["fixed", 0.3], ["fixed", 0.4]])
    sm = OrdinalContrastiveLoss_sm(4, learnable_map=[["fixed", 0.47]])
    assert [p for p in mm.parameters() if p.requires_grad] == []
    assert mm.learnables.numel() == 0 and F.softplus(mm.learnables).numel() == 0
    assert list(sm.parameters()) == [] and "distance" in dict(sm.named_buffers())
    x = torch.randn(8, 4, requires_grad=True)
    y = torch.tensor([0, 1, 2, 3, 0, 1, 2, 3])
    (mm(x, y) + sm(x, y)).backward()
    assert x.grad is not None and mm.learnables.grad is None


def test_state_dict_round_trip_with_buffers() -> None:
    lmap = [["fixed", 0.12], ["learnable", None], ["fixed", 0.40], ["learnable", 0.32]]
    torch.manual_seed(0)
    a = OrdinalContrastiveLoss_mm(5, learnable_map=lmap)
    with torch.no_grad():
        a.learnables.add_(0.3)  # "trained"
    sd = a.state_dict()
    assert set(sd) == {"learnables", "fixed_raw", "learnable_mask", "learnable_index"}
    assert sd["fixed_raw"].dtype == torch.float32 and sd["learnables"].dtype == torch.float32
    torch.manual_seed(1)
    b = OrdinalContrastiveLoss_mm(5, learnable_map=lmap)
    assert not torch.equal(a.margins(), b.margins())
    b.load_state_dict(sd)
    assert torch.equal(a.margins(), b.margins())
    x, y = torch.randn(10, 5), torch.randint(0, 5, (10,))
    assert torch.equal(a(x, y), b(x, y))

    sm_a = OrdinalContrastiveLoss_sm(5, learnable_map=[["fixed", 0.3]])
    sm_b = OrdinalContrastiveLoss_sm(5, learnable_map=[["fixed", 0.9]])
    assert set(sm_a.state_dict()) == {"distance"}
    sm_b.load_state_dict(sm_a.state_dict())
    torch.testing.assert_close(sm_b.margins(), torch.full((4,), 0.3))


def test_to_float64_moves_parameters_and_buffers() -> None:
    crit = OrdinalContrastiveLoss_mm(4, learnable_map=[["fixed", 0.2], ["learnable", 0.5], ["fixed", 0.7]])
    crit = crit.to(F64)
    assert crit.fixed_raw.dtype == F64 and crit.learnables.dtype == F64
    assert crit.learnable_mask.dtype == torch.bool and crit.learnable_index.dtype == torch.long
    loss = crit(torch.randn(6, 4), torch.tensor([0, 1, 2, 3, 0, 1]))
    assert loss.dtype == F64
    torch.testing.assert_close(crit.margins(), torch.tensor([0.2, 0.5, 0.7], dtype=F64), rtol=1e-6, atol=0)
    sm = OrdinalContrastiveLoss_sm(3, learnable_map=[["fixed", 0.4]]).to(F64)
    assert sm.distance.dtype == F64


# ----------------------------------------------------------------------------
# learnable_map semantics and phase two
# ----------------------------------------------------------------------------
def test_learnable_map_values_are_the_margins() -> None:
    lmap = [["learnable", None], ["learnable", 0.25], ["fixed", 1e-4], ["learnable", 30.0], ["fixed", 0.4]]
    torch.manual_seed(0)
    crit = OrdinalContrastiveLoss_mm(6, learnable_map=lmap)
    learned = F.softplus(crit.learnables.detach())
    assert 0.5 <= float(learned[0]) <= 1.0
    torch.testing.assert_close(learned[1:], torch.tensor([0.25, 30.0]), rtol=1e-6, atol=0)
    m = crit.margins().detach()
    torch.testing.assert_close(m[[1, 2, 3, 4]], torch.tensor([0.25, 1e-4, 30.0, 0.4]), rtol=1e-5, atol=0)
    assert crit.margin_names() == ["C0-C1", "C1-C2", "C2-C3", "C3-C4", "C4-C5"]
    assert torch.equal(crit.learnable_mask, torch.tensor([True, True, False, True, False]))

    # None -> every margin learnable from U(0.5, 1.0), reproducible under a seed
    torch.manual_seed(42)
    r1 = OrdinalContrastiveLoss_mm(9)
    torch.manual_seed(42)
    r2 = OrdinalContrastiveLoss_mm(9)
    m1 = r1.margins().detach()
    assert r1.learnables.shape == (8,) and torch.equal(m1, r2.margins().detach())
    assert bool(((m1 >= 0.5) & (m1 <= 1.0)).all()) and len(set(m1.tolist())) == 8

    sm = OrdinalContrastiveLoss_sm(5, learnable_map=[["learnable", 0.47]])
    torch.testing.assert_close(F.softplus(sm.distance.detach()), torch.tensor([0.47]))
    torch.testing.assert_close(sm.margins().detach(), torch.full((4,), 0.47))
    sm_none = OrdinalContrastiveLoss_sm(5)
    assert sm_none.learnable and 0.5 <= float(F.softplus(sm_none.distance.detach())) <= 1.0


def test_to_learnable_map_round_trips_through_yaml() -> None:
    torch.manual_seed(3)
    lmap = [["fixed", 0.12], ["learnable", None], ["fixed", 0.4], ["learnable", 0.32]]
    crit = OrdinalContrastiveLoss_mm(5, learnable_map=lmap)
    phase_two = crit.to_learnable_map()
    assert [k for k, _ in phase_two] == ["fixed"] * 4
    assert all(type(v) is float for _, v in phase_two)
    text = yaml.safe_dump(phase_two)
    loaded = yaml.safe_load(text)
    frozen = OrdinalContrastiveLoss_mm(5, learnable_map=loaded)
    torch.testing.assert_close(frozen.margins(), crit.margins().detach(), rtol=1e-6, atol=0)
    assert [p for p in frozen.parameters() if p.requires_grad] == []
    again = OrdinalContrastiveLoss_mm(5, learnable_map=crit.to_learnable_map("learnable"))
    torch.testing.assert_close(F.softplus(again.learnables.detach()), crit.margins().detach(), rtol=1e-6, atol=0)

    sm = OrdinalContrastiveLoss_sm(4, learnable_map=[["learnable", 0.8]])
    assert sm.to_learnable_map() == [["fixed", pytest.approx(0.8, rel=1e-6)]]
    sm2 = OrdinalContrastiveLoss_sm(4, learnable_map=yaml.safe_load(yaml.safe_dump(sm.to_learnable_map())))
    assert not sm2.learnable
    with pytest.raises(ValueError, match="'fixed' or 'learnable'"):
        crit.to_learnable_map("frozen")  # type: ignore[arg-type]


# ----------------------------------------------------------------------------
# TensorBoard logging
# ----------------------------------------------------------------------------
def _read_events(logdir: str) -> Any:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(logdir, size_guidance={"scalars": 0, "tensors": 0})
    ea.Reload()
    return ea


def _layout_tags(ea: Any) -> tuple[int, str, list[str]]:
    from tensorboard.plugins.custom_scalar import layout_pb2

    events = ea.Tensors("custom_scalars__config__")
    layout = layout_pb2.Layout()
    layout.ParseFromString(events[0].tensor_proto.string_val[0])
    category = layout.category[0]
    return len(events), category.title, list(category.chart[0].multiline.tag)


def test_summary_writer_logs_margins_and_layout_once(tmp_path: Any) -> None:
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(tmp_path / "mm"))
    lmap = [["fixed", 0.3], ["learnable", 0.6], ["fixed", 0.9]]
    crit = OrdinalContrastiveLoss_mm(4, summaryWriter=writer, learnable_map=lmap)
    crit.set_writer(writer)  # registering again is a no-op
    x, y = torch.randn(8, 4), torch.tensor([0, 1, 2, 3, 0, 1, 2, 3])
    for step in range(3):
        crit(x, y, step)
    crit(x, y)  # no step -> nothing logged
    writer.close()
    ea = _read_events(str(tmp_path / "mm"))
    assert sorted(ea.Tags()["scalars"]) == ["C0-C1", "C1-C2", "C2-C3"]
    for name, value in zip(["C0-C1", "C1-C2", "C2-C3"], [0.3, 0.6, 0.9], strict=True):
        events = ea.Scalars(name)
        assert [e.step for e in events] == [0, 1, 2]
        assert all(e.value == pytest.approx(value, rel=1e-5) for e in events)
    assert _layout_tags(ea) == (1, "Class Distances", ["C0-C1", "C1-C2", "C2-C3"])


def test_single_margin_logging_and_no_writer(tmp_path: Any) -> None:
    from torch.utils.tensorboard import SummaryWriter

    x, y = torch.randn(6, 3), torch.tensor([0, 1, 2, 0, 1, 2])
    plain = OrdinalContrastiveLoss_sm(3)  # the reference crashes here without a writer
    assert torch.isfinite(plain(x, y, step=5))

    writer = SummaryWriter(str(tmp_path / "sm"))
    crit = OrdinalContrastiveLoss_sm(3, summaryWriter=writer, learnable_map=[["learnable", 0.47]])
    crit(x, y, 0)
    crit(x, y, 1)
    writer.close()
    ea = _read_events(str(tmp_path / "sm"))
    assert ea.Tags()["scalars"] == ["Margin"]
    assert [round(e.value, 5) for e in ea.Scalars("Margin")] == [0.47, 0.47]
    assert _layout_tags(ea) == (1, "Class Distances", ["Margin"])
    assert crit.margin_scalars() == {"Margin": pytest.approx(0.47, rel=1e-6)}


# ----------------------------------------------------------------------------
# mixed precision and non-finite input
# ----------------------------------------------------------------------------
@pytest.mark.parametrize("cls", [OrdinalContrastiveLoss_mm, OrdinalContrastiveLoss_sm])
def test_bf16_autocast_is_finite_and_computed_in_float32(cls: type) -> None:
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    head = torch.nn.Linear(16, 5)
    crit = cls(5)
    x = torch.randn(64, 16, generator=g)
    y = torch.randint(0, 5, (64,), generator=g)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = head(x)
        assert out.dtype == torch.bfloat16
        loss = crit(out, y)
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in head.parameters())
    expected = crit(out.detach().float(), y)  # same bf16 values, upcast by hand
    torch.testing.assert_close(loss.detach(), expected.detach())
    half = crit(out.detach().half(), y)
    assert half.dtype == torch.float32 and torch.isfinite(half)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_prediction_raises(bad: float) -> None:
    crit = OrdinalContrastiveLoss_mm(3)
    x = torch.randn(6, 3)
    x[2, 1] = bad
    y = torch.tensor([0, 1, 2, 0, 1, 2])
    with pytest.raises(ValueError, match="NaN or inf.*diverged"):
        crit(x, y)
    unchecked = OrdinalContrastiveLoss_mm(3, check_finite=False)
    unchecked(x, y)  # the check can be switched off (the result is then undefined)


def test_non_finite_margins_raise() -> None:
    crit = OrdinalContrastiveLoss_mm(3)
    with torch.no_grad():
        crit.learnables[0] = math.nan
    with pytest.raises(ValueError, match="margins are not finite"):
        crit(torch.randn(4, 3), torch.tensor([0, 1, 2, 0]))


# ----------------------------------------------------------------------------
# bad input
# ----------------------------------------------------------------------------
_MM, _SM = OrdinalContrastiveLoss_mm, OrdinalContrastiveLoss_sm
BAD_CONSTRUCTION = [
    (lambda: _MM(1), ValueError, "n_classes must be >= 2"),
    (lambda: _MM(0), ValueError, "n_classes must be >= 2"),
    (lambda: _MM(2.5), TypeError, "n_classes must be an int"),
    (lambda: _MM("5"), TypeError, "n_classes must be an int"),
    (lambda: _SM(True), TypeError, "n_classes must be an int"),
    (lambda: _MM(4, learnable_map=[["fixed", 0.1]] * 2), ValueError, "has 2 entries but .* needs exactly 3"),
    (lambda: _SM(4, learnable_map=[["fixed", 0.1]] * 3), ValueError, "exactly 1"),
    (lambda: _MM(3, learnable_map=[["frozen", 0.1], ["fixed", 0.2]]), ValueError, "kind must be 'learnable' or 'fixed'"),
    (lambda: _MM(3, learnable_map=[["fixed", 0.0], ["fixed", 0.2]]), ValueError, "finite and > 0"),
    (lambda: _MM(3, learnable_map=[["learnable", -0.3], ["fixed", 0.2]]), ValueError, "finite and > 0"),
    (lambda: _MM(3, learnable_map=[["fixed", math.nan], ["fixed", 0.2]]), ValueError, "finite and > 0"),
    (lambda: _MM(3, learnable_map=[["fixed", math.inf], ["fixed", 0.2]]), ValueError, "finite and > 0"),
    (lambda: _MM(3, learnable_map=[["fixed", "0.4"], ["fixed", 0.2]]), TypeError, "quoted string in YAML"),
    (lambda: _MM(3, learnable_map=[["fixed", True], ["fixed", 0.2]]), TypeError, "number > 0 or None"),
    (lambda: _MM(3, learnable_map=[["fixed", None], ["fixed", 0.2]]), ValueError, "needs a value"),
    (lambda: _MM(3, learnable_map=[["fixed"], ["fixed", 0.2]]), TypeError, "pair \\[kind, value\\]"),
    (lambda: _MM(3, learnable_map=["fixed", "fixed"]), TypeError, "pair \\[kind, value\\]"),
    (lambda: _MM(3, learnable_map="fixed"), TypeError, "list of \\[kind, value\\] pairs"),
    (lambda: _MM(3, learnable_map={"a": 1}), TypeError, "list of \\[kind, value\\] pairs"),
    (lambda: _MM(3, reduction="sum"), ValueError, "reduction must be 'official'"),
    (lambda: _MM(3, gather_distributed="yes"), TypeError, "gather_distributed must be True or False"),
    (lambda: _MM(3, summaryWriter="runs/"), TypeError, "SummaryWriter"),
]


@pytest.mark.parametrize("make,exc,match", BAD_CONSTRUCTION)
def test_bad_construction_raises_clear_errors(make: Any, exc: type, match: str) -> None:
    with pytest.raises(exc, match=match):
        make()


_X = torch.randn(4, 3)
BAD_FORWARD = [
    (lambda c: c(_X, torch.tensor([0.0, 1.0, 2.0, 0.0])), TypeError, "integer class ids.*long"),
    (lambda c: c(_X, torch.tensor([True, False, True, False])), TypeError, "integer class ids"),
    (lambda c: c(_X, torch.tensor([0, 1, 3, 0])), ValueError, "labels must lie in \\[0, n_classes\\) = \\[0, 3\\)"),
    (lambda c: c(_X, torch.tensor([0, -1, 2, 0])), ValueError, "labels must lie in"),
    (lambda c: c(_X, torch.tensor([0, 1, 2])), ValueError, "target must be \\[batch\\] = \\[4\\]"),
    (lambda c: c(_X, torch.tensor([[0], [1], [2], [0]])), ValueError, "target.view\\(-1\\)"),
    (lambda c: c(_X, [0, 1, 2, 0]), TypeError, "target must be a torch.Tensor"),
    (lambda c: c(_X[0], torch.tensor([0])), ValueError, "2-D \\[batch, dim\\]"),
    (lambda c: c(_X.view(4, 3, 1), torch.tensor([0, 1, 2, 0])), ValueError, "flatten"),
    (lambda c: c(torch.empty(0, 3), torch.empty(0, dtype=torch.long)), ValueError, "non-empty"),
    (lambda c: c(torch.ones(4, 3, dtype=torch.long), torch.tensor([0, 1, 2, 0])), TypeError, "floating-point"),
    (lambda c: c(_X.numpy(), torch.tensor([0, 1, 2, 0])), TypeError, "prediction must be a torch.Tensor"),
]


@pytest.mark.parametrize("cls", [OrdinalContrastiveLoss_mm, OrdinalContrastiveLoss_sm])
@pytest.mark.parametrize("call,exc,match", BAD_FORWARD)
def test_bad_forward_input_raises_clear_errors(cls: type, call: Any, exc: type, match: str) -> None:
    with pytest.raises(exc, match=match):
        call(cls(3))


def test_integer_label_dtypes_are_accepted() -> None:
    crit = OrdinalContrastiveLoss_mm(3)
    x = torch.randn(6, 3)
    ref = crit(x, torch.tensor([0, 1, 2, 0, 1, 2]))
    for dt in (torch.int32, torch.int16, torch.uint8):
        assert torch.equal(crit(x, torch.tensor([0, 1, 2, 0, 1, 2], dtype=dt)), ref)


# ----------------------------------------------------------------------------
# DDP: 2 gloo processes against one process on the concatenated batch
# ----------------------------------------------------------------------------
DDP_CASES = [((5, 5), "mm"), ((7, 3), "mm"), ((6, 4), "sm"), ((1, 6), "mm")]


def _ddp_problem(sizes: tuple[int, ...], kind: str, gather: bool) -> tuple[torch.Tensor, torch.Tensor, torch.nn.Module]:
    g = torch.Generator().manual_seed(sum(sizes) * 7 + len(kind))
    n = sum(sizes)
    x = torch.randn(n, 5, generator=g, dtype=F64)
    y = torch.randint(0, 4, (n,), generator=g)
    if kind == "mm":
        lmap = [["learnable", 0.3], ["fixed", 0.5], ["learnable", 0.8]]
        crit = OrdinalContrastiveLoss_mm(4, learnable_map=lmap, gather_distributed=gather).to(F64)
    else:
        crit = OrdinalContrastiveLoss_sm(4, learnable_map=[["learnable", 0.6]], reduction="mean", gather_distributed=gather).to(F64)
    return x, y, crit


def _ddp_rank_fn(rank: int, world: int, cases: list) -> list[dict]:
    results = []
    for sizes, kind in cases:
        x, y, crit = _ddp_problem(sizes, kind, gather=True)
        start = sum(sizes[:rank])
        xl = x[start : start + sizes[rank]].clone().requires_grad_(True)
        loss = crit(xl, y[start : start + sizes[rank]])
        loss.backward()
        raw = _raw_param(crit)
        results.append(
            {
                "loss": D.all_reduce_sum(loss.detach()) / world,  # mean over ranks
                "x_grad": xl.grad / world,  # DDP divides input-side gradients by W
                "margin_grad": D.all_reduce_sum(raw.grad) / world,  # DDP's parameter averaging
            }
        )
    return results


@pytest.mark.slow  # 2-process DDP: the long tier (pytest -m slow)
@pytest.mark.ddp
def test_ddp_gather_equals_single_process_on_concatenated_batch() -> None:
    per_rank = run_distributed(_ddp_rank_fn, 2, DDP_CASES)
    for c, (sizes, kind) in enumerate(DDP_CASES):
        x, y, crit = _ddp_problem(sizes, kind, gather=False)
        xa = x.clone().requires_grad_(True)
        loss = crit(xa, y)
        loss.backward()
        raw = _raw_param(crit)
        assert float(loss.detach()) > 0
        for r in range(2):
            res = per_rank[r][c]
            start = sum(sizes[:r])
            torch.testing.assert_close(res["loss"], loss.detach(), rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(res["x_grad"], xa.grad[start : start + sizes[r]], rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(res["margin_grad"], raw.grad, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------
# degenerate batches: a batch of one, a single class (against the loop reference)
# ----------------------------------------------------------------------------
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
        grad_check(loss, x)
    # two samples of two classes: each anchor has a negative but no positive -> 0 as well
    x = torch.randn(2, 5, dtype=torch.float64, requires_grad=True)
    y = torch.tensor([0, 2])
    loss = crit(x, y)
    assert float(loss.detach()) == float(cloc_loop_reference(x.detach(), y.tolist(), crit.margins().detach().double())) == 0.0
    grad_check(loss, x)
