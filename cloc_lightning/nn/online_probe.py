"""Online evaluation of a representation while it trains: a detached linear probe and kNN.

Self-supervised and contrastive methods have no classifier of their own, so the
usual way to watch them learn (solo-learn's online classifier, lightly's
``OnlineLinearClassifier``) is a linear head trained *alongside* the method on
**detached** features with its own cross-entropy: it never changes the encoder,
costs one ``Linear`` per step, and its accuracy tracks the linear-probe accuracy
of the final (offline) evaluation.

:class:`OnlineLinearProbe` is that head, plus its metric collections, packaged so
a method only needs three lines (see the class docstring).  :func:`knn_predict` is
the weighted k-nearest-neighbour classifier of Wu et al.,
"Unsupervised Feature Learning via Non-Parametric Instance Discrimination", CVPR
2018 (also DINO's ``eval_knn.py``) on L2-normalised features (its offline accuracy on a
test set: :func:`cloc_lightning.probe.knn_accuracy`).  :class:`OnlineEvaluator`
puts both together as the one online-evaluation component of a pre-training method
(:class:`~cloc_lightning.methods.pretrain.PretrainModule`): the probe, a kNN bank of
recent training features, their setup from the data module and their optimiser group.

Labels ``< 0`` mark **unlabelled** samples (STL-10's unlabeled split): the probe
skips them in its loss and metrics, and the kNN helpers reject them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn
from torchmetrics import Metric, MetricCollection

from cloc_lightning.checks import require
from cloc_lightning.data_contract import DataInfo
from cloc_lightning.metrics import Task, TaskSetting, build_metrics
from cloc_lightning.validation import check_bool, check_choice, check_float, check_int, check_tensor

__all__ = ["OnlineLinearProbe", "OnlineEvaluator", "knn_predict", "masked_cross_entropy"]

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

    With ``norm`` (the default) the features pass a ``BatchNorm1d`` without affine
    parameters before the linear layer (batch statistics in training, running statistics
    in evaluation), the linear-probing recipe of He et al., "Masked Autoencoders Are
    Scalable Vision Learners" (CVPR 2022, appendix A.2) and MoCo v3.  It makes the probe's
    step size independent of the feature scale: on raw ResNet-18 features of a SupCon
    encoder (norm ≈ 47), a probe at SGD lr 0.1 / momentum 0.9 diverged (validation loss
    7–17, accuracy 14–29 %) while the normalised one learned (measured on CIFAR-10,
    ``docs/results.md``).  ``norm=False`` is the plain linear layer on raw features.

    Args:
        in_dim: feature dimension.
        num_classes: number of classes.
        task: ``nominal`` or ``ordinal`` (which metrics are computed).
        name: the middle part of the logged names.
        norm: normalise the features (``BatchNorm1d(in_dim, affine=False)``) before the
            linear layer.

    Shapes:
        ``features`` [B, in_dim] (any float dtype; computed in the probe's dtype: float32, or
        float64 under ``64-true``), ``y`` [B]
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

    def __init__(self, in_dim: int, num_classes: int, task: Task = "nominal", name: str = "online_probe", norm: bool = True) -> None:
        super().__init__()
        check_int("num_classes", num_classes, 2, hint="OnlineLinearProbe needs at least 2 classes")
        check_int("in_dim", in_dim, 1)
        check_choice("task", task, Task)
        self.in_dim = in_dim
        self.num_classes = num_classes
        self.task = task
        self.name = name
        #: the feature normalisation (``BatchNorm1d`` without affine parameters), or ``None``
        self.norm: nn.BatchNorm1d | None = nn.BatchNorm1d(in_dim, affine=False) if norm else None
        self.classifier = nn.Linear(in_dim, num_classes)
        self.metrics = nn.ModuleDict({s: build_metrics(task, num_classes, f"{s}/{name}/") for s in ("val", "test")})

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """Logits ``[B, num_classes]`` of detached ``features`` ``[B, in_dim]``, in the dtype of the probe's weights.

        float32 weights (32-true and the mixed precisions) take the features in float32, float64
        weights (64-true) in float64, bf16/fp16 weights (the ``-true`` half precisions) in theirs.
        """
        x = features.detach().to(self.classifier.weight.dtype)
        if self.norm is not None:
            if self.norm.training and x.shape[0] < 2:  # one row has no batch variance: use the running statistics
                x = F.batch_norm(x, self.norm.running_mean, self.norm.running_var, training=False, eps=self.norm.eps)
            else:
                x = self.norm(x)
        logits: torch.Tensor = self.classifier(x)
        return logits

    def _load_from_state_dict(
        self,
        state_dict: dict[str, Any],
        prefix: str,
        local_metadata: dict[str, Any],
        strict: bool,
        missing_keys: list[str],
        unexpected_keys: list[str],
        error_msgs: list[str],
    ) -> None:
        has_norm = f"{prefix}norm.running_mean" in state_dict
        if f"{prefix}classifier.weight" in state_dict and has_norm != (self.norm is not None):
            error_msgs.append(
                f"the saved online probe ({prefix or 'root'}) was trained {'with' if has_norm else 'without'} feature "
                f"normalisation but this one is built {'with' if self.norm is not None else 'without'} it; load with "
                f"online_probe_norm={has_norm} (e.g. Module.load_from_checkpoint(path, online_probe_norm={has_norm}), "
                f"or --model.init_args.online_probe_norm {str(has_norm).lower()})"
            )
            return
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs)

    def _check(self, features: torch.Tensor, y: torch.Tensor) -> None:
        if features.ndim != 2 or features.shape[1] != self.in_dim:
            raise ValueError(f"OnlineLinearProbe expects features [B, {self.in_dim}], got {tuple(features.shape)}")
        if y.ndim != 1 or y.shape[0] != features.shape[0]:
            raise ValueError(f"labels must be [B] with B = {features.shape[0]}, got {tuple(y.shape)}")
        if y.is_floating_point():
            raise TypeError(f"labels must be integer class ids, got dtype {y.dtype}")
        require(  # read at once, or recorded on the device inside a Trainer's step (cloc_lightning.checks)
            y < self.num_classes,
            f"a label is out of range for the online probe's {self.num_classes} classes; set the module's num_classes to the data module's",
            detail=lambda: f" (largest label {int(y.max())})",
        )

    def training_step(self, features: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Cross-entropy of the probe on the labelled rows; ``(loss, {name: value})`` to log.

        A batch without labelled rows gives a zero loss that still touches every
        probe parameter (so DDP sees them all used).
        """
        self._check(features, y)
        logits = self(features)
        loss, acc = masked_cross_entropy(logits, y, self.num_classes)
        if y.numel() == 0:
            loss = loss + torch.stack([p.sum() for p in self.classifier.parameters()]).sum() * 0.0
        prefix = f"train/{self.name}"
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


