"""Guards that stop (or flag) a run whose numbers are no result: NaN/inf losses, gradients and metrics, and a fit that trains nothing.

:class:`FiniteChecks` is added to every fit, validation and test by
:meth:`~cloc_lightning.methods.base.BaseModule.configure_callbacks` (unless one is configured):

* **training loss** (``on_before_backward``) and **gradients** (``on_before_optimizer_step``):
  a ``FloatingPointError`` naming the fixes when one is NaN/inf, while the module's
  ``check_finite_loss`` is true.  Sync-free: the flags are recorded on the device with
  :func:`cloc_lightning.checks.require` and read every ``log_every_n_steps`` by
  :class:`~cloc_lightning.callbacks.checks.DeviceChecks`; with the module's ``strict_checks``
  (or outside a :class:`~cloc_lightning.callbacks.checks.DeviceChecks` step) they are read at
  once, before the backward pass / the optimiser step, so the weights keep their last
  finite values.
* **the monitored validation metric** of a fit (``on_validation_end``) and **test metrics**
  (``on_test_end``): a warning on stderr (rank 0) naming the metric, the epoch and the fix
  when they are NaN/inf (a diverged model; :class:`~cloc_lightning.callbacks.BestCheckpoint`
  never keeps such an epoch as the best).

:func:`check_trains_something` refuses a fit that would train on nothing (called by
``BaseModule.setup('fit')``).
"""

from __future__ import annotations

import sys

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from cloc_lightning.checks import deferring, require

__all__ = [
    "FiniteChecks",
    "grads_finite",
    "nonfinite_loss_message",
    "nonfinite_grad_message",
    "nonfinite_monitor_message",
    "check_trains_something",
]


def grads_finite(grads: list[torch.Tensor]) -> torch.Tensor:
    """Bool scalar on the gradients' device: every gradient entry is finite (no host sync).

    One fused ``foreach`` 2-norm per tensor (NaN or inf in a tensor makes its norm non-finite;
    a finite tensor overflows only above a norm of ~1e19 in float32).  About 0.14x the time of
    the max-abs reduction it replaces.
    """
    by_device: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    for g in grads:
        by_device.setdefault((g.device, g.dtype), []).append(g.detach())
    flags = [torch.stack(torch._foreach_norm(group)).isfinite().all() for group in by_device.values()]
    return flags[0] if len(flags) == 1 else torch.stack([f.to(flags[0].device) for f in flags]).all()


def nonfinite_loss_message(owner: str) -> str:
    """The error of a NaN/inf training loss of module ``owner`` (the fixes, the switch that turns the check off)."""
    return (
        f"{owner}: the training loss is not finite (NaN/inf). Lower the learning rate (--model.lr), clip gradients "
        "(--trainer.gradient_clip_val 1.0), use bf16-mixed instead of 16-mixed, or check the data for NaN/inf. "
        "Resume from the last finite checkpoint with --ckpt_path; --model.check_finite_loss false turns this check off."
    )


def nonfinite_grad_message(owner: str) -> str:
    """The error of NaN/inf gradients after a finite loss of module ``owner``."""
    return (
        f"{owner}: non-finite gradients (NaN/inf) although the loss was finite. On CPU, half-precision strided "
        "convolutions with one-pixel-wide outputs are a known PyTorch fault (our backbones guard them; wrap a custom "
        "backbone with cloc_lightning.nn.backbones.use_half_safe_convs, or use --trainer.precision 32-true); otherwise lower the learning rate or clip gradients. --model.check_finite_loss false "
        "turns this check off; --model.strict_checks true names the tensors and stops before the optimiser step."
    )


def nonfinite_monitor_message(owner: str, name: str, value: float, epoch: int, others: bool) -> str:
    """The warning of a NaN/inf monitored metric ``name`` at ``epoch`` (``others``: a ModelCheckpoint you configured monitors it)."""
    note = (
        "the default best checkpoint (BestCheckpoint) skips it"
        if not others
        else "a ModelCheckpoint you configured ranks NaN as its worst value but may keep this epoch while it has no other"
    )
    return (
        f"warning: {owner}: the monitored metric {name} is {value} at epoch {epoch}: the model's validation outputs are "
        f"not finite (NaN/inf), the run diverged. This epoch is no improvement and no best checkpoint ({note}). Lower the "
        "learning rate (--model.lr) or clip gradients (--trainer.gradient_clip_val 1.0) and train again, or resume "
        "from a checkpoint written before the divergence (--ckpt_path)."
    )


def check_trains_something(trainer: L.Trainer, owner: str) -> None:
    """Refuse a fit that would train nothing (and then test and save the untrained model as its result)."""
    fix = (
        "; to evaluate a model without training, run `cloc-lightning validate` (or `test`) with --ckpt_path <a .ckpt> "
        "(Python: trainer.validate(model, datamodule, ckpt_path=...))"
    )
    settings = (
        ("max_epochs", trainer.max_epochs, "0 epochs", "set --trainer.max_epochs to 1 or more"),
        ("max_steps", trainer.max_steps, "0 optimiser steps", "set --trainer.max_steps to 1 or more (or -1: no limit)"),
        (
            "limit_train_batches",
            trainer.limit_train_batches,
            "0 batches per epoch",
            "set --trainer.limit_train_batches to a positive number of batches or fraction (or remove it)",
        ),
    )
    for name, value, what, how in settings:
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value == 0:
            raise ValueError(
                f"{owner}: trainer.{name}={value}: fit would train on {what} and then test and checkpoint the untrained "
                f"model as if it were a result; {how}{fix}"
            )


