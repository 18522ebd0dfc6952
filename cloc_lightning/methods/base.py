"""The thin base every method builds on.

:class:`BaseModule` owns what all methods share and nothing else:

* the **backbone** (a timm model by name; hook :meth:`BaseModule.build_backbone`, prepared
  by :meth:`BaseModule.prepare_build`);
* the **optimiser** and its per-step **schedule** (warm-up + cosine or step decay;
  hooks :meth:`BaseModule.param_groups` and :meth:`BaseModule.build_optimizer`);
* the **checkpoint** of the best validation metric (``monitor`` / ``monitor_mode``) and what
  a checkpoint records about the module and its encoder (:mod:`cloc_lightning.checkpoints`).

:class:`ClassifierModule` adds a linear classification head, ordinal or nominal
**metrics** (hook :meth:`ClassifierModule.build_metrics`) and the validation,
test and predict steps used by every module that outputs class scores.

Pre-training methods build on :class:`~cloc_lightning.methods.pretrain.PretrainModule`
(this base plus the online linear probe / kNN evaluation).

Every constructor takes explicit, typed arguments (LightningCLI builds ``--help``
and validates YAML from them); subclasses forward the shared ones with
``**kwargs``.  Build order: ``BaseModule.__init__`` checks its arguments, saves the
hyper-parameters of the whole constructor chain, calls :meth:`BaseModule.prepare_build`
(a subclass reads its own ``self.hparams`` there and sets plain attributes) and then
:meth:`BaseModule.build_backbone`; a subclass builds its other parts after
``super().__init__`` returns.  Subclassing a method in your own project::

    class MyCLOC(CLOCModule):
        def build_backbone(self):
            net = MyNet()
            return net, net.out_dim          # (module, feature dimension)

        def build_optimizer(self, groups):  # optimizer_options: the optimizer_fused / _foreach settings
            return torch.optim.AdamW(groups, lr=self.hparams.lr, **self.optimizer_options(torch.optim.AdamW))
"""

from __future__ import annotations

import inspect
import math
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Literal, cast

import lightning as L
import torch
import torch.nn.functional as F
from lightning.fabric.utilities.data import AttributeDict
from lightning.pytorch.callbacks import Callback, LearningRateMonitor, ModelCheckpoint
from torch import nn
from torchmetrics import MeanMetric, MetricCollection

from cloc_lightning.checkpoints import (
    DEFAULT_ENCODER_PREFIX,
    ENCODER_META_KEY,
    MODULE_META_KEY,
    check_checkpoint,
    encoder_metadata,
    module_record,
    read_checkpoint,
)
from cloc_lightning.checks import deferring, require
from cloc_lightning.data_contract import DataInfo, datamodule_info
from cloc_lightning.metrics import build_metrics
from cloc_lightning.nn.backbones import BackboneInit, create_backbone
from cloc_lightning.precision import check_precision
from cloc_lightning.validation import check_choice, check_float

__all__ = ["BaseModule", "ClassifierModule", "LRInterval", "OptimizerName", "SchedulerName", "Task", "lr_factor"]

OptimizerName = Literal["adam", "adamw", "sgd", "radam"]
SchedulerName = Literal["cosine", "step", "none"]
LRInterval = Literal["step", "epoch"]
#: a classifier's metrics: ``ordinal``, ``nominal`` or ``auto`` (the data module's ``task``)
Task = Literal["auto", "ordinal", "nominal"]

_OPTIMIZERS: dict[str, Callable[..., torch.optim.Optimizer]] = {
    "adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "sgd": torch.optim.SGD, "radam": torch.optim.RAdam,
}
#: the ``torch.compile`` arguments that ``compile_backbone`` may set (all but the model)
_COMPILE_ARGS = tuple(name for name in inspect.signature(torch.compile).parameters if name != "model")


def _accepts(optimizer_class: Callable[..., Any], argument: str) -> bool:
    """Whether ``optimizer_class(...)`` takes the keyword ``argument`` (or any keyword)."""
    try:
        params = inspect.signature(optimizer_class).parameters
    except (TypeError, ValueError):  # no signature to read: let the constructor decide
        return True
    return argument in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def _fused_devices() -> list[str]:
    """Device types with fused optimiser kernels in this torch (torch's own list; ``cuda`` / ``cpu`` if it has none)."""
    import torch.optim.optimizer as torch_optimizer  # (not an attribute of torch.optim in every torch)

    devices = getattr(torch_optimizer, "_get_fused_kernels_supported_devices", None)
    return list(devices()) if callable(devices) else ["cuda", "cpu"]


def _check_speed_options(
    compile_backbone: Any, channels_last: Any, optimizer: str, optimizer_fused: Any, optimizer_foreach: Any
) -> None:
    """Check ``compile_backbone`` / ``channels_last`` / ``optimizer_fused`` / ``optimizer_foreach`` (messages name the fix)."""
    if not isinstance(compile_backbone, (bool, dict)):
        raise TypeError(
            f"compile_backbone must be true, false or a dict of torch.compile arguments (e.g. {{mode: max-autotune}}), "
            f"got {compile_backbone!r}"
        )
    if isinstance(compile_backbone, dict):
        unknown = sorted(set(compile_backbone) - set(_COMPILE_ARGS))
        if unknown:
            raise ValueError(f"compile_backbone: {unknown} are no torch.compile arguments; it takes {list(_COMPILE_ARGS)}")
        if compile_backbone.get("mode") is not None and compile_backbone.get("options") is not None:
            raise ValueError("compile_backbone: torch.compile takes mode or options, not both; remove one of them")
    if not isinstance(channels_last, bool):
        raise TypeError(f"channels_last must be true or false, got {channels_last!r}")
    for name, value in (("optimizer_fused", optimizer_fused), ("optimizer_foreach", optimizer_foreach)):
        if value is not None and not isinstance(value, bool):
            raise TypeError(f"{name} must be true, false or null (torch's choice), got {value!r}")
    if optimizer_fused and optimizer_foreach:
        raise ValueError(
            "optimizer_fused and optimizer_foreach are both true, but torch runs one implementation per optimiser; "
            "keep one of them and set the other to null"
        )
    cls = _OPTIMIZERS.get(optimizer)
    if optimizer_fused and cls is not None and not _accepts(cls, "fused"):
        with_fused = [name for name, c in _OPTIMIZERS.items() if _accepts(c, "fused")]
        raise ValueError(
            f"optimizer_fused: true, but torch.optim.{getattr(cls, '__name__', cls)} (optimizer: {optimizer}) has no fused "
            f"implementation in torch {torch.__version__}; use optimizer_foreach: true instead, an optimizer with a "
            f"fused kernel ({', '.join(with_fused)}), or optimizer_fused: null"
        )


