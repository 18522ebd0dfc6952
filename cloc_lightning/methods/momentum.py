"""The base of methods that train an online network against a momentum (EMA) copy of it: BYOL / ReLIC style.

:class:`MomentumModule` is :class:`~cloc_lightning.methods.pretrain.PretrainModule` plus the
Lightning glue around one :class:`~cloc_lightning.nn.ema.EMATarget` (the copies, their update and
the schedule of its coefficient ``beta``):

* **which modules get a momentum copy**: the online attributes named in
  :attr:`MomentumModule.momentum_targets` (default: ``backbone`` -> ``target_encoder``).
  :meth:`MomentumModule.add_momentum_targets`, called at the end of the subclass's ``__init__``,
  registers a frozen deep copy of each as the module's own attribute, so its ``state_dict`` keys
  (``target_encoder.*``) are in every checkpoint and ``--ckpt_path`` resumes the target.
* **the update after every optimiser step**: :meth:`MomentumModule.optimizer_step` (automatic
  optimisation) or :meth:`MomentumModule.manual_optimizer_step` (manual optimisation) moves the
  target right after the optimiser, before any callback's ``on_train_batch_end``: a checkpoint
  written at the end of a batch holds the target of that step, so a resume from it continues
  exactly.  Batches that only accumulate gradients (``accumulate_grad_batches``) leave it alone.
* **the momentum schedule** (hook :meth:`MomentumModule.beta_at`): the target is a copy of the
  online modules after the optimiser steps ``k <= update_beta_after_step``, an EMA with
  coefficient ``beta_at(k)`` after the steps divisible by ``update_beta_every_n_steps``, and kept
  after the others (:meth:`MomentumModule.effective_beta`, logged as ``train/beta``).
* ``init_from`` a checkpoint without a target: the target becomes a copy of the loaded online
  network.

A method subclasses it with only what differs (:class:`~cloc_lightning.methods.ReLICModule` is the
example in this package)::

    class MyBYOL(MomentumModule):
        momentum_targets = {"backbone": "target_encoder", "projector": "target_projector"}

        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.projector = MLPHead(self.feature_dim, 512, 128)
            self.predictor = MLPHead(128, 512, 128)
            self.add_momentum_targets()       # once the online modules exist

        def training_step(self, batch, batch_idx):
            (v1, v2), y = self.split_batch(batch, expect_views=True, owner=type(self).__name__)
            f1, f2 = self.backbone(v1), self.backbone(v2)
            with torch.no_grad():
                t1, t2 = (self.target_projector(self.target_encoder(v)) for v in (v1, v2))
            loss = byol_loss(self.predictor(self.projector(f1)), t2) + byol_loss(self.predictor(self.projector(f2)), t1)
            self.log("train/loss", loss)
            return self.add_online_eval_loss(loss, f1, y)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar, cast

from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from cloc_lightning.callbacks.checks import is_logging_step
from cloc_lightning.methods.pretrain import PretrainModule
from cloc_lightning.nn.ema import BetaSchedule, EMATarget

__all__ = ["MomentumModule"]

_T = TypeVar("_T")


class MomentumModule(PretrainModule):
    """A pre-training method whose networks have momentum (EMA) copies that follow them after every optimiser step.

    After optimiser step ``k`` (0-based) every target module named in :attr:`momentum_targets`
    becomes ``beta * target + (1 - beta) * online`` (parameters and floating-point buffers such as
    BatchNorm running statistics; integer buffers copied): a copy while ``k <=
    update_beta_after_step``, unchanged on steps not divisible by ``update_beta_every_n_steps``,
    else with ``beta = beta_at(k)``.  The update runs in :meth:`optimizer_step` (automatic
    optimisation) or :meth:`manual_optimizer_step`; see the module docstring for what a
    subclass writes.

    Hooks a subclass may override: :attr:`momentum_targets` (which modules get a copy; with
    :attr:`backbone_modules` when the encoder's copy is renamed), :meth:`beta_at` (the momentum
    schedule), :meth:`update_target` / :meth:`copy_target` (what an update does).

    Its own arguments are the :class:`~cloc_lightning.nn.ema.EMATarget`'s, handed to it by name.

    Args:
        beta: the initial momentum coefficient ``beta_0`` in ``[0, 1]`` (``1``: the target
            never moves, ``0``: it is a copy of the online network).
        beta_schedule: ``'relic'`` (default): cosine from ``beta`` at step 0 to exactly 1 at
            the run's last optimiser step (ReLIC / BYOL).  ``'scl_train'``: the schedule of the
            "Sigmoid Contrastive Loss for Vision" seed script (a horizon two epochs longer than
            the run and a one-EMA-step lag; see :mod:`cloc_lightning.nn.ema`).
        update_beta_after_step: the target is a copy of the online network after every
            optimiser step ``k <= update_beta_after_step`` (0-based); the EMA starts after.
        update_beta_every_n_steps: EMA update only after steps ``k`` divisible by this.
        **kwargs: the :class:`~cloc_lightning.methods.pretrain.PretrainModule` arguments (the online
            probe) and the :class:`~cloc_lightning.methods.base.BaseModule` ones (backbone, optimiser,
            schedule).
    """

    #: online attribute -> attribute of its momentum copy (:meth:`add_momentum_targets`; the copies' ``state_dict`` prefixes)
    momentum_targets: ClassVar[dict[str, str]] = {"backbone": "target_encoder"}
    #: ``compile_backbone`` / ``channels_last`` apply to the online encoder and its momentum copy
    backbone_modules: ClassVar[tuple[str, ...]] = ("backbone", "target_encoder")

    def __init__(
        self,
        beta: float = 0.99,
        beta_schedule: BetaSchedule = "relic",
        update_beta_after_step: int = 0,
        update_beta_every_n_steps: int = 1,
        **kwargs: Any,
    ) -> None:
        ema = EMATarget(  # checks its arguments before the networks are built
            beta=beta,
            beta_schedule=beta_schedule,
            update_beta_after_step=update_beta_after_step,
            update_beta_every_n_steps=update_beta_every_n_steps,
        )
        super().__init__(**kwargs)
        #: the EMA of the online modules: the pairs, their update and the schedule of ``beta``
        self.ema = ema
        self._pending_step = 0  # index of the optimiser step the current batch contributes to

    # ------------------------------------------------------------------ hooks
    def add_momentum_targets(self) -> None:
        """Register a frozen deep copy of every online module of :attr:`momentum_targets` (its momentum target).

        Call it once, at the end of ``__init__``, when the online modules exist: each target is
        set as the attribute :attr:`momentum_targets` names (``requires_grad=False``, never in the
        optimiser) and tracked by :attr:`ema`.
        """
        if self.ema.online:
            raise RuntimeError(f"{type(self).__name__}: add_momentum_targets() was already called; call it once, in __init__")
        for online_name, target_name in self.momentum_targets.items():
            online = getattr(self, online_name, None)
            if not isinstance(online, nn.Module):
                raise AttributeError(
                    f"{type(self).__name__}.momentum_targets names {online_name!r}, which is no module of it; build "
                    f"self.{online_name} before calling add_momentum_targets(), or change momentum_targets"
                )
            setattr(self, target_name, self.ema.add_pair(online))

    def beta_at(self, step: int) -> float:
        """The momentum coefficient applied after optimiser step ``step`` when it is an EMA step (the schedule).

        ``beta_schedule='relic'``: cosine from ``beta`` to 1 over the run
        (:func:`~cloc_lightning.nn.ema.cosine_beta`); ``'scl_train'``: the seed script's lagged value
        (:func:`~cloc_lightning.nn.ema.scl_train_beta`).  Override it for another schedule (a
        constant: ``return self.ema.beta``).
        """
        return self.ema.beta_at(step, self.beta_horizon())

    def update_target(self, beta: float) -> None:
        """``target <- beta * target + (1 - beta) * online`` (parameters and floating-point buffers)."""
        self.ema.update(beta)

    def copy_target(self) -> None:
        """Make the target an exact copy of the online network (parameters and buffers)."""
        self.ema.copy_()

    # ------------------------------------------------------------------ schedule
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
        return self.ema.horizon(total, self._steps_per_epoch() if self.ema.beta_schedule == "scl_train" else None)

    def effective_beta(self, step: int) -> float:
        """The coefficient applied after step ``step`` (logged as ``train/beta``).

        0 (a copy) up to ``update_beta_after_step``; 1 (target kept) on steps skipped by
        ``update_beta_every_n_steps``; else :meth:`beta_at`.
        """
        return self.ema.effective_beta(step, self.beta_at)

    def _target_after_step(self, step: int) -> None:
        """The target's copy or EMA update after optimiser step ``step`` (nothing on the skipped steps)."""
        if self.ema.is_copy_step(step):
            self.copy_target()
        elif self.ema.is_update_step(step):
            self.update_target(self.beta_at(step))

    # ---------------------------------------------------------------- lifecycle
    def setup(self, stage: str) -> None:
        """Refuse a subclass that never registered its targets; then ``init_from`` and the online probe (:class:`PretrainModule`)."""
        if not self.ema.online:
            raise RuntimeError(
                f"{type(self).__name__} has no momentum targets: call self.add_momentum_targets() at the end of its "
                f"__init__ (it copies {sorted(self.momentum_targets)})"
            )
        super().setup(stage)

    def load_weights(self, path: str) -> dict[str, list[str]]:
        """``init_from``: load matching weights; if the checkpoint had no target, the target becomes a copy of the online network."""
        report = super().load_weights(path)
        prefixes = tuple(f"{target}." for target in self.momentum_targets.values())
        if not any(k.startswith(prefixes) for k in report["loaded"]):
            self.copy_target()
        return report

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        """Note the optimiser step this batch contributes to (the step whose target update follows it)."""
        super().on_train_batch_start(batch, batch_idx)
        self._pending_step = self._step()

    def optimizer_step(self, epoch: int, batch_idx: int, optimizer: Any, optimizer_closure: Any = None) -> None:
        """The optimiser step, then the target's copy/EMA update for that step (automatic optimisation).

        Lightning calls this only when the optimiser steps (not on ``accumulate_grad_batches``
        batches without a step) and before any callback's ``on_train_batch_end``, so a
        checkpoint written at the end of the batch (``ModelCheckpoint(every_n_train_steps)``)
        already holds the updated target and a resume from it continues exactly.  Under manual
        optimisation, :meth:`manual_optimizer_step` does the same.  An override must call
        ``super().optimizer_step(...)``.
        """
        super().optimizer_step(epoch, batch_idx, optimizer, optimizer_closure)
        self._target_after_step(self._pending_step)

    def manual_optimizer_step(self, step: int, accumulate: Callable[[], _T]) -> _T:
        """One optimiser step under manual optimisation (``automatic_optimization = False``); returns ``accumulate()``.

        Zero the gradients, ``accumulate()`` them (the forward and backward passes, e.g. through
        ``manual_backward``), step the optimiser, update the target for optimiser step ``step``
        (as :meth:`optimizer_step` does under automatic optimisation), then step the per-step
        learning-rate schedulers, in the order of automatic optimisation.
        """
        opt = self.optimizers()
        opt.zero_grad()  # type: ignore[union-attr]
        out = accumulate()
        opt.step()  # type: ignore[union-attr]
        self._target_after_step(step)
        scheduler = self.lr_schedulers()
        if scheduler is not None:
            for s in scheduler if isinstance(scheduler, list) else [scheduler]:
                cast(LambdaLR, s).step()  # what configure_optimizers builds: per-step schedules
        return out

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        """Log ``train/beta`` (:meth:`effective_beta` of the batch's optimiser step) on the steps the loggers write."""
        super().on_train_batch_end(outputs, batch, batch_idx)
        if is_logging_step(self.trainer):  # a Python number: self.log copies it to the device, so only then
            self.log("train/beta", self.effective_beta(self._pending_step))
