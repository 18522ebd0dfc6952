"""An exponential-moving-average (EMA, "momentum") target network: pairs, update, beta schedule.

BYOL (Grill et al., NeurIPS 2020, arXiv:2006.07733) and ReLIC (Mitrovic et al., ICLR 2021,
arXiv:2010.07922) train an *online* network by gradients and keep a *target* copy that
follows it after every optimiser step::

    target <- beta * target + (1 - beta) * online

:class:`EMATarget` is that component: it builds the frozen target copies of online
modules (:meth:`EMATarget.add_pair`), updates them (:meth:`EMATarget.update`,
:meth:`EMATarget.copy_`) and owns the coefficient's schedule
(:meth:`EMATarget.effective_beta`).  The pairs are *referenced*, not owned: the method
registers the target modules as its own attributes, so their ``state_dict`` keys are the
method's (``target_encoder.*``) and checkpoints hold them.  A LightningModule gets all of this,
and the update after every optimiser step, from
:class:`~cloc_lightning.methods.momentum.MomentumModule`.

Schedules (``beta_schedule``):

* ``'relic'``: :func:`cosine_beta`, from ``beta`` at step 0 to exactly 1 at the run's last
  optimiser step (ReLIC / BYOL).
* ``'scl_train'``: the script of the "Sigmoid Contrastive Loss for Vision" seed project
  (``train.py``): a horizon two epochs longer than the run (:func:`scl_train_beta_horizon`)
  and a one-EMA-step lag (:func:`scl_train_beta`), so beta never reaches 1.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from typing import Literal

import torch
from torch import nn

from cloc_lightning.validation import check_choice, check_int

__all__ = [
    "BetaSchedule",
    "EMATarget",
    "cosine_beta",
    "scl_train_beta_horizon",
    "scl_train_beta",
    "ema_update_",
    "copy_module_state_",
]

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


# ---------------------------------------------------------------------- updates
def _state_pairs(online: Sequence[nn.Module], target: Sequence[nn.Module]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Matching (online, target) tensors: parameters, then buffers, of modules built as deep copies."""
    o_list: list[torch.Tensor] = []
    t_list: list[torch.Tensor] = []
    for o_mod, t_mod in zip(online, target, strict=True):
        o_state = list(o_mod.parameters()) + list(o_mod.buffers())
        t_state = list(t_mod.parameters()) + list(t_mod.buffers())
        if len(o_state) != len(t_state) or any(o.shape != t.shape for o, t in zip(o_state, t_state, strict=True)):
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
    for o, t in zip(o_list, t_list, strict=True):
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


