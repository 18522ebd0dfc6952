"""Online evaluation of a representation while it trains: a detached linear probe and kNN.

Self-supervised and contrastive methods have no classifier of their own, so the
usual way to watch them learn (solo-learn's online classifier, lightly's
``OnlineLinearClassifier``) is a linear head trained *alongside* the method on
**detached** features with its own cross-entropy: it never changes the encoder,
costs one ``Linear`` per step, and its accuracy tracks the linear-probe accuracy
of the final (offline) evaluation.

:class:`OnlineLinearProbe` is that head, plus its metric collections, packaged so
a method only needs three lines (see the class docstring).  :func:`knn_predict` /
:func:`knn_accuracy` are the weighted k-nearest-neighbour classifier of Wu et al.,
"Unsupervised Feature Learning via Non-Parametric Instance Discrimination", CVPR
2018 (also DINO's ``eval_knn.py``) on L2-normalised features.

Labels ``< 0`` mark **unlabelled** samples (STL-10's unlabeled split): the probe
skips them in its loss and metrics, and the kNN helpers reject them.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn
from torchmetrics import Metric, MetricCollection

from cloc_lightning.metrics import build_metrics

__all__ = ["OnlineLinearProbe", "knn_predict", "knn_accuracy"]

Stage = Literal["train", "val", "test"]


class OnlineLinearProbe(nn.Module):
    """A linear classifier on detached features, trained with its own cross-entropy.

    ``training_step(features, y)`` detaches ``features`` ([B, in_dim]), fits the
    linear layer with CE on the labelled rows (``y >= 0``) and returns ``(loss,
    logs)``; add ``loss`` to the method's loss (gradients reach only the probe) and
    log ``logs``.  ``eval_step(features, y, stage)`` updates the stage's metric
    collection (``ordinal``: MAE, expected-rank MAE, accuracy, QWK, ±1 accuracy;
    ``nominal``: top-1 and, for >= 5 classes, top-5; see :mod:`cloc_lightning.metrics`)
    and returns what to log at epoch end.  Logged names are
    ``<stage>/<name>/<metric>``, e.g. ``train/online_probe/acc``,
    ``val/online_probe/acc``, ``val/online_probe/acc_top5``, ``val/online_probe/loss``.

    The probe's parameters belong in their own optimiser group without weight decay
    (:meth:`param_group`); the method's learning-rate schedule then scales the
    probe's rate too.

    Args:
        in_dim: feature dimension.
        num_classes: number of classes.
        task: ``nominal`` or ``ordinal`` (which metrics are computed).
        name: the middle part of the logged names.

    Shapes:
        ``features`` [B, in_dim] (any float dtype; computed in float32), ``y`` [B]
        integer labels, ``< 0`` = unlabelled (ignored).

    Example (inside a LightningModule)::

        self.probe = OnlineLinearProbe(self.feature_dim, num_classes=10)

        def training_step(self, batch, batch_idx):
            feats = self.backbone(x)
            loss = my_ssl_loss(...)
            probe_loss, logs = self.probe.training_step(feats, y)
            self.log_dict(logs, batch_size=len(y))
            return loss + probe_loss

        def validation_step(self, batch, batch_idx):
            logs = self.probe.eval_step(self.backbone(x), y, "val")
            self.log_dict(logs, on_step=False, on_epoch=True, batch_size=len(y))

        def param_groups(self):
            probe = self.probe.param_group(lr=0.1)
            ids = {id(p) for p in probe["params"]}
            rest = [p for p in self.parameters() if p.requires_grad and id(p) not in ids]
            return [{"name": "model", "params": rest}, probe]
    """

    def __init__(
        self, in_dim: int, num_classes: int, task: Literal["nominal", "ordinal"] = "nominal", name: str = "online_probe"
    ) -> None:
        super().__init__()
        if not isinstance(num_classes, int) or num_classes < 2:
            raise ValueError(f"OnlineLinearProbe needs num_classes >= 2 (an integer), got {num_classes!r}")
        if not isinstance(in_dim, int) or in_dim < 1:
            raise ValueError(f"in_dim must be a positive integer, got {in_dim!r}")
        if task not in ("nominal", "ordinal"):
            raise ValueError(f"task must be 'nominal' or 'ordinal', got {task!r}")
        self.in_dim = in_dim
        self.num_classes = num_classes
        self.task = task
        self.name = name
        self.classifier = nn.Linear(in_dim, num_classes)
        self.metrics = nn.ModuleDict({s: build_metrics(task, num_classes, f"{s}/{name}/") for s in ("val", "test")})

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """Logits ``[B, num_classes]`` of detached ``features`` ``[B, in_dim]``."""
        return self.classifier(features.detach().float())

    def _check(self, features: torch.Tensor, y: torch.Tensor) -> None:
        if features.ndim != 2 or features.shape[1] != self.in_dim:
            raise ValueError(f"OnlineLinearProbe expects features [B, {self.in_dim}], got {tuple(features.shape)}")
        if y.ndim != 1 or y.shape[0] != features.shape[0]:
            raise ValueError(f"labels must be [B] with B = {features.shape[0]}, got {tuple(y.shape)}")
        if y.is_floating_point():
            raise TypeError(f"labels must be integer class ids, got dtype {y.dtype}")
        if bool((y >= self.num_classes).any()):
            raise ValueError(
                f"label {int(y.max())} is out of range for the online probe's {self.num_classes} classes; "
                "set the module's num_classes to the data module's"
            )

    def training_step(self, features: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Cross-entropy of the probe on the labelled rows; ``(loss, {name: value})`` to log.

        A batch without labelled rows gives a zero loss that still touches every
        probe parameter (so DDP sees them all used).
        """
        self._check(features, y)
        keep = y >= 0
        logits = self(features)
        if not bool(keep.all()):
            logits, y = logits[keep], y[keep]
        prefix = f"train/{self.name}"
        if y.numel() == 0:
            zero = sum(p.sum() for p in self.classifier.parameters()) * 0.0
            return zero, {f"{prefix}/loss": zero.detach()}
        loss = F.cross_entropy(logits, y)
        acc = (logits.argmax(dim=1) == y).float().mean()
        return loss, {f"{prefix}/loss": loss.detach(), f"{prefix}/acc": acc}

    @torch.no_grad()
    def eval_step(self, features: torch.Tensor, y: torch.Tensor, stage: Stage = "val") -> dict[str, Any]:
        """Update ``stage``'s metrics with the labelled rows; return ``{name: tensor or Metric}`` to log per epoch."""
        if stage not in self.metrics:
            raise ValueError(f"stage must be 'val' or 'test', got {stage!r}")
        self._check(features, y)
        keep = y >= 0
        logits = self(features)
        logits, y = logits[keep], y[keep]
        out: dict[str, Any] = {}
        if y.numel() == 0:
            return out
        metrics: MetricCollection = self.metrics[stage]  # type: ignore[assignment]
        metrics.update(logits, y)
        out[f"{stage}/{self.name}/loss"] = F.cross_entropy(logits, y)
        out.update(dict(metrics.items(keep_base=False, copy_state=False)))
        return out

    @torch.no_grad()
    def predict(self, features: torch.Tensor) -> dict[str, torch.Tensor]:
        """``{'pred', 'expected', 'probs'}`` for ``features`` [B, in_dim] (the PredictionWriter's columns)."""
        probs = self(features).softmax(dim=1)
        ranks = torch.arange(self.num_classes, device=probs.device, dtype=probs.dtype)
        return {"pred": probs.argmax(dim=1), "expected": probs @ ranks, "probs": probs}

    def param_group(self, lr: float, weight_decay: float = 0.0, name: str = "online_probe") -> dict[str, Any]:
        """An optimiser parameter group of the probe's parameters (no weight decay by default)."""
        return {"name": name, "params": list(self.classifier.parameters()), "lr": lr, "weight_decay": weight_decay}

    def extra_repr(self) -> str:
        return f"task={self.task!r}, name={self.name!r}"


