"""The base of self-supervised / contrastive pre-training methods.

:class:`PretrainModule` is :class:`~cloc_lightning.methods.base.BaseModule` (backbone,
optimiser, schedule, checkpoints) plus one online-evaluation component,
:class:`~cloc_lightning.nn.online_probe.OnlineEvaluator` (a linear probe on detached
features and a kNN monitor): its arguments and their
checks, its setup from the data module, its optimiser group, the best-checkpoint monitor,
and the validation, test and predict steps.  The evaluator's arguments are the module's options
(``model.knn_k``, ...): :class:`PretrainModule` declares them in its signature and hands them to the
evaluator by name.  A method subclasses it with only what differs:
its networks, its loss and its ``training_step``.
:class:`~cloc_lightning.methods.momentum.MomentumModule` adds momentum (EMA) copies of the
networks (the base of ReLIC), and :class:`MultiViewModule` (the base of SupCon/SimCLR and Rank-N-Contrast) adds what methods
on ``n_views`` views of every image share: the views check, their one-forward encoding and
the multi-view loss::

    class MyMethod(PretrainModule):
        def __init__(self, temperature: float = 0.1, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.projector = MLPHead(self.feature_dim, self.feature_dim, 128)

        def training_step(self, batch, batch_idx):
            (v1, v2), y = self.split_batch(batch, expect_views=True, owner=type(self).__name__)
            f1, f2 = self.backbone(v1), self.backbone(v2)
            loss = my_loss(self.projector(f1), self.projector(f2))
            self.log("train/loss", loss)
            return self.add_online_eval_loss(loss, f1, y)   # + the probe's CE, kNN bank update
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, Literal

import torch
from torch import nn

from cloc_lightning.methods.base import BaseModule
from cloc_lightning.metrics import Task, TaskSetting
from cloc_lightning.nn.heads import MLPHead
from cloc_lightning.nn.online_probe import OnlineEvaluator, OnlineLinearProbe
from cloc_lightning.validation import check_int, check_keywords

__all__ = ["MultiViewModule", "PretrainModule"]


class PretrainModule(BaseModule):
    """Backbone + online evaluation (linear probe and kNN monitor) for pre-training methods.

    The online probe (``online_probe``) is an
    :class:`~cloc_lightning.nn.online_probe.OnlineLinearProbe` trained alongside the method
    on detached features with its own cross-entropy and optimiser group
    (``online_probe_lr``, no weight decay).  It is built in ``__init__`` when ``num_classes``
    and ``task`` are given, else in :meth:`setup` from the data module (both are then stored
    in ``hparams``, so checkpoints rebuild it).  Validation and test report
    ``<stage>/online_probe/acc`` (+ ``acc_top5`` for nominal data; MAE, QWK, ±1 accuracy for
    ordinal data), which the best checkpoint monitors (``train/loss`` without a probe);
    with ``knn_k > 0`` validation also reports ``val/knn/acc``, a weighted kNN (Wu et al.
    2018) against the most recent ``knn_bank_size`` labelled training features of this
    process.  Predictions are the probe's on :meth:`extract_features` (override that hook to
    change which features are evaluated, as ReLIC does with its target encoder).

    Subclasses hand the evaluator their training features with
    :meth:`add_online_eval_loss` (or ``self.online_eval.training_step``) and may override
    :meth:`eval_views` (multi-view evaluation batches) and :meth:`build_online_probe`.

    Its own arguments are the :class:`~cloc_lightning.nn.online_probe.OnlineEvaluator`'s (with the
    evaluator's defaults, which a method may change by re-declaring them); the rest are
    :class:`~cloc_lightning.methods.base.BaseModule`'s.

    Args:
        num_classes: classes of the online probe; ``None`` = the data module's.
        task: probe metrics: ``nominal``, ``ordinal`` or ``auto`` (the data module's).
        online_probe: train and report the online linear probe.
        online_probe_lr: the probe's learning rate (``None`` = the method's ``lr``).
        knn_k: neighbours of the kNN monitor (0 disables it).
        knn_bank_size: training features kept for the kNN monitor.
        knn_temperature: temperature of the kNN vote.
        online_probe_norm: normalise the features (``BatchNorm1d`` without affine) before the
            probe's linear layer, so its step size does not depend on the feature scale;
            ``false`` = the linear layer on raw features (also needed to load checkpoints saved
            without it).
        **kwargs: the :class:`~cloc_lightning.methods.base.BaseModule` arguments (backbone,
            optimiser, schedule, ...).
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
        **kwargs: Any,
    ) -> None:
        online_eval = OnlineEvaluator(  # checks its arguments before the backbone is built
            num_classes=num_classes,
            task=task,
            online_probe=online_probe,
            online_probe_lr=online_probe_lr,
            knn_k=knn_k,
            knn_bank_size=knn_bank_size,
            knn_temperature=knn_temperature,
            online_probe_norm=online_probe_norm,
        )
        check_keywords(self, super().__init__, kwargs)
        super().__init__(**kwargs)
        #: the online-evaluation component (probe + kNN bank)
        self.online_eval = online_eval
        #: the online probe (registered here, so its parameters are ``probe.*``), or ``None``
        self.probe: OnlineLinearProbe | None = None
        size = online_eval.known_size()
        if size is not None:
            self.probe = online_eval.build(*size, factory=self.build_online_probe)

    # ------------------------------------------------------------------ hooks
    def build_online_probe(self, num_classes: int, task: Task) -> OnlineLinearProbe:
        """The online linear probe on :meth:`extract_features`-sized features (normalised unless ``online_probe_norm: false``)."""
        return OnlineLinearProbe(self.feature_dim, num_classes, task, norm=self.online_eval.norm)

    def param_groups(self) -> list[dict[str, Any]]:
        """Every trainable parameter but the probe's with the base settings; the online probe in its own group."""
        probe_ids = {id(p) for p in self.probe.parameters()} if self.probe is not None else set()
        model = [p for p in self.parameters() if p.requires_grad and id(p) not in probe_ids]
        groups: list[dict[str, Any]] = [{"name": "model", "params": model}]
        probe = self.online_eval.param_group(base_lr=self.hparams.lr)
        if probe is not None:
            groups.append(probe)
        return groups

    @property
    def monitor(self) -> str:
        """The online probe's validation accuracy, or the training loss without a probe."""
        return self.online_eval.monitor

    @property
    def monitor_mode(self) -> Literal["min", "max"]:
        return self.online_eval.monitor_mode

    # ---------------------------------------------------------------- lifecycle
    def setup(self, stage: str) -> None:
        """``init_from``; build the online probe from the data module's classes/task if it is still missing."""
        super().setup(stage)
        probe = self.online_eval.setup_from_datamodule(self.datamodule_info, self.build_online_probe, owner=type(self).__name__)
        if probe is not None:
            self.probe = probe.to(self.device)
            # stored so that checkpoints rebuild the probe in __init__ (load_from_checkpoint)
            self.hparams["num_classes"] = self.online_eval.num_classes
            self.hparams["task"] = self.online_eval.task

    def evaluation_keys(self) -> list[str]:
        """The base's keys, plus the online probe's when it is built at :meth:`setup` (after ``init_from`` is applied)."""
        keys = super().evaluation_keys()
        if self.probe is None and self.online_eval.enabled:
            keys.append("probe.<built at setup>")
        return keys

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Forget the kNN bank: its features belong to the weights before the load."""
        super().on_load_checkpoint(checkpoint)
        self.online_eval.reset()

    # -------------------------------------------------------------------- steps
    def add_online_eval_loss(
        self, loss: torch.Tensor, features: torch.Tensor, y: torch.Tensor, batch_size: int | None = None
    ) -> torch.Tensor:
        """``loss`` plus the probe's cross-entropy on detached ``features`` [N, D] (labels ``y`` [N]); logs the probe.

        Also feeds the kNN bank.  Without a probe, ``loss`` itself.  ``batch_size``: what the
        logs are weighted with (default ``N``; e.g. the images of a multi-view batch).
        """
        probe_loss, logs = self.online_eval.training_step(features, y)
        if logs:
            self.log_dict(logs, batch_size=int(y.shape[0]) if batch_size is None else batch_size)
        return loss if probe_loss is None else loss + probe_loss

    def eval_views(self, views: list[torch.Tensor], y: torch.Tensor, stage: Literal["val", "test"]) -> torch.Tensor:
        """Multi-view evaluation batches: log the method's loss on them (if it wants) and return the evaluated features.

        The default logs nothing and evaluates :meth:`extract_features` of the first view.
        """
        return self.extract_features(views[0])

    def log_online_eval(self, features: torch.Tensor, y: torch.Tensor, stage: Literal["val", "test"]) -> None:
        """Update and log the probe's ``<stage>/online_probe/*`` metrics and (``val``) the kNN accuracy."""
        logs, knn = self.online_eval.eval_step(features, y, stage)
        labelled = (y >= 0).sum()  # the probe's loss and the kNN accuracy are means over the labelled rows
        metrics: dict[str, Any] = {}
        for name, value in logs.items():
            if isinstance(value, torch.Tensor):
                self.log_eval_mean(name, value, labelled)
            else:
                metrics[name] = value
        if metrics:
            self.log_dict(metrics, on_step=False, on_epoch=True)
        if knn is not None:
            self.log_eval_mean(f"{stage}/knn/acc", knn, labelled)

    def _eval_step(self, batch: Any, stage: Literal["val", "test"]) -> None:
        x, y = self.split_batch(batch, owner=type(self).__name__)
        features = self.eval_views(list(x), y, stage) if isinstance(x, (list, tuple)) else self.extract_features(x)
        self.log_online_eval(features, y, stage)
        if stage == "test":
            self.log_eval_count("test/images", y.shape[0], y.device)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self._eval_step(batch, "val")

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self._eval_step(batch, "test")

    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> dict[str, torch.Tensor]:
        """The online probe's ``{'pred', 'expected', 'probs'}`` (+ ``'target'``) for single-view batches."""
        probe = self.online_eval.require_probe(owner=type(self).__name__)
        x, y = batch if isinstance(batch, (list, tuple)) else (batch, None)
        out = probe.predict(self.extract_features(x))
        if y is not None:
            out["target"] = y
        return out


