"""ReLIC with the sigmoid contrastive loss: online network, EMA target, multi-crop, mini-batch splitting.

The architecture of *Representation Learning via Invariant Causal Mechanisms*
(ReLIC; J. Mitrovic et al., ICLR 2021, arXiv:2010.07922) trained with the SigLIP
pairwise sigmoid loss (X. Zhai et al., ICCV 2023, arXiv:2303.15343) plus a
confidence penalty and a KL invariance term -- the seed project "Sigmoid Contrastive
Loss for Vision" (F. Basara, https://github.com/filipbasara0/sigmoid-contrastive-loss,
package ``sigmoid-contrastive-learning``, command ``scl_train``).  The loss itself is
:func:`cloc_lightning.losses.sigmoid.sigmoid_contrastive_loss`; this module owns the
networks, the schedules and the batching around it.

* **Online network** = encoder + projector (:meth:`ReLICModule.build_projector`).
* **Target network** = a frozen deep copy of the online network that follows it by an
  exponential moving average after every optimiser step
  (:class:`~cloc_lightning.methods.momentum.MomentumModule`, on :class:`~cloc_lightning.nn.ema.EMATarget`:
  ``target <- beta * target + (1 - beta) * online`` on parameters and BatchNorm buffers,
  beta on a cosine schedule).
* **Multi-crop**: ``num_global_views`` global views (the target's inputs) then
  ``num_local_views`` local views; the loss is the mean over every (target view ``i``,
  online view ``j``) pair with ``i != j``.

Evaluation features are the **target encoder's** (no projector), L2-normalised.  How the
pieces work (mini-batch splitting and gradient caching, encoder BatchNorm modes, mixed
precision, evaluation) and how to run it: ``docs/methods/relic.md``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import nn

from cloc_lightning.callbacks.checks import is_logging_step
from cloc_lightning.losses.base import Loss, compute_dtype, upcast
from cloc_lightning.losses.sigmoid import SigmoidContrastiveLoss
from cloc_lightning.methods.grad_cache import cached_backward, check_mini_batch_size, check_mini_batches, chunk_backward, mini_batch_slices
from cloc_lightning.methods.momentum import MomentumModule
from cloc_lightning.methods.optim import SchedulerName
from cloc_lightning.nn.ema import BetaSchedule
from cloc_lightning.nn.heads import MLPHead
from cloc_lightning.validation import check_choice, check_float, check_int

__all__ = ["ReLICModule", "cosine_gamma"]

Negatives = Literal["mini_batch", "full_batch"]
EncoderBN = Literal["train", "frozen_stats"]


# ---------------------------------------------------------------------- schedules
def cosine_gamma(step: int, total_steps: int, gamma0: float) -> float:
    """Confidence-penalty exponent at step ``step``: cosine from ``gamma0`` (step 0) to 0 (``total_steps`` and after).

    The seed's ``cosine_scaling_gamma(step, gamma0, 0.0, total_steps)`` (``train.py``).
    """
    if total_steps <= 0 or step >= total_steps:
        return 0.0
    return gamma0 * (math.cos(math.pi * max(step, 0) / total_steps) + 1.0) / 2.0


# ---------------------------------------------------------------------- module
class ReLICModule(MomentumModule):
    """ReLIC pre-training with the sigmoid contrastive loss (online + EMA target, multi-crop).

    Each training batch holds ``num_global_views + num_local_views`` views per image
    (``data.train_views``: :class:`~cloc_lightning.data.MultiCropViews` with the same
    counts).  Every view goes through the online network separately (BatchNorm statistics
    per view, as the seed); the global views also through the target network (no
    gradients, train mode).  The loss of the online projections ``x`` against the target
    projections ``x'`` is :class:`~cloc_lightning.losses.sigmoid.SigmoidContrastiveLoss`
    (owning the learnable logit scale ``tau`` and bias ``b``; computed in float32, float64 under ``64-true``),
    averaged over :meth:`view_pairs`.  After each optimiser step the target is updated
    (:class:`~cloc_lightning.methods.momentum.MomentumModule`: the copies, the update, the schedule).

    ``mini_batch_size`` splits each batch into chunks forwarded and back-propagated one at
    a time (manual optimisation); ``negatives`` says whether each chunk is its own batch
    (``'mini_batch'``, the seed) or the whole-batch loss is kept exactly by gradient caching
    (``'full_batch'``, Gao et al. 2021; :meth:`accumulate_gradients`).  Evaluation features
    (:meth:`extract_features`; the online probe, kNN monitor and frozen-encoder probes via
    :attr:`encoder_prefix`) are the target encoder's, L2-normalised.  The details:
    ``docs/methods/relic.md``.

    **Defaults** (the seed's): ResNet-18, Adam, lr 3e-4, weight decay 1e-5 (also on ``tau`` and
    ``b``, as the seed), constant learning rate (``scheduler: none``); the online probe at lr
    0.01 and a kNN monitor of 20 neighbours.

    Args:
        num_global_views: global views per image (the target's inputs; >= 1).
        num_local_views: local views per image (online only; >= 0).
        projector_hidden_dim: hidden width of the projector (seed ``--proj_hidden_dim``, 512).
        projector_dim: output dimension of the projector (seed ``--proj_out_dim``, 64).
        encoder_bn: BatchNorm mode of the online and target *encoders* during training:
            ``'train'`` (default; what the seed's ``train.py`` does) or ``'frozen_stats'``
            (eval-mode BatchNorm: fixed running statistics, trained affine parameters; the
            state the seed's ``ReLIC`` class is constructed in; see ``docs/methods/relic.md``).
        alpha: weight of the KL invariance term (seed ``--alpha``).
        gamma: initial confidence-penalty exponent gamma_0 (seed ``--gamma``).
        use_gamma_scaling: cosine-decay gamma to 0 over ``gamma_scaling_steps``.
        gamma_scaling_steps: length of the gamma decay in optimiser steps.
        init_tau: initial log logit scale (the seed: ``log 5``).
        init_b: initial logit bias (the seed: -5).
        max_tau: clamp of the logit scale ``exp(tau)`` (the seed: 5).
        learnable_tau_b: learn ``tau`` and ``b`` (the seed does).
        penalty_filtering: the loss's
            negative filtering (see :func:`~cloc_lightning.losses.sigmoid.sigmoid_contrastive_loss`).
        filtering_warmup_steps: see ``penalty_filtering``.
        filtering_threshold: see ``penalty_filtering``.
        mini_batch_size: split every batch into chunks of this size (must divide the
            batch); ``None`` = no splitting.
        negatives: ``'mini_batch'`` or ``'full_batch'`` (see above; only with ``mini_batch_size``).
        gather_distributed: contrast against the global batch under DDP (passed to the
            loss); ``None`` = on (a no-op on one process).
        lr: base learning rate (the seed's 3e-4, Adam).
        weight_decay: weight decay of the default group (the seed's 1e-5, also on ``tau`` and ``b``).
        scheduler: ``none`` (the seed's constant learning rate) | ``cosine`` | ``step``.
        online_probe_lr: the probe's learning rate (``None`` = ``lr``; ReLIC's default 0.01 suits
            Adam on L2-normalised features).
        knn_k: neighbours of the kNN monitor (0 disables it; 20 here).
        update_beta_after_step: the target is a copy of the online network after every
            optimiser step ``k <= update_beta_after_step`` (0-based); the EMA starts after (1 here,
            as the seed).
        beta: initial EMA coefficient beta_0 (seed ``--beta``; its CLI default is 0.995,
            its README commands use 0.99).
        beta_schedule: ``'relic'`` (default): cosine from ``beta`` at step 0 to exactly 1 at
            the run's last optimiser step (ReLIC / BYOL).  ``'scl_train'``: the seed script's
            schedule -- horizon ``steps_per_epoch * (max_epochs + 2) - update_beta_after_step``
            (:func:`scl_train_beta_horizon`; with ``max_steps`` the run's steps plus two
            epochs) and a one-EMA-step lag (:func:`scl_train_beta`), so beta never reaches 1.
        update_beta_every_n_steps: EMA update only after steps ``k`` divisible by this.
        **kwargs: the :class:`~cloc_lightning.methods.momentum.MomentumModule` arguments (the EMA
            target, beyond the three above), the :class:`~cloc_lightning.methods.pretrain.PretrainModule` ones (the
            online probe: ``num_classes``, ``task``, ``online_probe``, ``knn_k``, ...) and the
            :class:`~cloc_lightning.methods.base.BaseModule` ones (backbone, optimiser, schedule).

    Subclassing: override :meth:`build_projector` (``[B, feature_dim] -> [B, D]``),
    :meth:`build_loss`, :meth:`build_online_probe`, ``build_backbone`` (base class), or the
    momentum schedule ``beta_at`` (:class:`~cloc_lightning.methods.momentum.MomentumModule`).
    """

    #: state_dict prefix of the evaluation encoder (the EMA target's), read by :mod:`cloc_lightning.probe`
    encoder_prefix = "target_encoder."
    #: the whole online network (encoder and projector) has a momentum copy
    momentum_targets: ClassVar[dict[str, str]] = {"backbone": "target_encoder", "projector": "target_projector"}
    target_encoder: nn.Module
    target_projector: nn.Module

    def __init__(
        self,
        num_global_views: int = 2,
        num_local_views: int = 0,
        projector_hidden_dim: int = 512,
        projector_dim: int = 64,
        encoder_bn: EncoderBN = "train",
        alpha: float = 1.0,
        gamma: float = 1.0,
        use_gamma_scaling: bool = False,
        gamma_scaling_steps: int = 20_000,
        init_tau: float = math.log(5.0),
        init_b: float = -5.0,
        max_tau: float = 5.0,
        learnable_tau_b: bool = True,
        penalty_filtering: bool = False,
        filtering_warmup_steps: int = 5000,
        filtering_threshold: float = 0.05,
        mini_batch_size: int | None = None,
        negatives: Negatives = "mini_batch",
        gather_distributed: bool | None = None,
        *,
        lr: float = 3e-4,
        weight_decay: float = 1e-5,
        scheduler: SchedulerName = "none",
        online_probe_lr: float | None = 0.01,
        knn_k: int = 20,
        update_beta_after_step: int = 1,
        beta: float = 0.99,
        beta_schedule: BetaSchedule = "relic",
        update_beta_every_n_steps: int = 1,
        **kwargs: Any,
    ) -> None:
        check_int("num_global_views", num_global_views, 1)
        check_int("num_local_views", num_local_views, 0)
        if num_global_views + num_local_views < 2:
            raise ValueError(
                "ReLIC needs at least two views per image (a target view and a different online view); "
                f"got num_global_views={num_global_views}, num_local_views={num_local_views}"
            )
        check_int("projector_hidden_dim", projector_hidden_dim, 1)
        check_int("projector_dim", projector_dim, 1)
        check_choice("encoder_bn", encoder_bn, EncoderBN)
        check_float("alpha", alpha, minimum=0.0)
        check_float("gamma", gamma, minimum=0.0)
        check_int("gamma_scaling_steps", gamma_scaling_steps, 1)
        check_mini_batch_size(mini_batch_size)
        check_choice("negatives", negatives, Negatives)
        super().__init__(
            lr=lr,
            weight_decay=weight_decay,
            scheduler=scheduler,
            online_probe_lr=online_probe_lr,
            knn_k=knn_k,
            update_beta_after_step=update_beta_after_step,
            beta=beta,
            beta_schedule=beta_schedule,
            update_beta_every_n_steps=update_beta_every_n_steps,
            **kwargs,
        )
        self.num_global_views = num_global_views
        self.num_local_views = num_local_views
        self.mini_batch_size = mini_batch_size
        self.negatives: Negatives = negatives
        self.encoder_bn: EncoderBN = encoder_bn
        # one backward per mini-batch inside the step needs manual optimisation (see the class docstring)
        self.automatic_optimization = mini_batch_size is None
        self.projector = self.build_projector()
        self.add_momentum_targets()  # target_encoder, target_projector (``target_*`` state_dict keys)
        self.criterion = self.build_loss()
        self._apply_encoder_bn_mode()

    # ------------------------------------------------------------------ BatchNorm mode
    def _apply_encoder_bn_mode(self) -> None:
        """``encoder_bn='frozen_stats'``: put every BatchNorm of the online and target encoders in eval mode."""
        if getattr(self, "encoder_bn", "train") != "frozen_stats":  # (train() runs inside nn.Module.__init__ too)
            return
        for encoder in (self.backbone, self.target_encoder):
            for module in encoder.modules():
                if isinstance(module, nn.modules.batchnorm._BatchNorm):
                    module.eval()

    def train(self, mode: bool = True) -> ReLICModule:
        """``nn.Module.train``, then the encoders' BatchNorm mode of ``encoder_bn`` (kept in eval with ``'frozen_stats'``)."""
        super().train(mode)
        if mode:
            self._apply_encoder_bn_mode()
        return self

    def on_train_epoch_start(self) -> None:
        """Re-apply ``encoder_bn`` (in case something switched the encoders to training behind :meth:`train`)."""
        super().on_train_epoch_start()
        self._apply_encoder_bn_mode()

    # ------------------------------------------------------------------ hooks
    def build_projector(self) -> nn.Module:
        """The projection head ``[B, feature_dim] -> [B, projector_dim]`` (seed: Linear(no bias) -> BN -> ReLU -> Linear(no bias))."""
        h = self.hparams
        return MLPHead(self.feature_dim, h.projector_hidden_dim, h.projector_dim, batch_norm=True, bias=False)

    def build_loss(self) -> Loss:
        """The criterion: ``compute(x, x_prime, gamma=..., global_step=...) -> LossOutput(loss, terms)``, owning ``tau``/``b``."""
        h = self.hparams
        return SigmoidContrastiveLoss(
            init_tau=h.init_tau,
            init_b=h.init_b,
            max_tau=h.max_tau,
            alpha=h.alpha,
            gamma=h.gamma,
            learnable=bool(h.learnable_tau_b),
            penalty_filtering=bool(h.penalty_filtering),
            filtering_warmup_steps=int(h.filtering_warmup_steps),
            filtering_threshold=float(h.filtering_threshold),
            gather_distributed=True if h.gather_distributed is None else bool(h.gather_distributed),
        )

    # ---------------------------------------------------------------- views
    @property
    def num_views(self) -> int:
        """Views per image the data module must deliver: global + local."""
        return self.num_global_views + self.num_local_views

    def view_pairs(self) -> list[tuple[int, int]]:
        """The (target view ``i``, online view ``j``) pairs of the loss: ``i < G``, ``j < G + L``, ``i != j``."""
        return [(i, j) for i in range(self.num_global_views) for j in range(self.num_views) if i != j]

    def _views_fix(self) -> str:
        g, loc = self.num_global_views, self.num_local_views
        return (
            f"set data.train_views: {{class_path: cloc_lightning.data.MultiCropViews, init_args: "
            f"{{num_global_views: {g}, num_local_views: {loc}}}}} (or change model.num_global_views / model.num_local_views)"
        )

    def check_views(self, views: Sequence[torch.Tensor], batch_size: int | None = None) -> None:
        """Raise a clear error unless ``views`` is ``num_global_views + num_local_views`` tensors ``[B, 3, h, w]``."""
        if len(views) != self.num_views:
            raise ValueError(
                f"{type(self).__name__}(num_global_views={self.num_global_views}, num_local_views={self.num_local_views}) "
                f"expects {self.num_views} views per image, the batch has {len(views)}; {self._views_fix()}"
            )
        sizes = {int(v.shape[0]) for v in views}
        if len(sizes) != 1 or (batch_size is not None and sizes != {batch_size}):
            raise ValueError(f"all views must hold the same images: got view batch sizes {sorted(sizes)} for {batch_size} labels")

    # ---------------------------------------------------------------- networks
    def online_projection(self, x: torch.Tensor) -> torch.Tensor:
        """Online network output ``[B, projector_dim]`` (not normalised; the loss normalises)."""
        projection: torch.Tensor = self.projector(self.backbone(x))
        return projection

    @torch.no_grad()
    def target_outputs(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(target encoder features [B, feature_dim], target projection [B, projector_dim])`` without gradients."""
        features = self.target_encoder(x)
        return features, self.target_projector(features)

    def extract_features(self, x: torch.Tensor) -> torch.Tensor:
        """Evaluation features: the target encoder's ``[B, feature_dim]``, L2-normalised, float32 (float64 under ``64-true``)."""
        return F.normalize(upcast(self.target_encoder(x)), dim=1)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """``{'features': normalised target-encoder features, 'projection': normalised target projection}``."""
        features = self.target_encoder(x)
        projection = self.target_projector(features)
        return {"features": F.normalize(upcast(features), dim=1), "projection": F.normalize(upcast(projection), dim=1)}

    # ---------------------------------------------------------------- schedules
    def gamma_at(self, step: int) -> float:
        """Confidence-penalty exponent of step ``step`` (cosine decay if ``use_gamma_scaling``, else ``gamma``)."""
        h = self.hparams
        if h.use_gamma_scaling:
            return cosine_gamma(step, int(h.gamma_scaling_steps), float(h.gamma))
        return float(h.gamma)

    # ---------------------------------------------------------------- loss
    def multicrop_loss(
        self, online: Sequence[torch.Tensor], target: Sequence[torch.Tensor], gamma: float, step: int = -1
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean ``(loss, invariance)`` over :meth:`view_pairs` of online ``[n, D]`` x ``num_views`` and target ``[n, D]`` x ``num_global_views``.

        The pair (``i``, ``j``) is ``criterion(x=online[j], x_prime=target[i])``; computed in
        float32 (float64 when the projections are float64, as under ``64-true``) with autocast disabled.
        """
        if len(online) != self.num_views or len(target) != self.num_global_views:
            raise ValueError(
                f"multicrop_loss needs {self.num_views} online and {self.num_global_views} target projections, "
                f"got {len(online)} and {len(target)}"
            )
        pairs = self.view_pairs()
        device_type = online[0].device.type
        with torch.autocast(device_type=device_type, enabled=False):
            dtype = compute_dtype(*online, *target)
            total = online[0].new_zeros((), dtype=dtype)
            invariance = online[0].new_zeros((), dtype=dtype)
            for i, j in pairs:
                loss, terms = self.criterion.compute(online[j].to(dtype), target[i].to(dtype).detach(), gamma=gamma, global_step=step)
                total = total + loss
                if "invariance" in terms:
                    invariance = invariance + terms["invariance"]
        return total / len(pairs), invariance / len(pairs)

    # ---------------------------------------------------------------- lifecycle
    def setup(self, stage: str) -> None:
        """Check the data module's views and batch size; then ``init_from`` and the online probe (:class:`PretrainModule`)."""
        data = self.datamodule_info
        n_views = data.n_views if data is not None and stage == "fit" else None
        if data is not None and n_views is not None:
            views = data.train_views
            if views is None:
                raise ValueError(f"{type(self).__name__} needs multi-crop batches; {self._views_fix()}")
            counts = (getattr(views, "num_global_views", None), getattr(views, "num_local_views", None))
            if n_views != self.num_views or (None not in counts and counts != (self.num_global_views, self.num_local_views)):
                raise ValueError(
                    f"{type(self).__name__}(num_global_views={self.num_global_views}, num_local_views={self.num_local_views}) "
                    f"but the data module yields {n_views} views ({type(views).__name__} {counts}); {self._views_fix()}"
                )
            check_mini_batches(self.mini_batch_size, data, self.trainer.world_size)
        super().setup(stage)

    # ---------------------------------------------------------------- steps
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        views, y = self.split_batch(batch, owner=type(self).__name__)
        if not isinstance(views, (list, tuple)):
            raise ValueError(f"{type(self).__name__} trains on multi-crop batches (a list of views per batch); {self._views_fix()}")
        views = list(views)
        bsz = int(y.shape[0])
        self.check_views(views, bsz)
        step = self._step()
        gamma = self.gamma_at(step)
        if self.mini_batch_size is not None:
            with self.training_gathers():  # full batches (and mini-batches) on every process: the gathers read no sizes
                loss, invariance, probe_logs = self.manual_optimizer_step(step, lambda: self.accumulate_gradients(views, y, gamma, step))
            total = loss
        else:
            target, features = [], None
            for i in range(self.num_global_views):
                f, p = self.target_outputs(views[i])
                target.append(p)
                if i == 0:
                    features = F.normalize(upcast(f), dim=1)
            online = [self.online_projection(v) for v in views]
            with self.training_gathers():  # full batches on every process: the gathers read no sizes
                loss, invariance = self.multicrop_loss(online, target, gamma, step)
            probe_loss, probe_logs = self.online_eval.training_step(features, y)  # type: ignore[arg-type]
            total = loss if probe_loss is None else loss + probe_loss
        self._log_train(loss, invariance, probe_logs, gamma, step, bsz)
        return total

    def _log_train(
        self, loss: torch.Tensor, invariance: torch.Tensor, probe_logs: dict[str, torch.Tensor], gamma: float, step: int, bsz: int
    ) -> None:
        crit = self.criterion
        tau = getattr(crit, "tau", None)
        b = getattr(crit, "b", None)
        logs: dict[str, Any] = {"train/invariance": invariance.detach()}
        if self._trainer is None or is_logging_step(self.trainer):
            # a Python number: self.log copies it to the device, so only on the steps the loggers write (beta: the base)
            logs["train/gamma"] = gamma
        if isinstance(tau, torch.Tensor):
            logs["train/tau"] = tau.detach().float()
            logs["train/logit_scale"] = tau.detach().float().exp().clamp(max=float(self.hparams.max_tau))
        if isinstance(b, torch.Tensor):
            logs["train/b"] = b.detach().float()
        self.log("train/loss", loss.detach(), prog_bar=True, batch_size=bsz)
        self.log_dict(logs, batch_size=bsz)
        if probe_logs:
            self.log_dict(probe_logs, batch_size=bsz)

    # ------------------------------------------------------ mini-batch splitting
    def accumulate_gradients(
        self, views: Sequence[torch.Tensor], y: torch.Tensor, gamma: float | None = None, step: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """Forward and backward the batch in mini-batches; gradients accumulate in ``.grad``.

        What a training step does with ``mini_batch_size`` (without the optimiser step).
        Under a Trainer the backward passes go through ``manual_backward`` (precision
        scaling, DDP synchronisation on the last mini-batch only); standalone, through
        ``Tensor.backward``.  Returns ``(loss, invariance, probe logs)`` of the batch,
        detached; the loss is the one whose gradient was accumulated (plus the probe's CE).
        """
        views = list(views)
        self.check_views(views, int(y.shape[0]))
        step = self._step() if step is None else step
        gamma = self.gamma_at(step) if gamma is None else gamma
        slices = mini_batch_slices(int(y.shape[0]), self.mini_batch_size)
        chunks = len(slices)
        g = self.num_global_views

        # the target, chunk by chunk (BatchNorm statistics per chunk, like the online network), no gradients
        target: list[list[torch.Tensor]] = [[] for _ in range(g)]
        first_features = []
        for sl in slices:
            for i in range(g):
                f, p = self.target_outputs(views[i][sl])
                target[i].append(p)
                if i == 0:
                    first_features.append(f)
        features = F.normalize(upcast(torch.cat(first_features)), dim=1)
        probe_loss, probe_logs = self.online_eval.training_step(features, y)

        def backward(tensor: torch.Tensor, last: bool) -> None:
            chunk_backward(self, tensor, last)

        if self.negatives == "full_batch":  # the gradient cache: exact gradients of the whole-batch loss
            full_target = [torch.cat(t) for t in target]
            loss, inv = cached_backward(
                lambda sl: [self.online_projection(view[sl]) for view in views],
                slices,
                lambda online: self.multicrop_loss(online, full_target, gamma, step),
                backward,
                device=views[0].device,
                params=[p for p in self.criterion.parameters() if p.requires_grad],
                buffers=[b for m in self.ema.online for b in m.buffers()],
                last_extra=probe_loss,
            )
            return loss, inv, probe_logs

        loss_sum = features.new_zeros(())
        inv_sum = features.new_zeros(())
        for c, sl in enumerate(slices):
            online = [self.online_projection(view[sl]) for view in views]
            loss, inv = self.multicrop_loss(online, [target[i][c] for i in range(g)], gamma, step)
            part = loss / chunks
            last = c == chunks - 1
            if last and probe_loss is not None:
                part = part + probe_loss
            backward(part, last)
            loss_sum = loss_sum + loss.detach() / chunks
            inv_sum = inv_sum + inv.detach() / chunks
        return loss_sum, inv_sum, probe_logs

    # ---------------------------------------------------------------- evaluation
    def eval_views(self, views: list[torch.Tensor], y: torch.Tensor, stage: Literal["val", "test"]) -> torch.Tensor:
        """Multi-view evaluation data: log the ReLIC loss and invariance; evaluate the first view's target features."""
        bsz = int(y.shape[0])
        self.check_views(views, bsz)
        step = self._step()
        target = [self.target_outputs(views[i])[1] for i in range(self.num_global_views)]
        online = [self.online_projection(v) for v in views]
        loss, inv = self.multicrop_loss(online, target, self.gamma_at(step), step)
        self.log_eval_mean(f"{stage}/loss", loss, bsz)
        self.log_eval_mean(f"{stage}/invariance", inv, bsz)
        return self.extract_features(views[0])