def _check_features(name: str, x: torch.Tensor) -> None:
    if not isinstance(x, torch.Tensor) or x.ndim != 2:
        raise ValueError(f"{name} must be a tensor [N, D], got {getattr(x, 'shape', type(x).__name__)}")


@torch.no_grad()
def knn_predict(
    train_features: torch.Tensor,
    train_labels: torch.Tensor,
    query_features: torch.Tensor,
    num_classes: int | None = None,
    k: int = 20,
    temperature: float = 0.07,
    chunk_size: int = 1024,
) -> torch.Tensor:
    """Class scores of a weighted kNN classifier (Wu et al. 2018; DINO ``eval_knn.py``).

    Features are L2-normalised; each query's ``k`` most cosine-similar training
    samples vote for their class with weight ``exp(sim / temperature)``.

    Args:
        train_features: [N, D]; train_labels: [N] integer labels in ``[0, C)``.
        query_features: [M, D].
        num_classes: ``C`` (default: ``max(train_labels) + 1``).
        k: neighbours (capped at N); temperature: vote sharpness.
        chunk_size: queries per block (memory ``chunk_size x N``).

    Returns:
        ``[M, C]`` vote scores (float32); ``argmax`` is the prediction.
    """
    _check_features("train_features", train_features)
    _check_features("query_features", query_features)
    if train_labels.ndim != 1 or train_labels.shape[0] != train_features.shape[0]:
        raise ValueError(f"train_labels must be [N] with N = {train_features.shape[0]}, got {tuple(train_labels.shape)}")
    if train_features.shape[1] != query_features.shape[1]:
        raise ValueError(f"feature dimensions differ: {train_features.shape[1]} (train) vs {query_features.shape[1]} (query)")
    if bool((train_labels < 0).any()):
        raise ValueError("train_labels contain negative (unlabelled) entries; drop them before the kNN probe")
    if k < 1 or temperature <= 0:
        raise ValueError(f"need k >= 1 and temperature > 0, got k={k}, temperature={temperature}")
    c = int(train_labels.max()) + 1 if num_classes is None else num_classes
    train = F.normalize(train_features.float(), dim=1)
    query = F.normalize(query_features.float(), dim=1)
    labels = train_labels.to(train.device).long()
    k = min(k, train.shape[0])
    out = []
    for start in range(0, query.shape[0], chunk_size):
        sim = query[start : start + chunk_size] @ train.t()  # [m, N]
        top_sim, top_idx = sim.topk(k, dim=1)
        weights = (top_sim / temperature).exp()
        scores = torch.zeros(sim.shape[0], c, device=sim.device)
        scores.scatter_add_(1, labels[top_idx], weights)
        out.append(scores)
    return torch.cat(out) if out else torch.zeros(0, c)


