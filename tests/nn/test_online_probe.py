"""The online linear probe and the kNN helpers (``cloc_lightning/nn/online_probe.py``)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from cloc_lightning.methods import SupConModule
from cloc_lightning.nn.online_probe import OnlineLinearProbe, _metric_values, knn_predict
from cloc_lightning.probe import knn_accuracy
from tests.conftest import TINY_BACKBONE


def _batch_standardised(x: torch.Tensor, eps: float = 1e-5) -> np.ndarray:
    """Per-feature (x - batch mean) / sqrt(biased batch variance + eps), in float64 NumPy."""
    a = x.detach().double().numpy()
    return (a - a.mean(axis=0)) / np.sqrt(a.var(axis=0) + eps)


def test_online_probe_is_detached_and_skips_unlabelled() -> None:
    raw = OnlineLinearProbe(8, 3, task="nominal", norm=False)
    feats = torch.randn(6, 8, requires_grad=True)
    y = torch.tensor([0, 1, 2, -1, 1, -1])
    loss, logs = raw.training_step(feats, y)
    loss.backward()
    assert feats.grad is None and raw.classifier.weight.grad is not None and raw.norm is None
    keep = y >= 0
    expected = F.cross_entropy(feats.detach()[keep] @ raw.classifier.weight.detach().t() + raw.classifier.bias.detach(), y[keep])
    assert torch.allclose(loss, expected) and set(logs) == {"train/online_probe/loss", "train/online_probe/acc"}
    probe = OnlineLinearProbe(8, 3, task="nominal")  # normalised (the default): batch statistics over every row
    loss, _ = probe.training_step(feats, y)
    w, b = probe.classifier.weight.detach().double().numpy(), probe.classifier.bias.detach().double().numpy()
    expected = F.cross_entropy(torch.from_numpy(_batch_standardised(feats) @ w.T + b)[keep], y[keep])
    assert torch.allclose(loss.double(), expected, atol=1e-6)
    zero, logs = probe.training_step(torch.randn(3, 8), torch.tensor([-1, -1, -1]))
    # no labelled row: a zero loss (still a graph), the accuracy undefined (NaN: a gap in the logs, never a 0)
    assert float(zero.detach()) == 0.0 and math.isnan(float(logs["train/online_probe/acc"]))
    with pytest.raises(ValueError, match="out of range for the online probe's 3 classes"):
        probe.training_step(torch.randn(2, 8), torch.tensor([0, 3]))
    with pytest.raises(ValueError, match=r"expects features \[B, 8\]"):
        probe.training_step(torch.randn(2, 5), torch.tensor([0, 1]))


def test_normalised_online_probe_does_not_depend_on_the_feature_scale() -> None:
    """The failure it fixes: SGD lr 0.1 on raw features with a large common offset (ResNet-like:
    mean ~1.2, std ~1.9 per dimension, norm ~37) overshoots; on normalised features it does not."""
    torch.manual_seed(0)
    dim, centres = 256, torch.randn(4, 256) * 0.1

    def sample(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.randint(0, 4, (n,))
        return 1.2 + 1.9 * (centres[y] + torch.randn(n, dim)), y

    feats, _ = sample(64)
    probe = OnlineLinearProbe(dim, 4, task="nominal")
    assert torch.allclose(probe(feats), probe(feats * 20.0), atol=1e-4)  # batch statistics: scale-free
    losses = {}
    for norm in (True, False):
        torch.manual_seed(1)
        p = OnlineLinearProbe(dim, 4, task="nominal", norm=norm)
        opt = torch.optim.SGD(p.parameters(), lr=0.1, momentum=0.9)
        for _ in range(300):
            f, y = sample(64)
            loss, _ = p.training_step(f, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        p.eval()
        f, y = sample(2000)
        losses[norm] = float(F.cross_entropy(p(f), y))
    assert losses[True] < 2.0 and losses[False] > 4.0, losses  # measured: 1.26 vs 6.06
    one = OnlineLinearProbe(dim, 4, task="nominal")  # a single row in training uses the running statistics
    assert one(feats[:1]).shape == (1, 4)


def test_checkpoint_with_or_without_probe_normalisation_says_how_to_load_it() -> None:
    plain = OnlineLinearProbe(8, 3, norm=False).state_dict()
    with pytest.raises(RuntimeError, match="trained without feature normalisation.*online_probe_norm=False"):
        OnlineLinearProbe(8, 3).load_state_dict(plain)
    OnlineLinearProbe(8, 3, norm=False).load_state_dict(plain)
    normed = OnlineLinearProbe(8, 3).state_dict()
    with pytest.raises(RuntimeError, match="trained with feature normalisation.*online_probe_norm=True"):
        OnlineLinearProbe(8, 3, norm=False).load_state_dict(normed)
    model = SupConModule(backbone=TINY_BACKBONE, num_classes=3, task="nominal", online_probe_norm=False)
    assert model.probe is not None and model.probe.norm is None and model.hparams.online_probe_norm is False
    with pytest.raises(TypeError, match="online_probe_norm must be True or False"):
        SupConModule(backbone=TINY_BACKBONE, num_classes=3, task="nominal", online_probe_norm="yes")


def test_online_probe_eval_metrics_match_hand_count() -> None:
    probe = OnlineLinearProbe(2, 6, task="nominal")
    with torch.no_grad():  # class scores = a hand-made table through an identity-like classifier
        probe.classifier.weight.zero_()
        probe.classifier.bias.zero_()
    feats = torch.zeros(4, 2)
    logits = torch.tensor([[5.0, 4, 3, 2, 1, 0], [0, 1, 2, 3, 4, 5], [0, 5, 4, 3, 2, 1], [1, 2, 3, 4, 5, 0]])
    probe.classifier.forward = lambda f: logits  # type: ignore[method-assign]
    y = torch.tensor([0, 0, 1, 5])  # top-1 right: rows 0, 2 -> 0.5; top-5: row 1 (rank 6) and row 3 (rank 6) miss
    vals = _metric_values(probe.eval_step(feats, y, "val"))
    assert vals["val/online_probe/acc"] == pytest.approx(0.5)
    assert vals["val/online_probe/acc_top5"] == pytest.approx(0.5)
    assert vals["val/online_probe/loss"] == pytest.approx(float(F.cross_entropy(logits, y)))
    ordinal = OnlineLinearProbe(4, 3, task="ordinal")
    assert {"test/online_probe/mae", "test/online_probe/qwk"} <= set(ordinal.metrics["test"].keys())
    group = probe.param_group(lr=0.3)
    assert group["lr"] == 0.3 and group["weight_decay"] == 0.0 and len(group["params"]) == 2


def _knn_loop(train_x, train_y, query, c, k, t):
    """Independent reference: per query, sort cosine similarities and add exp(s/t) per class."""
    out = []
    for q in query.tolist():
        qn = torch.tensor(q) / torch.tensor(q).norm()
        sims = [
            (float(qn @ (torch.tensor(r) / torch.tensor(r).norm())), int(lab)) for r, lab in zip(train_x.tolist(), train_y, strict=True)
        ]
        sims.sort(key=lambda s: -s[0])
        scores = [0.0] * c
        for s, lab in sims[:k]:
            scores[lab] += math.exp(s / t)
        out.append(scores)
    return torch.tensor(out)


@pytest.mark.parametrize("k", [1, 3, 50])
def test_knn_predict_against_loop_reference(k: int) -> None:
    g = torch.Generator().manual_seed(k)
    train_x, train_y = torch.randn(30, 5, generator=g), torch.randint(0, 4, (30,), generator=g)
    query = torch.randn(7, 5, generator=g)
    got = knn_predict(train_x, train_y, query, num_classes=4, k=k, temperature=0.5, chunk_size=3)
    assert torch.allclose(got, _knn_loop(train_x, train_y, query, 4, min(k, 30), 0.5), rtol=1e-5)


def test_knn_accuracy_on_separable_clusters_and_errors() -> None:
    g = torch.Generator().manual_seed(0)
    centres = torch.eye(6) * 10
    train_y = torch.arange(60) % 6
    test_y = torch.arange(30) % 6
    train_x = centres[train_y] + torch.randn(60, 6, generator=g)
    test_x = centres[test_y] + torch.randn(30, 6, generator=g)
    acc = knn_accuracy(train_x, train_y, test_x, test_y, k=5)
    assert acc["top1"] == 1.0 and acc["top5"] == 1.0
    with pytest.raises(ValueError, match="negative"):
        knn_predict(train_x, torch.full((60,), -1), test_x)