# ---------------------------------------------------------------------- component
class EMATarget:
    """Target copies of online modules, their EMA update and the schedule of its coefficient.

    After optimiser step ``k`` (0-based; :meth:`is_copy_step`, :meth:`is_update_step`) the target is

    * a copy of the online modules while ``k <= update_beta_after_step``;
    * unchanged on steps ``k`` not divisible by ``update_beta_every_n_steps``;
    * else ``beta_k * target + (1 - beta_k) * online`` (:func:`ema_update_`: parameters and
      floating-point buffers such as BatchNorm running statistics; integer buffers copied),
      with ``beta_k`` from ``beta_schedule`` (see the module docstring).

    Args:
        beta: initial coefficient ``beta_0`` in ``[0, 1]``.
        beta_schedule: ``'relic'`` or ``'scl_train'``.
        update_beta_after_step: last step (0-based) after which the target is a copy.
        update_beta_every_n_steps: EMA update only after steps divisible by this.

    Example (inside a LightningModule)::

        self.ema = EMATarget(beta=0.99)
        self.target_encoder = self.ema.add_pair(self.backbone)    # a frozen deep copy, registered here

        # after optimiser step k of a run of `total` steps:
        if self.ema.is_copy_step(k):
            self.ema.copy_()
        elif self.ema.is_update_step(k):
            self.ema.update(self.ema.beta_at(k, horizon=total))
    """

    def __init__(
        self,
        beta: float = 0.99,
        beta_schedule: BetaSchedule = "relic",
        update_beta_after_step: int = 0,
        update_beta_every_n_steps: int = 1,
    ) -> None:
        if not 0.0 <= beta <= 1.0:
            raise ValueError(f"beta (the initial EMA coefficient) must lie in [0, 1], got {beta}")
        self.beta = float(beta)
        self.beta_schedule: BetaSchedule = check_choice("beta_schedule", beta_schedule, BetaSchedule)
        self.update_beta_after_step = check_int("update_beta_after_step", update_beta_after_step, 0)
        self.update_beta_every_n_steps = check_int("update_beta_every_n_steps", update_beta_every_n_steps, 1)
        self.online: list[nn.Module] = []
        self.target: list[nn.Module] = []

    # ------------------------------------------------------------------ pairs
    def add_pair(self, online: nn.Module) -> nn.Module:
        """A frozen deep copy of ``online`` (``requires_grad=False``), tracked as its target; register it on the owner."""
        target = copy.deepcopy(online)
        target.requires_grad_(False)
        self.online.append(online)
        self.target.append(target)
        return target

    @property
    def momentum_pairs(self) -> list[tuple[nn.Module, nn.Module]]:
        """``[(online, target), ...]`` in the order they were added."""
        return list(zip(self.online, self.target, strict=True))

    def update(self, beta: float) -> None:
        """``target <- beta * target + (1 - beta) * online`` for every pair (:func:`ema_update_`)."""
        ema_update_(self.online, self.target, beta)

    def copy_(self) -> None:
        """Make every target an exact copy of its online module (parameters and buffers)."""
        copy_module_state_(self.online, self.target)

    # ------------------------------------------------------------------ schedule
    def horizon(self, total_steps: int, steps_per_epoch: int | None = None) -> int:
        """Steps over which the cosine runs: ``total_steps`` (``'relic'``), or for ``'scl_train'`` the seed's
        ``total_steps + 2 * steps_per_epoch - update_beta_after_step`` (:func:`scl_train_beta_horizon`
        when ``max_epochs`` bounds the run)."""
        if self.beta_schedule != "scl_train":
            return total_steps
        if steps_per_epoch is None:
            raise ValueError("beta_schedule='scl_train' needs steps_per_epoch for its horizon")
        return max(1, total_steps + 2 * steps_per_epoch - self.update_beta_after_step)

    def beta_at(self, step: int, horizon: int) -> float:
        """The scheduled coefficient of EMA step ``step`` (:func:`cosine_beta` or :func:`scl_train_beta`)."""
        if self.beta_schedule == "scl_train":
            return scl_train_beta(step, horizon, self.beta, self.update_beta_after_step, self.update_beta_every_n_steps)
        return cosine_beta(step, horizon, self.beta)

    def is_copy_step(self, step: int) -> bool:
        """Whether the target becomes a copy after step ``step``."""
        return step <= self.update_beta_after_step

    def is_update_step(self, step: int) -> bool:
        """Whether step ``step`` is an EMA step (after the copies, divisible by ``update_beta_every_n_steps``)."""
        return not self.is_copy_step(step) and step % self.update_beta_every_n_steps == 0

    def effective_beta(self, step: int, beta_at: Callable[[int], float]) -> float:
        """The coefficient applied after step ``step``: 0 (a copy), 1 (kept: not an EMA step), else ``beta_at(step)``.

        ``beta_at`` is the schedule (e.g. ``lambda k: ema.beta_at(k, horizon)``), called only on
        EMA steps (it may need a Trainer).
        """
        if self.is_copy_step(step):
            return 0.0
        if not self.is_update_step(step):
            return 1.0
        return beta_at(step)

    def extra_repr(self) -> str:
        return (
            f"beta={self.beta}, beta_schedule={self.beta_schedule!r}, update_beta_after_step={self.update_beta_after_step}, "
            f"update_beta_every_n_steps={self.update_beta_every_n_steps}, pairs={len(self.online)}"
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.extra_repr()})"
