"""The optimiser every method builds and its per-step learning-rate schedule.

What :meth:`BaseModule.configure_optimizers <cloc_lightning.methods.base.BaseModule.configure_optimizers>`
puts together, one function per piece:

* the **optimisers** by name (:data:`OPTIMIZERS`: ``--model.optimizer``) and the ``fused`` /
  ``foreach`` keyword arguments of ``optimizer_fused`` / ``optimizer_foreach``
  (:func:`optimizer_kwargs`), checked when the module is built (:func:`check_optimizer_settings`)
  and again on the optimiser built (:func:`check_built_optimizer`);
* :func:`match_param_layouts`, the optimiser's load-state-dict post-hook that lets a run resume
  the state of a run in another memory format (``channels_last`` or not);
* the **schedule**: :func:`lr_factor`, the multiplier of the base rate at a step (warm-up +
  cosine or step decay, per step or SupContrast's per epoch), and :func:`build_lr_scheduler`,
  the ``LambdaLR`` over it with the step counts of the Trainer.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import lightning as L
import torch

__all__ = [
    "OptimizerName",
    "SchedulerName",
    "LRInterval",
    "OPTIMIZERS",
    "accepts",
    "fused_devices",
    "check_optimizer_settings",
    "optimizer_kwargs",
    "check_built_optimizer",
    "match_param_layouts",
    "lr_factor",
    "has_lr_schedule",
    "build_lr_scheduler",
    "ScheduleLR",
]

OptimizerName = Literal["adam", "adamw", "sgd", "radam"]
SchedulerName = Literal["cosine", "step", "none"]
LRInterval = Literal["step", "epoch"]

#: ``--model.optimizer`` name -> optimiser class
OPTIMIZERS: dict[str, Callable[..., torch.optim.Optimizer]] = {
    "adam": torch.optim.Adam,
    "adamw": torch.optim.AdamW,
    "sgd": torch.optim.SGD,
    "radam": torch.optim.RAdam,
}


# ------------------------------------------------------------------ optimiser options
def accepts(optimizer_class: Callable[..., Any], argument: str) -> bool:
    """Whether ``optimizer_class(...)`` takes the keyword ``argument`` (or any keyword)."""
    try:
        params = inspect.signature(optimizer_class).parameters
    except (TypeError, ValueError):  # no signature to read: let the constructor decide
        return True
    return argument in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def fused_devices() -> list[str]:
    """Device types with fused optimiser kernels in this torch (torch's own list; ``cuda`` / ``cpu`` if it has none)."""
    import torch.optim.optimizer as torch_optimizer  # (not an attribute of torch.optim in every torch)

    devices = getattr(torch_optimizer, "_get_fused_kernels_supported_devices", None)
    return list(devices()) if callable(devices) else ["cuda", "cpu"]


def check_optimizer_settings(optimizer: str, optimizer_fused: Any, optimizer_foreach: Any) -> None:
    """Check ``optimizer_fused`` / ``optimizer_foreach`` for the ``optimizer`` named (messages name the fix)."""
    for name, value in (("optimizer_fused", optimizer_fused), ("optimizer_foreach", optimizer_foreach)):
        if value is not None and not isinstance(value, bool):
            raise TypeError(f"{name} must be true, false or null (torch's choice), got {value!r}")
    if optimizer_fused and optimizer_foreach:
        raise ValueError(
            "optimizer_fused and optimizer_foreach are both true, but torch runs one implementation per optimiser; "
            "keep one of them and set the other to null"
        )
    cls = OPTIMIZERS.get(optimizer)
    if optimizer_fused and cls is not None and not accepts(cls, "fused"):
        with_fused = [name for name, c in OPTIMIZERS.items() if accepts(c, "fused")]
        raise ValueError(
            f"optimizer_fused: true, but torch.optim.{getattr(cls, '__name__', cls)} (optimizer: {optimizer}) has no fused "
            f"implementation in torch {torch.__version__}; use optimizer_foreach: true instead, an optimizer with a "
            f"fused kernel ({', '.join(with_fused)}), or optimizer_fused: null"
        )


def optimizer_kwargs(optimizer_class: Callable[..., Any], fused: bool | None, foreach: bool | None) -> dict[str, Any]:
    """The ``fused`` / ``foreach`` keyword arguments for ``optimizer_class`` (what ``BaseModule.optimizer_options`` returns).

    Only the options that are set (not ``None``); ``fused: false`` is left out for an optimiser
    without a fused implementation (it is what such an optimiser does).  Raises a ``ValueError``
    naming the fix when ``optimizer_class`` does not take a requested option.
    """
    options: dict[str, Any] = {}
    for name, value in (("fused", fused), ("foreach", foreach)):
        if value is None:
            continue
        if not accepts(optimizer_class, name):
            if not value:
                continue
            raise ValueError(
                f"optimizer_{name}: true, but {getattr(optimizer_class, '__name__', optimizer_class)} takes no {name!r} "
                f"argument (torch {torch.__version__}); set optimizer_{name}: null"
                + (" (optimizer_foreach: true may work instead)" if name == "fused" else "")
            )
        options[name] = bool(value)
    return options


def check_built_optimizer(optimizer: torch.optim.Optimizer, options: Mapping[str, Any], owner: str) -> None:
    """Check that ``optimizer`` runs with the requested ``options`` (:func:`optimizer_kwargs`) on a device that has them.

    ``owner`` names the module whose ``build_optimizer`` built it (in messages).
    """
    for name, value in options.items():
        if optimizer.defaults.get(name) != value:
            raise ValueError(
                f"optimizer_{name}: {str(value).lower()}, but {owner}.build_optimizer built "
                f"{type(optimizer).__name__} with {name}={optimizer.defaults.get(name)!r}; pass "
                f"**self.optimizer_options({type(optimizer).__name__}) to the optimiser it builds, or set optimizer_{name}: null"
            )
    if options.get("fused"):
        supported = fused_devices()
        devices = sorted({p.device.type for g in optimizer.param_groups for p in g["params"]} - set(supported))
        if devices:
            raise ValueError(
                f"optimizer_fused: true, but torch {torch.__version__} has fused {type(optimizer).__name__} kernels for "
                f"{supported} only and the parameters are on {devices}; set optimizer_fused: null (or try "
                "optimizer_foreach: true)"
            )


def match_param_layouts(optimizer: torch.optim.Optimizer) -> None:
    """Give every optimiser state tensor shaped like its parameter the parameter's memory layout (strides).

    Registered as a load-state-dict post-hook: a state written by a run in another memory
    format (``channels_last`` vs contiguous) would otherwise be read element by element in
    the wrong order by fused kernels (torch 2.14's fused CPU Adam then steps silently wrong).
    Values are unchanged; a no-op when the layouts already match.
    """
    for param, state in optimizer.state.items():
        if not isinstance(param, torch.Tensor) or not isinstance(state, dict):
            continue
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and value.shape == param.shape and value.stride() != param.stride():
                state[key] = torch.empty_like(param, dtype=value.dtype, device=value.device).copy_(value)


# ------------------------------------------------------------------ schedule
def lr_factor(
    step: int,
    total_steps: int,
    steps_per_epoch: float,
    scheduler: SchedulerName,
    warmup_epochs: float = 0.0,
    min_lr_ratio: float = 0.0,
    milestones: Sequence[int] = (),
    gamma: float = 0.1,
    interval: LRInterval = "step",
    warmup_start: float | None = None,
    max_epochs: float | None = None,
) -> float:
    """Multiplier of the base learning rate at optimiser step ``step`` (0-based).

    ``interval="step"`` (default): linear warm-up over ``warmup_epochs`` (from
    ``1/warmup_steps`` to 1), then ``cosine`` decay over the remaining steps to
    ``min_lr_ratio`` at ``total_steps``, ``step`` decay by ``gamma`` at each epoch in
    ``milestones``, or constant (``none``).

    ``interval="epoch"``: the schedule changes once per epoch, as SupContrast's
    ``adjust_learning_rate`` (Khosla et al. 2020, github.com/HobbitLong/SupContrast,
    ``util.py``) with epochs counted from 1: in epoch ``e = k + 1`` (``k`` the 0-based
    epoch index) ``cosine`` gives ``m + (1 - m)(1 + cos(pi e / E)) / 2`` over all ``E =
    max_epochs`` epochs (warm-up included; ``m = min_lr_ratio``, so the last epoch runs at
    ``m``) and ``step`` gives ``gamma ** #{milestones < e}``.  Warm-up is per step and ends
    at the schedule's value at epoch ``warmup_epochs`` (SupContrast's ``warmup_to``).

    ``warmup_start``: ``None`` warms up from ``1/warmup_steps`` of the target; a number
    warms up linearly from that multiplier at step 0 (SupContrast's ``warmup_from`` /
    base lr), reaching the target after ``warmup_steps`` steps.
    """
    warmup = round(warmup_epochs * steps_per_epoch)
    spe = max(steps_per_epoch, 1e-12)
    if interval == "epoch":
        epochs = float(max_epochs) if max_epochs and max_epochs > 0 else max(1.0, total_steps / spe)

        def value_at(e: float) -> float:  # schedule value in (1-based) epoch e
            if scheduler == "cosine":
                return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * min(e, epochs) / epochs))
            if scheduler == "step":
                return gamma ** sum(1 for m in milestones if e > m)
            return 1.0

        if step < warmup:  # SupContrast's warmup_to: the cosine at the end of warm-up, else the base rate
            target = value_at(warmup_epochs) if scheduler == "cosine" else 1.0
        else:
            return value_at(math.floor(step / spe) + 1)
    else:
        target = 1.0
        if step >= warmup:
            if scheduler == "cosine":
                span = max(1, total_steps - warmup)
                progress = min(1.0, (step - warmup) / span)
                return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))
            if scheduler == "step":
                epoch = step / spe
                return gamma ** sum(1 for m in milestones if epoch >= m)
            return 1.0
    if warmup_start is None:
        return target * (step + 1) / warmup
    return warmup_start + (step / warmup) * (target - warmup_start)