class MultiViewModule(PretrainModule):
    """A pre-training method on ``n_views`` views of every image that go through the backbone together.

    The base of SupCon/SimCLR and Rank-N-Contrast: the subclass sets :attr:`n_views`,
    ``projector`` and ``criterion`` in its ``__init__``; this class checks at ``setup`` that the
    data module delivers that many views, and :meth:`views_loss` encodes a multi-view batch in
    one forward (BatchNorm over all views, as the references), projects it to the ``[bsz,
    n_views, dim]`` the contrastive losses take and applies ``criterion`` with the targets of
    :meth:`view_targets`.  Multi-view evaluation batches log that loss (:meth:`eval_views`).
    """

    #: views per image the data module must deliver (set by the subclass's ``__init__``)
    n_views: int
    #: the fewest views the method trains on (below it, only the data module is told to change)
    min_views: ClassVar[int] = 1
    #: the projection between the backbone and the loss, and the loss (built by the subclass)
    projector: nn.Module
    criterion: nn.Module

    @staticmethod
    def check_projector_dims(projector_dim: int | None, projector_hidden_dim: int | None, none_means: str = "") -> None:
        """Check the widths of an MLP projector before anything is built.

        ``none_means`` says what ``projector_dim: null`` does where a method allows it (RnC: no
        projector); without it ``projector_dim`` must be an int >= 1.
        """
        if projector_dim is not None or not none_means:
            check_int("projector_dim", projector_dim, 1, hint=f"or null: {none_means}" if none_means else "")
        if projector_hidden_dim is not None:
            check_int("projector_hidden_dim", projector_hidden_dim, 1)

    def mlp_projector(self, normalize: bool = False) -> nn.Module:
        """``MLPHead(feature_dim, projector_hidden_dim or feature_dim, projector_dim)`` from the hyper-parameters.

        ``nn.Identity()`` when ``projector_dim`` is ``None``; ``normalize`` L2-normalises the output.
        """
        h = self.hparams
        if h.projector_dim is None:
            return nn.Identity()
        return MLPHead(self.feature_dim, h.projector_hidden_dim or self.feature_dim, h.projector_dim, normalize=normalize)

    def setup(self, stage: str) -> None:
        """Check the data module's views; then ``init_from`` and the online probe (:class:`PretrainModule`)."""
        data = self.datamodule_info
        n_views = data.n_views if data is not None and stage == "fit" else None
        if data is not None and n_views is not None:
            if data.train_views is None:
                raise ValueError(
                    f"{type(self).__name__} needs multi-view batches; set data.train_views, e.g. "
                    f"{{class_path: cloc_lightning.data.SupConViews, init_args: {{n_views: {self.n_views}}}}}"
                )
            if n_views != self.n_views:
                raise ValueError(self._views_message(n_views))
        super().setup(stage)

    def _views_message(self, got: int) -> str:
        fix = f"set data.train_views.init_args.n_views: {self.n_views}"
        if got >= self.min_views:
            fix += f" (or model.n_views: {got})"
        return f"{type(self).__name__}(n_views={self.n_views}) got {got} view(s) per image from the data module; {fix}"

    def encode_views(self, views: Sequence[torch.Tensor]) -> torch.Tensor:
        """Backbone features of all views, view-major: ``[n_views * B, feature_dim]``.

        Views of equal size go through the backbone in one batch (BatchNorm sees all of them,
        as the references); views of other sizes (multi-crop) separately.
        """
        if len({tuple(v.shape) for v in views}) == 1:
            features: torch.Tensor = self.backbone(torch.cat(list(views)))
            return features
        return torch.cat([self.backbone(v) for v in views])

    def view_targets(self, y: torch.Tensor) -> torch.Tensor | None:
        """What ``criterion`` takes beside the projections, from the labels ``y`` ``[B]`` (default: ``y``)."""
        return y

    def views_loss(self, views: Sequence[torch.Tensor], y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(loss, backbone features [n_views * B, feature_dim])`` of a multi-view batch with labels ``y`` ``[B]``."""
        if len(views) != self.n_views:
            raise ValueError(self._views_message(len(views)))
        feats = self.encode_views(views)
        z = self.projector(feats).view(self.n_views, y.shape[0], -1).transpose(0, 1)  # [B, V, dim]
        loss: torch.Tensor = self.criterion(z, self.view_targets(y))
        return loss, feats

    def eval_views(self, views: list[torch.Tensor], y: torch.Tensor, stage: Literal["val", "test"]) -> torch.Tensor:
        """Multi-view evaluation data: log the method's loss as ``<stage>/loss``; evaluate the first view's backbone features."""
        bsz = int(y.shape[0])
        loss, feats = self.views_loss(views, y)
        self.log_eval_mean(f"{stage}/loss", loss, bsz)
        return feats[:bsz]
