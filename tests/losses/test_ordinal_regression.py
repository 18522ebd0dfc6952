"""CORAL and CORN losses against loops of the papers' formulas (values and gradients), and against coral_pytorch.

References written here, independently of ``cloc_lightning/losses/ordinal_regression.py``:
per-sample, per-task Python loops over the binary cross-entropies of the events ``y > k``
(CORAL: every sample trains every task, Cao et al. 2020, eq. 4; CORN: task k on the samples with
``y >= k`` only, normalised by the number of (sample, task) pairs, Shi et al. 2023), in float64
with ``math.log`` of the explicit sigmoid.  ``coral_pytorch`` (the authors' package, a test-only
dependency) is compared where it imports.
"""

from __future__ import annotations

import math

import pytest
import torch

from cloc_lightning.losses.ordinal_regression import (
    CORALLoss,
    CORNLoss,
    class_probabilities_from_exceedance,
    coral_exceedance,
    coral_loss,
    corn_exceedance,
    corn_loss,
    rank_from_exceedance,
)

GRID = [(1, 2), (3, 2), (5, 3), (17, 6), (32, 8)]  # (N, K)


def _sig(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-z))


def _bce(z: float, t: int) -> float:
    p = _sig(z)
    return -(t * math.log(p) + (1 - t) * math.log(1.0 - p))


def coral_reference(logits: list[list[float]], labels: list[int], weights: list[float] | None = None) -> float:
    n, tasks = len(logits), len(logits[0])
    total = 0.0
    for i in range(n):
        for k in range(tasks):
            w = 1.0 if weights is None else weights[k]
            total += w * _bce(logits[i][k], int(labels[i] > k))
    return total / n


def corn_reference(logits: list[list[float]], labels: list[int]) -> float:
    n, tasks = len(logits), len(logits[0])
    total, pairs = 0.0, 0
    for k in range(tasks):
        for i in range(n):
            if labels[i] >= k:  # task k's conditional subset: y > k - 1
                total += _bce(logits[i][k], int(labels[i] > k))
                pairs += 1
    return total / pairs


def _inputs(n: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, k - 1, generator=g, dtype=torch.float64) * 2.0, torch.randint(0, k, (n,), generator=g)