def has_lr_schedule(hparams: Mapping[str, Any]) -> bool:
    """Whether the module's settings change the learning rate over the run (a scheduler or a warm-up)."""
    return not (hparams["scheduler"] == "none" and hparams["warmup_epochs"] == 0)


class ScheduleLR(torch.optim.lr_scheduler.LambdaLR):
    """The ``LambdaLR`` of :func:`build_lr_scheduler`: its factor follows the Trainer's step counts of *this* fit.

    A fit resumed with ``--ckpt_path`` restores the optimiser's learning rates as the
    checkpoint left them: the rate of the resumed step under the *old* total.  When the
    resumed fit has another total (a finished run extended with a larger
    ``--trainer.max_epochs``), :meth:`continue_at_resumed_step` (called by
    :class:`~cloc_lightning.resume.ResumeState` before the first resumed step) sets each
    group's rate to the schedule's value at the resumed step over the new total, so the
    schedule spans the whole extended run and continues from where it stands; with the same
    total it sets the values the checkpoint holds (an exact resume stays exact).
    """

    def continue_at_resumed_step(self) -> None:
        """Set each parameter group's rate to ``base_lr * factor(last_epoch)`` (this fit's schedule at the current step)."""
        groups = self.optimizer.param_groups
        if not (len(groups) == len(self.lr_lambdas) == len(self.base_lrs)):
            return  # groups changed since the schedule was built (e.g. a removed margin group): left as restored
        values = [base * fn(self.last_epoch) for fn, base in zip(self.lr_lambdas, self.base_lrs, strict=True)]
        for group, value in zip(groups, values, strict=True):
            group["lr"] = value
        self._last_lr = values


