"""Rank-N-Contrast against a plain loop of the paper's formula (values and gradients, grids of sizes), and DDP = one process.

The reference here follows Zha et al. (NeurIPS 2023) eq. 2 literally: for every anchor view i and
every other view j, the denominator sums exp(s_ik / tau) over the views k != i whose label
distance to i is at least d(y_i, y_j); s is the negative Euclidean feature distance (or cosine),
d the L1 (or L2) label distance; the loss is the mean over the M (M - 1) pairs.  Triple loops in
float64, written without the sorting used by ``cloc_lightning/losses/rnc.py``.
"""

from __future__ import annotations

import math

import pytest
import torch

from cloc_lightning.losses.rnc import RnCLoss, rnc_loss
from tests._ddp import run_distributed


def rnc_reference(
    features: torch.Tensor, labels: torch.Tensor, tau: float, label_distance: str = "l1", feature_similarity: str = "l2"
) -> torch.Tensor:
    bsz, n_views, _ = features.shape
    views = [features[s, v] for v in range(n_views) for s in range(bsz)]  # view-major
    ys = [labels.reshape(bsz, -1)[s].double() for _ in range(n_views) for s in range(bsz)]
    m = len(views)

    def sim(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if feature_similarity == "cosine":
            return torch.dot(a, b) / (a.norm() * b.norm())
        return -torch.sqrt(((a - b) ** 2).sum())

    def ldist(a: torch.Tensor, b: torch.Tensor) -> float:
        return float((a - b).abs().sum()) if label_distance == "l1" else math.sqrt(float(((a - b) ** 2).sum()))

    total = features.new_zeros(())
    for i in range(m):
        for j in range(m):
            if j == i:
                continue
            d_ij = ldist(ys[i], ys[j])
            denominator = features.new_zeros(())
            for k in range(m):
                if k != i and ldist(ys[i], ys[k]) >= d_ij:
                    denominator = denominator + torch.exp(sim(views[i], views[k]) / tau)
            total = total - (sim(views[i], views[j]) / tau - torch.log(denominator))
    return total / (m * (m - 1))


GRID = [(1, 2, 3), (2, 2, 4), (5, 2, 8), (6, 3, 5)]  # (bsz, n_views, dim)


@pytest.mark.parametrize(("bsz", "n_views", "dim"), GRID)
@pytest.mark.parametrize(("label_distance", "feature_similarity", "tau"), [("l1", "l2", 2.0), ("l2", "cosine", 0.5)])
def test_rnc_equals_the_loop_values_and_gradients(
    bsz: int, n_views: int, dim: int, label_distance: str, feature_similarity: str, tau: float
) -> None:
    g = torch.Generator().manual_seed(bsz * 100 + n_views * 10 + dim)
    features = torch.randn(bsz, n_views, dim, generator=g, dtype=torch.float64)
    labels = torch.randint(0, 4, (bsz,), generator=g)  # ranks: ties in label distance on purpose
    a = features.clone().requires_grad_(True)
    b = features.clone().requires_grad_(True)
    value = rnc_loss(a, labels, tau, label_distance, feature_similarity)  # type: ignore[arg-type]
    ref = rnc_reference(b, labels, tau, label_distance, feature_similarity)
    value.backward()
    ref.backward()
    assert value.dtype == torch.float64
    torch.testing.assert_close(value, ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(a.grad, b.grad, rtol=1e-10, atol=1e-12)


def test_rnc_with_vector_targets_and_float32() -> None:
    g = torch.Generator().manual_seed(0)
    features = torch.randn(6, 2, 5, generator=g, dtype=torch.float64)
    targets = torch.randn(6, 3, generator=g, dtype=torch.float64)  # continuous, multi-dimensional regression targets
    ref = rnc_reference(features, targets, 2.0)
    value32 = RnCLoss()(features.float(), targets.float())
    assert value32.dtype == torch.float32
    torch.testing.assert_close(value32.double(), ref, rtol=1e-5, atol=1e-6)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert RnCLoss()(features.to(torch.bfloat16), targets).dtype == torch.float32


def test_rnc_single_view_in_the_batch_and_bad_inputs() -> None:
    z = torch.randn(1, 1, 4, requires_grad=True)
    value = rnc_loss(z, torch.tensor([2]))
    value.backward()
    assert value.item() == 0.0 and z.grad is not None and torch.all(z.grad == 0)
    with pytest.raises(ValueError, match="NaN or inf"):
        rnc_loss(torch.full((2, 2, 3), float("nan")), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match=r"labels must be \[bsz\]=2"):
        rnc_loss(torch.randn(2, 2, 3), torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match="temperature"):
        RnCLoss(temperature=0.0)
    with pytest.raises(ValueError, match="label_distance"):
        RnCLoss(label_distance="l3")  # type: ignore[arg-type]


def _ddp_rnc(rank: int, world_size: int, features: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
    local = features.chunk(world_size)[rank].clone().requires_grad_(True)
    value = rnc_loss(local, labels.chunk(world_size)[rank], 2.0, gather_distributed=True)
    value.backward()
    assert local.grad is not None
    return {"value": value.detach(), "grad": local.grad}


@pytest.mark.slow  # 2-process DDP: the long tier (pytest -m slow)
@pytest.mark.ddp
def test_rnc_under_ddp_equals_one_process_on_the_global_batch() -> None:
    """2 gloo processes of 3 samples each: the mean of the ranks' values, and each rank's feature gradient divided
    by the world size (what DDP's averaging does to parameter gradients), equal one process on the 6 samples."""
    g = torch.Generator().manual_seed(5)
    features = torch.randn(6, 2, 4, generator=g, dtype=torch.float64)
    labels = torch.randint(0, 3, (6,), generator=g)
    whole = features.clone().requires_grad_(True)
    reference = rnc_loss(whole, labels, 2.0)
    reference.backward()
    assert whole.grad is not None
    ranks = run_distributed(_ddp_rnc, 2, features, labels)
    torch.testing.assert_close(sum(r["value"] for r in ranks) / 2, reference.detach(), rtol=1e-12, atol=1e-12)
    # the gather sends every rank's share of the gradient back to the features' owner; DDP then divides by W
    torch.testing.assert_close(torch.cat([r["grad"] / 2 for r in ranks]), whole.grad, rtol=1e-10, atol=1e-12)