def _numeric_grad(fn, x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:  # type: ignore[no-untyped-def]
    grad = torch.zeros_like(x)
    for idx in range(x.numel()):
        plus, minus = x.clone(), x.clone()
        plus.view(-1)[idx] += eps
        minus.view(-1)[idx] -= eps
        grad.view(-1)[idx] = (fn(plus) - fn(minus)) / (2 * eps)
    return grad


@pytest.mark.parametrize(("n", "k"), GRID)
@pytest.mark.parametrize("weighted", [False, True])
def test_coral_loss_values_and_gradients_equal_the_loop(n: int, k: int, weighted: bool) -> None:
    logits, labels = _inputs(n, k, seed=n * 10 + k)
    weights = [0.5 + j for j in range(k - 1)] if weighted else None
    w = None if weights is None else torch.tensor(weights, dtype=torch.float64)
    x = logits.clone().requires_grad_(True)
    value = coral_loss(x, labels, w)
    value.backward()
    ref = coral_reference(logits.tolist(), labels.tolist(), weights)
    assert value.dtype == torch.float64 and abs(value.item() - ref) < 1e-12 * max(1.0, ref)
    numeric = _numeric_grad(lambda t: coral_reference(t.tolist(), labels.tolist(), weights), logits)
    torch.testing.assert_close(x.grad, numeric, rtol=1e-6, atol=1e-8)
    # the class form: float32 from float32 inputs, the same value
    loss32 = CORALLoss(k, importance_weights=weights)(logits.float(), labels)
    assert loss32.dtype == torch.float32 and abs(float(loss32) - ref) < 1e-5 * max(1.0, ref)


@pytest.mark.parametrize(("n", "k"), GRID)
def test_corn_loss_values_and_gradients_equal_the_loop(n: int, k: int) -> None:
    logits, labels = _inputs(n, k, seed=n * 7 + k)
    x = logits.clone().requires_grad_(True)
    value = corn_loss(x, labels)
    value.backward()
    ref = corn_reference(logits.tolist(), labels.tolist())
    assert abs(value.item() - ref) < 1e-12 * max(1.0, ref)
    numeric = _numeric_grad(lambda t: corn_reference(t.tolist(), labels.tolist()), logits)
    torch.testing.assert_close(x.grad, numeric, rtol=1e-6, atol=1e-8)
    assert abs(float(CORNLoss(k)(logits.float(), labels)) - ref) < 1e-5 * max(1.0, ref)


def test_corn_ignores_the_tasks_a_sample_is_not_conditioned_on() -> None:
    """A sample of rank 0 is only in task 0's subset: its logits for tasks >= 1 get no gradient."""
    logits = torch.randn(2, 4, dtype=torch.float64, requires_grad=True)
    corn_loss(logits, torch.tensor([0, 4])).backward()
    assert logits.grad is not None
    assert torch.all(logits.grad[0, 1:] == 0) and torch.all(logits.grad[0, :1] != 0) and torch.all(logits.grad[1] != 0)


@pytest.mark.parametrize(("n", "k"), GRID)
def test_equal_to_coral_pytorch(n: int, k: int) -> None:
    losses = pytest.importorskip("coral_pytorch.losses", reason="coral-pytorch (test extra) is not installed")
    dataset = pytest.importorskip("coral_pytorch.dataset")
    logits, labels = _inputs(n, k, seed=n + k)
    levels = dataset.levels_from_labelbatch(labels, num_classes=k).to(torch.float64)
    torch.testing.assert_close(coral_loss(logits, labels), losses.coral_loss(logits, levels), rtol=1e-12, atol=0)
    torch.testing.assert_close(corn_loss(logits, labels), losses.corn_loss(logits, labels, num_classes=k), rtol=1e-12, atol=0)
    torch.testing.assert_close(rank_from_exceedance(corn_exceedance(logits)), dataset.corn_label_from_logits(logits))
    probas = torch.sigmoid(logits)
    torch.testing.assert_close(rank_from_exceedance(coral_exceedance(logits)), dataset.proba_to_label(probas))


def test_exceedance_ranks_and_class_probabilities() -> None:
    z = torch.tensor([[3.0, 1.0, -2.0], [-4.0, -5.0, -6.0], [5.0, 5.0, 5.0]], dtype=torch.float64)
    coral = coral_exceedance(z)
    torch.testing.assert_close(coral, torch.sigmoid(z))
    corn = corn_exceedance(z)
    s = torch.sigmoid(z)
    torch.testing.assert_close(corn[:, 2], s[:, 0] * s[:, 1] * s[:, 2])
    assert rank_from_exceedance(coral).tolist() == [2, 0, 3]
    probs = class_probabilities_from_exceedance(corn)
    assert probs.shape == (3, 4) and torch.all(probs >= 0)
    torch.testing.assert_close(probs.sum(1), torch.ones(3, dtype=torch.float64))
    ranks = torch.arange(4, dtype=torch.float64)
    torch.testing.assert_close((probs * ranks).sum(1), corn.sum(1))  # E[rank] = sum_k P(y > k)
    unordered = class_probabilities_from_exceedance(torch.tensor([[0.2, 0.9]]))  # CORAL biases out of order
    assert torch.all(unordered >= 0) and abs(float(unordered.sum()) - 1.0) < 1e-6


def test_losses_compute_in_float32_under_bf16_autocast() -> None:
    logits, labels = _inputs(16, 5, seed=3)
    ref = coral_reference(logits.tolist(), labels.tolist())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        x = logits.to(torch.bfloat16).requires_grad_(True)
        value = coral_loss(x, labels)
        cvalue = corn_loss(x, labels)
    value.backward()
    assert value.dtype == cvalue.dtype == torch.float32 and x.grad is not None and bool(torch.isfinite(x.grad).all())
    assert abs(float(value) - coral_reference(x.detach().double().tolist(), labels.tolist())) < 1e-5 * ref


def test_bad_inputs_are_clear_errors() -> None:
    logits, labels = _inputs(4, 5, seed=0)
    with pytest.raises(ValueError, match=r"labels must be ranks in \[0, 5\) for 4 logits"):
        coral_loss(logits, torch.tensor([0, 1, 5, 2]))
    with pytest.raises(ValueError, match="NaN/inf logits"):
        corn_loss(torch.full((4, 4), float("nan")), labels)
    with pytest.raises(TypeError, match="labels"):
        corn_loss(logits, labels.float())
    with pytest.raises(ValueError, match=r"CORALLoss\(num_classes=6\) needs \[N, 5\] logits"):
        CORALLoss(6)(logits, labels)
    with pytest.raises(ValueError, match="importance_weights must be 4 finite numbers >= 0"):
        CORALLoss(5, importance_weights=[1.0, -1.0, 1.0, 1.0])
    with pytest.raises(ValueError, match="num_classes"):
        CORNLoss(1)