def build_lr_scheduler(
    optimizer: torch.optim.Optimizer, hparams: Mapping[str, Any], trainer: L.Trainer
) -> torch.optim.lr_scheduler.LambdaLR:
    """The per-optimiser-step ``LambdaLR`` of :func:`lr_factor` with the module's settings and ``trainer``'s step counts.

    ``hparams``: the module's ``scheduler``, ``warmup_epochs``, ``min_lr_ratio``,
    ``lr_milestones``, ``lr_gamma``, ``lr_interval``, ``warmup_from`` and ``lr``.  The steps
    per epoch are the training batches over ``accumulate_grad_batches`` (or, for an iterable
    of unknown length, the estimated stepping batches over ``max_epochs``).
    """
    h = hparams
    if not math.isfinite(trainer.estimated_stepping_batches) and h.get("scheduler") not in (None, "none"):
        raise ValueError(
            f"--model.scheduler {h.get('scheduler')}: the schedule needs the run's length, but --trainer.max_epochs -1 and "
            "--trainer.max_steps -1 set no end; give --trainer.max_epochs or --trainer.max_steps, or --model.scheduler none"
        )
    total = max(1, int(trainer.estimated_stepping_batches))
    n_batches = trainer.num_training_batches
    accumulate = max(1, trainer.accumulate_grad_batches)
    if math.isfinite(n_batches) and n_batches > 0:
        per_epoch = max(1.0, math.ceil(n_batches / accumulate))
    else:
        per_epoch = total / max(1, trainer.max_epochs or 1)
    milestones = list(h["lr_milestones"] or [])
    warmup_start = None if h["warmup_from"] is None else float(h["warmup_from"]) / float(h["lr"])
    max_epochs = trainer.max_epochs if (trainer.max_epochs or 0) > 0 else None
    warmup_epochs = float(h.get("warmup_epochs") or 0.0)
    if warmup_epochs > 0 and warmup_epochs * per_epoch >= total:
        from lightning.pytorch.utilities import rank_zero_warn

        rank_zero_warn(
            f"--model.warmup_epochs {warmup_epochs:g} lasts the whole run ({total} optimiser steps, "
            f"{total / per_epoch:g} epochs): the learning rate never reaches --model.lr; lower it or train longer"
        )

    def factor(step: int) -> float:
        return lr_factor(
            step,
            total,
            per_epoch,
            h["scheduler"],
            h["warmup_epochs"],
            h["min_lr_ratio"],
            milestones,
            h["lr_gamma"],
            interval=h["lr_interval"],
            warmup_start=warmup_start,
            max_epochs=max_epochs,
        )

    return ScheduleLR(optimizer, factor)