def masked_cross_entropy(logits: torch.Tensor, y: torch.Tensor, num_classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Cross-entropy and accuracy over the labelled rows (``y >= 0``) of a batch, without a host sync.

    ``(loss, acc)``: the mean cross-entropy of ``logits`` [B, C] over the labelled rows
    (``F.cross_entropy`` with the unlabelled rows as ``ignore_index``: on a fully labelled
    batch exactly ``F.cross_entropy(logits, y)``) and their accuracy (detached).  Without a
    labelled row the loss is 0 (it keeps its graph, with zero gradients) and the accuracy NaN.  Labels are
    clamped below ``num_classes`` so that a label whose range check is deferred
    (:mod:`cloc_lightning.checks`) cannot index out of bounds.
    """
    labelled = y >= 0
    target = torch.where(labelled, y.clamp(max=num_classes - 1), torch.full_like(y, -100))
    ce = F.cross_entropy(logits, target, ignore_index=-100)  # NaN (0 / 0) when no row is labelled
    n = labelled.sum()
    loss = torch.where(n > 0, ce, torch.zeros_like(ce))
    hits = ((logits.detach().argmax(dim=1) == y) & labelled).sum()
    acc = hits.to(torch.float32) / n.to(torch.float32)  # NaN (undefined; a gap in TensorBoard) without labelled rows
    return loss, acc


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
    check_tensor("train_features", train_features, dim=2, hint="[N, D]")
    check_tensor("query_features", query_features, dim=2, hint="[M, D]")
    if train_labels.ndim != 1 or train_labels.shape[0] != train_features.shape[0]:
        raise ValueError(f"train_labels must be [N] with N = {train_features.shape[0]}, got {tuple(train_labels.shape)}")
    if train_features.shape[1] != query_features.shape[1]:
        raise ValueError(f"feature dimensions differ: {train_features.shape[1]} (train) vs {query_features.shape[1]} (query)")
    if bool((train_labels < 0).any()):
        raise ValueError("train_labels contain negative (unlabelled) entries; drop them before the kNN probe")
    check_int("k", k, 1)
    check_float("temperature", temperature, minimum=0.0, strict_minimum=True)
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


class OnlineEvaluator:
    """The online evaluation of a pre-training method: an :class:`OnlineLinearProbe` and a kNN monitor.

    One component that a method owns (:class:`~cloc_lightning.methods.pretrain.PretrainModule`
    does) instead of writing the pieces itself:

    * **the probe** (:attr:`probe`): built at construction when ``num_classes`` and ``task``
      are given, else by :meth:`setup_from_datamodule` from the attached data module's
      ``num_classes`` / ``task``; trained by :meth:`training_step` on detached features, in
      its own optimiser group (:meth:`param_group`: ``online_probe_lr``, no weight decay);
      reported by :meth:`eval_step` (``<stage>/online_probe/...``).
    * **the kNN monitor** (``knn_k > 0``): :meth:`training_step` keeps the most recent
      ``knn_bank_size`` labelled training features of this process; :meth:`eval_step`
      classifies validation features against them (weighted kNN, :func:`knn_predict`,
      logged as ``val/knn/acc``).  A training-time monitor: the bank is not checkpointed
      and :meth:`reset` clears it (do so when weights are loaded).

    The evaluator is not an ``nn.Module``: the method registers :attr:`probe` as its own
    submodule (``PretrainModule.probe``), so the probe's parameters, ``state_dict`` keys
    and optimiser group are the method's.

    Its arguments are the pre-training methods' options (``model.online_probe``, ``model.knn_k``,
    ...): :class:`~cloc_lightning.methods.pretrain.PretrainModule` takes them as its own.

    Args:
        num_classes: classes of the online probe; ``None`` = the data module's.
        task: probe metrics: ``nominal``, ``ordinal`` or ``auto`` (the data module's).
        online_probe: train and report the online linear probe.
        online_probe_lr: the probe's learning rate (``None`` = the method's ``lr``).
        knn_k: neighbours of the kNN monitor (0 disables it).
        knn_bank_size: training features kept for the kNN monitor.
        knn_temperature: temperature of the kNN vote.
        online_probe_norm: normalise the features (``BatchNorm1d`` without affine) before the
            probe's linear layer, so its step size does not depend on the feature scale
            (:class:`OnlineLinearProbe`, built by the owner's probe factory); ``false`` = the
            linear layer on raw features (also needed to load checkpoints saved without it).
    """

    def __init__(
        self,
        num_classes: int | None = None,
        task: TaskSetting = "auto",
        online_probe: bool = True,
        online_probe_lr: float | None = None,
        knn_k: int = 0,
        knn_bank_size: int = 4096,
        knn_temperature: float = 0.07,
        online_probe_norm: bool = True,
    ) -> None:
        if num_classes is not None and (isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 2):
            raise ValueError(f"num_classes must be an integer >= 2 or null (= the data module's), got {num_classes!r}")
        self.enabled = bool(online_probe)
        self.num_classes = num_classes
        self.task: TaskSetting = check_choice("task", task, TaskSetting)
        self.lr = (
            None
            if online_probe_lr is None
            else check_float("online_probe_lr", online_probe_lr, minimum=0.0, strict_minimum=True, hint="or null = the method's lr")
        )
        self.knn_k = check_int("knn_k", knn_k, 0, hint="0 turns the kNN monitor off")
        self.knn_bank_size = check_int("knn_bank_size", knn_bank_size, 1)
        self.knn_temperature = check_float("knn_temperature", knn_temperature, minimum=0.0, strict_minimum=True)
        self.norm = check_bool("online_probe_norm", online_probe_norm)
        self.probe: OnlineLinearProbe | None = None
        self._bank_features: torch.Tensor | None = None
        self._bank_labels: torch.Tensor | None = None
        self._bank_next: torch.Tensor | None = None  # the ring buffer's next slot, on the device

    # ------------------------------------------------------------------ probe
    @property
    def monitor(self) -> str:
        """What the best checkpoint monitors: the probe's ``val/online_probe/acc``, else ``train/loss``."""
        return "val/online_probe/acc" if self.enabled else "train/loss"

    @property
    def monitor_mode(self) -> Literal["min", "max"]:
        return "max" if self.enabled else "min"

    def known_size(self) -> tuple[int, Task] | None:
        """``(num_classes, task)`` when the probe can be built before the data module is known."""
        if not self.enabled or self.num_classes is None or self.task == "auto":
            return None
        return self.num_classes, self.task

    def build(self, num_classes: int, task: Task, factory: Callable[[int, Task], OnlineLinearProbe]) -> OnlineLinearProbe:
        """Build the probe with ``factory(num_classes, task)`` and keep it (the owner registers it)."""
        self.probe = factory(num_classes, task)
        self.num_classes, self.task = num_classes, task
        return self.probe

    def setup_from_datamodule(
        self, data: DataInfo | None, factory: Callable[[int, Task], OnlineLinearProbe], owner: str = "the module"
    ) -> OnlineLinearProbe | None:
        """Check ``num_classes`` against the data module's; build the probe if it is still missing.

        ``data`` is the attached data module's :class:`~cloc_lightning.data_contract.DataInfo`
        (``None`` without one).  Returns the newly built probe (``None`` if none was built);
        ``task='auto'`` takes the data module's ``task`` (``nominal`` without a data module).
        """
        if not self.enabled:
            return None
        n = self.num_classes
        if data is not None:
            data.check_num_classes(n, fix="give the model num_classes {n}, or null to take the data module's")
        if self.probe is not None:
            return None
        if n is None:
            if data is None:
                raise ValueError(f"{owner} cannot size its online probe: set model.num_classes, or online_probe: false")
            n = data.num_classes
        # task auto: the data module's (nominal without one)
        task: Task = self.task if self.task != "auto" else "nominal" if data is None else data.task
        return self.build(n, task, factory)

    def param_group(self, base_lr: float) -> dict[str, Any] | None:
        """The probe's optimiser group (``online_probe_lr`` or ``base_lr``, no weight decay); ``None`` without a probe."""
        if self.probe is None:
            return None
        return self.probe.param_group(lr=self.lr or base_lr)

    # ------------------------------------------------------------------ steps
    def training_step(self, features: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor | None, dict[str, torch.Tensor]]:
        """Remember labelled ``features`` [B, D] for the kNN monitor; the probe's ``(loss, logs)`` (``(None, {})`` without one).

        Add ``loss`` to the method's loss (it reaches only the probe) and log ``logs``.
        """
        self._remember(features, y)
        if self.probe is None:
            return None, {}
        return self.probe.training_step(features, y)

    def eval_step(
        self, features: torch.Tensor, y: torch.Tensor, stage: Literal["val", "test"]
    ) -> tuple[dict[str, Any], torch.Tensor | None]:
        """``(probe logs, kNN accuracy)`` of evaluation ``features`` [B, D]; the kNN accuracy only for ``val``.

        Log the probe's dict per epoch with the batch size, the kNN accuracy (``None`` when
        there is nothing to report) with the number of labelled rows as batch size.
        """
        logs = self.probe.eval_step(features, y, stage) if self.probe is not None else {}
        return logs, self.knn_accuracy(features, y) if stage == "val" else None

    def require_probe(self, owner: str = "the module") -> OnlineLinearProbe:
        """The probe, for predictions; a clear error without one."""
        if self.probe is None:
            raise ValueError(
                f"{owner}.predict needs the online probe (online_probe: true); for embeddings call model.extract_features(images)"
            )
        return self.probe

    def __repr__(self) -> str:
        probe = f"{self.num_classes} classes, {self.task}" if self.probe is not None else ("pending" if self.enabled else "off")
        return f"{type(self).__name__}(probe={probe}, lr={self.lr}, knn_k={self.knn_k}, knn_bank_size={self.knn_bank_size})"

    # ------------------------------------------------------------------ kNN monitor
    def reset(self) -> None:
        """Forget the kNN bank (its features belong to the weights they were computed with)."""
        self._bank_features = self._bank_labels = self._bank_next = None

    @torch.no_grad()
    def _remember(self, features: torch.Tensor, y: torch.Tensor) -> None:
        """Write the labelled rows of a training batch into the kNN bank, a ring buffer on the device.

        No host sync: the labelled rows are moved to the front (a stable sort on the
        "unlabelled" flag), the first ``n_labelled`` of them are written at the ring's
        position (a device counter) and the others leave the bank as it was.  Empty slots
        have label -1 and are skipped by :meth:`knn_accuracy`.
        """
        if self.knn_k <= 0 or y.numel() == 0:
            return
        size = self.knn_bank_size
        f = features.detach().float()
        if (
            self._bank_features is None
            or self._bank_labels is None
            or self._bank_features.device != f.device
            or self._bank_features.shape[1] != f.shape[1]
        ):
            self._bank_features = f.new_zeros(size, f.shape[1])
            self._bank_labels = torch.full((size,), -1, dtype=torch.int64, device=f.device)
            self._bank_next = torch.zeros((), dtype=torch.int64, device=f.device)
        labelled = y >= 0
        order = torch.argsort((~labelled).to(torch.int8), stable=True)[:size]  # labelled rows first, in batch order
        n_new = labelled.sum().clamp(max=size)
        nxt = self._bank_next if self._bank_next is not None else torch.zeros((), dtype=torch.int64, device=f.device)
        slots = (nxt + torch.arange(order.shape[0], device=f.device)) % size
        write = torch.arange(order.shape[0], device=f.device) < n_new
        old_f, old_y = self._bank_features[slots], self._bank_labels[slots]
        self._bank_features.index_copy_(0, slots, torch.where(write.unsqueeze(1), f[order], old_f))
        self._bank_labels.index_copy_(0, slots, torch.where(write, y[order].detach().to(torch.int64), old_y))
        self._bank_next = (nxt + n_new) % size

    def knn_accuracy(self, features: torch.Tensor, y: torch.Tensor) -> torch.Tensor | None:
        """Accuracy of the weighted kNN vote of the bank on the labelled rows; ``None`` when off, empty or unlabelled.

        An evaluation step (not the training step): it reads the device to drop empty bank slots.
        """
        keep = y >= 0
        if self.knn_k <= 0 or self._bank_features is None or self._bank_labels is None or not bool(keep.any()):
            return None
        filled = self._bank_labels >= 0
        if not bool(filled.any()):
            return None
        bank_features, bank_labels = self._bank_features[filled], self._bank_labels[filled]
        n_classes = self.probe.num_classes if self.probe is not None else None
        if n_classes is None:
            n_classes = int(max(int(bank_labels.max()), int(y[keep].max()))) + 1
        with torch.autocast(device_type=features.device.type, enabled=False):  # float32 similarities and votes
            scores = knn_predict(bank_features, bank_labels, features[keep].float(), n_classes, self.knn_k, self.knn_temperature)
        return (scores.argmax(dim=1) == y[keep].to(scores.device)).float().mean()


def _metric_values(logs: dict[str, Any]) -> dict[str, float]:
    """``{name: float}`` of a logs dict (computing Metric entries); for plain-Python use and tests."""
    return {k: float(v.compute() if isinstance(v, Metric) else v) for k, v in logs.items()}