def _channels_last_inputs(module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
    """Forward pre-hook of ``channels_last``: every 4-D tensor argument in ``torch.channels_last`` (others unchanged)."""
    return tuple(
        a.contiguous(memory_format=torch.channels_last) if isinstance(a, torch.Tensor) and a.dim() == 4 else a for a in args
    )


def _to_channels_last(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous(memory_format=torch.channels_last) if t.dim() == 4 else t


def _match_param_layouts(optimizer: torch.optim.Optimizer) -> None:
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


def _grads_finite(grads: list[torch.Tensor]) -> torch.Tensor:
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


def _nonfinite_loss_message(owner: str) -> str:
    return (
        f"{owner}: the training loss is not finite (NaN/inf). Lower the learning rate (--model.lr), clip gradients "
        "(--trainer.gradient_clip_val 1.0), use bf16-mixed instead of 16-mixed, or check the data for NaN/inf. "
        "Resume from the last finite checkpoint with --ckpt_path; --model.check_finite_loss false turns this check off."
    )


def _nonfinite_grad_message(owner: str) -> str:
    return (
        f"{owner}: non-finite gradients (NaN/inf) although the loss was finite. On CPU, half-precision strided "
        "convolutions with one-pixel-wide outputs are a known PyTorch fault (our backbones guard them; wrap a custom "
        "backbone with cloc_lightning.nn.backbones.use_half_safe_convs, or use --trainer.precision 32-true); otherwise lower the learning rate or clip gradients. --model.check_finite_loss false "
        "turns this check off; --model.strict_checks true names the tensors and stops before the optimiser step."
    )


def _check_trains_something(trainer: L.Trainer, owner: str) -> None:
    """Refuse a fit that would train nothing (and then test and save the untrained model as its result)."""
    fix = (
        "; to evaluate a model without training, run `cloc-lightning validate` (or `test`) with --ckpt_path <a .ckpt> "
        "(Python: trainer.validate(model, datamodule, ckpt_path=...))"
    )
    settings = (
        ("max_epochs", trainer.max_epochs, "0 epochs", "set --trainer.max_epochs to 1 or more"),
        ("max_steps", trainer.max_steps, "0 optimiser steps", "set --trainer.max_steps to 1 or more (or -1: no limit)"),
        ("limit_train_batches", trainer.limit_train_batches, "0 batches per epoch",
         "set --trainer.limit_train_batches to a positive number of batches or fraction (or remove it)"),
    )
    for name, value, what, how in settings:
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value == 0:
            raise ValueError(
                f"{owner}: trainer.{name}={value}: fit would train on {what} and then test and checkpoint the untrained "
                f"model as if it were a result; {how}{fix}"
            )


def _nonfinite_monitor_message(owner: str, name: str, value: float, epoch: int, others: bool) -> str:
    note = (
        "the default best checkpoint (BestCheckpoint) skips it" if not others
        else "a ModelCheckpoint you configured ranks NaN as its worst value but may keep this epoch while it has no other"
    )
    return (
        f"warning: {owner}: the monitored metric {name} is {value} at epoch {epoch}: the model's validation outputs are "
        f"not finite (NaN/inf), the run diverged. This epoch is no improvement and no best checkpoint ({note}). Lower the "
        "learning rate (--model.lr) or clip gradients (--trainer.gradient_clip_val 1.0) and train again, or resume "
        "from a checkpoint written before the divergence (--ckpt_path)."
    )


def _is_default_checkpoint(cb: Callback) -> bool:
    """Whether ``cb`` is Lightning's own ``ModelCheckpoint()`` (added when no checkpoint callback is configured)."""
    if type(cb) is not ModelCheckpoint:
        return False
    default = ModelCheckpoint()
    return (
        cb.state_key == default.state_key
        and cb.dirpath is None
        and cb.filename is None
        and cb.save_last is None
        and cb.save_top_k == default.save_top_k
        and cb.save_weights_only == default.save_weights_only
    )


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


class BaseModule(L.LightningModule):
    """Backbone + optimiser/scheduler + best-checkpoint plumbing shared by all methods.

    Args:
        backbone: timm model name (``resnet18``, ``resnet50``, ``convnext_tiny``, ...).
        pretrained: ``False``, ``True`` (timm weights from the hub) or a local weights path.
        cifar_stem: 3x3/1 stem without max-pool for 32 px images (ResNet family).
        backbone_kwargs: extra ``timm.create_model`` arguments (e.g. ``drop_path_rate``).
        optimizer: ``adam`` | ``adamw`` | ``sgd`` | ``radam``.
        lr: base learning rate (per-group rates may differ; see :meth:`param_groups`).
        weight_decay: weight decay of the default group.
        momentum: SGD momentum (and Adam's beta1 is untouched).
        nesterov: Nesterov momentum for SGD.
        scheduler: ``cosine`` | ``step`` | ``none``; stepped every optimiser step.
        warmup_epochs: linear warm-up length (fractions allowed).
        min_lr_ratio: final cosine learning rate as a fraction of the base rate.
        lr_interval: ``step`` (default: the cosine runs per step over the steps after
            warm-up) or ``epoch`` (SupContrast's schedule: one value per epoch, the cosine
            over all epochs with epochs counted from 1, warm-up ending at the cosine's value;
            see :func:`lr_factor`).
        warmup_from: absolute learning rate of the first warm-up step (SupContrast's
            ``warmup_from``, 0.01 there); ``None`` starts at ``lr / warmup_steps``.  Other
            parameter groups scale by the same factor.
        lr_milestones: epochs at which ``step`` multiplies the rate by ``lr_gamma``.
        lr_gamma: decay factor of the ``step`` schedule.
        backbone_init: ``timm`` (default: timm's initialisation, which zero-initialises the
            last BatchNorm of each residual block; a ``cifar_stem`` convolution keeps PyTorch's
            default) or ``kaiming`` (SupContrast's ResNet: every convolution kaiming-normal
            with ``fan_out``, norm layers weight 1 / bias 0, no zero-init); see
            :func:`~cloc_lightning.nn.backbones.init_backbone`.  Random-init backbones only.
        init_from: a checkpoint (ours or a plain ``state_dict`` file) whose matching
            weights initialise this module before training (weights only: no
            optimiser state, epoch or hyper-parameters; ``--ckpt_path`` resumes instead).
        check_finite_loss: raise a ``FloatingPointError`` naming the fixes when a training
            loss or a gradient is NaN/inf (see :meth:`on_before_backward` and
            :meth:`on_before_optimizer_step`).
        strict_checks: read every value check of the training step (finite loss and
            gradients, label ranges, finite features) at once, stopping at the failing step
            before the optimiser changes the weights; costs host-device syncs every step (a
            debugging mode).  The default records the checks on the device and reads them
            every ``log_every_n_steps``, at epoch end and before every checkpoint
            (:class:`~cloc_lightning.callbacks.checks.DeviceChecks`): the same checks, no stall
            of the GPU, reported at most ``log_every_n_steps`` batches late.
        compile_backbone: ``torch.compile`` the image encoders (:attr:`backbone_modules`: the
            backbone, and ReLIC's EMA target encoder) when a Trainer run starts
            (:meth:`configure_model`): ``false`` (default), ``true`` (torch's defaults) or a dict
            of ``torch.compile`` arguments (``{mode: max-autotune}``, ``{dynamic: false}``).  In
            place (``nn.Module.compile``): the module tree and ``state_dict`` keys stay plain, so
            checkpoints save, load, resume and probe the same compiled or not.  The first step,
            and each new input shape or train/eval switch, waits for a compilation.
        channels_last: keep the image encoders' 4-D weights and their 4-D inputs (every view)
            in ``torch.channels_last`` (NHWC) memory format, which convolutions under mixed
            precision on recent GPUs may run faster in.  The same numbers up to rounding;
            checkpoints are interchangeable with contiguous runs.
        optimizer_fused: the optimiser's ``fused`` argument (one kernel per step; Adam, AdamW
            and SGD have one, RAdam does not); ``null`` (default) leaves torch's choice.
        optimizer_foreach: the optimiser's ``foreach`` argument (multi-tensor operations; all
            four optimisers); ``null`` (default) leaves torch's choice (foreach on CUDA).
            Neither option changes the result beyond rounding.  The four speed options are off
            by default until a GPU measurement shows they help (docs: *Speed options*).  A
            subclass whose :meth:`build_optimizer` builds its own optimiser passes
            ``**self.optimizer_options(its class)`` to it (checked when the optimiser is built).
    """

    #: constructor arguments not stored in ``hparams`` (non-serialisable objects)
    hparams_ignore: ClassVar[tuple[str, ...]] = ()
    #: state_dict key prefixes that ``init_from`` never loads
    init_from_exclude: ClassVar[tuple[str, ...]] = ()
    #: attributes holding image encoders (``[B, 3, H, W] -> features``) that ``compile_backbone`` and ``channels_last`` apply to
    backbone_modules: ClassVar[tuple[str, ...]] = ("backbone",)

    def __init__(
        self,
        backbone: str = "resnet18",
        pretrained: bool | str = False,
        cifar_stem: bool = False,
        backbone_kwargs: dict[str, Any] | None = None,
        optimizer: OptimizerName = "adam",
        lr: float = 1e-3,
        weight_decay: float = 0.0,
        momentum: float = 0.9,
        nesterov: bool = False,
        scheduler: SchedulerName = "cosine",
        warmup_epochs: float = 0.0,
        min_lr_ratio: float = 0.0,
        lr_milestones: list[int] | None = None,
        lr_gamma: float = 0.1,
        lr_interval: LRInterval = "step",
        warmup_from: float | None = None,
        backbone_init: BackboneInit = "timm",
        init_from: str | None = None,
        check_finite_loss: bool = True,
        strict_checks: bool = False,
        compile_backbone: bool | dict[str, Any] = False,
        channels_last: bool = False,
        optimizer_fused: bool | None = None,
        optimizer_foreach: bool | None = None,
    ) -> None:
        super().__init__()
        check_float("lr", lr, minimum=0.0, strict_minimum=True)
        check_float("weight_decay", weight_decay, minimum=0.0)
        check_choice("optimizer", optimizer, OptimizerName)
        check_choice("scheduler", scheduler, SchedulerName)
        check_choice("lr_interval", lr_interval, LRInterval)
        check_choice("backbone_init", backbone_init, BackboneInit)
        if warmup_from is not None and (warmup_from < 0 or warmup_epochs <= 0):
            raise ValueError(
                f"warmup_from={warmup_from} needs warmup_epochs > 0 (got {warmup_epochs}) and a value >= 0: it is the "
                "learning rate of the first warm-up step. Set warmup_epochs (SupContrast: 10), or warmup_from: null."
            )
        _check_speed_options(compile_backbone, channels_last, optimizer, optimizer_fused, optimizer_foreach)
        self.save_hyperparameters(ignore=list(self.hparams_ignore))
        self._initialised_from: str | None = None
        self._speed_applied: dict[str, int] = {}  # backbone_modules done by configure_model: name -> id(module)
        self.eval_means = nn.ModuleDict()  # the MeanMetrics of log_eval_mean, made on first use
        self.prepare_build()
        self.backbone, self.feature_dim = self.build_backbone()

    @property
    def hparams(self) -> AttributeDict:
        """The saved arguments of every constructor in the chain, read as attributes (``self.hparams.lr``)."""
        return cast(AttributeDict, super().hparams)

    # ------------------------------------------------------------------ hooks
    def prepare_build(self) -> None:
        """Set up what :meth:`build_backbone` needs; called by ``BaseModule.__init__`` before it.

        Runs after ``save_hyperparameters()`` (``self.hparams`` holds the arguments of every
        constructor in the chain, a subclass's own included) and after ``nn.Module``'s
        initialisation, so a subclass can read its arguments from ``self.hparams`` and set
        plain attributes here, although its own ``__init__`` has not yet returned from
        ``super().__init__``.  The default does nothing.
        """

    def build_backbone(self) -> tuple[nn.Module, int]:
        """Return ``(encoder, feature_dim)``; ``encoder(x)`` maps ``[B, 3, H, W]`` to ``[B, feature_dim]``."""
        h = self.hparams
        return create_backbone(h.backbone, h.pretrained, h.cifar_stem, init=h.backbone_init, **(h.backbone_kwargs or {}))

    @property
    def datamodule_info(self) -> DataInfo | None:
        """The attached data module's fields (:mod:`cloc_lightning.data_contract`); ``None`` without one (plain dataloaders)."""
        return datamodule_info(self._trainer, owner=type(self).__name__)

    @property
    def monitor(self) -> str:
        """Metric the default checkpoint callback monitors (``val/loss``; overridden by subclasses)."""
        return "val/loss"

    @property
    def monitor_mode(self) -> Literal["min", "max"]:
        """Whether :attr:`monitor` is better lower (``min``) or higher (``max``)."""
        return "min"

    def log_eval_mean(self, name: str, value: torch.Tensor, weight: int | torch.Tensor) -> None:
        """Log ``value`` (a batch mean over ``weight`` rows) as the epoch's weighted mean, exact under DDP.

        For validation/test losses and other per-batch means: a torchmetrics ``MeanMetric``
        per ``name`` (made on first use, in :attr:`eval_means`) accumulates ``value *
        weight`` and ``weight`` and synchronises both sums across processes at epoch end.
        ``self.log(..., sync_dist=True, batch_size=n)`` would not be exact when processes
        evaluate different numbers of rows, as they do under DDP here (every sample once,
        :mod:`cloc_lightning.data.eval_sharding`): Lightning accumulates the batch sizes in an
        integer tensor and its gloo ``mean`` divides it in place by the world size,
        truncating it (ranks with 9 and 8 rows: ``17 / 2 -> 8``).  NaN values are kept (the
        logged mean is NaN), not dropped; a value with ``weight`` 0 adds nothing.
        """
        key = name.replace(".", "_")
        if key not in self.eval_means:
            # nan_strategy NaN: a NaN value makes the mean NaN (the default drops it with a warning;
            # "disable" would also drop the weights: torchmetrics 1.9 then takes every weight as 1)
            self.eval_means[key] = MeanMetric(nan_strategy=float("nan")).to(value.device)
        metric = cast(MeanMetric, self.eval_means[key])
        w = torch.as_tensor(weight, dtype=torch.float32, device=value.device)
        v = torch.where(w > 0, value.detach().float(), torch.zeros_like(w))  # a mean over 0 rows (NaN) adds nothing
        metric.update(v, w)
        self.log(name, metric, on_step=False, on_epoch=True, metric_attribute=f"eval_means.{key}")

    def param_groups(self) -> list[dict[str, Any]]:
        """Optimiser parameter groups; override to give parts their own lr/weight decay.

        The default is one group of every trainable parameter with the base lr and
        weight decay.  Groups may carry ``lr`` / ``weight_decay`` / ``name`` keys.
        """
        return [{"name": "model", "params": [p for p in self.parameters() if p.requires_grad]}]

    def build_optimizer(self, groups: list[dict[str, Any]]) -> torch.optim.Optimizer:
        """Build the optimiser over ``groups`` from the ``optimizer``/``lr``/... arguments.

        An override passes ``**self.optimizer_options(<optimiser class>)`` to the optimiser it
        builds, so that ``optimizer_fused`` / ``optimizer_foreach`` reach it.
        """
        h = self.hparams
        cls = _OPTIMIZERS[h.optimizer]
        if h.optimizer == "sgd":
            return torch.optim.SGD(
                groups, lr=h.lr, momentum=h.momentum, weight_decay=h.weight_decay, nesterov=h.nesterov,
                **self.optimizer_options(torch.optim.SGD),
            )
        return cls(groups, lr=h.lr, weight_decay=h.weight_decay, **self.optimizer_options(cls))

    def optimizer_options(self, optimizer_class: Callable[..., Any]) -> dict[str, Any]:
        """The ``fused`` / ``foreach`` keyword arguments of ``optimizer_fused`` / ``optimizer_foreach`` for ``optimizer_class``.

        Only the options that are set (not ``null``); ``fused: false`` is left out for an
        optimiser without a fused implementation (it is what such an optimiser does).  Raises
        a ``ValueError`` naming the fix when ``optimizer_class`` does not take a requested option.
        """
        h = self.hparams
        options: dict[str, Any] = {}
        for name in ("fused", "foreach"):
            value = h.get(f"optimizer_{name}")
            if value is None:
                continue
            if not _accepts(optimizer_class, name):
                if not value:
                    continue
                raise ValueError(
                    f"optimizer_{name}: true, but {getattr(optimizer_class, '__name__', optimizer_class)} takes no {name!r} "
                    f"argument (torch {torch.__version__}); set optimizer_{name}: null"
                    + (" (optimizer_foreach: true may work instead)" if name == "fused" else "")
                )
            options[name] = bool(value)
        return options

    def _check_optimizer_options(self, optimizer: torch.optim.Optimizer) -> None:
        """Check that the built optimiser runs with ``optimizer_fused`` / ``optimizer_foreach`` on a device that has them."""
        options = self.optimizer_options(type(optimizer))
        for name, value in options.items():
            if optimizer.defaults.get(name) != value:
                raise ValueError(
                    f"optimizer_{name}: {str(value).lower()}, but {type(self).__name__}.build_optimizer built "
                    f"{type(optimizer).__name__} with {name}={optimizer.defaults.get(name)!r}; pass "
                    f"**self.optimizer_options({type(optimizer).__name__}) to the optimiser it builds, or set optimizer_{name}: null"
                )
        if options.get("fused"):
            supported = _fused_devices()
            devices = sorted({p.device.type for g in optimizer.param_groups for p in g["params"]} - set(supported))
            if devices:
                raise ValueError(
                    f"optimizer_fused: true, but torch {torch.__version__} has fused {type(optimizer).__name__} kernels for "
                    f"{supported} only and the parameters are on {devices}; set optimizer_fused: null (or try "
                    "optimizer_foreach: true)"
                )

    def configure_optimizers(self) -> Any:
        groups = [g for g in self.param_groups() if len(list(g["params"])) > 0]
        if not groups:
            raise RuntimeError(f"{type(self).__name__} has no trainable parameters to optimise")
        optimizer = self.build_optimizer(groups)
        self._check_optimizer_options(optimizer)
        optimizer.register_load_state_dict_post_hook(_match_param_layouts)  # resumes across memory formats
        h = self.hparams
        if h.scheduler == "none" and h.warmup_epochs == 0:
            return optimizer
        total = max(1, int(self.trainer.estimated_stepping_batches))
        n_batches = self.trainer.num_training_batches
        accumulate = max(1, self.trainer.accumulate_grad_batches)
        if math.isfinite(n_batches) and n_batches > 0:
            per_epoch = max(1.0, math.ceil(n_batches / accumulate))
        else:
            per_epoch = total / max(1, self.trainer.max_epochs or 1)
        milestones = list(h.lr_milestones or [])
        warmup_start = None if h.warmup_from is None else float(h.warmup_from) / float(h.lr)
        max_epochs = self.trainer.max_epochs if (self.trainer.max_epochs or 0) > 0 else None

        def factor(step: int) -> float:
            return lr_factor(
                step, total, per_epoch, h.scheduler, h.warmup_epochs, h.min_lr_ratio, milestones, h.lr_gamma,
                interval=h.lr_interval, warmup_start=warmup_start, max_epochs=max_epochs,
            )

        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def configure_callbacks(self) -> list[Callback]:
        """Best-``monitor`` checkpoint, ``last.ckpt`` of every epoch, LR logging, RNG state in checkpoints.

        * With no ``ModelCheckpoint`` configured (only Lightning's default one), a
          :class:`~cloc_lightning.callbacks.BestCheckpoint` keeps the best epoch by
          ``self.monitor`` and rewrites ``last.ckpt`` after every epoch, improved or not.
        * A ``ModelCheckpoint`` that you configure is kept as it is.  If it ties ``save_last`` to
          a monitored metric (Lightning then rewrites ``last.ckpt`` only when the metric
          improves), its ``save_last`` is switched off and a ``LatestCheckpoint`` in the same
          folder writes ``last.ckpt`` every epoch instead (a message says so).

        Checkpoint callbacks are put on the trainer directly rather than returned: Lightning
        drops every trainer callback of a type that ``configure_callbacks`` returns, which would
        discard checkpoints you configured (and print a misleading "will override" notice).
        :class:`~cloc_lightning.resume.ResumeState` makes resumed fits exact;
        :class:`~cloc_lightning.callbacks.checks.DeviceChecks` reads the step's value checks
        every ``log_every_n_steps`` (``strict_checks``: every step);
        :class:`~cloc_lightning.callbacks.preemption.PreemptionCheckpoint` turns a SIGTERM into a
        mid-epoch ``last.ckpt`` and a non-zero exit.
        """
        from cloc_lightning.callbacks.checkpoint import BestCheckpoint, LatestCheckpoint
        from cloc_lightning.callbacks.checks import DeviceChecks
        from cloc_lightning.callbacks.preemption import PreemptionCheckpoint
        from cloc_lightning.resume import ResumeState

        callbacks: list[Callback] = []
        trainer = self._trainer
        if trainer is None:
            return callbacks
        current: list[Callback] = trainer.callbacks  # type: ignore[attr-defined]  # set by Lightning at runtime, not declared on Trainer
        existing = trainer.checkpoint_callbacks
        if existing:  # checkpointing is enabled
            added: list[Callback] = []
            if all(_is_default_checkpoint(cb) for cb in existing):
                current = [cb for cb in current if not _is_default_checkpoint(cb)]
                added.append(
                    BestCheckpoint(
                        monitor=self.monitor,
                        mode=self.monitor_mode,
                        filename="best-{epoch:03d}-{step}",
                        auto_insert_metric_name=False,
                    )
                )
            elif not any(isinstance(cb, (LatestCheckpoint, BestCheckpoint)) for cb in current):
                configured = [cb for cb in trainer.checkpoint_callbacks if isinstance(cb, ModelCheckpoint)]
                tied = [cb for cb in configured if cb.save_last is True and cb.monitor is not None]
                for cb in tied:
                    cb.save_last = False
                    if trainer.is_global_zero:
                        print(
                            f"ModelCheckpoint(monitor={cb.monitor!r}, save_last=True) would rewrite last.ckpt only "
                            "when the metric improves; a LatestCheckpoint writes it after every epoch instead"
                        )
                configured_last = any(cb.save_last for cb in configured)
                if not configured_last or tied:
                    dirpath = tied[0].dirpath if tied else None
                    added.append(LatestCheckpoint(dirpath=None if dirpath is None else os.fspath(dirpath)))
            if added:
                # checkpoints run after every other callback (Lightning's own ordering)
                current = [*current, *added]
                trainer.callbacks = current  # type: ignore[attr-defined]
        if trainer.loggers and not any(isinstance(cb, LearningRateMonitor) for cb in current):
            callbacks.append(LearningRateMonitor(logging_interval="step"))
        if not any(isinstance(cb, ResumeState) for cb in current):
            callbacks.append(ResumeState())
        if not any(isinstance(cb, DeviceChecks) for cb in current):
            callbacks.append(DeviceChecks(strict=bool(self.hparams.get("strict_checks", False))))
        if not any(isinstance(cb, PreemptionCheckpoint) for cb in current):
            callbacks.append(PreemptionCheckpoint())
        return callbacks

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        """Stop with a message naming the fix when a 1-sample batch would reach BatchNorm layers in training mode.

        (PyTorch's own error, "Expected more than 1 value per channel when training", names
        neither the batch size nor ``drop_last``.)  Checked only when the batch has one sample.
        """
        labels = batch[-1] if isinstance(batch, (list, tuple)) and batch else None
        if not isinstance(labels, torch.Tensor) or labels.ndim == 0 or labels.shape[0] != 1:
            return
        if any(isinstance(m, nn.modules.batchnorm._BatchNorm) and m.training for m in self.modules()):
            raise ValueError(
                f"{type(self).__name__}: training batch {batch_idx} of epoch {self.current_epoch} has 1 sample, but "
                "BatchNorm layers need at least 2 samples per batch in training. Set data.batch_size >= 2 (it is "
                "per process under DDP) and keep data.drop_last: true, so that a last batch of 1 sample is dropped."
            )

    def on_before_backward(self, loss: torch.Tensor) -> None:
        """Stop with an error naming the fixes when the training loss is NaN/inf (``check_finite_loss``).

        By default the flag is recorded on the device (no host sync) and read every
        ``log_every_n_steps`` (:class:`~cloc_lightning.callbacks.checks.DeviceChecks`); with
        ``strict_checks`` (or outside a Trainer) it is read now, before the backward pass, so
        the weights keep their last finite values.  Under DDP the strict flag is summed over
        ranks (and the deferred read is all-reduced), so every rank raises and none hangs.
        """
        if not self.hparams.check_finite_loss:
            return
        from cloc_lightning import distributed as dist_utils

        finite = torch.isfinite(loss.detach()).all()
        if deferring():
            require(finite, _nonfinite_loss_message(type(self).__name__), FloatingPointError)
            return
        bad = (~finite).to(torch.float32).reshape(1)
        if dist_utils.is_distributed():
            bad = dist_utils.all_reduce_sum(bad)
        if bool(bad.item()):
            raise FloatingPointError(
                _nonfinite_loss_message(type(self).__name__)
                + f" Loss {float(loss.detach().float().sum())} at step {self.global_step} (epoch {self.current_epoch}); "
                "stopped before the weights were updated."
            )

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Stop when a gradient is NaN/inf although the loss was finite (``check_finite_loss``).

        One fused norm over the gradients (the 2-norm of each tensor, finite exactly when
        every entry is, short of a norm above ~1e19), recorded on the device by default and
        read every ``log_every_n_steps``; with ``strict_checks`` read now, before the optimiser
        step (weights unchanged).  Under DDP the gradients are already averaged, so every rank
        raises.  Skipped under fp16's ``GradScaler``, which skips such steps itself.
        """
        if not self.hparams.check_finite_loss:
            return
        trainer = self._trainer
        if trainer is not None and getattr(trainer.precision_plugin, "scaler", None) is not None:
            return
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        if not grads:
            return
        finite = _grads_finite(grads)
        if deferring():
            require(finite, _nonfinite_grad_message(type(self).__name__), FloatingPointError)
            return
        if bool(finite):
            return
        bad = [n for n, p in self.named_parameters() if p.grad is not None and not bool(torch.isfinite(p.grad).all())]
        raise FloatingPointError(
            _nonfinite_grad_message(type(self).__name__)
            + f" Non-finite in {len(bad)} tensor(s) {bad[:4]} at step {self.global_step}; stopped before the optimiser "
            "step (weights unchanged)."
        )

    # ---------------------------------------------------------------- diverged evaluations
    def on_validation_end(self) -> None:
        """Say loudly when the monitored metric of a fit's validation epoch is NaN/inf (a diverged model).

        The metrics of :mod:`cloc_lightning.metrics` are NaN when any output row is NaN/inf, and
        :class:`~cloc_lightning.callbacks.BestCheckpoint` never keeps such an epoch as the best;
        this names the metric, the epoch and the fix (on stderr, rank 0).  One host read of the
        synced value per validation epoch.
        """
        super().on_validation_end()
        trainer = self._trainer
        if trainer is None or trainer.sanity_checking or trainer.state.fn != "fit":
            return
        value = trainer.callback_metrics.get(self.monitor)
        if not isinstance(value, torch.Tensor) or bool(torch.isfinite(value).all()):
            return
        from cloc_lightning.callbacks.checkpoint import BestCheckpoint, print_line

        others = any(
            isinstance(cb, ModelCheckpoint) and not isinstance(cb, BestCheckpoint) and cb.monitor == self.monitor
            for cb in trainer.checkpoint_callbacks
        )
        message = _nonfinite_monitor_message(type(self).__name__, self.monitor, float(value), int(self.current_epoch), others)
        print_line(trainer, message, file=sys.stderr)

    def on_test_end(self) -> None:
        """Say loudly when test metrics are NaN/inf: the tested weights give non-finite outputs, the numbers are no result."""
        super().on_test_end()
        trainer = self._trainer
        if trainer is None:
            return
        bad = sorted(
            k for k, v in trainer.callback_metrics.items()
            if k.startswith("test/") and isinstance(v, torch.Tensor) and not bool(torch.isfinite(v).all())
        )
        if not bad:
            return
        from cloc_lightning.callbacks.checkpoint import print_line

        weights = f"the weights of {trainer.ckpt_path}" if trainer.ckpt_path else "the final weights of the fit"
        print_line(
            trainer,
            f"warning: {type(self).__name__}: the test metrics {bad[:6]} are NaN/inf: {weights} give non-finite outputs "
            "(the run diverged), so these numbers are no result. Lower the learning rate (--model.lr) or clip gradients "
            "(--trainer.gradient_clip_val 1.0) and train again.",
            file=sys.stderr,
        )

    # ---------------------------------------------------------------- checkpoints
    #: state_dict prefix of the encoder that frozen-encoder probes evaluate (:mod:`cloc_lightning.checkpoints`)
    encoder_prefix: ClassVar[str] = DEFAULT_ENCODER_PREFIX

    def encoder_metadata(self) -> dict[str, Any]:
        """``checkpoint[ENCODER_META_KEY]``: class, :attr:`encoder_prefix` and encoder architecture
        (:func:`cloc_lightning.checkpoints.encoder_metadata`); override to record another architecture."""
        return encoder_metadata(self)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Record the module class and encoder architecture (:mod:`cloc_lightning.checkpoints`), and the
        encoder entry that ``cloc-lightning probe`` and ``LinearProbeModule(encoder_ckpt=...)`` read.

        Subclasses that override this hook call ``super().on_save_checkpoint(checkpoint)``.
        """
        checkpoint[MODULE_META_KEY] = module_record(self)
        checkpoint[ENCODER_META_KEY] = self.encoder_metadata()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Refuse a checkpoint of another module class or encoder, naming both (before any weight is loaded).

        Subclasses that override this hook call ``super().on_load_checkpoint(checkpoint)``.
        A fit resumed with ``--ckpt_path`` on a model with ``init_from`` says that the resumed
        weights replace the ``init_from`` ones (Lightning restores checkpoints after ``setup``, where
        ``init_from`` was applied and reported).
        """
        check_checkpoint(self, checkpoint)
        trainer = self._trainer
        if self._initialised_from is not None and trainer is not None and trainer.state.fn == "fit" and trainer.is_global_zero:
            print(f"init_from {self._initialised_from}: replaced by the weights of the resumed checkpoint (--ckpt_path "
                  f"{trainer.ckpt_path}); init_from only initialises a new run", flush=True)

    # ---------------------------------------------------------------- lifecycle
    def configure_model(self) -> None:
        """Apply ``channels_last`` and ``compile_backbone`` to the :attr:`backbone_modules`, once per module.

        Lightning calls this hook at the start of every ``fit`` / ``validate`` / ``test`` /
        ``predict``, before a checkpoint is restored and the optimiser is built.  Both options
        work in place and keep the module tree: ``channels_last`` converts the 4-D weights and
        registers a forward pre-hook that converts the encoder's 4-D inputs;
        ``compile_backbone`` calls ``module.compile(...)`` (``nn.Module.compile``), never
        ``torch.compile(module)``, whose wrapper would add ``_orig_mod.`` to every
        ``state_dict`` key.  Plain Python use (no Trainer) runs uncompiled; call this
        method to apply them there.  A subclass overriding it calls ``super().configure_model()``.
        """
        super().configure_model()
        h = self.hparams
        compile_args = h.get("compile_backbone", False)
        applied = getattr(self, "_speed_applied", None)
        if applied is None:
            applied = self._speed_applied = {}
        for name in self.backbone_modules:
            module = getattr(self, name, None)
            if not isinstance(module, nn.Module) or applied.get(name) == id(module):
                continue
            if isinstance(getattr(module, "_orig_mod", None), nn.Module):  # a torch.compile(...) wrapper (OptimizedModule)
                raise TypeError(
                    f"{type(self).__name__}.{name} is a torch.compile(...) wrapper: its state_dict keys gain '_orig_mod.', so "
                    "its checkpoints fit neither plain modules nor LinearProbeModule / cloc-lightning probe. Return the "
                    "plain module from build_backbone and set compile_backbone: true (it compiles in place, keys unchanged)"
                )
            if h.get("channels_last", False):
                cast(Any, module)._apply(_to_channels_last)  # every 4-D parameter/buffer (and gradient), in place
                module.register_forward_pre_hook(_channels_last_inputs)
            if compile_args:
                module.compile(**(dict(compile_args) if isinstance(compile_args, dict) else {}))
            applied[name] = id(module)

    def setup(self, stage: str) -> None:
        """Refuse a precision this module cannot train in (:func:`cloc_lightning.precision.check_precision`);
        apply ``init_from`` once, unless a checkpoint is being resumed (``--ckpt_path``)."""
        if stage == "fit":
            check_precision(self)
            if self._trainer is not None:
                _check_trains_something(self.trainer, type(self).__name__)
        path = self.hparams.init_from
        resuming = self._trainer is not None and self.trainer.ckpt_path is not None
        if path and not resuming and self._initialised_from != path:
            self.load_weights(path)
            self._initialised_from = path

    def load_weights(self, path: str) -> dict[str, list[str]]:
        """Load the matching weights of a checkpoint (weights only); report what did not match.

        Keys under :attr:`init_from_exclude` are skipped; a key present in both with a
        different shape is an error.  Returns ``{'loaded', 'missing', 'unexpected'}``.
        """
        ckpt = read_checkpoint(
            path,
            what="init_from checkpoint",
            hint="init_from takes a .ckpt file (e.g. runs/<name>/version_0/checkpoints/best-*.ckpt or last.ckpt) or a "
            "state_dict saved with torch.save; a CLOC margins YAML goes to --model.learnable_map",
        )
        state = ckpt.get("state_dict", ckpt)
        if not isinstance(state, dict) or not any(isinstance(v, torch.Tensor) for v in state.values()):
            raise ValueError(f"init_from {path!r} is neither a Lightning checkpoint nor a state_dict of tensors")
        own = self.state_dict()
        skip = tuple(self.init_from_exclude)
        take = {k: v for k, v in state.items() if k in own and isinstance(v, torch.Tensor) and not k.startswith(skip)}
        bad = [f"{k}: {tuple(v.shape)} vs {tuple(own[k].shape)}" for k, v in take.items() if v.shape != own[k].shape]
        if bad:
            raise ValueError(f"init_from {path!r} does not fit this model (shape mismatch): {bad[:5]}")
        if not take:
            raise ValueError(f"init_from {path!r} shares no weights with {type(self).__name__} (keys like {list(state)[:3]})")
        self.load_state_dict(take, strict=False)
        missing = [k for k in own if k not in take and not k.startswith(skip)]
        unexpected = [k for k in state if k not in own]
        if self._trainer is None or self.trainer.is_global_zero:
            print(f"init_from {path}: loaded {len(take)} tensors; not in the checkpoint: {len(missing)} {missing[:5]}; "
                  f"ignored from the checkpoint: {len(unexpected)} {unexpected[:5]}")
        return {"loaded": list(take), "missing": missing, "unexpected": unexpected}

    # ---------------------------------------------------------------- helpers
    def extract_features(self, x: torch.Tensor) -> torch.Tensor:
        """Backbone features ``[B, feature_dim]`` (what linear probes read)."""
        features: torch.Tensor = self.backbone(x)
        return features

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """The embedding the method's loss shapes (for plots); default: backbone features."""
        return self.extract_features(x)

    @staticmethod
    def split_batch(batch: Any, expect_views: bool | None = None, owner: str = "this module") -> tuple[Any, torch.Tensor]:
        """``(images or list of views, labels)`` from a batch, with a clear error on the wrong kind."""
        if not isinstance(batch, (list, tuple)) or len(batch) != 2:
            raise ValueError(f"{owner} expects batches (images, labels), got {type(batch).__name__}")
        x, y = batch
        is_views = isinstance(x, (list, tuple))
        if expect_views is False and is_views:
            raise ValueError(
                f"{owner} trains on single-view batches but the data module yields {len(x)} views; "
                "remove data.train_views (or set it to null)"
            )
        if expect_views is True and not is_views:
            raise ValueError(
                f"{owner} needs multi-view batches; set data.train_views, e.g. "
                "{class_path: cloc_lightning.data.SupConViews, init_args: {n_views: 2}}"
            )
        return x, y



class ClassifierModule(BaseModule):
    """Backbone + linear head with ordinal/nominal metrics for validation, test and predict.

    **Final and best.**  Every validation epoch of a fit also logs the running best of
    :meth:`tracked_metrics` -- ``val/acc_best`` and ``val/acc_best_epoch`` (and ``val/mae_best``
    / ``val/mae_best_epoch`` for ordinal data) -- next to the epoch's own value; at the end of
    ``fit`` both are printed (:meth:`summary_line`, e.g. ``CEModule: val/acc final 0.8712
    (epoch 99), best 0.8760 (epoch 87)``), sent to the loggers as ``<name>_final`` /
    ``<name>_best`` and kept in :attr:`val_summary`.  A ``test`` run in the same process
    (``test_after_fit``, which tests the best checkpoint) logs them again next to the test
    metrics.  Epochs count from 0, as in the checkpoint names.  The history is saved in
    checkpoints (:attr:`VAL_HISTORY_KEY`), so a resumed fit continues it.

    Args:
        num_classes: number of classes (ranks); must match the data module's.
        task: ``ordinal`` (MAE, expected-rank MAE, accuracy, QWK, ±1 accuracy),
            ``nominal`` (top-1/top-5) or ``auto`` (the data module's ``task``).
        **kwargs: :class:`BaseModule` arguments (backbone, optimiser, schedule).
    """

    #: checkpoint key of the validation history (final / best per tracked metric)
    VAL_HISTORY_KEY: ClassVar[str] = "cloc_lightning/val_history"
    #: how :meth:`summary_line` names the module (``None``: the class name)
    summary_name: ClassVar[str | None] = None

    def __init__(self, num_classes: int, task: Task = "auto", **kwargs: Any) -> None:
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 2:
            raise ValueError(f"num_classes must be an integer >= 2, got {num_classes!r}")
        check_choice("task", task, Task)
        super().__init__(**kwargs)
        self.num_classes = num_classes
        self.task = task
        self.head = self.build_head()
        self.val_metrics: MetricCollection | None = None
        self.test_metrics: MetricCollection | None = None
        if task != "auto":
            self._make_metrics(task)
        #: ``{metric: {"final", "final_epoch", "best", "best_epoch"}}`` of the validation epochs of the fit
        self.val_summary: dict[str, dict[str, float]] = {}

    # ------------------------------------------------------------------ hooks
    def build_head(self) -> nn.Module:
        """The classifier on backbone features: ``Linear(feature_dim, num_classes)``."""
        return nn.Linear(self.feature_dim, self.num_classes)

    def build_metrics(self, task: Literal["ordinal", "nominal"], prefix: str) -> MetricCollection:
        """Metrics logged as ``<prefix><name>`` (see :mod:`cloc_lightning.metrics`)."""
        return build_metrics(task, self.num_classes, prefix)

    def resolved_task(self) -> Literal["ordinal", "nominal"]:
        """``task``, or with ``task='auto'`` the attached data module's ``task`` (``ordinal`` without a data module).

        Known before ``setup``: the checkpoint callback that monitors ``val/acc`` (nominal) or
        ``val/mae`` (ordinal) is built from it.
        """
        if self.task != "auto":
            return self.task
        data = self.datamodule_info
        return "ordinal" if data is None else data.task

    @property
    def monitor(self) -> str:
        return "val/acc" if self.resolved_task() == "nominal" else "val/mae"

    @property
    def monitor_mode(self) -> Literal["min", "max"]:
        return "max" if self.resolved_task() == "nominal" else "min"

    # ---------------------------------------------------------------- lifecycle
    def _make_metrics(self, task: Literal["ordinal", "nominal"]) -> tuple[MetricCollection, MetricCollection]:
        self.task = task
        self.val_metrics = self.build_metrics(task, "val/")
        self.test_metrics = self.build_metrics(task, "test/")
        return self.val_metrics, self.test_metrics

    def setup(self, stage: str) -> None:
        super().setup(stage)
        data = self.datamodule_info
        if data is not None and data.num_classes != self.num_classes:
            n = data.num_classes
            raise ValueError(
                f"model.num_classes={self.num_classes} but {data.name} has {n} classes ({(data.class_names or [])[:10]}); "
                f"give the model num_classes {n} ({type(self).__name__}(num_classes={n}); the command line takes it from "
                "the data module: leave model.num_classes out)"
            )
        if self.val_metrics is None:
            for metrics in self._make_metrics(self.resolved_task()):
                metrics.to(self.device)

    # -------------------------------------------------------------------- steps
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Class scores (logits) ``[B, num_classes]`` for images ``[B, 3, H, W]``."""
        logits: torch.Tensor = self.head(self.backbone(x))
        return logits

    def eval_outputs(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """``(loss, scores [B, C], metric keywords)`` of an evaluation batch: what validation and test log and score.

        The default: the cross-entropy of the class scores ``self(x)`` (in float32), the scores
        themselves and no keywords.  A module whose output is no class distribution overrides
        it: :class:`~cloc_lightning.methods.LinearRegressorModule` returns its L1 loss, scores
        whose arg-max is its nearest rank and ``{'expected': its clamped output}``, which
        ``mae_expected`` reads instead of a softmax expectation (the keywords go to the metrics
        whose ``update`` takes them, :class:`~cloc_lightning.metrics.ExpectedRankMAE`).
        """
        logits = self(x).float()
        return F.cross_entropy(logits, y), logits, {}

    def _eval_step(self, batch: Any, metrics: MetricCollection | None, stage: str) -> torch.Tensor:
        x, y = self.split_batch(batch, expect_views=False, owner=type(self).__name__)
        loss, scores, metric_kwargs = self.eval_outputs(x, y)
        self.log_eval_mean(f"{stage}/loss", loss, y.shape[0])
        if metrics is None:  # plain-Python use (no setup)
            val, test = self._make_metrics("ordinal" if self.task == "auto" else self.task)
            metrics = (val if stage == "val" else test).to(scores.device)
        metrics.update(scores, y, **metric_kwargs)
        self.log_dict(metrics, on_step=False, on_epoch=True, batch_size=y.shape[0])
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self._eval_step(batch, self.val_metrics, "val")

    def test_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self._eval_step(batch, self.test_metrics, "test")

    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> dict[str, torch.Tensor]:
        """``{'pred': argmax class, 'expected': expected rank, 'probs': [B, C], 'target': labels}``."""
        x, y = batch if isinstance(batch, (list, tuple)) else (batch, None)
        probs = self(x).float().softmax(dim=1)
        ranks = torch.arange(probs.shape[1], device=probs.device, dtype=probs.dtype)
        out = {"pred": probs.argmax(dim=1), "expected": probs @ ranks, "probs": probs}
        if y is not None:
            out["target"] = y
        return out

    # ---------------------------------------------------------------- final and best
    def tracked_metrics(self) -> dict[str, str]:
        """Validation metrics whose best value is tracked: ``{name: 'max' | 'min'}``.

        Top-1 accuracy (what SupContrast's linear stage reports) and the checkpoint's monitor
        (``val/mae`` for ordinal data).
        """
        tracked = {"val/acc": "max"}
        tracked.setdefault(self.monitor, self.monitor_mode)
        return tracked

    def _tracking(self) -> bool:
        trainer = self._trainer
        return trainer is not None and not trainer.sanity_checking and trainer.state.fn == "fit"

    def on_validation_epoch_end(self) -> None:
        """Update the final/best summary with this epoch's values and log the running best."""
        super().on_validation_epoch_end()
        if not self._tracking() or self.val_metrics is None:
            return
        if not any(m.update_called for m in self.val_metrics.values(copy_state=False)):
            return
        values = self.val_metrics.compute()  # the epoch's values (Lightning computes the same, cached, next)
        epoch = int(self.current_epoch)
        for name, mode in self.tracked_metrics().items():
            if name not in values:
                continue
            value = float(values[name])
            entry = self.val_summary.get(name)
            if entry is None:  # no best yet: NaN until an epoch has a finite value
                entry = self.val_summary[name] = {"best": math.nan, "best_epoch": math.nan}
            # a NaN/inf value (non-finite outputs, cloc_lightning.metrics) is never an improvement
            better = math.isfinite(value) and (
                not math.isfinite(entry["best"]) or (value > entry["best"] if mode == "max" else value < entry["best"])
            )
            entry["final"], entry["final_epoch"] = value, float(epoch)
            if better:
                entry["best"], entry["best_epoch"] = value, float(epoch)
            # the same value on every rank (computed from synced metrics); sync_dist keeps Lightning quiet under DDP
            self.log(f"{name}_best", entry["best"], on_epoch=True, sync_dist=True)
            self.log(f"{name}_best_epoch", entry["best_epoch"], on_epoch=True, sync_dist=True)

    def summary_line(self) -> str:
        """``<summary_name>: val/acc final 0.8712 (epoch 99), best 0.8760 (epoch 87)`` (empty before any validation)."""
        parts = [
            f"{name} final {e['final']:.4f} (epoch {int(e['final_epoch'])}), "
            + (f"best {e['best']:.4f} (epoch {int(e['best_epoch'])})" if math.isfinite(e["best"])
               else "best none (no epoch had a finite value: the run diverged)")
            for name, e in self.val_summary.items()
        ]
        if not parts:
            return ""
        data = self.datamodule_info
        note = " [validation set = the test split: data.val_fraction 0]" if data is not None and data.val_fraction == 0 else ""
        return f"{self.summary_name or type(self).__name__}: " + "; ".join(parts) + note

    def on_fit_end(self) -> None:
        """Print the final and best validation values and send them to the loggers (``<name>_final`` / ``_best``)."""
        super().on_fit_end()
        if not self.val_summary:
            return
        if self.trainer.is_global_zero:
            print(self.summary_line(), flush=True)
        metrics: dict[str, float] = {}
        for name, e in self.val_summary.items():
            metrics.update({f"{name}_final": e["final"], f"{name}_best": e["best"], f"{name}_best_epoch": e["best_epoch"]})
        if self.trainer.is_global_zero:
            for logger in self.loggers:
                logger.log_metrics(metrics, step=self.global_step)
                logger.save()

    def on_test_epoch_end(self) -> None:
        """Log the fit's final and best validation values next to the test metrics (when this process ran the fit)."""
        super().on_test_epoch_end()
        for name, e in self.val_summary.items():
            self.log(f"{name}_final", e["final"], sync_dist=True)
            self.log(f"{name}_best", e["best"], sync_dist=True)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Record the validation history (final / best), so a resumed fit continues it."""
        super().on_save_checkpoint(checkpoint)
        checkpoint[self.VAL_HISTORY_KEY] = {k: dict(v) for k, v in self.val_summary.items()}

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Restore the validation history when resuming a fit (or when this process has none).

        ``test_after_fit`` loads the best checkpoint into the module that just trained: its
        history (with the true final epoch) is kept then.
        """
        super().on_load_checkpoint(checkpoint)
        saved = checkpoint.get(self.VAL_HISTORY_KEY)
        fitting = self._trainer is not None and self.trainer.state.fn == "fit"
        if isinstance(saved, dict) and (fitting or not self.val_summary):
            self.val_summary = {k: {kk: float(vv) for kk, vv in v.items()} for k, v in saved.items()}
