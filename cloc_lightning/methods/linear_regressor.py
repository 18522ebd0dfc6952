"""Stage two of Rank-N-Contrast: a linear regressor trained with the L1 loss on a frozen encoder.

The evaluation protocol of K. Zha et al., *Rank-N-Contrast: Learning Continuous Representations
for Regression*, NeurIPS 2023 (arXiv:2210.01189), ``main_linear.py`` of
https://github.com/kaiwenzha/Rank-N-Contrast: the encoder of a stage-one checkpoint is frozen
(eval mode, no gradients) and a ``Linear(feature_dim, 1)`` is trained with the L1 loss against the
targets; the model is selected by the validation L1 error and tested once.

Here the target is the rank: the class index of ordinal data.  The regressor outputs one value
``r`` per image, in class-index units, and the ordinal metrics mean what they mean for a
classifier (:class:`LinearRegressorModule`).
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import nn

from cloc_lightning.checks import require
from cloc_lightning.losses.base import upcast
from cloc_lightning.methods.linear_probe import LinearProbeModule

__all__ = ["LinearRegressorModule"]

_NOMINAL = (
    "LinearRegressorModule regresses ranks, so its data must be ordinal (classes are ranks 0..K-1), but task is "
    "'nominal'; for unordered classes use cloc_lightning.methods.LinearProbeModule (a linear classifier with cross-entropy)"
)


class LinearRegressorModule(LinearProbeModule):
    """A linear regressor with the L1 loss on the frozen encoder of a stage-one checkpoint (RnC's stage two).

    Everything about the encoder is :class:`~cloc_lightning.methods.LinearProbeModule`'s: it is
    read from ``encoder_ckpt`` (any of our pre-training modules: :class:`~cloc_lightning.methods.RnCModule`,
    SupCon/SimCLR, CE, CLOC, ReLIC, or an encoder ``state_dict`` file), frozen and kept in eval mode
    (BatchNorm statistics do not move).  What differs is the head, ``Linear(feature_dim, 1)``, and its
    loss: the training loss is ``mean |r - y|`` over the labelled images (class ``>= 0``), ``r`` the
    raw output and ``y`` the class index, as ``main_linear.py``'s ``L1Loss`` on its targets.

    **Metrics.**  With ``K`` classes and ``r`` the output, the ordinal metrics of
    :mod:`cloc_lightning.metrics` mean what they mean for a classifier:

    * ``mae``, ``acc``, ``qwk``, ``acc_pm1``: of the nearest rank, ``round(clamp(r, 0, K-1))``
      (ties to the lower rank): :meth:`forward` returns the class scores ``-|r - c|``, ``c = 0..K-1``,
      whose arg-max is that rank (they are no class distribution; the arg-max is what counts);
    * ``mae_expected``: ``mean |clamp(r, 0, K-1) - y|``, the regressor's continuous estimate (the
      classifiers' softmax-expected rank; :meth:`eval_outputs` hands it to the metric);
    * ``val/loss`` / ``test/loss``: the L1 loss of the raw output, ``mean |r - y|`` (what the paper
      validates on).

    The best checkpoint monitors ``val/mae_expected`` (the paper selects its regressor by the
    validation L1 error of the continuous output); the final and best ``val/mae_expected``,
    ``val/mae`` and ``val/acc`` are logged and printed at the end of ``fit``.  :meth:`predict_step`
    gives ``pred`` (nearest rank), ``expected`` (the clamped output) and ``regression`` (the raw
    output).  The task must be ordinal; nominal classes need :class:`LinearProbeModule`.

    **Defaults** (``main_linear.py``'s): SGD, momentum 0.9, no weight decay, lr 0.05 (batch 64),
    cosine to ``lr * 0.008`` (its ``lr_decay_rate ** 3`` = 0.2 ** 3).

    Args:
        lr: base learning rate (``main_linear.py``'s 0.05 at batch 64).
        min_lr_ratio: final cosine learning rate as a fraction of the base rate (``main_linear.py``'s
            ``lr_decay_rate ** 3`` = 0.008).
        **kwargs: the :class:`~cloc_lightning.methods.LinearProbeModule` arguments (``encoder_ckpt``,
            ``backbone`` / ``cifar_stem`` overrides, ``normalize_features``, ``task``, the optimiser
            and schedule, ...).

    Keyword Args:
        num_classes (int): classes (ranks) of the data module; the output is clamped to ``[0, K-1]``.

    Example::

        cloc-lightning fit --config configs/rnc/demo.yaml                                     # stage one
        cloc-lightning fit --config configs/rnc/demo_linear.yaml \\
            --model.encoder_ckpt runs/rnc_demo/version_0/checkpoints/last.ckpt               # stage two

        model = LinearRegressorModule(num_classes=6, encoder_ckpt="last.ckpt")
        L.Trainer(max_epochs=10).fit(model, datamodule=dm)
        model.predict_step((images, None), 0)["expected"]   # clamp(r, 0, 5)
    """

    summary_name = "linear regressor"
    #: checkpoint key of the validation history
    VAL_HISTORY_KEY = "linear_regressor_val_history"
    #: the best checkpoint's metric: the validation L1 error of the clamped output (the paper's model selection), lower is better
    monitor = "val/mae_expected"
    monitor_mode: Literal["min", "max"] = "min"

    def __init__(self, *, lr: float = 0.05, min_lr_ratio: float = 0.008, **kwargs: Any) -> None:
        if kwargs.get("task") == "nominal":
            raise ValueError(_NOMINAL)
        super().__init__(lr=lr, min_lr_ratio=min_lr_ratio, **kwargs)

    # ------------------------------------------------------------------ hooks
    def build_head(self) -> nn.Module:
        """The regressor: ``Linear(feature_dim, 1)``."""
        return nn.Linear(self.feature_dim, 1)

    def tracked_metrics(self) -> dict[str, str]:
        """The final and best ``val/mae_expected``, ``val/mae`` and ``val/acc``."""
        return {"val/mae_expected": "min", "val/mae": "min", "val/acc": "max"}

    def setup(self, stage: str) -> None:
        """Refuse nominal data (``task: auto`` and a nominal data module), then the classifier's setup."""
        if self.resolved_task() == "nominal":
            raise ValueError(_NOMINAL)
        super().setup(stage)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Refuse a linear classifier's checkpoint (its head has ``K`` outputs, the regressor's one), naming the fix."""
        head = (checkpoint.get("state_dict") or {}).get("head.weight")
        if isinstance(head, torch.Tensor) and head.dim() == 2 and head.shape[0] != 1:
            raise ValueError(
                f"the checkpoint holds a linear classifier with {head.shape[0]} outputs (a LinearProbeModule run), not a "
                "regressor; evaluate it with its own config (class_path: cloc_lightning.methods.LinearProbeModule), or "
                "train the regressor from the stage-one checkpoint with --model.encoder_ckpt"
            )
        super().on_load_checkpoint(checkpoint)

    # -------------------------------------------------------------------- outputs
    def regress(self, x: torch.Tensor) -> torch.Tensor:
        """The raw regression output ``r`` ``[B]`` (rank units, not clamped) in the head's dtype."""
        r: torch.Tensor = self.head(self.encode(x))
        return r.squeeze(1)

    def clamp_rank(self, r: torch.Tensor) -> torch.Tensor:
        """``clamp(r, 0, K-1)``: the continuous rank estimate."""
        return r.clamp(0.0, float(self.num_classes - 1))

    def rank_scores(self, r: torch.Tensor) -> torch.Tensor:
        """Class scores ``-|r - c|`` ``[B, K]``: their arg-max is the nearest rank ``round(clamp(r, 0, K-1))``."""
        ranks = torch.arange(self.num_classes, device=r.device, dtype=r.dtype)
        return -(r[:, None] - ranks[None, :]).abs()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Class scores ``-|r - c|`` ``[B, num_classes]`` (arg-max = the nearest rank; see :meth:`regress` for ``r``)."""
        return self.rank_scores(self.regress(x))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = self.split_batch(batch, expect_views=False, owner=type(self).__name__)
        require(
            y < self.num_classes,
            f"a training label is >= num_classes={self.num_classes}; set --model.num_classes to the data module's number of classes",
            detail=lambda: f" (largest label {int(y.max())})",
        )
        r = upcast(self.regress(x))  # float32 (float64 under 64-true)
        # unlabelled rows (y < 0) weigh 0: a mask of weights, not boolean-mask indexing (no host read)
        labelled = (y >= 0).to(r.dtype)
        loss = (labelled * (r - y.clamp_min(0).to(r.dtype)).abs()).sum() / labelled.sum().clamp_min(1.0)
        self.log("train/loss", loss, prog_bar=True, batch_size=y.shape[0])
        return loss

    def eval_outputs(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """``(mean |r - y|, scores -|r - c|, {'expected': clamp(r, 0, K-1)})`` in float32 (see the class docstring)."""
        r = self.regress(x).float()
        loss = (r - y.float()).abs().mean()
        return loss, self.rank_scores(r), {"expected": self.clamp_rank(r)}

    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> dict[str, torch.Tensor]:
        """``{'pred': nearest rank, 'expected': clamp(r, 0, K-1), 'regression': r, 'target': labels}`` (float32)."""
        x, y = batch if isinstance(batch, (list, tuple)) else (batch, None)
        r = self.regress(x).float()
        out = {"pred": self.rank_scores(r).argmax(dim=1), "expected": self.clamp_rank(r), "regression": r}
        if y is not None:
            out["target"] = y
        return out
