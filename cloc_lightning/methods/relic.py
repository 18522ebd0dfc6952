"""ReLIC with the sigmoid contrastive loss: online network, EMA target, multi-crop, mini-batch splitting.

The architecture of *Representation Learning via Invariant Causal Mechanisms*
(ReLIC; J. Mitrovic et al., ICLR 2021, arXiv:2010.07922) trained with the SigLIP
pairwise sigmoid loss (X. Zhai et al., ICCV 2023, arXiv:2303.15343) plus a
confidence penalty and a KL invariance term -- the seed project "Sigmoid Contrastive
Loss for Vision" (F. Basara, https://github.com/filipbasara0/sigmoid-contrastive-loss,
package ``sigmoid-contrastive-learning``, command ``scl_train``).  The loss itself is
:func:`cloc_lightning.losses.sigmoid.sigmoid_contrastive_loss`; this module owns the
networks, the schedules and the batching around it.

* **Online network** = encoder (:meth:`~cloc_lightning.methods.base.BaseModule.build_backbone`)
  + projector (:meth:`ReLICModule.build_projector`: Linear without bias -> BatchNorm1d
  -> ReLU -> Linear without bias, 512 hidden / 64 out as the seed).
* **Target network** = a deep copy of the whole online network (encoder and projector),
  never trained by gradients; after each optimiser step its parameters **and its
  floating-point buffers** (BatchNorm running statistics; integer buffers such as
  ``num_batches_tracked`` are copied) move towards the online ones with
  ``torch._foreach_lerp_``: ``target <- beta * target + (1 - beta) * online``, right
  after the optimiser step (:meth:`ReLICModule.optimizer_step`).
* **Schedules**: beta follows the cosine schedule of the ReLIC paper (BYOL's), from
  ``beta`` at step 0 to 1 at the last step (``trainer.estimated_stepping_batches``;
  ``beta_schedule='relic'``), or the seed script's variant (``beta_schedule='scl_train'``:
  a horizon two epochs longer than the run, minus ``update_beta_after_step``, and the
  coefficient of the previous EMA step -- :func:`scl_train_beta`); gamma (the confidence
  penalty exponent) decays with a cosine from ``gamma`` to 0 over ``gamma_scaling_steps``
  when ``use_gamma_scaling`` (the seed's curriculum), else stays.
* **Multi-crop**: the data module yields ``num_global_views`` global then
  ``num_local_views`` local views (:class:`~cloc_lightning.data.MultiCropViews`); the
  target sees only the global views, the online network all of them, and the loss is
  the mean over every (target view ``i``, online view ``j``) pair with ``i != j``:
  ``G * (G + L) - G`` pairs.

Evaluation features are the **target encoder's** (no projector), L2-normalised:
:meth:`ReLICModule.extract_features`, the online linear probe / kNN monitor during
training, ``cloc-lightning probe`` and ``LinearProbeModule(encoder_ckpt=...)`` (both
read :attr:`ReLICModule.encoder_prefix`).
"""

from __future__ import annotations

import copy
import math
from contextlib import nullcontext
from typing import Any, ContextManager, Literal, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from cloc_lightning.losses.sigmoid import SigmoidContrastiveLoss
from cloc_lightning.methods.base import BaseModule, OnlineProbeEvalMixin, OptimizerName, SchedulerName
from cloc_lightning.nn.heads import MLPHead
from cloc_lightning.nn.online_probe import OnlineLinearProbe, knn_predict
from cloc_lightning.checkpoints import ENCODER_META_KEY, encoder_metadata

__all__ = [
    "ReLICModule", "cosine_beta", "cosine_gamma", "scl_train_beta", "scl_train_beta_horizon", "ema_update_",
    "copy_module_state_",
]

Negatives = Literal["mini_batch", "full_batch"]
EncoderBN = Literal["train", "frozen_stats"]
BetaSchedule = Literal["relic", "scl_train"]


# ---------------------------------------------------------------------- schedules
def cosine_beta(step: int, total_steps: int, beta0: float) -> float:
    """EMA coefficient at optimiser step ``step``: ``1 - (1 - beta0) * (cos(pi * step / total) + 1) / 2``.

    The cosine schedule of ReLIC / BYOL (Grill et al. 2020): ``beta0`` at step 0,
    increasing monotonically to exactly 1 at ``total_steps`` (and after).
    """
    if total_steps <= 0:
        return 1.0
    progress = min(max(step, 0), total_steps) / total_steps
    return 1.0 - (1.0 - beta0) * (math.cos(math.pi * progress) + 1.0) / 2.0


def scl_train_beta_horizon(steps_per_epoch: int, epochs: int, update_beta_after_step: int) -> int:
    """The seed script's cosine horizon ``K = steps_per_epoch * (epochs + 2) - update_beta_after_step``.

    ``train.py`` of the seed (``total_num_steps``): two epochs longer than the run, so
    its beta never reaches 1 (at least 1 here, for degenerate tiny runs).
    """
    return max(1, steps_per_epoch * (epochs + 2) - update_beta_after_step)


def scl_train_beta(step: int, horizon: int, beta0: float, update_beta_after_step: int = 1, every_n_steps: int = 1) -> float:
    """EMA coefficient the seed's ``train.py`` applies after optimiser step ``step`` (an EMA step).

    The seed applies the coefficient it computed at its *previous* EMA step and only then
    computes the next one, so the schedule lags one EMA step: ``beta0`` at the first EMA
    step (the first ``k > update_beta_after_step`` divisible by ``every_n_steps``), then
    ``cosine_beta(step - every_n_steps, horizon, beta0)``.  With the horizon of
    :func:`scl_train_beta_horizon` it stays below 1 to the end of the run.  Only
    meaningful for EMA steps (the caller copies on ``step <= update_beta_after_step`` and
    skips steps not divisible by ``every_n_steps``).
    """
    previous = step - every_n_steps
    if previous <= update_beta_after_step:
        return float(beta0)
    return cosine_beta(previous, horizon, beta0)