def _check_finite_loss(pl_module: L.LightningModule) -> bool:
    """The module's ``check_finite_loss`` setting (on for a module without one)."""
    return bool(getattr(pl_module, "hparams", {}).get("check_finite_loss", True))


class FiniteChecks(Callback):
    """Stop a fit at a NaN/inf training loss or gradient; warn when validation or test metrics are NaN/inf.

    See the module docstring.  The loss and gradient checks follow the module's
    ``check_finite_loss`` (``--model.check_finite_loss false`` turns both off).
    """

    def on_before_backward(self, trainer: L.Trainer, pl_module: L.LightningModule, loss: torch.Tensor) -> None:
        """Stop with an error naming the fixes when the training loss is NaN/inf.

        By default the flag is recorded on the device (no host sync) and read every
        ``log_every_n_steps`` (:class:`~cloc_lightning.callbacks.checks.DeviceChecks`); with
        ``strict_checks`` it is read now, before the backward pass, so the weights keep their
        last finite values.  Under DDP the strict flag is summed over ranks (and the deferred
        read is all-reduced), so every rank raises and none hangs.
        """
        if not _check_finite_loss(pl_module):
            return
        from cloc_lightning import distributed as dist_utils

        owner = type(pl_module).__name__
        finite = torch.isfinite(loss.detach()).all()
        if deferring():
            require(finite, nonfinite_loss_message(owner), FloatingPointError)
            return
        bad = (~finite).to(torch.float32).reshape(1)
        if dist_utils.is_distributed():
            bad = dist_utils.all_reduce_sum(bad)
        if bool(bad.item()):
            raise FloatingPointError(
                nonfinite_loss_message(owner)
                + f" Loss {float(loss.detach().float().sum())} at step {pl_module.global_step} (epoch {pl_module.current_epoch}); "
                "stopped before the weights were updated."
            )

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: torch.optim.Optimizer) -> None:
        """Stop when a gradient is NaN/inf although the loss was finite.

        One fused norm over the gradients (:func:`grads_finite`), recorded on the device by
        default and read every ``log_every_n_steps``; with ``strict_checks`` read now, before
        the optimiser step (weights unchanged).  Under DDP the gradients are already averaged,
        so every rank raises.  Skipped under fp16's ``GradScaler``, which skips such steps itself.
        """
        if not _check_finite_loss(pl_module):
            return
        if getattr(trainer.precision_plugin, "scaler", None) is not None:
            return
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        if not grads:
            return
        owner = type(pl_module).__name__
        finite = grads_finite(grads)
        if deferring():
            require(finite, nonfinite_grad_message(owner), FloatingPointError)
            return
        if bool(finite):
            return
        bad = [n for n, p in pl_module.named_parameters() if p.grad is not None and not bool(torch.isfinite(p.grad).all())]
        raise FloatingPointError(
            nonfinite_grad_message(owner)
            + f" Non-finite in {len(bad)} tensor(s) {bad[:4]} at step {pl_module.global_step}; stopped before the optimiser "
            "step (weights unchanged)."
        )

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Say loudly when the monitored metric of a fit's validation epoch is NaN/inf (a diverged model).

        The metrics of :mod:`cloc_lightning.metrics` are NaN when any output row is NaN/inf, and
        :class:`~cloc_lightning.callbacks.BestCheckpoint` never keeps such an epoch as the best;
        this names the metric (the module's ``monitor``), the epoch and the fix (on stderr,
        rank 0).  One host read of the synced value per validation epoch.
        """
        if trainer.sanity_checking or trainer.state.fn != "fit":
            return
        monitor = getattr(pl_module, "monitor", None)
        value = trainer.callback_metrics.get(monitor) if isinstance(monitor, str) else None
        if not isinstance(value, torch.Tensor) or bool(torch.isfinite(value).all()):
            return
        from cloc_lightning.callbacks.checkpoint import BestCheckpoint, print_line

        others = any(
            isinstance(cb, ModelCheckpoint) and not isinstance(cb, BestCheckpoint) and cb.monitor == monitor
            for cb in trainer.checkpoint_callbacks
        )
        message = nonfinite_monitor_message(type(pl_module).__name__, str(monitor), float(value), int(pl_module.current_epoch), others)
        print_line(trainer, message, file=sys.stderr)

    def on_test_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Say loudly when test metrics are NaN/inf: the tested weights give non-finite outputs, the numbers are no result."""
        bad = sorted(
            k
            for k, v in trainer.callback_metrics.items()
            if k.startswith("test/") and isinstance(v, torch.Tensor) and not bool(torch.isfinite(v).all())
        )
        if not bad:
            return
        from cloc_lightning.callbacks.checkpoint import print_line

        weights = f"the weights of {trainer.ckpt_path}" if trainer.ckpt_path else "the final weights of the fit"
        print_line(
            trainer,
            f"warning: {type(pl_module).__name__}: the test metrics {bad[:6]} are NaN/inf: {weights} give non-finite outputs "
            "(the run diverged), so these numbers are no result. Lower the learning rate (--model.lr) or clip gradients "
            "(--trainer.gradient_clip_val 1.0) and train again.",
            file=sys.stderr,
        )