def knn_accuracy(
    train_features: torch.Tensor,
    train_labels: torch.Tensor,
    test_features: torch.Tensor,
    test_labels: torch.Tensor,
    k: int = 20,
    temperature: float = 0.07,
    num_classes: int | None = None,
) -> dict[str, float]:
    """Top-1 (and, for >= 5 classes, top-5) accuracy of :func:`knn_predict` on a test set.

    Shapes: ``train_features`` [N, D], ``train_labels`` [N], ``test_features`` [M, D],
    ``test_labels`` [M].  Returns ``{'top1': ..., 'top5': ...}`` as fractions in [0, 1].
    """
    c = num_classes or int(max(int(train_labels.max()), int(test_labels.max()))) + 1
    scores = knn_predict(train_features, train_labels, test_features, c, k, temperature)
    y = test_labels.to(scores.device).long()
    result = {"top1": float((scores.argmax(1) == y).float().mean())}
    if c >= 5:
        top5 = scores.topk(5, dim=1).indices
        result["top5"] = float((top5 == y[:, None]).any(dim=1).float().mean())
    return result


def _metric_values(logs: dict[str, Any]) -> dict[str, float]:
    """``{name: float}`` of a logs dict (computing Metric entries); for plain-Python use and tests."""
    return {k: float(v.compute() if isinstance(v, Metric) else v) for k, v in logs.items()}
