"""Metric values against numbers computed by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from cloc_lightning.metrics import ArgmaxMAE, ExpectedRankMAE, OffByOneAccuracy, nominal_metrics, ordinal_metrics


def _one_hot_scores(pred: list[int], n: int) -> torch.Tensor:
    s = torch.full((len(pred), n), -10.0)
    s[torch.arange(len(pred)), torch.tensor(pred)] = 10.0
    return s


def test_ordinal_metrics_hand_computed() -> None:
    # targets 0 1 2 3, predictions 0 2 2 0: errors 0 1 0 3
    target = torch.tensor([0, 1, 2, 3])
    scores = _one_hot_scores([0, 2, 2, 0], 4)
    m = ordinal_metrics(4, prefix="val/")
    m.update(scores, target)
    out = {k: float(v) for k, v in m.compute().items()}
    assert out["val/mae"] == pytest.approx(1.0)  # (0+1+0+3)/4
    assert out["val/acc"] == pytest.approx(0.5)
    assert out["val/acc_pm1"] == pytest.approx(0.75)
    # QWK by hand: conf = confusion, W_ij = (i-j)^2/(N-1)^2, E = outer(hist_t, hist_p)/n
    conf = np.zeros((4, 4))
    for t, p in zip([0, 1, 2, 3], [0, 2, 2, 0], strict=True):
        conf[t, p] += 1
    W = np.array([[(i - j) ** 2 / 9 for j in range(4)] for i in range(4)])
    E = np.outer(conf.sum(1), conf.sum(0)) / conf.sum()
    qwk = 1 - (W * conf).sum() / (W * E).sum()
    assert out["val/qwk"] == pytest.approx(qwk, abs=1e-6)
    # expected rank of near-one-hot scores equals the arg-max
    assert out["val/mae_expected"] == pytest.approx(1.0, abs=1e-3)


def test_expected_rank_mae_uses_softmax() -> None:
    scores = torch.log(torch.tensor([[0.5, 0.5, 0.0 + 1e-12], [0.2, 0.3, 0.5]]))
    target = torch.tensor([0, 2])
    m = ExpectedRankMAE()
    m.update(scores, target)
    # expected ranks: 0.5 and 0.3 + 1.0 = 1.3 -> errors 0.5 and 0.7
    assert float(m.compute()) == pytest.approx(0.6, abs=1e-6)


def test_expected_rank_mae_takes_a_regressors_own_estimate() -> None:
    """``expected`` (a regressor's clamped output) replaces the softmax expectation; the collection hands it to this metric only."""
    target = torch.tensor([0, 1, 3])
    scores = _one_hot_scores([0, 2, 3], 4)
    expected = torch.tensor([0.25, 2.0, 2.5])
    m = ordinal_metrics(4)
    m.update(scores, target, expected=expected)
    out = {k: float(v) for k, v in m.compute().items()}
    assert out["mae_expected"] == pytest.approx((0.25 + 1.0 + 0.5) / 3)
    assert out["mae"] == pytest.approx(1 / 3) and out["acc"] == pytest.approx(2 / 3)  # the arg-max metrics: from the scores
    alone = ExpectedRankMAE()
    alone.update(scores, target)  # without it: the softmax expectation, as before
    probs = scores.softmax(dim=1).double().numpy()
    assert float(alone.compute()) == pytest.approx(float(np.abs(probs @ np.arange(4) - target.numpy()).mean()), abs=1e-6)
    nan = ExpectedRankMAE()
    nan.update(torch.full((1, 4), float("nan")), torch.tensor([1]), expected=torch.tensor([1.0]))
    assert math.isnan(float(nan.compute()))  # a non-finite row of scores is no prediction
    with pytest.raises(ValueError, match=r"expected \[B\] and target \[B\] must agree in B"):
        ExpectedRankMAE().update(scores, target, expected=torch.tensor([1.0]))


def test_metrics_accumulate_over_batches_and_reset() -> None:
    m = ArgmaxMAE()
    m.update(_one_hot_scores([1], 3), torch.tensor([0]))
    m.update(_one_hot_scores([2, 2], 3), torch.tensor([0, 2]))
    assert float(m.compute()) == pytest.approx((1 + 2 + 0) / 3)
    m.reset()
    m.update(_one_hot_scores([0], 3), torch.tensor([0]))
    assert float(m.compute()) == 0.0


def test_off_by_one_tolerance() -> None:
    m = OffByOneAccuracy(tolerance=2)
    m.update(_one_hot_scores([0, 3, 4], 5), torch.tensor([2, 0, 4]))
    assert float(m.compute()) == pytest.approx(2 / 3)


def test_nominal_top5() -> None:
    scores = torch.arange(10.0).repeat(2, 1)  # class 9 highest, top-5 = 5..9
    m = nominal_metrics(10)
    m.update(scores, torch.tensor([9, 4]))
    out = {k: float(v) for k, v in m.compute().items()}
    assert out["acc"] == pytest.approx(0.5)
    assert out["acc_top5"] == pytest.approx(0.5)
    assert "acc_top5" not in nominal_metrics(3)


def test_bad_shapes_raise() -> None:
    with pytest.raises(ValueError, match=r"scores \[B, C\]"):
        ArgmaxMAE().update(torch.zeros(3), torch.zeros(3, dtype=torch.long))
    assert math.isfinite(float(ArgmaxMAE().compute()))  # empty metric: 0, not NaN


def test_metrics_are_not_merged_by_equal_first_batches() -> None:
    """A first batch where every error is exactly 1 rank (MAE 1 = ±1 accuracy 1) must not tie ``mae`` to ``acc_pm1``."""
    m = ordinal_metrics(6, prefix="val/")
    m.update(_one_hot_scores([1, 2, 3, 4], 6), torch.tensor([0, 1, 2, 3]))  # errors 1 1 1 1
    m.update(_one_hot_scores([5, 0, 5, 0], 6), torch.tensor([0, 5, 2, 3]))  # errors 5 5 3 3
    out = {k: float(v) for k, v in m.compute().items()}
    errors = np.array([1, 1, 1, 1, 5, 5, 3, 3])
    assert out["val/mae"] == pytest.approx(errors.mean())  # 2.5
    assert out["val/acc_pm1"] == pytest.approx((errors <= 1).mean())  # 0.5