def cosine_gamma(step: int, total_steps: int, gamma0: float) -> float:
    """Confidence-penalty exponent at step ``step``: cosine from ``gamma0`` (step 0) to 0 (``total_steps`` and after).

    The seed's ``cosine_scaling_gamma(step, gamma0, 0.0, total_steps)`` (``train.py``).
    """
    if total_steps <= 0 or step >= total_steps:
        return 0.0
    return gamma0 * (math.cos(math.pi * max(step, 0) / total_steps) + 1.0) / 2.0


# ---------------------------------------------------------------------- EMA
def _state_pairs(online: Sequence[nn.Module], target: Sequence[nn.Module]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Matching (online, target) tensors: parameters, then buffers, of modules built as deep copies."""
    o_list: list[torch.Tensor] = []
    t_list: list[torch.Tensor] = []
    for o_mod, t_mod in zip(online, target):
        o_state = list(o_mod.parameters()) + list(o_mod.buffers())
        t_state = list(t_mod.parameters()) + list(t_mod.buffers())
        if len(o_state) != len(t_state) or any(o.shape != t.shape for o, t in zip(o_state, t_state)):
            raise RuntimeError(
                f"the target copy of {type(o_mod).__name__} no longer matches the online module "
                "(parameters/buffers added after construction?); rebuild the target with copy_target()"
            )
        o_list += o_state
        t_list += t_state
    return o_list, t_list


@torch.no_grad()
def ema_update_(online: Sequence[nn.Module], target: Sequence[nn.Module], beta: float) -> None:
    """``target <- beta * target + (1 - beta) * online`` on parameters and floating-point buffers.

    Integer buffers (BatchNorm's ``num_batches_tracked``) are copied.  One fused
    ``torch._foreach_lerp_`` per dtype group; ``beta = 0`` copies, ``beta = 1`` keeps.
    """
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"beta must lie in [0, 1], got {beta}")
    o_list, t_list = _state_pairs(online, target)
    groups: dict[tuple[torch.dtype, torch.device], tuple[list[torch.Tensor], list[torch.Tensor]]] = {}
    for o, t in zip(o_list, t_list):
        if t.is_floating_point():
            ts, os_ = groups.setdefault((t.dtype, t.device), ([], []))
            ts.append(t)
            os_.append(o.detach().to(t.dtype))
        else:
            t.copy_(o)
    for ts, os_ in groups.values():
        torch._foreach_lerp_(ts, os_, 1.0 - beta)


@torch.no_grad()
def copy_module_state_(online: Sequence[nn.Module], target: Sequence[nn.Module]) -> None:
    """Copy every parameter and buffer of ``online`` into ``target`` (target = online)."""
    o_list, t_list = _state_pairs(online, target)
    torch._foreach_copy_(t_list, [o.detach() for o in o_list])


# ---------------------------------------------------------------------- module
class ReLICModule(OnlineProbeEvalMixin, BaseModule):
    """ReLIC pre-training with the sigmoid contrastive loss (online + EMA target, multi-crop).

    Each training batch holds ``num_global_views + num_local_views`` views per image
    (set ``data.train_views`` to :class:`~cloc_lightning.data.MultiCropViews` with the
    same counts).  Every view goes through the online network separately (BatchNorm
    statistics per view, as the seed); the global views also through the target network
    (no gradients, train mode: BatchNorm batch statistics, as BYOL and the seed's
    ``train.py``; the encoders' BatchNorm follows ``encoder_bn``, see below).  The
    loss of the online projections ``x`` against the target projections ``x'`` is
    :class:`~cloc_lightning.losses.sigmoid.SigmoidContrastiveLoss` (owning the learnable
    logit scale ``tau`` and bias ``b``), averaged over the (target ``i``, online ``j``,
    ``i != j``) view pairs (:meth:`view_pairs`).

    **Mini-batches** (``mini_batch_size``, the seed's ``-mb``): the batch is split into
    ``batch / mini_batch_size`` chunks that are forwarded and back-propagated one at a
    time, so activation memory is that of one chunk while the optimiser still takes one
    step per batch.  A chunk's graph must be freed before the next is built, so this
    needs one backward per chunk inside the step, which Lightning allows only with
    manual optimisation: setting ``mini_batch_size`` switches the module to
    ``automatic_optimization = False`` (it then calls the optimiser, the learning-rate
    scheduler and DDP's gradient synchronisation itself -- one all-reduce per step).
    Summing the chunk losses under automatic optimisation would give the same
    gradients but keep every chunk's graph alive until the end, saving no memory.
    Trainer's ``accumulate_grad_batches`` and ``gradient_clip_val`` are not available
    with ``mini_batch_size`` (Lightning raises); without it everything is automatic.

    ``negatives`` says what each chunk is contrasted with:

    * ``'mini_batch'`` (the seed): each chunk is an independent batch -- its online
      projections against its own target projections, positives on the diagonal,
      ``mini_batch_size - 1`` negatives per row; the step's loss is the mean of the
      chunk losses.  Smaller chunks mean fewer negatives: the result depends on
      ``mini_batch_size``.
    * ``'full_batch'``: the loss of the *whole* batch (every row against all ``batch``
      target columns; the KL term's column softmax over all rows), exactly as without
      ``mini_batch_size`` except that BatchNorm statistics are per chunk.  Gradients
      are exact by gradient caching (L. Gao et al., "Scaling Deep Contrastive Learning
      Batch Size under Memory Limited Setup", RepL4NLP 2021): the online projections
      of all chunks are first computed without gradients (BatchNorm buffers and RNG
      state restored afterwards), the loss and its gradient with respect to those
      projections are computed on the full batch, and each chunk is then re-forwarded
      with gradients and back-propagated with its slice of that gradient.  Costs one
      extra forward pass of the online network per step.

    **Encoder BatchNorm** (``encoder_bn``): ``'train'`` (default) trains the online
    encoder's BatchNorm layers normally (batch statistics, running statistics updated)
    and runs the target encoder in train mode too.  ``'frozen_stats'`` keeps every
    BatchNorm layer of the online *and* target encoders in eval mode while training: they
    normalise with their running statistics, which never move (PyTorch's initial 0 / 1,
    or whatever ``init_from``/``pretrained`` loaded), so they act as fixed affine layers
    whose weight and bias are still trained (online) and EMA-averaged (target); the
    projectors' BatchNorm keeps batch statistics.  That is the state the seed's ``ReLIC``
    *constructor* leaves its encoder in (its ``get_feature_size`` calls ``encoder.eval()``
    and nothing in the class switches it back), so a loop that uses the class without
    ``.train()`` trains that way.  The seed's own ``train.py``, however, calls
    ``torchinfo.summary(model)`` right after construction, and torchinfo (every version
    the seed allows, >= 1.8) ends with ``model.train(previous_mode)`` -- ``train(True)``
    on the whole model, encoder included -- so the seed's published runs trained the
    encoder's BatchNorm normally, as ``'train'`` does.  The mode is re-applied whenever
    the module is switched to training (:meth:`train`) and at every training epoch start
    (Lightning then reports "modules in eval mode at the start of training": expected).

    **Mixed precision**: use the Trainer's ``precision`` (``16-mixed``, ``bf16-mixed``);
    the networks run under autocast, the loss always in float32 (autocast disabled),
    which keeps ``exp(tau)``, the sigmoid and the KL term finite.

    **Evaluation**: features are the target encoder's, L2-normalised
    (:meth:`extract_features`).  An :class:`~cloc_lightning.nn.online_probe.OnlineLinearProbe`
    trains on the (free) target features of the first global view; validation/test
    report ``val/online_probe/acc`` (+ top-5 / ordinal metrics) and, with ``knn_k > 0``,
    validation reports ``val/knn/acc``: a weighted kNN (Wu et al. 2018) against a bank of
    the most recent ``knn_bank_size`` labelled training features of this process (a
    training-time monitor: the bank is not checkpointed and is cleared when weights are
    loaded, so ``test`` reports the probe only).  Checkpoints record
    :attr:`encoder_prefix` (``'target_encoder.'``), so ``cloc-lightning probe --ckpt``
    (add ``--normalize true`` for the normalised features, or ``--preset sigmoid_cl`` for
    the seed's whole protocol) and
    ``LinearProbeModule(encoder_ckpt=..., normalize_features=True)`` evaluate the target
    encoder.  The target is part of the ``state_dict``: checkpoints hold it and
    ``--ckpt_path`` resumes it.

    Args:
        num_global_views: global views per image (the target's inputs; >= 1).
        num_local_views: local views per image (online only; >= 0).
        projector_hidden_dim: hidden width of the projector (seed ``--proj_hidden_dim``, 512).
        projector_dim: output dimension of the projector (seed ``--proj_out_dim``, 64).
        beta: initial EMA coefficient beta_0 (seed ``--beta``; its CLI default is 0.995,
            its README commands use 0.99).
        beta_schedule: ``'relic'`` (default): cosine from ``beta`` at step 0 to exactly 1 at
            the run's last optimiser step (ReLIC / BYOL).  ``'scl_train'``: the seed script's
            schedule -- horizon ``steps_per_epoch * (max_epochs + 2) - update_beta_after_step``
            (:func:`scl_train_beta_horizon`; with ``max_steps`` the run's steps plus two
            epochs) and a one-EMA-step lag (:func:`scl_train_beta`), so beta never reaches 1.
        encoder_bn: BatchNorm mode of the online and target *encoders* during training:
            ``'train'`` (default; what the seed's ``train.py`` does) or ``'frozen_stats'``
            (eval-mode BatchNorm: fixed running statistics, trained affine parameters; the
            state the seed's ``ReLIC`` class is constructed in).  See "Encoder BatchNorm" above.
        update_beta_after_step: the target is a copy of the online network after every
            optimiser step ``k <= update_beta_after_step`` (0-based); the EMA starts after.
        update_beta_every_n_steps: EMA update only after steps ``k`` divisible by this.
        alpha: weight of the KL invariance term (seed ``--alpha``).
        gamma: initial confidence-penalty exponent gamma_0 (seed ``--gamma``).
        use_gamma_scaling: cosine-decay gamma to 0 over ``gamma_scaling_steps``.
        gamma_scaling_steps: length of the gamma decay in optimiser steps.
        init_tau: initial log logit scale (the seed: ``log 5``).
        init_b: initial logit bias (the seed: -5).
        max_tau: clamp of the logit scale ``exp(tau)`` (the seed: 5).
        learnable_tau_b: learn ``tau`` and ``b`` (the seed does).
        penalty_filtering, filtering_warmup_steps, filtering_threshold: the loss's
            negative filtering (see :func:`~cloc_lightning.losses.sigmoid.sigmoid_contrastive_loss`).
        mini_batch_size: split every batch into chunks of this size (must divide the
            batch); ``None`` = no splitting.
        negatives: ``'mini_batch'`` or ``'full_batch'`` (see above; only with ``mini_batch_size``).
        gather_distributed: contrast against the global batch under DDP (passed to the
            loss); ``None`` = on (a no-op on one process).
        num_classes: classes of the online probe; ``None`` = the data module's.
        task: probe metrics: ``nominal``, ``ordinal`` or ``auto`` (the data module's).
        online_probe: train and report the online linear probe.
        online_probe_lr: the probe's learning rate (``None`` = ``lr``; the default 0.01
            suits Adam on L2-normalised features).
        knn_k: neighbours of the kNN monitor (0 disables it).
        knn_bank_size: training features kept for the kNN monitor.
        knn_temperature: temperature of the kNN vote.
        backbone, cifar_stem, optimizer, lr, weight_decay, scheduler: as
            :class:`~cloc_lightning.methods.base.BaseModule`, with the seed's defaults:
            ResNet-18, Adam, lr 3e-4, weight decay 1e-5 (also on ``tau`` and ``b``, as the
            seed), constant learning rate.
        **kwargs: other :class:`~cloc_lightning.methods.base.BaseModule` arguments
            (``pretrained``, ``backbone_kwargs``, ``warmup_epochs``, ``init_from``, ...).

    Example::

        from cloc_lightning.data import ImageFolderDataModule, MultiCropViews

        views = MultiCropViews(num_global_views=2, num_local_views=4, blur_p=1.0)
        dm = ImageFolderDataModule("../shared/data/cifar10", batch_size=256, drop_last=True, train_views=views)
        model = ReLICModule(num_global_views=2, num_local_views=4, backbone="resnet18", cifar_stem=True)
        L.Trainer(max_epochs=100, precision="16-mixed").fit(model, datamodule=dm)
        model.extract_features(images)     # [B, 512] L2-normalised target-encoder features

    Subclassing: override :meth:`build_projector` (``[B, feature_dim] -> [B, D]``),
    :meth:`build_loss`, :meth:`build_online_probe`, or ``build_backbone`` (base class).
    """

    #: state_dict prefix of the evaluation encoder (the EMA target's), read by :mod:`cloc_lightning.probe`
    encoder_prefix: str = "target_encoder."

    def __init__(
        self,
        num_global_views: int = 2,
        num_local_views: int = 0,
        projector_hidden_dim: int = 512,
        projector_dim: int = 64,
        beta: float = 0.99,
        update_beta_after_step: int = 1,
        update_beta_every_n_steps: int = 1,
        beta_schedule: BetaSchedule = "relic",
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
        num_classes: int | None = None,
        task: Literal["auto", "ordinal", "nominal"] = "auto",
        online_probe: bool = True,
        online_probe_lr: float | None = 0.01,
        knn_k: int = 20,
        knn_bank_size: int = 4096,
        knn_temperature: float = 0.07,
        backbone: str = "resnet18",
        cifar_stem: bool = False,
        optimizer: OptimizerName = "adam",
        lr: float = 3e-4,
        weight_decay: float = 1e-5,
        scheduler: SchedulerName = "none",
        **kwargs: Any,
    ) -> None:
        if not isinstance(num_global_views, int) or num_global_views < 1:
            raise ValueError(f"num_global_views must be an integer >= 1, got {num_global_views!r}")
        if not isinstance(num_local_views, int) or num_local_views < 0:
            raise ValueError(f"num_local_views must be an integer >= 0, got {num_local_views!r}")
        if num_global_views + num_local_views < 2:
            raise ValueError(
                "ReLIC needs at least two views per image (a target view and a different online view); "
                f"got num_global_views={num_global_views}, num_local_views={num_local_views}"
            )
        if projector_dim < 1 or projector_hidden_dim < 1:
            raise ValueError(f"projector dimensions must be >= 1, got {projector_hidden_dim} and {projector_dim}")
        if not 0.0 <= beta <= 1.0:
            raise ValueError(f"beta (the initial EMA coefficient) must lie in [0, 1], got {beta}")
        if update_beta_after_step < 0:
            raise ValueError(f"update_beta_after_step must be >= 0, got {update_beta_after_step}")
        if update_beta_every_n_steps < 1:
            raise ValueError(f"update_beta_every_n_steps must be >= 1, got {update_beta_every_n_steps}")
        if beta_schedule not in ("relic", "scl_train"):
            raise ValueError(f"beta_schedule must be 'relic' or 'scl_train', got {beta_schedule!r}")
        if encoder_bn not in ("train", "frozen_stats"):
            raise ValueError(f"encoder_bn must be 'train' or 'frozen_stats', got {encoder_bn!r}")
        if alpha < 0 or gamma < 0:
            raise ValueError(f"alpha and gamma must be >= 0, got alpha={alpha}, gamma={gamma}")
        if gamma_scaling_steps < 1:
            raise ValueError(f"gamma_scaling_steps must be >= 1, got {gamma_scaling_steps}")
        if mini_batch_size is not None and (not isinstance(mini_batch_size, int) or mini_batch_size < 1):
            raise ValueError(f"mini_batch_size must be a positive integer or null (no splitting), got {mini_batch_size!r}")
        if negatives not in ("mini_batch", "full_batch"):
            raise ValueError(f"negatives must be 'mini_batch' or 'full_batch', got {negatives!r}")
        if num_classes is not None and (not isinstance(num_classes, int) or num_classes < 2):
            raise ValueError(f"num_classes must be an integer >= 2 or null (= the data module's), got {num_classes!r}")
        if task not in ("auto", "ordinal", "nominal"):
            raise ValueError(f"task must be auto|ordinal|nominal, got {task!r}")
        if online_probe_lr is not None and online_probe_lr <= 0:
            raise ValueError(f"online_probe_lr must be > 0 (or null = lr), got {online_probe_lr}")
        if knn_k < 0 or knn_bank_size < 1 or knn_temperature <= 0:
            raise ValueError(
                f"need knn_k >= 0 (0 = off), knn_bank_size >= 1, knn_temperature > 0; got {knn_k}, {knn_bank_size}, {knn_temperature}"
            )
        super().__init__(
            backbone=backbone,
            cifar_stem=cifar_stem,
            optimizer=optimizer,
            lr=lr,
            weight_decay=weight_decay,
            scheduler=scheduler,
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
        self.target_encoder = copy.deepcopy(self.backbone)
        self.target_projector = copy.deepcopy(self.projector)
        self.target_encoder.requires_grad_(False)
        self.target_projector.requires_grad_(False)
        self.criterion = self.build_loss()
        self.probe: OnlineLinearProbe | None = None
        if online_probe and num_classes is not None and task != "auto":
            self.probe = self.build_online_probe(num_classes, task)
        self._pending_step = 0  # index of the optimiser step the current batch contributes to
        self._knn_features: torch.Tensor | None = None
        self._knn_labels: torch.Tensor | None = None
        self._apply_encoder_bn_mode()

    # ------------------------------------------------------------------ BatchNorm mode
    def _apply_encoder_bn_mode(self) -> None:
        """``encoder_bn='frozen_stats'``: put every BatchNorm of the online and target encoders in eval mode."""
        if getattr(self, "encoder_bn", "train") != "frozen_stats":
            return
        for encoder in (self.backbone, self.target_encoder):
            for module in encoder.modules():
                if isinstance(module, nn.modules.batchnorm._BatchNorm):
                    module.eval()

    def train(self, mode: bool = True) -> "ReLICModule":
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
        return MLPHead(self.feature_dim, h.get("projector_hidden_dim", 512), h.get("projector_dim", 64), batch_norm=True, bias=False)

    def build_loss(self) -> nn.Module:
        """The criterion: ``forward(x, x_prime, gamma=..., global_step=...) -> (loss, invariance)``, owning ``tau``/``b``."""
        h = self.hparams
        gather = h.get("gather_distributed")
        return SigmoidContrastiveLoss(
            init_tau=h.get("init_tau", math.log(5.0)),
            init_b=h.get("init_b", -5.0),
            max_tau=h.get("max_tau", 5.0),
            alpha=h.get("alpha", 1.0),
            gamma=h.get("gamma", 1.0),
            learnable=bool(h.get("learnable_tau_b", True)),
            penalty_filtering=bool(h.get("penalty_filtering", False)),
            filtering_warmup_steps=int(h.get("filtering_warmup_steps", 5000)),
            filtering_threshold=float(h.get("filtering_threshold", 0.05)),
            gather_distributed=True if gather is None else bool(gather),
        )

    def build_online_probe(self, num_classes: int, task: Literal["nominal", "ordinal"]) -> OnlineLinearProbe:
        """The online linear probe on the (normalised) target-encoder features."""
        return OnlineLinearProbe(self.feature_dim, num_classes, task)

    def param_groups(self) -> list[dict[str, Any]]:
        """Online network + ``tau``/``b`` with the base settings (as the seed); the probe in its own group."""
        probe_ids = {id(p) for p in self.probe.parameters()} if self.probe is not None else set()
        model = [p for p in self.parameters() if p.requires_grad and id(p) not in probe_ids]
        groups: list[dict[str, Any]] = [{"name": "model", "params": model}]
        if self.probe is not None:
            h = self.hparams
            groups.append(self.probe.param_group(lr=h.get("online_probe_lr") or h.lr))
        return groups

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
        return self.projector(self.backbone(x))

    @torch.no_grad()
    def target_outputs(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(target encoder features [B, feature_dim], target projection [B, projector_dim])`` without gradients."""
        features = self.target_encoder(x)
        return features, self.target_projector(features)

    def extract_features(self, x: torch.Tensor) -> torch.Tensor:
        """Evaluation features: the target encoder's ``[B, feature_dim]``, L2-normalised, float32."""
        return F.normalize(self.target_encoder(x).float(), dim=1)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """``{'features': normalised target-encoder features, 'projection': normalised target projection}``."""
        features = self.target_encoder(x)
        projection = self.target_projector(features)
        return {"features": F.normalize(features.float(), dim=1), "projection": F.normalize(projection.float(), dim=1)}

    # ---------------------------------------------------------------- target (EMA)
    def _online_modules(self) -> list[nn.Module]:
        return [self.backbone, self.projector]

    def _target_modules(self) -> list[nn.Module]:
        return [self.target_encoder, self.target_projector]

    def update_target(self, beta: float) -> None:
        """``target <- beta * target + (1 - beta) * online`` (parameters and floating-point buffers)."""
        ema_update_(self._online_modules(), self._target_modules(), beta)

    def copy_target(self) -> None:
        """Make the target an exact copy of the online network (parameters and buffers)."""
        copy_module_state_(self._online_modules(), self._target_modules())

    def _total_steps(self) -> int:
        if self._trainer is None:
            raise RuntimeError("the beta schedule needs the Trainer's step count; attach the module to a Trainer")
        return max(1, int(self.trainer.estimated_stepping_batches))

    def _step(self) -> int:
        """Index (0-based) of the optimiser step the current batch contributes to."""
        return int(self.trainer.global_step) if self._trainer is not None else 0

    def _steps_per_epoch(self) -> int:
        """Optimiser steps per training epoch (the seed's ``len(train_loader)``)."""
        self._total_steps()  # makes the Trainer set up the training data
        batches = float(self.trainer.num_training_batches)
        if not math.isfinite(batches):
            raise RuntimeError("beta_schedule='scl_train' needs a training loader with a length (steps per epoch)")
        return max(1, math.ceil(int(batches) / max(1, int(self.trainer.accumulate_grad_batches))))

    def beta_horizon(self) -> int:
        """Steps over which beta's cosine runs: the run's steps (``'relic'``), or the seed script's horizon (``'scl_train'``).

        ``'scl_train'``: ``steps_per_epoch * (epochs + 2) - update_beta_after_step``, computed as
        the run's optimiser steps plus two epochs (the same when ``max_epochs`` bounds the run).
        """
        total = self._total_steps()
        if self.hparams.get("beta_schedule", "relic") != "scl_train":
            return total
        per_epoch = self._steps_per_epoch()
        return max(1, total + 2 * per_epoch - int(self.hparams.update_beta_after_step))

    def beta_at(self, step: int) -> float:
        """EMA coefficient applied after optimiser step ``step`` when it is an EMA step.

        ``'relic'``: cosine from ``beta`` to 1 over the run (:func:`cosine_beta`);
        ``'scl_train'``: the seed script's lagged value (:func:`scl_train_beta`).
        """
        h = self.hparams
        if h.get("beta_schedule", "relic") == "scl_train":
            return scl_train_beta(
                step, self.beta_horizon(), float(h.beta), int(h.update_beta_after_step), int(h.update_beta_every_n_steps)
            )
        return cosine_beta(step, self._total_steps(), float(h.beta))

    def gamma_at(self, step: int) -> float:
        """Confidence-penalty exponent of step ``step`` (cosine decay if ``use_gamma_scaling``, else ``gamma``)."""
        h = self.hparams
        if h.get("use_gamma_scaling", False):
            return cosine_gamma(step, int(h.gamma_scaling_steps), float(h.gamma))
        return float(h.gamma)

    def effective_beta(self, step: int) -> float:
        """The coefficient applied after step ``step`` (logged as ``train/beta``).

        0 (a copy) up to ``update_beta_after_step``; 1 (target kept) on steps skipped by
        ``update_beta_every_n_steps``; else :meth:`beta_at`.
        """
        h = self.hparams
        if step <= int(h.update_beta_after_step):
            return 0.0
        if step % int(h.update_beta_every_n_steps) != 0:
            return 1.0
        return self.beta_at(step)

    def _target_after_step(self, step: int) -> None:
        h = self.hparams
        if step <= int(h.update_beta_after_step):
            self.copy_target()
        elif step % int(h.update_beta_every_n_steps) == 0:
            self.update_target(self.beta_at(step))

    # ---------------------------------------------------------------- loss
    def multicrop_loss(
        self, online: Sequence[torch.Tensor], target: Sequence[torch.Tensor], gamma: float, step: int = -1
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean ``(loss, invariance)`` over :meth:`view_pairs` of online ``[n, D]`` x ``num_views`` and target ``[n, D]`` x ``num_global_views``.

        The pair (``i``, ``j``) is ``criterion(x=online[j], x_prime=target[i])``; computed in
        float32 with autocast disabled.
        """
        if len(online) != self.num_views or len(target) != self.num_global_views:
            raise ValueError(
                f"multicrop_loss needs {self.num_views} online and {self.num_global_views} target projections, "
                f"got {len(online)} and {len(target)}"
            )
        pairs = self.view_pairs()
        device_type = online[0].device.type
        with torch.autocast(device_type=device_type, enabled=False):
            total = online[0].new_zeros((), dtype=torch.float32)
            invariance = online[0].new_zeros((), dtype=torch.float32)
            for i, j in pairs:
                loss, terms = self.criterion.compute(online[j].float(), target[i].float().detach(), gamma=gamma, global_step=step)
                total = total + loss
                if "invariance" in terms:
                    invariance = invariance + terms["invariance"]
        return total / len(pairs), invariance / len(pairs)

    def _probe_loss(self, features: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor | None, dict[str, torch.Tensor]]:
        """Probe CE on normalised target features (+ kNN bank update); ``(None, {})`` without a probe."""
        self._remember_for_knn(features, y)
        if self.probe is None:
            return None, {}
        return self.probe.training_step(features, y)

    # ---------------------------------------------------------------- kNN monitor
    @torch.no_grad()
    def _remember_for_knn(self, features: torch.Tensor, y: torch.Tensor) -> None:
        if int(self.hparams.get("knn_k", 0)) <= 0:
            return
        keep = y >= 0
        if not bool(keep.any()):
            return
        f, lab = features[keep].detach().float(), y[keep].detach()
        if self._knn_features is not None and self._knn_features.device == f.device:
            f = torch.cat([self._knn_features, f])
            lab = torch.cat([self._knn_labels, lab])  # type: ignore[list-item]
        size = int(self.hparams.get("knn_bank_size", 4096))
        self._knn_features, self._knn_labels = f[-size:], lab[-size:]

    def _knn_accuracy(self, features: torch.Tensor, y: torch.Tensor) -> torch.Tensor | None:
        k = int(self.hparams.get("knn_k", 0))
        keep = y >= 0
        if k <= 0 or self._knn_features is None or not bool(keep.any()):
            return None
        n_classes = self.probe.num_classes if self.probe is not None else None
        if n_classes is None:
            n_classes = int(max(int(self._knn_labels.max()), int(y[keep].max()))) + 1  # type: ignore[union-attr]
        with torch.autocast(device_type=features.device.type, enabled=False):  # float32 similarities and votes
            scores = knn_predict(
                self._knn_features, self._knn_labels, features[keep].float(), n_classes, k,  # type: ignore[arg-type]
                float(self.hparams.get("knn_temperature", 0.07)),
            )
        return (scores.argmax(dim=1) == y[keep].to(scores.device)).float().mean()

    # ---------------------------------------------------------------- lifecycle
    def setup(self, stage: str) -> None:
        """``init_from``; check the data module's views and batch size; build the probe from its classes/task."""
        super().setup(stage)
        dm = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        if stage == "fit" and dm is not None and hasattr(dm, "n_views"):
            views = getattr(dm, "train_views", None)
            if views is None:
                raise ValueError(f"{type(self).__name__} needs multi-crop batches; {self._views_fix()}")
            counts = (getattr(views, "num_global_views", None), getattr(views, "num_local_views", None))
            if dm.n_views != self.num_views or (None not in counts and counts != (self.num_global_views, self.num_local_views)):
                raise ValueError(
                    f"{type(self).__name__}(num_global_views={self.num_global_views}, num_local_views={self.num_local_views}) "
                    f"but the data module yields {dm.n_views} views ({type(views).__name__} {counts}); {self._views_fix()}"
                )
            self._check_mini_batch_config(dm)
        self._setup_probe(dm)

    def _check_mini_batch_config(self, dm: Any) -> None:
        mb = self.mini_batch_size
        bs = getattr(dm, "batch_size", None)
        if mb is None or not isinstance(bs, int):
            return
        if bs % mb != 0:
            raise ValueError(
                f"mini_batch_size={mb} does not divide data.batch_size={bs}; choose a divisor of the batch size "
                f"(e.g. {max(d for d in range(1, mb + 1) if bs % d == 0)})"
            )
        train_set = getattr(dm, "train_set", None)
        if not getattr(dm, "drop_last", True) and train_set is not None and self.trainer.world_size == 1:
            last = len(train_set) % bs
            if last and last % mb != 0:
                raise ValueError(
                    f"the last training batch holds {last} images, which mini_batch_size={mb} does not divide; "
                    "set data.drop_last: true (the seed drops the last batch too)"
                )

    def _setup_probe(self, dm: Any) -> None:
        if not self._probe_wanted():
            return
        n = self.hparams.get("num_classes")
        dm_classes = getattr(dm, "num_classes", None) if dm is not None else None
        if n is not None and dm_classes is not None and dm_classes != n:
            raise ValueError(
                f"model.num_classes={n} but {type(dm).__name__} has {dm_classes} classes; "
                f"set --model.init_args.num_classes {dm_classes} (or null to take the data module's)"
            )
        if self.probe is None:
            if n is None:
                if dm_classes is None:
                    raise ValueError(f"{type(self).__name__} cannot size its online probe: set model.num_classes, or online_probe: false")
                n = int(dm_classes)
            task = self.hparams.get("task", "auto")
            if task == "auto":
                task = getattr(dm, "task", "nominal") if dm is not None else "nominal"
            self.probe = self.build_online_probe(n, task)
            self.probe.to(self.device)
            # stored so that checkpoints rebuild the probe in __init__ (load_from_checkpoint)
            self.hparams["num_classes"] = n
            self.hparams["task"] = task

    def load_weights(self, path: str) -> dict[str, list[str]]:
        """``init_from``: load matching weights; if the checkpoint had no target, the target becomes a copy of the online network."""
        report = super().load_weights(path)
        if not any(k.startswith(("target_encoder.", "target_projector.")) for k in report["loaded"]):
            self.copy_target()
        return report

    def optimizer_step(self, epoch: int, batch_idx: int, optimizer: Any, optimizer_closure: Any = None) -> None:
        """The optimiser step, then the target's copy/EMA update for that step (automatic optimisation).

        Lightning calls this only when the optimiser steps (not on ``accumulate_grad_batches``
        batches without a step) and before any callback's ``on_train_batch_end``, so a
        checkpoint written at the end of the batch (``ModelCheckpoint(every_n_train_steps)``)
        already holds the updated target and a resume from it continues exactly.  With
        ``mini_batch_size`` (manual optimisation) the step method does the same.  An
        override must call ``super().optimizer_step(...)``.
        """
        super().optimizer_step(epoch, batch_idx, optimizer, optimizer_closure)
        self._target_after_step(self._pending_step)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(checkpoint)
        checkpoint[ENCODER_META_KEY] = encoder_metadata(self)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Forget the kNN bank: its features belong to the weights before the load."""
        super().on_load_checkpoint(checkpoint)
        self._knn_features = self._knn_labels = None

    # ---------------------------------------------------------------- steps
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        views, y = self.split_batch(batch, owner=type(self).__name__)
        if not isinstance(views, (list, tuple)):
            raise ValueError(f"{type(self).__name__} trains on multi-crop batches (a list of views per batch); {self._views_fix()}")
        views = list(views)
        bsz = int(y.shape[0])
        self.check_views(views, bsz)
        step = self._step()
        self._pending_step = step
        gamma = self.gamma_at(step)
        if self.mini_batch_size is not None:
            loss, invariance, probe_logs = self._manual_step(views, y, gamma, step)
            total = loss
        else:
            target, features = [], None
            for i in range(self.num_global_views):
                f, p = self.target_outputs(views[i])
                target.append(p)
                if i == 0:
                    features = F.normalize(f.float(), dim=1)
            online = [self.online_projection(v) for v in views]
            loss, invariance = self.multicrop_loss(online, target, gamma, step)
            probe_loss, probe_logs = self._probe_loss(features, y)  # type: ignore[arg-type]
            total = loss if probe_loss is None else loss + probe_loss
        self._log_train(loss, invariance, probe_logs, gamma, step, bsz)
        return total

    def _log_train(self, loss: torch.Tensor, invariance: torch.Tensor, probe_logs: dict[str, torch.Tensor], gamma: float, step: int, bsz: int) -> None:
        crit = self.criterion
        tau = getattr(crit, "tau", None)
        b = getattr(crit, "b", None)
        logs: dict[str, Any] = {"train/invariance": invariance.detach(), "train/gamma": gamma}
        if self._trainer is not None:
            logs["train/beta"] = self.effective_beta(step)
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
    def _check_mini_batch(self, bsz: int) -> int:
        mb = self.mini_batch_size or bsz
        if mb > bsz or bsz % mb != 0:
            raise ValueError(
                f"mini_batch_size={mb} does not divide the batch of {bsz} images; use a divisor of data.batch_size "
                "and data.drop_last: true (so that the last batch is full too)"
            )
        return bsz // mb

    def _backward(self, tensor: torch.Tensor, last: bool) -> None:
        """Backward of one mini-batch: ``manual_backward`` under a Trainer (DDP sync only on the last), else plain."""
        # backward outside autocast (training_step runs under the Trainer's autocast): custom autograd
        # Functions (the fused loss) would otherwise run their backward matmuls in half precision
        no_autocast = torch.autocast(device_type=tensor.device.type, enabled=False)
        if self._trainer is None:
            with no_autocast:
                tensor.backward()
            return
        strategy = self.trainer.strategy
        ctx: ContextManager[Any] = nullcontext()
        if not last and hasattr(strategy, "block_backward_sync"):
            ctx = strategy.block_backward_sync()
        with ctx, no_autocast:
            self.manual_backward(tensor)

    def _rng_state(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
        cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
        return torch.get_rng_state(), cuda

    def _set_rng_state(self, state: tuple[torch.Tensor, torch.Tensor | None], device: torch.device) -> None:
        torch.set_rng_state(state[0])
        if state[1] is not None:
            torch.cuda.set_rng_state(state[1], device)

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
        chunks = self._check_mini_batch(int(y.shape[0]))
        mb = int(y.shape[0]) // chunks
        slices = [slice(c * mb, (c + 1) * mb) for c in range(chunks)]
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
        features = F.normalize(torch.cat(first_features).float(), dim=1)
        probe_loss, probe_logs = self._probe_loss(features, y)

        if self.negatives == "full_batch":
            return (*self._gradient_cache(views, target, slices, gamma, step, probe_loss), probe_logs)

        loss_sum = features.new_zeros(())
        inv_sum = features.new_zeros(())
        for c, sl in enumerate(slices):
            online = [self.online_projection(view[sl]) for view in views]
            loss, inv = self.multicrop_loss(online, [target[i][c] for i in range(g)], gamma, step)
            part = loss / chunks
            last = c == chunks - 1
            if last and probe_loss is not None:
                part = part + probe_loss
            self._backward(part, last)
            loss_sum = loss_sum + loss.detach() / chunks
            inv_sum = inv_sum + inv.detach() / chunks
        return loss_sum, inv_sum, probe_logs

    def _gradient_cache(
        self,
        views: list[torch.Tensor],
        target: list[list[torch.Tensor]],
        slices: list[slice],
        gamma: float,
        step: int,
        probe_loss: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``negatives='full_batch'``: exact gradients of the whole-batch loss, one mini-batch graph at a time."""
        device = views[0].device
        online_buffers = [b for m in self._online_modules() for b in m.buffers()]
        saved_buffers = [b.clone() for b in online_buffers]
        rng_states = []
        outputs: list[list[torch.Tensor]] = [[] for _ in views]
        with torch.no_grad():  # pass 1: every chunk's online projections, no graph kept
            for sl in slices:
                rng_states.append(self._rng_state(device))
                for j, view in enumerate(views):
                    outputs[j].append(self.online_projection(view[sl]))
        if online_buffers:  # pass 2 repeats the forward: keep BatchNorm running statistics updated once
            torch._foreach_copy_(online_buffers, saved_buffers)
        leaves = [torch.cat(o).float().requires_grad_(True) for o in outputs]
        full_target = [torch.cat(t) for t in target]
        crit_params = [p for p in self.criterion.parameters() if p.requires_grad]
        with torch.enable_grad():
            loss, inv = self.multicrop_loss(leaves, full_target, gamma, step)
            with torch.autocast(device_type=device.type, enabled=False):  # see _backward
                grads = torch.autograd.grad(loss, leaves + crit_params)
        out_grads, crit_grads = grads[: len(leaves)], grads[len(leaves):]
        after_pass1 = self._rng_state(device)
        for c, sl in enumerate(slices):  # pass 2: re-forward each chunk with a graph; back-propagate its gradient slice
            self._set_rng_state(rng_states[c], device)
            surrogate = sum(
                (self.online_projection(view[sl]).float() * out_grads[j][sl]).sum() for j, view in enumerate(views)
            )
            last = c == len(slices) - 1
            if last:
                surrogate = surrogate + sum((p * gp).sum() for p, gp in zip(crit_params, crit_grads))
                if probe_loss is not None:
                    surrogate = surrogate + probe_loss
            self._backward(surrogate, last)  # type: ignore[arg-type]
        self._set_rng_state(after_pass1, device)
        return loss.detach(), inv.detach()

    def _manual_step(
        self, views: list[torch.Tensor], y: torch.Tensor, gamma: float, step: int
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        opt = self.optimizers()
        opt.zero_grad()  # type: ignore[union-attr]
        loss, invariance, probe_logs = self.accumulate_gradients(views, y, gamma, step)
        opt.step()  # type: ignore[union-attr]
        self._target_after_step(step)
        scheduler = self.lr_schedulers()
        if scheduler is not None:
            for s in scheduler if isinstance(scheduler, list) else [scheduler]:
                s.step()  # type: ignore[union-attr]
        return loss, invariance, probe_logs

    # ---------------------------------------------------------------- evaluation
    def _eval_step(self, batch: Any, stage: Literal["val", "test"]) -> None:
        x, y = self.split_batch(batch, owner=type(self).__name__)
        bsz = int(y.shape[0])
        if isinstance(x, (list, tuple)):  # multi-view evaluation data: also the ReLIC loss
            views = list(x)
            self.check_views(views, bsz)
            step = self._step()
            target = [self.target_outputs(views[i])[1] for i in range(self.num_global_views)]
            online = [self.online_projection(v) for v in views]
            loss, inv = self.multicrop_loss(online, target, self.gamma_at(step), step)
            self.log(f"{stage}/loss", loss, on_epoch=True, sync_dist=True, batch_size=bsz)
            self.log(f"{stage}/invariance", inv, on_epoch=True, sync_dist=True, batch_size=bsz)
            x = views[0]
        features = self.extract_features(x)
        if self.probe is not None:
            self.log_dict(self.probe.eval_step(features, y, stage), on_step=False, on_epoch=True, sync_dist=True, batch_size=bsz)
        knn = self._knn_accuracy(features, y) if stage == "val" else None
        if knn is not None:
            self.log(f"{stage}/knn/acc", knn, on_step=False, on_epoch=True, sync_dist=True, batch_size=int((y >= 0).sum()))
